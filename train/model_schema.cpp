// The model schema (train/model_schema.hpp): one row a field of the model description.
#include <xgrad/train/model_schema.hpp>

#include <xgrad/core/error.hpp>
#include <xgrad/io/number.hpp>
#include <xgrad/nn/layer_registry.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/options.hpp>

namespace xg::train {

std::string model_kind_name(ModelKind k) { return k == ModelKind::gpt ? "gpt" : "encoder_decoder"; }

ModelKind model_kind_from_name(const std::string& name) {
  if (name == "gpt") return ModelKind::gpt;
  if (name == "encoder_decoder") return ModelKind::encoder_decoder;
  throw ValueError("model kind '" + shown_value(name) + "' is not gpt or encoder_decoder");
}

TaskKind task_kind(const std::string& task) {
  if (task == "sort") return TaskKind::sort;
  if (task == "reverse") return TaskKind::reverse;
  if (task == "charlm") return TaskKind::charlm;
  if (task == "text") return TaskKind::text;
  return TaskKind::imported;
}

namespace {

using F = ModelField;
using P = ModelField::Presence;
using Info = ModelInfo;

// `at` is "[checkpoint] PATH: ": every message names the file.
std::size_t size_of(const std::string& key, const std::string& text, const std::string& at, std::size_t max) {
  const std::uint64_t v = io::parse_uint(text, at + "metadata '" + key + "'");
  if (v > max)
    throw FormatError(at + "metadata '" + key + "' = " + text + " exceeds the limit " + std::to_string(max));
  return static_cast<std::size_t>(v);
}

bool is_gpt(const Info& i) { return i.kind == ModelKind::gpt; }
bool is_llama(const Info& i) { return i.config.arch == nn::Architecture::llama; }
bool is_rope(const Info& i) { return i.config.pos == nn::PositionScheme::rope; }

// A row of a size field of the configuration: `member`, at most `max`.
#define XG_SIZE_ROW(KEY, OPTION, HELP, MEMBER, MAX)                                                             \
  F {                                                                                                          \
    KEY, OPTION, HELP, P::always, nullptr, [](const Info& i) { return std::to_string(i.config.MEMBER); },      \
        [](Info& i, const std::string& t, const std::string& at) { i.config.MEMBER = size_of(KEY, t, at, MAX); } \
  }

// The name of a registered layer of kind KIND (nn/layer_registry.hpp) in TransformerConfig::KIND:
// written only when set; a name this program has not registered is refused by name.
void set_layer_name(Info& i, nn::LayerKind kind, std::string nn::TransformerConfig::*field, const std::string& t,
                    const std::string& at) {
  const std::string what = nn::layer_kind_name(kind);
  if (!is_gpt(i)) throw FormatError(at + "registered layers (layer_*) are for GPT models only");
  if (!nn::is_registered(kind, t))
    throw FormatError(at + "the model's " + what + " is the registered layer '" + shown_value(t, 64) +
                      "', which this program has not registered (a program that registers it with nn::register_" +
                      what + " can load it; docs/custom-layers.md)");
  i.config.*field = t;
}
#define XG_LAYER_ROW(KIND, KEY, HELP)                                                                   \
  F {                                                                                                  \
    KEY, "", HELP, P::unless_default, [](const Info& i) { return !i.config.KIND.empty(); },             \
        [](const Info& i) { return i.config.KIND; },                                                   \
        [](Info& i, const std::string& t, const std::string& at) {                                     \
          set_layer_name(i, nn::LayerKind::KIND, &nn::TransformerConfig::KIND, t, at);                 \
        }                                                                                              \
  }

// A field of the task or the importer, carried as text. `shapes`: its option shapes the model
// (ModelField::option_shapes; the sort and reverse sizes), else it only feeds the run.
F carried(const char* key, const char* option, const char* help, bool shapes = false) {
  F f{key, option, help, P::carried, nullptr, nullptr, nullptr};
  f.option_shapes = shapes;
  return f;
}

// A row whose option's values mean more than the field's text (ModelField::from_option).
F from_option(F f, void (*from)(Info&, const std::string&, const std::string&)) {
  f.from_option = from;
  return f;
}

void set_dtype(Info& i, const std::string& t, const std::string& at) {
  if (t != "float32" && t != "float64") throw FormatError(at + "unknown dtype '" + t + "'");
  i.config.dtype = t == "float32" ? DType::float32 : DType::float64;
}

std::vector<ModelField> make_schema() {
  return {
      // The file's format word: written by this version, not read (any word loads).
      F{"format", "", "the checkpoint format, xgrad-1", P::always, nullptr, [](const Info&) { return std::string("xgrad-1"); },
        nullptr},
      F{"model", "", "the model family: gpt (decoder-only) or encoder_decoder", P::always, nullptr,
        [](const Info& i) { return model_kind_name(i.kind); },
        [](Info& i, const std::string& t, const std::string& at) {
          try {
            i.kind = model_kind_from_name(t);
          } catch (const ValueError&) {
            throw FormatError(at + "unknown model kind '" + t + "'");
          }
        }},
      F{"layout", "", "the weight layout: in_x_out (y = x W + b)", P::always, nullptr,
        [](const Info&) { return std::string("in_x_out"); },
        [](Info&, const std::string& t, const std::string& at) {
          if (t != "in_x_out") throw FormatError(at + "unsupported weight layout '" + t + "'");
        }},
      F{"task", "task", "what made the model: sort, reverse, charlm, text, or an importer's word (llama2c)", P::always,
        nullptr, [](const Info& i) { return i.task; }, [](Info& i, const std::string& t, const std::string&) { i.task = t; }},
      F{"vocabulary", "", "the token of each id (JSON)", P::always, nullptr, [](const Info& i) { return i.vocab.to_json(); },
        [](Info& i, const std::string& t, const std::string&) { i.vocab = text::Vocabulary::from_json(t); }},
      XG_SIZE_ROW("V_vocab", "vocab_size", "vocabulary size", V_vocab, 1u << 20),
      XG_SIZE_ROW("context", "context", "the longest sequence the model takes", context, 1u << 16),
      XG_SIZE_ROW("d_model", "d_model", "model width", d_model, 1u << 14),
      XG_SIZE_ROW("H_q", "heads", "query heads", H_q, 1u << 14),
      XG_SIZE_ROW("H_kv", "kv_heads", "key/value heads", H_kv, 1u << 14),
      F{"d_h", "", "head width, d_model / H_q", P::always, nullptr,
        [](const Info& i) { return std::to_string(i.config.d_model / i.config.H_q); },
        [](Info& i, const std::string& t, const std::string& at) {
          const std::size_t d_h = size_of("d_h", t, at, 1u << 14);
          if (i.config.H_q == 0 || d_h * i.config.H_q != i.config.d_model)
            throw FormatError(at + "d_h * H_q must equal d_model");
        }},
      XG_SIZE_ROW("layers", "layers", "decoder layers", layers, 1024),
      F{"encoder_layers", "", "encoder layers (0 for gpt)", P::always, nullptr,
        [](const Info& i) { return std::to_string(i.kind == ModelKind::encoder_decoder ? i.config.encoder_layers : 0); },
        [](Info& i, const std::string& t, const std::string& at) {
          i.config.encoder_layers = size_of("encoder_layers", t, at, 1024);
        }},
      XG_SIZE_ROW("d_ff", "d_ff", "feed-forward width", d_ff, 1u << 18),
      // --dtype bfloat16 trains float32 parameters (bfloat16 only in the matmuls): a float32 model.
      from_option(F{"dtype", "dtype", "parameter precision: float32 or float64", P::always, nullptr,
                    [](const Info& i) { return std::string(dtype_name(i.config.dtype)); }, set_dtype},
                  [](Info& i, const std::string& t, const std::string& at) { set_dtype(i, t == "bfloat16" ? "float32" : t, at); }),
      // GPT-2 blocks are the default and write no key (those checkpoints keep their bytes).
      F{"arch", "arch", "the blocks: gpt (GPT-2) or llama (RMSNorm, SwiGLU, no biases)", P::unless_default, is_llama,
        [](const Info& i) { return std::string(nn::architecture_name(i.config.arch)); },
        [](Info& i, const std::string& t, const std::string& at) {
          try {
            i.config.arch = nn::architecture_from_name(t);
          } catch (const ValueError&) {
            throw FormatError(at + "metadata 'arch' = '" + t + "' is not gpt or llama");
          }
          if (!is_gpt(i)) throw FormatError(at + "metadata 'arch' is for GPT models only");
        }},
      F{"multiple_of", "multiple_of", "llama: the feed-forward width rounding", P::with, is_llama,
        [](const Info& i) { return std::to_string(i.config.multiple_of); },
        [](Info& i, const std::string& t, const std::string& at) { i.config.multiple_of = size_of("multiple_of", t, at, 1u << 16); }},
      F{"norm_eps", "norm_eps", "llama: RMSNorm's epsilon", P::with, is_llama,
        [](const Info& i) { return io::exact_text(i.config.norm_eps); },
        [](Info& i, const std::string& t, const std::string& at) {
          i.config.norm_eps = io::parse_double(t, at + "metadata 'norm_eps'");
        }},
      F{"tie_embeddings", "tie_embeddings", "llama: the classifier is the token embedding's transpose", P::with, is_llama,
        [](const Info& i) { return std::string(i.config.tie_embeddings ? "true" : "false"); },
        [](Info& i, const std::string& t, const std::string& at) {
          if (t != "true" && t != "false")
            throw FormatError(at + "metadata 'tie_embeddings' = '" + t + "' is not true or false");
          i.config.tie_embeddings = t == "true";
        }},
      // GPT-2 blocks with biases are the default and write no key (nanoGPT's bias; --no-bias).
      from_option(F{"bias", "bias", "gpt: biases in the linear layers and LayerNorms (absent: yes; false: none)",
                    P::unless_default, [](const Info& i) { return !i.config.bias; },
                    [](const Info& i) { return std::string(i.config.bias ? "true" : "false"); },
                    [](Info& i, const std::string& t, const std::string& at) {
                      if (t != "false")
                        throw FormatError(at + "metadata 'bias' = '" + shown_value(t, 64) +
                                          "' is not false (leave the key out for biases)");
                      if (!is_gpt(i) || is_llama(i)) throw FormatError(at + "metadata 'bias' is for GPT-2 blocks only");
                      i.config.bias = false;
                    }},
                  [](Info& i, const std::string& t, const std::string&) { i.config.bias = t == "true"; }),
      // --window 0 is no window, which the metadata says by leaving the key out.
      from_option(F{"window", "window", "sliding-window attention width (absent: none)", P::unless_default,
                    [](const Info& i) { return i.config.window > 0; },
                    [](const Info& i) { return std::to_string(i.config.window); },
                    [](Info& i, const std::string& t, const std::string& at) {
                      i.config.window = size_of("window", t, at, 1u << 16);
                      if (i.config.window == 0)
                        throw FormatError(at + "metadata 'window' = 0; leave the key out for no window");
                    }},
                  [](Info& i, const std::string& t, const std::string& at) { i.config.window = size_of("window", t, at, 1u << 16); }),
      // Learned positions are the default and write no key.
      F{"pos", "pos", "positions: learned, rope, alibi or none", P::unless_default,
        [](const Info& i) { return i.config.pos != nn::PositionScheme::learned; },
        [](const Info& i) { return std::string(nn::position_scheme_name(i.config.pos)); },
        [](Info& i, const std::string& t, const std::string& at) {
          try {
            i.config.pos = nn::position_scheme_from_name(t);
          } catch (const ValueError&) {
            throw FormatError(at + "metadata 'pos' = '" + t + "' is not learned, rope, alibi or none");
          }
          if (i.config.pos != nn::PositionScheme::learned && !is_gpt(i))
            throw FormatError(at + "metadata 'pos' = '" + t + "' but an encoder_decoder has learned position embeddings only");
        }},
      F{"rope_base", "rope_base", "rope: the frequency base", P::with, is_rope,
        [](const Info& i) { return io::exact_text(i.config.rope.base); },
        [](Info& i, const std::string& t, const std::string& at) {
          i.config.rope.base = io::parse_double(t, at + "metadata 'rope_base'");
        }},
      F{"rope_fraction", "rope_fraction", "rope: the fraction of each head rotated", P::with, is_rope,
        [](const Info& i) { return io::exact_text(i.config.rope.fraction); },
        [](Info& i, const std::string& t, const std::string& at) {
          i.config.rope.fraction = io::parse_double(t, at + "metadata 'rope_fraction'");
        }},
      F{"rope_layout", "rope_layout", "rope: interleaved or half-split pairs", P::with, is_rope,
        [](const Info& i) { return std::string(ops::rope_layout_name(i.config.rope.layout)); },
        [](Info& i, const std::string& t, const std::string& at) {
          try {
            i.config.rope.layout = ops::rope_layout_from_name(t);
          } catch (const ValueError&) {
            throw FormatError(at + "metadata 'rope_layout' = '" + t + "' is not interleaved or half-split");
          }
        }},
      // Registered layers (nn/layer_registry.hpp): written only when one is used (other
      // checkpoints keep their bytes); a program must have registered the name to load it.
      XG_LAYER_ROW(activation, "layer_activation", "a registered activation in place of GELU / SiLU (absent: the built-in one)"),
      XG_LAYER_ROW(mlp, "layer_mlp", "a registered feed-forward layer (absent: the built-in one)"),
      XG_LAYER_ROW(norm, "layer_norm", "a registered norm (absent: the built-in one)"),
      XG_LAYER_ROW(attention, "layer_attention", "a registered attention core in place of scaled dot-product attention (absent: the built-in one)"),
      // The tokenizer's identity: its kind, digest and the model file itself (base64).
      carried("tokenizer", "tokenizer", "text: the tokenizer's kind (bytes, sentencepiece, llama2c)"),
      carried("tokenizer_sha256", "", "text: the tokenizer's SHA-256"),
      carried("tokenizer_model", "", "text: the tokenizer's file, base64"),
      carried("doc_separator", "doc_separator", "text: what joins documents into one token stream (absent: none)"),
      carried("val_fraction", "val_fraction", "text: the share of documents held out for validation"),
      carried("n_digits", "n_digits", "sort: digits per problem", true),
      carried("n_values", "", "sort: the values of a digit"),
      carried("min_len", "min_len", "reverse: the shortest source", true),
      carried("max_len", "max_len", "reverse: the longest source", true),
      carried("llama2c_format", "", "xgrad import llama2c: the file's format"),
      carried("llama2c_tables", "", "xgrad import llama2c: RoPE table entries that differ from xgrad's, for a "
                                    "byte-identical export"),
  };
}

#undef XG_SIZE_ROW
#undef XG_LAYER_ROW

}  // namespace

const std::vector<ModelField>& model_schema() {
  static const std::vector<ModelField> schema = make_schema();
  return schema;
}

const ModelField* find_model_field(const std::string& key) {
  for (const ModelField& f : model_schema())
    if (f.key == key) return &f;
  return nullptr;
}

ModelInfo model_from_options(const TrainOptions& o) {
  ModelInfo info;
  info.kind = ModelKind::gpt;
  for (const ModelField& f : model_schema()) {
    if (f.option.empty() || !f.option_shapes || f.presence == ModelField::Presence::carried || !f.set) continue;
    const OptionSpec* s = find_option(f.option);
    if (!s) throw InternalError(op_message("train", "model row '" + f.key + "' names no option '" + f.option + "'"));
    if (!option_applies(o, *s)) continue;
    f.set_from_option(info, option_text(o, *s), "[train] " + (s->flag.empty() ? s->name : s->flag) + ": ");
  }
  return info;
}

const std::vector<std::string>& save_keys() {
  static const std::vector<std::string> keys = {"step", "xgrad_version"};
  return keys;
}

}  // namespace xg::train
