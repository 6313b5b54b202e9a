/// \file
/// Installed as <xgrad/nn/attention_reference.hpp> (with xgrad::checks only), never included by
/// xgrad itself: it lives under checks/ so that nn/ includes nothing above it.
/// Deprecated: SPEC 9's closed-form attention reference moved to the gradient-check suite,
/// <xgrad/checks/attention_reference.hpp> (namespace xg::checks::reference, library
/// xgrad::checks), since only checks use it. This header includes that one and keeps the old
/// name xg::nn::reference as an alias, so code written for xgrad 0.2 keeps compiling when it
/// links xgrad::checks; it will be removed in the release after 0.3.
#pragma once

#include <xgrad/checks/attention_reference.hpp>

namespace xg::nn {
/// Deprecated alias of xg::checks::reference (see the file comment).
namespace reference = xg::checks::reference;
}  // namespace xg::nn
