#include <xgrad/core/error.hpp>

namespace xg {

std::string op_message(const std::string& op, const std::string& message) {
  return "[" + op + "] " + message;
}

}  // namespace xg
