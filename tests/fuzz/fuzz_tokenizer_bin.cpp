// libFuzzer target: llama2.c's tokenizer.bin reader (text/tokenizer_llama2c.cpp) on arbitrary
// bytes; a file that loads encodes texts (fixed ones, and the input's own tail, whose pieces it
// holds) and decodes the ids back. Checked: BOS first, every id inside the vocabulary, decode
// and piece accept every id encode gives. Any outcome but success or an xg::Error is a
// finding. Run by scripts/fuzz.sh.
#include <algorithm>
#include <string>

#include <xgrad/core/error.hpp>
#include <xgrad/text/tokenizer.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const auto tok = xg::text::make_llama2c_tokenizer(bytes, "fuzz.bin");
    const std::string texts[] = {"", "Once upon a time", std::string("a\0\xff\xc3\xa9 \xe2\x82\xac\x80\x80", 11),
                                 bytes.substr(bytes.size() - std::min<std::size_t>(bytes.size(), 64))};
    for (const std::string& t : texts) {
      const std::vector<std::int64_t> ids = tok->encode(t);
      if (ids.empty() || ids[0] != xg::text::kLlama2cBos) __builtin_trap();
      for (std::int64_t id : ids) {
        if (id < 0 || static_cast<std::size_t>(id) >= tok->vocab_size()) __builtin_trap();
        (void)tok->piece(id);
      }
      (void)tok->decode(ids);
    }
    if (tok->serialized() != bytes) __builtin_trap();
  } catch (const xg::Error&) {
  }
  return 0;
}
