// NumPy .npy/.npz files (io/npy.hpp): round trips, the exact bytes NumPy writes, the zip
// layer (CRC-32, stored and deflate members) and one bad input per error. Files written by
// NumPy itself, and read back by NumPy, are tested in tests/interop (npy_numpy.py).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "tests/support/helpers.hpp"
#include <xgrad/io/npy.hpp>

using namespace xg;
using xgt::same_bits;
namespace npy = xg::io::npy;

namespace {

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The bytes NumPy 1.24's np.save writes for a header text: magic, version 1.0, length, text.
std::string npy_file(const std::string& dict, const std::string& data, int major = 1) {
  std::string h = dict;
  const std::size_t pre = major == 1 ? 10 : 12;
  h.append((64 - (pre + h.size() + 1) % 64) % 64, ' ');
  h.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (std::size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out.push_back(static_cast<char>((h.size() >> (8 * i)) & 0xFF));
  return out + h + data;
}

std::string f4_bytes(std::initializer_list<float> v) {
  std::string s;
  for (float x : v) s.append(reinterpret_cast<const char*>(&x), 4);
  return s;
}

#define REQUIRE_FORMAT_ERROR(expr, text)                 \
  do {                                                   \
    CHECK_THROWS_AS(expr, FormatError);                  \
    CHECK_THROWS_WITH(expr, Catch::Contains(text));      \
  } while (0)

}  // namespace

TEST_CASE("crc32 of the standard check string is 0xCBF43926", "[npy]") {
  REQUIRE(npy::crc32("123456789", 9) == 0xCBF43926u);
  REQUIRE(npy::crc32("", 0) == 0u);
  // Incremental use gives the same value.
  REQUIRE(npy::crc32("56789", 5, npy::crc32("1234", 4)) == 0xCBF43926u);
}

TEST_CASE("inflate decodes stored/fixed/dynamic deflate blocks written by zlib", "[npy]") {
  // Raw deflate streams made with Python's zlib (wbits -15): a stored block (level 0), fixed
  // Huffman codes (Z_FIXED) and dynamic codes (level 9 on skewed text).
  REQUIRE(npy::inflate(std::string("\x01\x03\x00\xfc\xff\x78\x79\x7a", 8), 3, "t") == "xyz");
  REQUIRE(npy::inflate(std::string("\xcb\x48\xcd\xc9\xc9\x57\xc8\x40\x27\x01", 10), 23, "t") ==
          "hello hello hello hello");
  const std::string dyn(
      "\x2d\x8c\xc1\x11\x00\x51\x0c\x41\x6b\xf5\xe8\xbf\x86\x25\x7f\x73\xc0\x20\x84\x6d\xf5\x0a\xe8\x54\x26\x6b\x32"
      "\x2a\x66\x26\xe3\x39\xaf\x85\xfe\x7a\x43\x87\x2c\xe1\xfc\x00\x6d\x3a\x57\x89\xcc\x56\x6e\xea\xfe\x83\xbb\xa5\x0f",
      55);
  const std::string text =
      "abcccaaaacaabacaaaadcaabccabaabcabadaaaabbadabaababacaabaaabacaadaacdbdbaabbcaabadbbbdabcdbaaabdacbabcaaabcaab"
      "aabdbcbbaa";
  REQUIRE(npy::inflate(dyn, text.size(), "t") == text);
  REQUIRE(npy::crc32(text.data(), text.size()) == 0x5659d8f1u);  // zlib.crc32 of the same text
}

TEST_CASE("inflate rejects malformed deflate streams with a FormatError", "[npy][errors]") {
  const std::string fixed("\xcb\x48\xcd\xc9\xc9\x57\xc8\x40\x27\x01", 10);
  REQUIRE_FORMAT_ERROR(npy::inflate(fixed.substr(0, 6), 23, "t"), "deflate stream is truncated");
  REQUIRE_FORMAT_ERROR(npy::inflate(fixed, 22, "t"), "more than the 22 bytes");
  REQUIRE_FORMAT_ERROR(npy::inflate(fixed, 24, "t"), "inflates to 23 bytes, the archive declares 24");
  REQUIRE_FORMAT_ERROR(npy::inflate(fixed + "x", 23, "t"), "1 bytes follow the end");
  REQUIRE_FORMAT_ERROR(npy::inflate(std::string("\x07", 1), 1, "t"), "reserved type 3");
  REQUIRE_FORMAT_ERROR(npy::inflate(std::string("\x01\x03\x00\x00\x00xyz", 8), 3, "t"),
                       "does not match its complement");
  // Hand-made fixed-code streams (bits written LSB first, codes MSB first).
  REQUIRE_FORMAT_ERROR(npy::inflate(std::string("\x03\x02\x00", 3), 3, "t"), "refers 1 bytes back with only 0 written");
  REQUIRE_FORMAT_ERROR(npy::inflate(std::string("\x73\x1c\x03\x00", 4), 3, "t"), "invalid length symbol 286");
  REQUIRE_FORMAT_ERROR(npy::inflate(std::string("\x73\x04\x3e\x00", 4), 4, "t"), "invalid distance symbol 30");
  REQUIRE_FORMAT_ERROR(npy::inflate(std::string("\x05\x00\x92\x04", 4), 4, "t"), "over-subscribed code-length code");
  REQUIRE_FORMAT_ERROR(npy::inflate(std::string("\x72\x04\x00", 3), 1, "t"), "truncated");  // last block missing
  // Hand-made dynamic-block headers.
  REQUIRE_FORMAT_ERROR(npy::inflate(std::string("\xf5\x00\x00\x00", 4), 1, "t"), "declares 287 literal/length");
  REQUIRE_FORMAT_ERROR(npy::inflate(std::string("\x05\x00\x02\x24", 4), 1, "t"), "repeat before the first length");
  REQUIRE_FORMAT_ERROR(npy::inflate(std::string("\x05\x00\x80\xe4\xff\x1f", 6), 1, "t"), "code lengths overrun");
  REQUIRE_FORMAT_ERROR(npy::inflate(std::string("\x05\x00\x80\xe4\x7f\x1b", 6), 1, "t"), "no end-of-block code");
}

TEST_CASE("npy save/load round-trips float32 float64 and int64 bit for bit", "[npy]") {
  const auto dir = xgt::temp_dir("npy_round_trip");
  Generator g(7);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const DType dt : {DType::float32, DType::float64}) {
    for (const Shape& s : std::vector<Shape>{{}, {0}, {5}, {2, 3}, {2, 0, 4}, {1, 2, 1, 3}}) {
      Array a = random_normal(s, g, dt);
      if (a.size() >= 5) {
        a.set_flat(0, -0.0);
        a.set_flat(1, inf);
        a.set_flat(2, -inf);
        a.set_flat(3, nan);
        a.set_flat(4, dt == DType::float32 ? 1e-45 : 5e-324);  // the smallest subnormal
      }
      const std::string path = (dir / "a.npy").string();
      npy::save(path, a);
      const Array b = npy::load(path);
      INFO(dtype_name(dt) << " " << shape_str(s));
      REQUIRE(same_bits(a, b));  // NaN payloads and the sign of zero included
      const npy::Value v = npy::read(path);
      REQUIRE(!v.is_index());
      REQUIRE(v.shape() == s);
      // The data is 64-byte aligned after the header, as NumPy writes it.
      const std::string bytes = xgt::read_file(path);
      REQUIRE((bytes.size() - a.size() * (dt == DType::float32 ? 4 : 8)) % 64 == 0);
    }
  }
  const IndexArray ids({2, 3}, {0, -1, std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min(),
                                (std::int64_t(1) << 53) + 1, 42});
  const std::string path = (dir / "ids.npy").string();
  npy::save(path, ids);
  const IndexArray back = npy::load_index(path);
  REQUIRE(back.shape == ids.shape);
  REQUIRE(back.data == ids.data);  // exact, including 2^53 + 1 (a float64 could not hold it)
  npy::save(path, IndexArray(Shape{0}, {}));
  REQUIRE(npy::load_index(path).size() == 0);
}

