/// \file
/// A vocabulary as a list of tokens (strings of bytes): what a model's ids mean, saved in
/// checkpoints as JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

/// Text for language models, below the training loop: tokenizers (bytes, SentencePiece,
/// llama2.c's tokenizer.bin), vocabularies, corpora of documents and their token files.
/// Knows nothing of models.
namespace xg::text {

/// Tokens are strings (a digit, a separator, a character); ids index `tokens`.
struct Vocabulary {
  std::vector<std::string> tokens;  ///< The token of each id, in id order.
  /// The number of tokens, V_vocab.
  std::size_t size() const { return tokens.size(); }
  /// The id of token `t`; ValueError naming the token if unknown.
  std::int64_t id(const std::string& t) const;
  /// The tokens of `ids` concatenated; ValueError for an id outside [0, size()).
  std::string decode(const std::vector<std::int64_t>& ids) const;
  /// JSON array of the tokens (saved in checkpoints): a UTF-8 token as a string, any other
  /// as an array of its byte values, so every vocabulary reads back exactly.
  std::string to_json() const;
  /// The vocabulary of to_json()'s text; FormatError when `json` is not such an array.
  static Vocabulary from_json(const std::string& json);
};

/// The token that stands for an id with no text of its own: "<id>" (e.g. "<300>"). A model
/// imported without a tokenizer (xgrad import llama2c) has one for every id; a text model whose
/// vocabulary is larger than its tokenizer's, one for each id past the tokenizer's (never sampled).
std::string placeholder_token(std::size_t id);

}  // namespace xg::text
