/// \file
/// Numbers in text files (checkpoint metadata, log.csv, config.json): checked parsing, and
/// formatting that reads back to the same double.
#pragma once

#include <cstdint>
#include <string>

namespace xg::io {

/// Checked conversion of text read from a file to a signed integer: the whole text must be the
/// number (digits, optionally after '-'), in range; otherwise FormatError "<where>: '<text>' is
/// not an integer" (or "is out of range").
std::int64_t parse_int(const std::string& text, const std::string& where);
/// The same for a non-negative integer (digits only).
std::uint64_t parse_uint(const std::string& text, const std::string& where);
/// The same for a finite floating-point number (FormatError for inf and nan too).
double parse_double(const std::string& text, const std::string& where);

/// `v` with 17 significant digits: text that reads back to exactly `v` ("%.17g").
std::string exact_text(double v);
/// The shortest text that reads back to exactly `v` (0.0030000000000000001 -> "0.003").
std::string shortest_text(double v);

}  // namespace xg::io