TEST_CASE("npy save writes exactly the bytes NumPy 1.24's np.save writes", "[npy]") {
  // Headers copied from np.save output (numpy 1.24.2): 118-byte header, 21-digit growth room.
  const auto dir = xgt::temp_dir("npy_bytes");
  const std::string path = (dir / "a.npy").string();
  npy::save(path, Array::from_vector({2, 3}, {0, 1, 2, 3, 4, 5}, DType::float32));
  std::string want = std::string("\x93NUMPY\x01\x00v\x00", 10) + "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  want.append(127 - want.size(), ' ');
  want += "\n" + f4_bytes({0, 1, 2, 3, 4, 5});
  REQUIRE(xgt::read_file(path) == want);
  npy::save(path, Array::scalar(1.5, DType::float64));
  std::string scalar = std::string("\x93NUMPY\x01\x00v\x00", 10) + "{'descr': '<f8', 'fortran_order': False, 'shape': (), }";
  scalar.append(127 - scalar.size(), ' ');
  const double x = 1.5;
  REQUIRE(xgt::read_file(path) == scalar + "\n" + std::string(reinterpret_cast<const char*>(&x), 8));
  npy::save(path, IndexArray{7, 8, 9});
  REQUIRE(xgt::read_file(path).substr(10, 60) == "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }   ");
}

