#include "megatron/core/dtype.h"

#include "megatron/core/error.h"

namespace megatron {

namespace {
struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
  bool floating;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::f32, "f32", 4, true},  {DType::f64, "f64", 8, true},   {DType::bf16, "bf16", 2, true},
    {DType::f16, "f16", 2, true},  {DType::e4m3, "e4m3", 1, true}, {DType::e5m2, "e5m2", 1, true},
    {DType::i32, "i32", 4, false}, {DType::i64, "i64", 8, false},  {DType::u16, "u16", 2, false},
    {DType::u8, "u8", 1, false},
};
const DTypeInfo& info(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d;
  MEGATRON_FAIL("unknown dtype code " << int(dtype));
}
}  // namespace

size_t dtype_size(DType dtype) { return info(dtype).size; }
const char* dtype_name(DType dtype) { return info(dtype).name; }
bool dtype_is_floating(DType dtype) { return info(dtype).floating; }

DType dtype_from_name(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.dtype;
  MEGATRON_FAIL("unknown dtype '" << name << "'; expected one of f32, f64, bf16, f16, e4m3, e5m2, i32, i64, u16, u8");
}

uint16_t f16::from_float(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);          // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);         // overflow (incl. rounding up) -> inf
  if (abs < 0x38800000u) {                                         // subnormal or zero in half: value = m * 2^-24
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;  // exact multiply by 2^24
    // nearbyint with ties-to-even under the default rounding mode
    const float r = scaled + 12582912.0f - 12582912.0f;
    return uint16_t(sign | uint32_t(r));
  }
  uint32_t mant = abs + 0xc8000fffu + ((abs >> 13) & 1u);  // rebias exponent (-112 << 23) and round
  return uint16_t(sign | (mant >> 13));
}

float f16::to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = float(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

}  // namespace megatron
