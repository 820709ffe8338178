#pragma once
// CRC-32C (Castagnoli): the checksum of checkpoint files. Reflected polynomial 0x82F63B78,
// initial value and final xor 0xFFFFFFFF, so crc32c("123456789") == 0xE3069283.
#include <cstddef>
#include <cstdint>

namespace megatron::checkpointing {

// Checksum of `size` bytes. Pass a previous result as `crc` to continue it:
// crc32c(b, nb, crc32c(a, na)) == crc32c of a followed by b.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace megatron::checkpointing
