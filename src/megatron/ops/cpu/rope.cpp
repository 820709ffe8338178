// Rotary position embedding on the CPU. Frequencies and angles are float32, as Megatron computes
// them; cos and sin are then taken in the compute type. Backward is the same rotation by -angle.
#include "megatron/ops/rope.h"

#include <cmath>
#include <vector>

#include "megatron/ops/checks/fp8.h"
#include "megatron/ops/checks/rope.h"
#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/fp8.h"

namespace megatron::ops::cpu {
namespace {

// cos and sin of angle (position_offset + s) * inv_freq[j] (rope_inv_freq),
// as (S, rot_dim/2) tables.
template <class A>
void rotation_tables(std::vector<A>& cos_t, std::vector<A>& sin_t, int64_t S, int64_t rot_dim, const RopeParams& p) {
  const int64_t half = rot_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) inv_freq[size_t(j)] = rope_inv_freq(j, rot_dim, p);
  cos_t.resize(size_t(S * half));
  sin_t.resize(size_t(S * half));
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t j = 0; j < half; ++j) {
      const float angle = float(p.position_offset + s) * inv_freq[size_t(j)];
      cos_t[size_t(s * half + j)] = std::cos(A(angle));
      sin_t[size_t(s * half + j)] = std::sin(A(angle));
    }
  }
}

// Rotates each pair (x1, x2) by +angle (forward) or -angle (backward, the inverse rotation):
//   y1 = x1 cos - x2 sin,   y2 = x2 cos + x1 sin
// Pairs are (j, j + rot_dim/2), or (2j, 2j+1) when interleaved. Channels >= rot_dim are copied.
// Heads of D channels: position s holds `sets` sets of `stored` heads, of which the first `rotated`
// rotate: (S,B,H,D) is sets = B*H with one head each; the fused qkv is sets = B*G of r+2 heads, the
// r query heads and the key head rotated. One loop for both, so the fused op is split + rope +
// merge to the bit.
template <class T>
void rope_kernel(T* y, const T* x, int64_t S, int64_t sets, int64_t rotated, int64_t stored, int64_t D, int64_t rot_dim,
                 const RopeParams& p, bool inverse) {
  using A = compute_t<T>;
  std::vector<A> cos_t, sin_t;
  rotation_tables(cos_t, sin_t, S, rot_dim, p);
  const int64_t half = rot_dim / 2;
  const A sign = inverse ? A(-1) : A(1);
#pragma omp parallel for if (worth_parallel(S * sets * rotated * D))
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t head = 0; head < sets * rotated; ++head) {
      const int64_t offset = ((s * sets + head / rotated) * stored + head % rotated) * D;
      const T* xr = x + offset;
      T* yr = y + offset;
      for (int64_t j = 0; j < half; ++j) {
        const int64_t i1 = p.interleaved ? 2 * j : j;
        const int64_t i2 = p.interleaved ? 2 * j + 1 : j + half;
        const A c = cos_t[size_t(s * half + j)], sn = sign * sin_t[size_t(s * half + j)];
        const A x1 = load(xr[i1]), x2 = load(xr[i2]);
        yr[i1] = store<T>(x1 * c - x2 * sn);
        yr[i2] = store<T>(x2 * c + x1 * sn);
      }
      for (int64_t i = rot_dim; i < D; ++i) yr[i] = xr[i];
    }
  }
}

void rope_apply(Tensor& y, const Tensor& x, const RopeParams& p, bool inverse, const char* op, const char* y_name,
                const char* x_name) {
  const checks::RopeDims d = checks::check_rope(y, x, p, op, y_name, x_name, check_cpu);
  dispatch_floating(x.dtype(), op, [&]<class T>(std::type_identity<T>) {
    rope_kernel<T>(y.data<T>(), x.data<T>(), d.S, d.B * d.H, 1, 1, d.D, d.rot_dim, p, inverse);
  });
}

void rope_apply_qkv(Tensor& qkv, int64_t num_heads, const RopeParams& p, bool inverse, const char* op,
                    const char* qkv_name) {
  const checks::RopeQkvDims d = checks::check_rope_qkv(qkv, num_heads, p, op, qkv_name, check_cpu);
  dispatch_floating(qkv.dtype(), op, [&]<class T>(std::type_identity<T>) {
    rope_kernel<T>(qkv.data<T>(), qkv.data<T>(), d.S, d.B * d.G, d.r + 1, d.r + 2, d.D, d.rot_dim, p, inverse);
  });
}

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::rope_forward(Tensor& y, const Tensor& x, const RopeParams& params) {
  rope_apply(y, x, params, false, "rope_forward", "rope y", "rope x");
}

void cpu::rope_backward(Tensor& dx, const Tensor& dy, const RopeParams& params) {
  rope_apply(dx, dy, params, true, "rope_backward", "rope dx", "rope dy");
}

void cpu::rope_forward_qkv(Tensor& qkv, int64_t num_heads, const RopeParams& params) {
  rope_apply_qkv(qkv, num_heads, params, false, "rope_forward_qkv", "rope qkv");
}

void cpu::rope_backward_qkv(Tensor& dqkv, int64_t num_heads, const RopeParams& params) {
  rope_apply_qkv(dqkv, num_heads, params, true, "rope_backward_qkv", "rope dqkv");
}

// The reference composes the unfused ops: the contract's definition.
void cpu::rope_backward_qkv_fp8(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& dqkv, int64_t num_heads,
                                const RopeParams& params, const Tensor& scale) {
  const checks::RopeQkvDims d =
      checks::check_rope_qkv(dqkv, num_heads, params, "rope_backward_qkv_fp8", "rope dqkv", check_cpu);
  const int64_t rows = d.S * d.B;
  checks::check_fp8_casts(q, q_t, amax, scale, rows, d.G * (d.r + 2) * d.D, "rope_backward_qkv_fp8", check_cpu);
  Tensor rotated = dqkv.clone();
  cpu::rope_backward_qkv(rotated, num_heads, params);
  cpu::fp8_quantize_transpose(q, q_t, amax, rotated.view({rows, -1}), scale);
}

}  // namespace megatron::ops
