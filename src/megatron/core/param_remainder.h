#pragma once
// An f32 master weight stored as its bf16 parameter and a 16-bit remainder (Megatron's
// --use-precision-aware-optimizer with store_param_remainders, Transformer Engine's FusedAdam
// scheme): the bf16 parameter is the master's top 16 bits, rounded up (in magnitude) when the
// low 16 bits are 0x8000 or more; the remainder is the low 16 bits read as a signed number, so its
// sign tells whether the top was rounded up. The pair gives back the f32 bits exactly, and the
// bf16 parameter equals round-to-nearest-even of the master except at exact ties (low bits
// 0x8000), which round away from zero here: the masters, 4 bytes an element, cost 2.
#include <bit>
#include <cstdint>

#include "megatron/core/host_device.h"

namespace megatron {

struct SplitMaster {
  uint16_t param;      // bf16 bits
  uint16_t remainder;  // the master's low 16 bits (an int16: negative when param was rounded up)
};

MEGATRON_HD SplitMaster split_master(uint32_t master_bits) {
  const uint16_t low = uint16_t(master_bits & 0xffffu);
  const uint16_t top = uint16_t(master_bits >> 16);
  return {uint16_t(top + (low >= 0x8000u ? 1u : 0u)), low};
}

MEGATRON_HD uint32_t join_master(uint16_t param, uint16_t remainder) {
  const uint16_t top = uint16_t(param - (remainder >= 0x8000u ? 1u : 0u));
  return (uint32_t(top) << 16) | remainder;
}

inline SplitMaster split_master(float master) { return split_master(std::bit_cast<uint32_t>(master)); }
inline float join_master_value(uint16_t param, uint16_t remainder) {
  return std::bit_cast<float>(join_master(param, remainder));
}

}  // namespace megatron
