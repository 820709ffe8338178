// RoPE's frequencies, computed once for both backends (ops/rope.h).
#include "megatron/ops/rope.h"

#include <cmath>
#include <numbers>

namespace megatron::ops {

namespace {
// The base frequencies, with Llama-3.x's scaling where asked.
float scaled_inv_freq(int64_t j, int64_t rot_dim, const RopeParams& p) {
  const float inv_freq = 1.0f / std::pow(p.base, float(2 * j) / float(rot_dim));
  if (p.scaling_factor <= 0.0f) return inv_freq;
  // Llama-3.x's constants, fixed as in Megatron-Core (only the factor is a flag).
  constexpr float low_freq_factor = 1.0f, high_freq_factor = 4.0f, original_context = 8192.0f;
  const float wavelength = 2.0f * std::numbers::pi_v<float> / inv_freq;
  if (wavelength < original_context / high_freq_factor) return inv_freq;
  if (wavelength > original_context / low_freq_factor) return inv_freq / p.scaling_factor;
  const float smooth = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
  return (1.0f - smooth) * inv_freq / p.scaling_factor + smooth * inv_freq;
}
}  // namespace

float rope_inv_freq(int64_t j, int64_t rot_dim, const RopeParams& p) {
  return scaled_inv_freq(j, rot_dim, p) / p.seq_len_interpolation_factor;
}

}  // namespace megatron::ops
