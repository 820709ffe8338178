#include "megatron/checkpointing/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

namespace megatron::checkpointing {

namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, bit-reversed

// Slice-by-8: table[k][b] is the CRC register after byte b followed by k zero bytes, so eight
// input bytes are folded with eight independent lookups instead of eight dependent ones.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    t[0][b] = crc;
  }
  for (size_t k = 1; k < 8; ++k)
    for (size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  return t;
}

constexpr Tables kTables = make_tables();

// The 8-byte step reads words in host order and relies on the low byte coming first.
static_assert(std::endian::native == std::endian::little, "crc32c slice-by-8 assumes a little-endian host");

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t r = ~crc;
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // unaligned-safe load
    word ^= r;
    r = kTables[7][word & 0xffu] ^ kTables[6][(word >> 8) & 0xffu] ^ kTables[5][(word >> 16) & 0xffu] ^
        kTables[4][(word >> 24) & 0xffu] ^ kTables[3][(word >> 32) & 0xffu] ^ kTables[2][(word >> 40) & 0xffu] ^
        kTables[1][(word >> 48) & 0xffu] ^ kTables[0][word >> 56];
  }
  for (; size > 0; --size, ++p) r = kTables[0][(r ^ *p) & 0xffu] ^ (r >> 8);
  return ~r;
}

}  // namespace megatron::checkpointing
