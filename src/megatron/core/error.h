#pragma once
// One exception type for the whole library. Messages name the value, the rule and the fix.
#include <sstream>
#include <stdexcept>
#include <string>

namespace megatron {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace megatron

// MEGATRON_CHECK(cond, "value " << v << " must be ...; fix: ...");
#define MEGATRON_CHECK(cond, msg_stream)                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::ostringstream megatron_check_os_;                                 \
      megatron_check_os_ << msg_stream;                                      \
      ::megatron::throw_error(__FILE__, __LINE__, megatron_check_os_.str()); \
    }                                                                        \
  } while (0)

#define MEGATRON_FAIL(msg_stream) MEGATRON_CHECK(false, msg_stream)
