// Process-wide settings. The defaults are the fast ones: nothing here needs to be called for
// xgrad to run at full speed (docs/performance.md).
#pragma once

namespace xg {

// xgrad's worker threads (one pool, core/parallel.hpp). Default: one per core. Every parallel loop and
// every split GEMM uses this pool; OpenBLAS itself always runs single-threaded inside it.
// n >= 1. Results are bit-identical run to run for a fixed n.
void set_num_threads(int n);
int num_threads();

// Kept for programs written against earlier versions: same as set_num_threads(n).
void set_blas_threads(int n);

// Earlier versions tuned glibc malloc here. Array storage now comes from xgrad's own caching
// allocator (core/allocator.hpp), which keeps freed blocks for reuse by default; this call is
// a no-op kept for source compatibility.
void tune_allocator_for_training();

}  // namespace xg
