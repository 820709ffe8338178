#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/checkpointing/crc32c.h"

using megatron::checkpointing::crc32c;

namespace {

uint32_t crc_of(const std::string& s) { return crc32c(s.data(), s.size()); }

// Independent oracle: the textbook one-bit-at-a-time CRC-32C, no tables.
uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

}  // namespace

TEST(Crc32c, KnownAnswers) {
  // reference/interop-formats.md section 7.1.
  EXPECT_EQ(crc_of(""), 0x00000000u);
  EXPECT_EQ(crc_of("a"), 0xC1D04330u);
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);
  EXPECT_EQ(crc_of("hello world"), 0xC99465AAu);
  const unsigned char length_prefix[8] = {0x18, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(crc32c(length_prefix, 8), 0x4A65BFE4u);
}

TEST(Crc32c, MatchesBitwiseOracleForEveryLengthAndAlignment) {
  // Covers the 8-byte fast path, the byte tail and unaligned starts.
  std::vector<unsigned char> bytes(80);
  uint32_t x = 12345;
  for (auto& b : bytes) b = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 24);
  for (size_t offset = 0; offset < 8; ++offset)
    for (size_t n = 0; n + offset <= 72; ++n)
      ASSERT_EQ(crc32c(bytes.data() + offset, n), crc32c_bitwise(bytes.data() + offset, n))
          << "offset " << offset << " length " << n;
}

TEST(Crc32c, StreamingContinuesAPreviousValue) {
  const std::string text = "The quick brown fox jumps over the lazy dog.";
  const uint32_t whole = crc_of(text);
  for (size_t split = 0; split <= text.size(); ++split) {
    const uint32_t first = crc32c(text.data(), split);
    ASSERT_EQ(crc32c(text.data() + split, text.size() - split, first), whole) << "split at " << split;
  }
}
