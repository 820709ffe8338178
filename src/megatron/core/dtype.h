#pragma once
// Element types. Storage dtype is a runtime property of a Tensor; kernels are templates
// instantiated for the dtypes they support and chosen by a runtime switch.
//
// f64 exists for the CPU reference only: gradient checks run whole ops and models in double
// against finite differences. bf16/f16 are storage formats; arithmetic is done in float.
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>

namespace megatron {

enum class DType : uint8_t { f32, f64, bf16, f16, e4m3, e5m2, i32, i64, u16, u8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
DType dtype_from_name(const std::string& name);  // throws on unknown names
bool dtype_is_floating(DType dtype);
inline bool dtype_is_fp8(DType dtype) { return dtype == DType::e4m3 || dtype == DType::e5m2; }

// bfloat16: the top 16 bits of an IEEE float. Conversion rounds to nearest even; NaN stays NaN.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(round_from_float(f)) {}
  explicit operator float() const { return std::bit_cast<float>(uint32_t(bits) << 16); }
  static uint16_t round_from_float(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
};

// IEEE binary16, converted in software (no hardware half type on the CPU side).
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }
  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

// The two FP8 formats of Hopper's tensor cores (OCP FP8): e4m3 (bias 7, no infinities, max 448,
// NaN = S.1111.111) and e5m2 (bias 15, IEEE-like, max 57344). Conversion from float rounds to
// nearest even on the format's grid (subnormals included) and saturates: a finite value or an
// infinity beyond the max becomes +-max, NaN becomes NaN (S.1111.111 in both). That is the
// hardware's cvt.rn.satfinite, which the CUDA cast kernels use, so the two backends agree bit for
// bit.
template <int kExponentBits>
struct fp8 {
  static constexpr int kMantissaBits = 7 - kExponentBits;
  static constexpr int kBias = (1 << (kExponentBits - 1)) - 1;
  uint8_t bits = 0;
  fp8() = default;
  explicit fp8(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }
  static float max();  // 448 (e4m3) or 57344 (e5m2)
  static uint8_t from_float(float f);
  static float to_float(uint8_t bits);
};
using fp8_e4m3 = fp8<4>;
using fp8_e5m2 = fp8<5>;

// The largest finite value of an FP8 dtype (e4m3 or e5m2).
float fp8_max(DType dtype);

// Round a float through a storage type and back: how mixed precision is emulated on the CPU.
inline float round_to_bf16(float f) { return float(bf16(f)); }

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<fp8_e4m3>() {
  return DType::e4m3;
}
template <>
constexpr DType dtype_of<fp8_e5m2>() {
  return DType::e5m2;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint16_t>() {
  return DType::u16;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}

// Arithmetic type used for a storage type: float for the 16-bit formats, itself otherwise.
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<bf16> {
  using type = float;
};
template <>
struct compute_type<f16> {
  using type = float;
};
template <int E>
struct compute_type<fp8<E>> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

template <class T>
inline compute_t<T> load(const T& x) {
  return compute_t<T>(x);
}
template <class T>
inline T store(compute_t<T> x) {
  return T(x);
}

}  // namespace megatron