TEST_CASE("npy reads format versions 2.0 and 3.0 and headers written by hand", "[npy]") {
  const std::string data = f4_bytes({1, 2});
  for (int major : {2, 3}) {
    const npy::Value v = npy::parse(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data, major));
    REQUIRE(v.array.to_vector() == std::vector<double>{1, 2});
  }
  // Key order, quotes, spacing and the trailing comma are free in a dict literal.
  const npy::Value v = npy::parse(npy_file("{\"shape\":(1,2),'fortran_order':False,'descr':'<f4'}", data));
  REQUIRE(v.array.shape() == Shape{1, 2});
}

TEST_CASE("npy rejects every malformed or unsupported file with a FormatError", "[npy][errors]") {
  const std::string ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const std::string data = f4_bytes({1, 2});
  auto with = [&](const std::string& dict, const std::string& d) { return npy::parse(npy_file(dict, d), "x"); };
  auto header = [&](const std::string& descr, const std::string& fortran, const std::string& shape) {
    return "{'descr': " + descr + ", 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  };
  REQUIRE_NOTHROW(with(ok_dict, data));
  // Magic, version, lengths.
  REQUIRE_FORMAT_ERROR(npy::parse("", "x"), "[npy] x: truncated: 0 bytes");
  REQUIRE_FORMAT_ERROR(npy::parse("PK\x03\x04 not npy", "x"), "not a .npy file: it starts with 'PK\\x03\\x04");
  std::string v4 = npy_file(ok_dict, data);
  v4[6] = 4;
  REQUIRE_FORMAT_ERROR(npy::parse(v4, "x"), "format version 4.0 is not supported");
  std::string v11 = npy_file(ok_dict, data);
  v11[7] = 1;
  REQUIRE_FORMAT_ERROR(npy::parse(v11, "x"), "format version 1.1");
  std::string long_header = npy_file(ok_dict, data);
  long_header[8] = '\xff';
  long_header[9] = '\x7f';
  REQUIRE_FORMAT_ERROR(npy::parse(long_header, "x"), "truncated: the header length is 32767 bytes");
  REQUIRE_FORMAT_ERROR(npy::parse(npy_file(ok_dict, data).substr(0, 9), "x"), "truncated: the header length needs 2");
  // The header literal.
  REQUIRE_FORMAT_ERROR(with("[1, 2]", data), "not a dict literal");
  REQUIRE_FORMAT_ERROR(with("{'descr': '<f4', 'fortran_order': False}", data), "missing key 'shape'");
  REQUIRE_FORMAT_ERROR(with("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", data),
                       "unexpected key 'x'");
  REQUIRE_FORMAT_ERROR(with("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", data),
                       "'descr' appears twice");
  REQUIRE_FORMAT_ERROR(with("{'descr': '<f4', 'fortran_order': False, 'shape': (2,) junk", data), "malformed header");
  REQUIRE_FORMAT_ERROR(with("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", data),
                       "unexpected text after the header dict");
  REQUIRE_FORMAT_ERROR(with("{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", data), "malformed header");
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "0", "(2,)"), data), "'fortran_order' is not True or False");
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "False", "[2]"), data), "'shape' is not a tuple");
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "False", "(-2,)"), data), "non-negative integers, got '-2'");
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "False", "(2.5,)"), data), "'2.' is not an integer");
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "False", "('2',)"), data), "non-negative integers");
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "False", "(1048576, 1048576, 2)"), data), "implausibly large");
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "False", "(99999999999999999999,)"), data), "implausibly large");
  REQUIRE_FORMAT_ERROR(with("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}" + std::string(1, '\0'), data),
                       "NUL byte");
  // Layout and element types.
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "True", "(2,)"), data), "Fortran (column-major) order");
  REQUIRE_FORMAT_ERROR(with(header("'>f8'", "False", "(1,)"), std::string(8, '\0')),
                       "'>f8' is big-endian float64, which xgrad does not read; convert with a.astype('<f8')");
  REQUIRE_FORMAT_ERROR(with(header("'<i4'", "False", "(2,)"), std::string(8, '\0')), "dtype '<i4' (int32) is not supported");
  REQUIRE_FORMAT_ERROR(with(header("'<f2'", "False", "(2,)"), std::string(4, '\0')), "(float16) is not supported");
  REQUIRE_FORMAT_ERROR(with(header("'|b1'", "False", "(2,)"), std::string(2, '\0')), "(bool) is not supported");
  REQUIRE_FORMAT_ERROR(with(header("'|O'", "False", "(2,)"), data), "object: pickled Python objects");
  REQUIRE_FORMAT_ERROR(with(header("[('a', '<f4')]", "False", "(2,)"), data), "structured dtypes");
  // The literal parser's own errors.
  REQUIRE_FORMAT_ERROR(with("{'descr': " + std::string(20, '(') + "1" + std::string(20, ')') + "}", data), "nesting deeper than 16");
  REQUIRE_FORMAT_ERROR(with("{'descr': ", data), "the text ends where a value should start");
  REQUIRE_FORMAT_ERROR(with("{1: '<f4'}", data), "a dict key is not a string");
  REQUIRE_FORMAT_ERROR(with("{'descr' '<f4'}", data), "expected ':' after the key 'descr'");
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "False", "(2 3)"), data), "expected ',' or ')'");
  REQUIRE_FORMAT_ERROR(with("{'descr': '<\\f4', 'fortran_order': False, 'shape': (2,)}", data), "escapes and line breaks");
  REQUIRE_FORMAT_ERROR(with("{'descr': '<f4", data), "escapes and line breaks");  // runs into the final newline
  REQUIRE_FORMAT_ERROR(npy::parse(std::string("\x93NUMPY\x01\x00\x0e\x00", 10) + "{'descr': '<f4", "x"), "unterminated string");
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "False", "(-,)"), data), "a sign without digits");
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "Maybe", "(2,)"), data), "unexpected text 'Maybe");
  std::string dims33 = "(";
  for (int i = 0; i < 33; ++i) dims33 += "1, ";
  REQUIRE_FORMAT_ERROR(with(header("'<f4'", "False", dims33 + ")"), data), "shape has 33 dimensions (at most 32)");
  // Version 2.0/3.0 specifics.
  std::string big = npy_file(ok_dict, data, 2);
  const std::uint32_t huge = (1u << 20) + 1;
  std::memcpy(&big[8], &huge, 4);
  big.append(huge, ' ');
  REQUIRE_FORMAT_ERROR(npy::parse(big, "x"), "header length 1048577 exceeds 1 MiB");
  REQUIRE_FORMAT_ERROR(npy::parse(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x\xff': 1}", data, 3), "x"),
                       "a version 3.0 header must be UTF-8 text");
  // Data size.
  REQUIRE_FORMAT_ERROR(with(ok_dict, data.substr(0, 7)), "truncated: shape (2) of <f4 needs 8 data bytes, the file has 7");
  REQUIRE_FORMAT_ERROR(with(ok_dict, data + "x"), "1 trailing bytes after the 8 data bytes");
}

