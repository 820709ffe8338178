#include "megatron/core/error.h"

#include <cstring>

namespace megatron {

void throw_error(const char* file, int line, const std::string& message) {
  // Keep only the path below src/ so messages stay short and build-location independent.
  const char* short_file = std::strstr(file, "megatron/");
  std::ostringstream os;
  os << message << " [" << (short_file ? short_file : file) << ":" << line << "]";
  throw Error(os.str());
}

}  // namespace megatron
