/// \file
/// Deprecated: the key/value head pooling of checkpoint conversion is now
/// <xgrad/nn/kv_head_pooling.hpp>, named for what it does. This header only includes that one,
/// so code written for xgrad 0.2 keeps compiling; it will be removed in the release after 0.3.
#pragma once

#include <xgrad/nn/kv_head_pooling.hpp>