TEST_CASE("npy load/load_index check the element type and name the file", "[npy][errors]") {
  const auto dir = xgt::temp_dir("npy_kinds");
  const std::string f = (dir / "f.npy").string(), i = (dir / "i.npy").string();
  npy::save(f, Array::of({1.0, 2.0}));
  npy::save(i, IndexArray{1, 2});
  REQUIRE_FORMAT_ERROR(npy::load(i), "[npy] " + i + ": holds int64 data ('<i8'), which is not an Array; read it with load_index");
  REQUIRE_FORMAT_ERROR(npy::load_index(f), "holds float64 data, not int64 indices; read it with load");
  REQUIRE_FORMAT_ERROR(npy::load((dir / "missing.npy").string()), "missing.npy: cannot open the file");
  REQUIRE_FORMAT_ERROR(npy::load(dir.string()), "cannot read the file");  // a folder
  // A truncated file on disk (not only in memory).
  const std::string bytes = xgt::read_file(f);
  spit(f, bytes.substr(0, bytes.size() - 3));
  REQUIRE_FORMAT_ERROR(npy::load(f), "truncated: shape (2) of <f8 needs 16 data bytes, the file has 13");
  REQUIRE_THROWS_AS(npy::save((dir / "no" / "such" / "dir.npy").string(), Array::of({1.0})), FormatError);
  REQUIRE_THROWS_AS(npy::save(f, Array()), ValueError);
}

