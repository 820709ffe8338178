#pragma once
// Small string helpers shared across the library.
#include <sstream>
#include <string>

namespace megatron {

// Streams every part into one string: concat("--hidden-size ", 30, " is odd").
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

}  // namespace megatron
