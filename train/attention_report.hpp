/// \file
/// The attention maps of a checkpoint on a prompt, for `xgrad report` (runs::AttentionReport).
#pragma once

#include <string>

#include <xgrad/runs/report.hpp>

namespace xg::train {

/// Loads the checkpoint (a model file, or a run folder: its model.safetensors), encodes the
/// prompt with the checkpoint's tokenizer (the text task's, from its metadata) or one token a
/// character of its vocabulary, and runs the model once over the prompt with weights
/// returned. UsageError (one line) for an encoder-decoder checkpoint, an empty prompt, a prompt
/// the checkpoint's vocabulary cannot encode, and a prompt longer than the context;
/// FormatError for a file that is not an xgrad model.
runs::AttentionReport attention_report(const std::string& checkpoint, const std::string& prompt);

}  // namespace xg::train
