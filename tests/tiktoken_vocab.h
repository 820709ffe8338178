#pragma once
// Small vocabularies in Megatron's TikTokenizer format (a JSON list of {rank, token_bytes,
// token_str}: the 256 single bytes in byte order, then `longer` in order), for the tokenizer's
// unit tests and the checkpoint tests.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace megatron::testing {

// Standard base64 with padding, as Python's b64encode writes token_bytes.
inline std::string base64(const std::string& bytes) {
  static const char* const kDigits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = uint32_t(static_cast<uint8_t>(bytes[i])) << 16;
    if (i + 1 < bytes.size()) n |= uint32_t(static_cast<uint8_t>(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) n |= uint32_t(static_cast<uint8_t>(bytes[i + 2]));
    out += kDigits[(n >> 18) & 63];
    out += kDigits[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kDigits[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kDigits[n & 63] : '=';
  }
  return out;
}

inline nlohmann::json tiktoken_vocabulary(const std::vector<std::string>& longer) {
  nlohmann::json list = nlohmann::json::array();
  for (int b = 0; b < 256; ++b)
    list.push_back({{"rank", b}, {"token_bytes", base64(std::string(1, char(b)))}, {"token_str", ""}});
  for (const std::string& t : longer) list.push_back({{"rank", list.size()}, {"token_bytes", base64(t)}, {"token_str", t}});
  return list;
}

}  // namespace megatron::testing