namespace {

// Offsets into a save_npz archive: the local header of the first member at 0, and the first
// central directory entry.
std::size_t central_of(const std::string& z) { return z.find(std::string("PK\x01\x02", 4)); }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

}  // namespace

TEST_CASE("npz save/load round-trips mixed arrays in order", "[npy]") {
  const auto dir = xgt::temp_dir("npz_round_trip");
  Generator g(3);
  npy::Npz z;
  z.add("weights", random_normal({3, 4}, g, DType::float32))
      .add("bias", Array::zeros({4}, DType::float64))
      .add("tokens", IndexArray({2, 2}, {5, 6, 7, 8}))
      .add("scalar", Array::scalar(2.5, DType::float64))
      .add("empty", Array::zeros({0, 3}, DType::float32))
      .add("naïve/μ", Array::of({1.0}));
  const std::string path = (dir / "a.npz").string();
  npy::save_npz(path, z);
  const npy::Npz back = npy::load_npz(path);
  REQUIRE(back.entries.size() == z.entries.size());
  for (std::size_t k = 0; k < z.entries.size(); ++k) REQUIRE(back.entries[k].first == z.entries[k].first);
  REQUIRE(same_bits(back.array("weights"), z.array("weights")));
  REQUIRE(same_bits(back.array("bias"), z.array("bias")));
  REQUIRE(back.index("tokens").data == std::vector<std::int64_t>{5, 6, 7, 8});
  REQUIRE(back.array("scalar").item() == 2.5);
  REQUIRE(back.array("empty").shape() == Shape{0, 3});
  REQUIRE(back.contains("naïve/μ"));
  // An empty archive is valid too.
  npy::save_npz(path, npy::Npz{});
  REQUIRE(npy::load_npz(path).entries.empty());
}

