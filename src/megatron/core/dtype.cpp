#include "megatron/core/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

template <int E>
float fp8<E>::max() {
  // e4m3 gives up its top mantissa code to NaN (1.75 * 2^8 = 448); e5m2 keeps IEEE's infinities
  // (1.75 * 2^15 = 57344).
  return E == 4 ? 448.0f : 57344.0f;
}

// Round to nearest even on the grid of the value's binade, with the smallest normal binade's
// spacing below it (subnormals): a / quantum is exact in float, std::nearbyint rounds it under
// the default ties-to-even mode.
template <int E>
uint8_t fp8<E>::from_float(float f) {
  const uint8_t sign = (std::bit_cast<uint32_t>(f) >> 24) & 0x80u;
  if (std::isnan(f)) return uint8_t(sign | 0x7fu);
  const float a = std::fabs(f);
  const uint8_t max_bits = E == 4 ? 0x7eu : 0x7bu;  // S.1111.110 and S.11110.11
  if (a >= max()) return uint8_t(sign | max_bits);  // saturate (infinity included)
  constexpr int kMinExponent = 1 - kBias;           // of the smallest normal binade
  int exponent = 0;
  std::frexp(a, &exponent);  // a = m * 2^exponent, m in [0.5, 1): a's binade is 2^(exponent - 1)
  const int binade = std::max(exponent - 1, kMinExponent);
  const float quantum = std::ldexp(1.0f, binade - kMantissaBits);
  const float r = std::nearbyint(a / quantum) * quantum;  // at most max(): larger values saturated above
  if (r == 0.0f) return sign;
  std::frexp(r, &exponent);  // rounding may carry into the next binade
  const int e = exponent - 1;
  if (e < kMinExponent) return uint8_t(sign | uint32_t(r / std::ldexp(1.0f, kMinExponent - kMantissaBits)));
  const uint32_t mantissa = uint32_t(r / std::ldexp(1.0f, e - kMantissaBits)) - (1u << kMantissaBits);
  return uint8_t(sign | uint32_t(e + kBias) << kMantissaBits | mantissa);
}

template <int E>
float fp8<E>::to_float(uint8_t bits) {
  const bool negative = (bits & 0x80u) != 0;
  const uint32_t exponent = (bits >> kMantissaBits) & ((1u << E) - 1u);
  const uint32_t mantissa = bits & ((1u << kMantissaBits) - 1u);
  float v = 0.0f;
  if (E == 4 && exponent == 15u && mantissa == 7u) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (E == 5 && exponent == 31u) {
    v = mantissa == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    v = std::ldexp(float(mantissa), 1 - kBias - kMantissaBits);
  } else {
    v = std::ldexp(float(mantissa | (1u << kMantissaBits)), int(exponent) - kBias - kMantissaBits);
  }
  return negative ? -v : v;
}

template struct fp8<4>;
template struct fp8<5>;

float fp8_max(DType dtype) {
  if (dtype == DType::e4m3) return fp8_e4m3::max();
  MEGATRON_CHECK(dtype == DType::e5m2, "fp8_max: " << dtype_name(dtype) << " is not an FP8 dtype (e4m3 or e5m2)");
  return fp8_e5m2::max();
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
