/// \file
/// Error types. Every message starts with the op in brackets and names the argument and the
/// shapes or values involved, e.g. "[matmul] inner dimensions differ: a has shape (2, 3), ...".
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace xg {

/// Base of every error xgrad throws on purpose. Catch it to handle any of them; what()
/// is the message, starting with the op in brackets.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Incompatible shapes (broadcasting, matmul dimensions, a wrong rank or size).
class ShapeError : public Error { using Error::Error; };
/// A float32 and a float64 operand mixed, or typed access with the wrong element type.
class DTypeError : public Error { using Error::Error; };
/// An axis out of range, or the same axis named twice.
class AxisError : public Error { using Error::Error; };
/// A bad scalar argument or bad data (0/0, the log of a negative number, an index out of range).
class ValueError : public Error { using Error::Error; };
/// Misuse of the tape: backward on a consumed tape, a stale tensor, a tensor from another tape.
class TapeError : public Error { using Error::Error; };
/// Anomaly mode (set_anomaly_mode): a recorded output or a cotangent is not finite.
class AnomalyError : public Error { using Error::Error; };
/// Attention: an illegal allowed set, e.g.\ a valid query that may see no key.
class VisibilityError : public Error { using Error::Error; };
/// An op broke the VJP contract (a cotangent of the wrong count, shape or dtype).
class InternalError : public Error { using Error::Error; };
/// A malformed file (safetensors checkpoints, JSON).
class FormatError : public Error { using Error::Error; };
/// A bad command-line flag; the xgrad program exits with status 2 on it.
class UsageError : public ValueError { using ValueError::ValueError; };

/// The message "[op] message": how every xgrad error starts with the op's name `op`.
std::string op_message(const std::string& op, const std::string& message);

/// The longest value an error message shows whole, in bytes (docs/reliability.md).
constexpr std::size_t kShownBytes = 80;
/// A value (a file's text, a token, a config value or key) as an error message shows it: every
/// byte outside printable ASCII (NUL, newlines, other control bytes, bytes >= 0x80) as `\xNN`,
/// and a value longer than `max` bytes cut to its first `max` bytes followed by
/// `... (N bytes)`, N the whole value's size. Every message that quotes input goes through
/// it, so no message is longer than its own text plus a few times `max`.
std::string shown_value(const std::string& value, std::size_t max = kShownBytes);
/// `v` as the shortest decimal text that reads back (strtod) to exactly `v`: `0.1`, not
/// `0.10000000000000001`; `inf`, `-inf`, `nan` for those. How messages, config.json and the
/// run line print a real number the user gave.
std::string number_text(double v);

}  // namespace xg
