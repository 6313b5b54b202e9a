/// \file
/// Saving and loading a module's parameters as a safetensors file (the container itself, its
/// checks and its metadata: io/safetensors.hpp).
#pragma once

#include <string>

#include <xgrad/io/safetensors.hpp>
#include <xgrad/nn/module.hpp>

/// Modules in safetensors files.
namespace xg::nn::safetensors {

/// The container's types, as io::safetensors names them. @{
using io::safetensors::Metadata;
using io::safetensors::NamedArrays;
/// @}

/// Saves module `m`'s parameters by their hierarchical names to `path`, with `metadata`.
void save_module(const std::string& path, const Module& m, const Metadata& metadata = {});
/// Loads values from `path` into m's parameters: every parameter must be present with its
/// exact shape and dtype, every value finite, and the file may hold nothing else. Returns the
/// file's metadata.
Metadata load_module(const std::string& path, Module& m);

}  // namespace xg::nn::safetensors
