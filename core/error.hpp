/// \file
/// Error types. Every message starts with the op in brackets and names the argument and the
/// shapes or values involved, e.g. "[matmul] inner dimensions differ: a has shape (2, 3), ...".
#pragma once

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

}  // namespace xg
