// SHA-256 (core/detail/sha256.hpp, internal): the FIPS 180-4 example messages (NIST's "Cryptographic
// Standards and Guidelines" examples for SHA-256), and messages whose lengths sit at the
// padding's boundaries, with digests from Python's hashlib (an independent implementation).
#include <catch2/catch.hpp>
#include <string>

#include <xgrad/core/detail/sha256.hpp>

using xg::detail::Sha256;
using xg::detail::sha256_hex;

namespace {

// (i * 7 + 3) mod 256 for i = 0 .. n-1: a message of n bytes covering all byte values.
std::string pattern(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + 3) % 256);
  return s;
}

}  // namespace

TEST_CASE("sha256 gives the FIPS 180-4 example digests", "[sha256]") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // 448 bits: the padding needs a second block.
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                   "mnopqrstnopqrstu") == "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(sha256_hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256 pads messages of every length around a block boundary", "[sha256]") {
  const std::pair<std::size_t, const char*> cases[] = {
      {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
      {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
      {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
      {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
      {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
      {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
      {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
      {127, "a8d23e75d936f303d248888d9b165ee543f4cbafcad3c9dd2a79bd84faa11d07"},
      {128, "d2742f1f4ac6bb7ca2b239ee18402ba8b3f9f8e652d2a72973c2b9ba11c08cf6"},
      {1000, "1e9bc38cbf860b9ec31918b065f9b52476c549a782e0e7990bed8ce3868d2371"}};
  for (const auto& [n, hex] : cases) {
    INFO("length " << n);
    CHECK(sha256_hex(pattern(n)) == hex);
  }
}

TEST_CASE("sha256 gives the same digest however the message is split into updates", "[sha256]") {
  const std::string m = pattern(1000);
  for (std::size_t piece : {1, 3, 63, 64, 65, 200}) {
    Sha256 h;
    for (std::size_t at = 0; at < m.size(); at += piece) h.update(m.data() + at, std::min(piece, m.size() - at));
    const auto d = h.digest();
    std::string hex;
    for (std::uint8_t b : d) {
      hex += "0123456789abcdef"[b >> 4];
      hex += "0123456789abcdef"[b & 15];
    }
    INFO("updates of " << piece << " bytes");
    CHECK(hex == "1e9bc38cbf860b9ec31918b065f9b52476c549a782e0e7990bed8ce3868d2371");
  }
}
