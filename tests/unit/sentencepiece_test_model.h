#pragma once
// A small SentencePiece BPE model written byte by byte in the ModelProto format (interop-formats.md
// 5.6), so the expected ids follow by hand from SentencePiece's BPE rule: merge the adjacent pair
// whose joined piece has the highest score. Shared by the tokenizer and checkpoint tests.
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace megatron::testing::sentencepiece_proto {

// Protocol buffer wire format: varints, length-delimited fields, 32-bit floats.
inline std::string varint(uint64_t v) {
  std::string s;
  do {
    s += char((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
    v >>= 7;
  } while (v != 0);
  return s;
}
inline std::string tag(int field, int wire) { return varint(uint64_t(field) << 3 | uint64_t(wire)); }
inline std::string bytes_field(int field, const std::string& b) { return tag(field, 2) + varint(b.size()) + b; }
inline std::string int_field(int field, int64_t v) { return tag(field, 0) + varint(uint64_t(v)); }
inline std::string float_field(int field, float v) {
  char b[4];
  std::memcpy(b, &v, 4);
  return tag(field, 5) + std::string(b, 4);
}

inline const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Types: 1 NORMAL, 2 UNKNOWN, 3 CONTROL. Ids are the list order.
inline std::string sentencepiece_model_proto() {
  const std::vector<std::tuple<std::string, float, int>> pieces = {
      {"<unk>", 0, 2}, {"<s>", 0, 3},         {"</s>", 0, 3}, {kSpace, -1, 1},
      {"h", -2, 1},    {"e", -3, 1},          {"l", -4, 1},   {"o", -5, 1},
      {"w", -6, 1},    {"r", -7, 1},          {"d", -8, 1},   {"ll", 10, 1},
      {"he", 9, 1},    {kSpace + "he", 8, 1}, {"llo", 7, 1},  {kSpace + "hello", 6, 1},
      {"wo", 5, 1},    {kSpace + "wo", 4, 1},
  };
  std::string proto;
  for (const auto& [piece, score, type] : pieces) {
    proto += bytes_field(1, bytes_field(1, piece) + float_field(2, score) + int_field(3, type));
  }
  // trainer_spec: model_type BPE, vocab_size, unk/bos/eos/pad ids (pad -1: none).
  proto += bytes_field(2, int_field(3, 2) + int_field(4, int64_t(pieces.size())) + int_field(40, 0) + int_field(41, 1) +
                              int_field(42, 2) + int_field(43, -1));
  // normalizer_spec: identity, dummy prefix, spaces kept and escaped.
  proto += bytes_field(3, bytes_field(1, "identity") + int_field(3, 1) + int_field(4, 0) + int_field(5, 1));
  return proto;
}

}  // namespace megatron::testing::sentencepiece_proto

namespace megatron::testing {
using sentencepiece_proto::sentencepiece_model_proto;
}  // namespace megatron::testing
