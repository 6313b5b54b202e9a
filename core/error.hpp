// Error types. Every message starts with the op in brackets and names the argument and the
// shapes or values involved, e.g. "[matmul] inner dimensions differ: a has shape (2, 3), ...".
#pragma once

#include <stdexcept>
#include <string>

namespace xg {

// Base of every error xgrad throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ShapeError : public Error { using Error::Error; };      // incompatible shapes
class DTypeError : public Error { using Error::Error; };      // float32 vs float64 mix
class AxisError : public Error { using Error::Error; };       // axis out of range / repeated
class ValueError : public Error { using Error::Error; };      // bad scalar argument or data
class TapeError : public Error { using Error::Error; };       // backward misuse, stale tensors
class AnomalyError : public Error { using Error::Error; };    // anomaly mode: non-finite value
class VisibilityError : public Error { using Error::Error; }; // attention: illegal allowed set
class InternalError : public Error { using Error::Error; };   // an op broke the VJP contract
class FormatError : public Error { using Error::Error; };     // a malformed file (checkpoints)
class UsageError : public ValueError { using ValueError::ValueError; };  // a bad command-line flag: exit 2

// "[op] message"
std::string op_message(const std::string& op, const std::string& message);

}  // namespace xg
