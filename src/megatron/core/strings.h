#pragma once
// Small string helpers shared across the library.
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace megatron {

// Streams every part into one string: concat("--hidden-size ", 30, " is odd").
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// The items with `separator` between them: join({"a", "b"}, ", ") == "a, b".
inline std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

}  // namespace megatron
