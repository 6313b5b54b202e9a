// Process-wide settings for programs that run many small steps (training loops). Library code
// never calls these on its own: they change the whole process.
#pragma once

namespace xg {

// glibc malloc: keep freed memory in the heap instead of trimming it back to the OS after every
// step (M_TRIM_THRESHOLD, M_TOP_PAD) and serve arrays up to 64 MiB from the heap rather than
// fresh mmaps (M_MMAP_THRESHOLD). A training step frees and reallocates the same sizes every
// time; without this each step page-faults its memory in again. Measured on the sort task:
// 200 steps 8.6 s -> 5.9 s wall, minor page faults 1.1M -> 9k (bench numbers in the issue note).
void tune_allocator_for_training();

// OpenBLAS worker threads. Matrices in tiny models are too small to split: extra threads
// spin in sched_yield and slow the step down.
void set_blas_threads(int n);

}  // namespace xg
