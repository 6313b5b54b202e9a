/// \file
/// llama2.c model files (Karpathy's llama2.c: `run.c` reads them, `export.py` writes them) as
/// xgrad's named arrays: reading (legacy, version 1, version 2) and writing (legacy). The model
/// built from them, import and export are train/llama2c.hpp's (docs/llama.md has the formats
/// and the name map).
///
/// - **legacy** (llama2.c's "version 0"): seven little-endian int32 (dim, hidden_dim, n_layers,
///   n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means a classifier of its
///   own), then float32 tensors in run.c's order: token embedding, every layer's
///   attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3 (each group over all layers), the
///   final norm, the RoPE tables freq_cis_real and freq_cis_imag [seq_len, head_size / 2]
///   (which run.c skips), then the classifier when it is not shared.
/// - **version 1**: the uint32 magic 0x616b3432 ("ak42"), int32 version 1, the seven int32,
///   a shared_classifier byte, zeros up to byte 256, then float32 tensors in export.py's
///   version-1 order: the attention norms, the ffn norms, the final norm, the token
///   embedding, wq, wk, wv, wo, w1, w2, w3 (each over all layers), the classifier when not
///   shared. No RoPE tables.
/// - **version 2** (int8 Q8_0): as version 1 plus an int32 group_size after the
///   shared_classifier byte; the norms in float32, then every other tensor (same order) as
///   int8 values followed by one float32 scale per group. Dequantized on import as runq.c does
///   (value = q * scale, in float32).
///
/// llama2.c stores matrices out x in (PyTorch's Linear); xgrad in x out, so every matrix is
/// transposed on the way; wq, wk and wv become the columns of W_QKV. The RoPE tables of a legacy
/// file are kept so that import then export gives back the same bytes: xgrad computes them
/// (rope_tables()) and records in the checkpoint's metadata only the entries where the file's
/// bytes differ (torch's float32 pow, cos and sin are not correctly rounded).
///
/// Every size is checked against the file's length before anything is allocated; every
/// failure is a FormatError "[llama2c] FILE: ..." naming the file and the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <xgrad/io/safetensors.hpp>

/// llama2.c model files: reading (legacy, version 1, version 2) and writing (legacy).
namespace xg::io::llama2c {

/// The formats xgrad reads.
enum class Format {
  legacy,    ///< The 7-int32 header, run.c's order, RoPE tables; a negative vocab_size for an unshared classifier.
  version1,  ///< Magic "ak42", version 1, a 256-byte header, export.py's version-1 order, float32.
  version2   ///< Magic "ak42", version 2: int8 Q8_0 weights with float32 scales (dequantized on import).
};

/// "legacy", "version 1" or "version 2".
std::string format_name(Format f);

/// The values of a llama2.c header, as stored.
struct Header {
  Format format = Format::legacy;  ///< Which layout the file has.
  std::int32_t dim = 0;            ///< d_model.
  std::int32_t hidden_dim = 0;     ///< d_ff.
  std::int32_t n_layers = 0;       ///< Layers.
  std::int32_t n_heads = 0;        ///< Query heads.
  std::int32_t n_kv_heads = 0;     ///< Key/value heads.
  std::int32_t vocab_size = 0;     ///< As stored: legacy files negate it for an unshared classifier.
  std::int32_t seq_len = 0;        ///< Context length.
  bool shared_classifier = true;   ///< Whether the classifier is the token embedding.
  std::int32_t group_size = 0;     ///< Version 2: values per quantization group (0 otherwise).
};

/// A Llama model's sizes, checked: what a header says once it holds together (every size
/// positive and within xgrad's checkpoint limits, dim a multiple of n_heads, n_heads of
/// n_kv_heads, an even head size).
struct Sizes {
  std::uint64_t dim = 0;         ///< d_model.
  std::uint64_t hidden_dim = 0;  ///< d_ff.
  std::uint64_t n_layers = 0;    ///< Layers.
  std::uint64_t n_heads = 0;     ///< Query heads.
  std::uint64_t n_kv_heads = 0;  ///< Key/value heads.
  std::uint64_t vocab_size = 0;  ///< Tokens (positive).
  std::uint64_t seq_len = 0;     ///< Context length.
  bool shared_classifier = true; ///< Whether the classifier is the token embedding.
  /// dim / n_heads.
  std::uint64_t head_size() const { return n_heads ? dim / n_heads : 0; }
};

/// A llama2.c file's contents.
struct File {
  Header header;               ///< The file's header.
  Sizes sizes;                 ///< Its sizes, checked.
  safetensors::NamedArrays tensors;  ///< Every parameter by xgrad's name (blocks.L.attn.W_QKV, ...), in x out, float32.
  /// The file's RoPE tables (legacy only; empty for versions 1 and 2): freq_cis_real then
  /// freq_cis_imag, each [seq_len, head_size / 2], as stored.
  std::vector<float> rope_tables;
};

/// Reads a llama2.c file (legacy, version 1 or 2). FormatError "[llama2c] PATH: ..." when it is
/// not a regular file (a folder, a FIFO), unreadable, truncated, longer than its header says,
/// has a bad magic or version, a header value that is not positive, not consistent (dim a
/// multiple of n_heads, n_heads of n_kv_heads, an even head size, a group_size dividing every
/// quantized tensor) or above xgrad's checkpoint limits, or a non-finite weight (after
/// dequantization).
File read(const std::string& path);

/// xgrad's RoPE tables for head size `head_size` and `seq_len` positions, as export.py
/// computes them in float32: theta_i = 1 / float32(10000 ^ float32(2i / head_size)), angle =
/// float32(t * theta_i), then cos and sin rounded to float32. freq_cis_real then
/// freq_cis_imag, each [seq_len, head_size / 2].
std::vector<float> rope_tables(std::size_t head_size, std::size_t seq_len);

/// The legacy file's bytes for a Llama model of sizes `sizes` with parameters `params`
/// (xgrad's names and layout, float32 or float64 rounded to float32) and RoPE tables `tables`
/// (rope_tables() layout). ValueError naming the parameter when one is missing or not finite
/// in float32, or the tables have another size; ShapeError for a parameter of another shape.
std::string legacy_bytes(const Sizes& sizes, const safetensors::NamedArrays& params, const std::vector<float>& tables);

}  // namespace xg::io::llama2c
