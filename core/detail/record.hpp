// Internal: record() for built-in ops whose inputs the caller holds. A braced list of Tensors
// ({a, b}) copies each handle into the list and drops it again: two atomic reference-count
// updates per input, which on a one-element op are a visible part of its overhead
// (bench_op_overhead). record_refs takes the inputs' addresses instead; everything else is
// record()'s (core/tape.hpp): same checks, same errors, same node.
#pragma once

#include <initializer_list>
#include <string>

#include <xgrad/core/tape.hpp>

namespace xg::detail {

// record(op, output, {*inputs...}, vjp, dvjp) without copying the inputs. Each pointer must
// be non-null and stay valid for the call.
Tensor record_refs(const std::string& op, Array output, std::initializer_list<const Tensor*> inputs, VjpFn vjp,
                   DiffVjpFn dvjp);

}  // namespace xg::detail