TEST_CASE("npz rejects damaged and unsupported archives with a FormatError", "[npy][errors]") {
  npy::Npz z;
  z.add("a", Array::of({1.0, 2.0})).add("b", IndexArray{3});
  const auto dir = xgt::temp_dir("npz_errors");
  const std::string path = (dir / "z.npz").string();
  npy::save_npz(path, z);
  const std::string good = xgt::read_file(path);
  REQUIRE_NOTHROW(npy::parse_npz(good));
  const std::size_t cd = central_of(good);
  auto patched = [&](std::size_t at, std::initializer_list<unsigned char> bytes) {
    std::string s = good;
    for (unsigned char b : bytes) s[at++] = static_cast<char>(b);
    return s;
  };
  REQUIRE_FORMAT_ERROR(npy::parse_npz("", "z"), "[npz] z: not a zip archive (.npz): 0 bytes");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(std::string(100, 'x'), "z"), "no end-of-central-directory record");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(npy::serialize(z.get("a")) + std::string(30, ' '), "z"),
                       "this is a .npy file, not an .npz archive");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(good.substr(0, good.size() - 1), "z"), "no end-of-central-directory record");
  REQUIRE_FORMAT_ERROR(npy::parse_npz("junk" + good, "z"), "does not end where the end record starts");
  // A flipped data byte: the CRC-32 no longer matches.
  std::string flipped = good;
  flipped[good.find("\x93NUMPY") + 130] ^= 1;  // in the data of 'a'
  REQUIRE_FORMAT_ERROR(npy::parse_npz(flipped, "z"), "member 'a.npy': CRC-32 is");
  // Method 12 (bzip2) in the local header and the central directory.
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(8, {12}).replace(cd + 10, 1, "\x0c"), "z"),
                       "member 'a.npy': uses compression method 12 (bzip2)");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(cd + 10, {14}), "z"), "compression method 14 (lzma)");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(cd + 10, {8}), "z"), "local header does not match the central directory");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(cd + 8, {1}), "z"), "is encrypted");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(cd + 42, {1}), "z"), "local header at offset 1 is missing or damaged");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(replace_all(good, "a.npy", "a.txt"), "z"), "member 'a.txt': is not a .npy member");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(replace_all(good, "b.npy", "a.npy"), "z"), "member 'a.npy': appears twice");
  // A member whose .npy content is bad (with a matching CRC) reports the member and the problem.
  std::string f2 = replace_all(good, "'<f8'", "'<f2'");
  const std::string member = npy::serialize(z.get("a"));
  const std::uint32_t crc = npy::crc32(f2.data() + 35, member.size());
  for (std::size_t at : {std::size_t(14), cd + 16})
    for (int k = 0; k < 4; ++k) f2[at + k] = static_cast<char>((crc >> (8 * k)) & 0xFF);
  REQUIRE_FORMAT_ERROR(npy::parse_npz(f2, "z"), "[npz] z: member 'a.npy': dtype '<f2' (float16) is not supported");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(replace_all(good, "'<f8'", "'<f2'"), "z"), "member 'a.npy': CRC-32");
  REQUIRE_FORMAT_ERROR(npy::load_npz((dir / "missing.npz").string()), "cannot open the file");
  // The end record and the central directory.
  const std::size_t end = good.size() - 22;
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(end + 4, {1}), "z"), "multi-disk (split) zip archives are not supported");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(end + 8, {1}), "z"), "multi-disk");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(end + 8, {0xE8, 0x03}).replace(end + 10, 2, "\xe8\x03"), "z"),
                       "declares 1000 members, more than fit");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(end + 8, {1}).replace(end + 10, 1, "\x01"), "z"),
                       "the central directory has bytes after its last entry");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(cd, {'X'}), "z"), "central directory entry 0 is damaged");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(cd + 28, {0xFF, 0x7F}), "z"), "runs past the directory");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(cd + 34, {1}), "z"), "lies on another disk");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(cd + 20, {154}).replace(cd + 24, 1, "\x9a"), "z"),
                       "member 'b.npy': overlaps member 'a.npy'");  // a's 144 data bytes claimed as 154
  REQUIRE_FORMAT_ERROR(npy::load_npz(dir.string()), "cannot read the file");  // a folder
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(cd + 24, {0x01, 0x01}), "z"), "is stored with 144 bytes but declares 257 uncompressed");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(cd + 20, {0xFF, 0xFF, 0xFF, 0x00}).replace(cd + 24, 4, std::string("\xff\xff\xff\x00", 4)), "z"),
                       "data bytes run past the central directory");
  REQUIRE_FORMAT_ERROR(npy::parse_npz(patched(8, {8}).replace(cd + 10, 1, "\x08").replace(cd + 24, 4, std::string("\xff\xff\xff\x7f", 4)), "z"),
                       "more than deflate can expand");
  // Lookups.
  const npy::Npz back = npy::parse_npz(good);
  REQUIRE_FORMAT_ERROR(back.get("c"), "no array named 'c' (the archive holds 'a', 'b')");
  REQUIRE_FORMAT_ERROR(back.array("b"), "holds int64 data: read it with index()");
  REQUIRE_FORMAT_ERROR(back.index("a"), "holds float64 data: read it with array()");
}

TEST_CASE("npz writing checks names and the zip limits", "[npy][errors]") {
  npy::Npz z;
  z.add("a", Array::of({1.0}));
  REQUIRE_THROWS_AS(z.add("a", Array::of({2.0})), ValueError);
  REQUIRE_THROWS_AS(z.add("", IndexArray{1}), ValueError);
  IndexArray ragged;
  ragged.shape = {3};
  ragged.data = {1};
  REQUIRE_THROWS_AS(z.add("i", ragged), ShapeError);
  const auto dir = xgt::temp_dir("npz_limits");
  npy::Npz many;
  for (std::size_t k = 0; k < 65536; ++k) many.entries.emplace_back("x" + std::to_string(k), z.get("a"));
  REQUIRE_FORMAT_ERROR(npy::save_npz((dir / "many.npz").string(), many), "65536 arrays: save_npz writes at most 65535");
  npy::Npz bad_name;
  bad_name.entries.emplace_back(std::string("a\xff", 2), z.get("a"));
  REQUIRE_THROWS_AS(npy::save_npz((dir / "bad.npz").string(), bad_name), ValueError);
}
