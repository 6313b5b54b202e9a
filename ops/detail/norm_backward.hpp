/// \file
/// The backward pass of layer_norm and rms_norm as one recorded op under create_graph
/// (ops/norm_backward.cpp; docs/math.md derives its VJP). Internal to ops/.
#pragma once

#include <xgrad/core/tape.hpp>

namespace xg::ops {

/// x_bar of layer_norm (`center`: the row mean is subtracted) or rms_norm, recorded as op `name`
/// with inputs x, [gamma], g (c.grad_output); its value comes from the norm's own first-order VJP
/// (c.first_order, so the same bits as a plain pass), its VJP is the fused double backward and its
/// own rule the same map with recorded ops.
Tensor recorded_norm_backward(const char* name, const DiffVjpContext& c, double eps, bool has_g, bool center);

}  // namespace xg::ops
