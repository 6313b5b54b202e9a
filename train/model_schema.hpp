/// \file
/// The model schema: every field of a checkpoint's model description (the keys of
/// model.safetensors' `__metadata__` that say what the model is) declared once, as one row. The
/// rows write the metadata (model_metadata), read it back (model_info), name the `xgrad train`
/// option that sets each field and turn its value into the field (model_from_options, which
/// tasks::config_from_options is; the option table's model_key and the `--init-from` agreement
/// check are derived from them) and describe it (`inspect --json`). Beside the option schema
/// (train/options.hpp): an option row says how a run is asked for, a model row what the saved
/// model is. docs/architecture.md, "The model schema".
#pragma once

#include <string>
#include <vector>

#include <xgrad/io/safetensors.hpp>

namespace xg::train {

struct ModelInfo;
struct TrainOptions;

/// The two model families a checkpoint can hold.
enum class ModelKind {
  gpt,              ///< Decoder-only (nn::GPT: GPT-2 or Llama blocks); metadata "gpt".
  encoder_decoder,  ///< nn::EncoderDecoder; metadata "encoder_decoder".
};
/// "gpt" or "encoder_decoder".
std::string model_kind_name(ModelKind k);
/// The kind named `name`; ValueError for another word.
ModelKind model_kind_from_name(const std::string& name);

/// What made a checkpoint: a task of `xgrad train`, or an import.
enum class TaskKind {
  sort,      ///< --task sort.
  reverse,   ///< --task reverse.
  charlm,    ///< --task charlm of xgrad 0.2.0 (a byte vocabulary of the corpus's bytes).
  text,      ///< --task text (a tokenizer in the checkpoint).
  imported,  ///< Any other word: `xgrad import llama2c` ("llama2c"), tools/xgrad_torch.py's own.
};
/// The kind of the metadata word `task` (imported for a word that is no task of xgrad train).
TaskKind task_kind(const std::string& task);

/// One field of the model description.
struct ModelField {
  /// When the key is in the metadata.
  enum class Presence {
    always,          ///< Written always; a checkpoint without it is refused.
    unless_default,  ///< Written only when not at its default (added after checkpoints existed: those keep
                     ///< their bytes); absent means the default, present at the default is refused.
    with,            ///< Written when `written` holds for the fields before it (RoPE's base beside pos
                     ///< rope), then required.
    carried,         ///< Data of the task or importer (a tokenizer, the sort task's sizes, llama2.c's
                     ///< RoPE tables): kept as text in ModelInfo::task_params, written when there.
  };
  std::string key;     ///< The metadata key, e.g. "d_model".
  /// The `xgrad train` option that sets it (its row name in option_schema()), "" for none. The
  /// one place the two tables are tied: the option row's model_key is derived from it.
  std::string option;
  std::string help;    ///< What it is, for people (inspect --json, docs).
  Presence presence = Presence::always;  ///< When the key is in the metadata.
  /// unless_default and with: whether the key is written for `info` (with: read as required).
  bool (*written)(const ModelInfo&) = nullptr;
  /// The field's text in `info` (not for carried rows).
  std::string (*get)(const ModelInfo&) = nullptr;
  /// Sets the field of `info` from its text; FormatError naming `where` for a bad value (not a
  /// number, beyond a sane bound, not one of the choices).
  void (*set)(ModelInfo&, const std::string& text, const std::string& where) = nullptr;
  /// Sets the field from the text of its option (option_text), where the option's values mean
  /// something the field's text does not: `--dtype bfloat16` is a float32 model (bfloat16 only
  /// in the matmuls), `--window 0` no window (the key left out). Null: `set` takes the option's
  /// text as it is (the sizes; `--kv-heads 0` and `--d-ff 0` are the field's own 0, which
  /// nn::TransformerConfig::resolved derives). Not for carried rows.
  void (*from_option)(ModelInfo&, const std::string& text, const std::string& where) = nullptr;
  /// Whether `option` shapes the model: a run `--init-from` a checkpoint takes the option's value
  /// from the field and refuses another one. False for an option that only names how a run feeds
  /// the model (the tokenizer, the validation split, the document separator): the field records
  /// it, a run from the checkpoint may change it.
  bool option_shapes = true;

  /// The field set in `info` from the option's `text` (from_option, else set).
  void set_from_option(ModelInfo& info, const std::string& text, const std::string& where) const {
    (from_option ? from_option : set)(info, text, where);
  }
};

/// Every field, in reading order (a field's `written` may look at the fields before it).
const std::vector<ModelField>& model_schema();
/// The row of metadata key `key`, or null.
const ModelField* find_model_field(const std::string& key);

/// The model a run of `o` asks for, before its task fills in the context and the vocabulary:
/// every row that is no carried row, whose option shapes the model and applies to the run (its
/// task; RoPE's rows only under `--pos rope`, Llama's under `--arch llama`), set from the
/// option's text through the row (ModelField::set_from_option), in the schema's order. Rows
/// whose option does not apply keep nn::TransformerConfig's defaults. Not resolved; the kind is
/// gpt, the task word o.task.
ModelInfo model_from_options(const TrainOptions& o);

/// The metadata keys a checkpoint holds beside its model description: written when a file is
/// saved (the training step, the xgrad version), not part of what the model is.
const std::vector<std::string>& save_keys();

}  // namespace xg::train
