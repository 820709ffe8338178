// The FP8 quantiser and the recipes' scale update on the CPU: the reference the CUDA kernels are
// held to bit for bit. Rounding is core/dtype.h's (nearest even on the FP8 grid, saturating).
#include "megatron/ops/checks/fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/fp8.h"

namespace megatron::ops::cpu {
namespace {

void check_cpu_floating(const Tensor& t, const char* name) {
  dispatch_floating(t.dtype(), name, []<class T>(std::type_identity<T>) {});
}

// max |x| with NaN above everything: the order of the magnitudes' bit patterns, which is the
// order of the values for non-negative floats and puts NaN (exponent all ones, mantissa non-zero)
// above infinity. The CUDA kernels reduce the same bit patterns with atomicMax.
uint32_t magnitude_bits(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }

template <class T>
uint32_t amax_bits(const T* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, magnitude_bits(float(load(x[i]))));
  return m;
}

void accumulate_amax(Tensor& amax, uint32_t bits) {
  float& a = amax.data<float>()[0];
  a = std::bit_cast<float>(std::max(magnitude_bits(a), bits));
}

// fn(std::type_identity<Q>) with Q the host type of an FP8 dtype (e4m3 or e5m2, as checked).
template <class Fn>
void dispatch_fp8(DType dtype, Fn&& fn) {
  if (dtype == DType::e4m3)
    fn(std::type_identity<fp8_e4m3>{});
  else
    fn(std::type_identity<fp8_e5m2>{});
}

template <class Q, class T>
void quantize(Q* q, const T* x, int64_t n, float scale) {
#pragma omp parallel for if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) q[i] = Q(float(load(x[i])) * scale);  // one f32 product, then the rounding
}

// q_t (cols, rows) = the cast of x (rows, cols), transposed.
template <class Q, class T>
void quantize_transposed(Q* q_t, const T* x, int64_t rows, int64_t cols, float scale) {
#pragma omp parallel for if (worth_parallel(rows * cols))
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) q_t[c * rows + r] = Q(float(load(x[r * cols + c])) * scale);
}

// A block's scale from its amax: Transformer Engine's compute_scale_from_amax with power_2_scale
// on and amax_epsilon 0 (ops/fp8.h). The CUDA kernel computes the same f32 operations.
float block_scale(float amax, float fp8_max) {
  if (std::isinf(amax) || std::isnan(amax) || amax == 0.0f) return 1.0f;
  float scale = fp8_max / amax;
  if (std::isinf(scale)) scale = std::numeric_limits<float>::max();
  return std::bit_cast<float>(std::bit_cast<uint32_t>(scale) & 0xFF800000u);  // sign and exponent: a power of 2
}

// q (R, C) = x's elements (r, c) at x[r * row_stride + c * col_stride], cast block by block, and
// the blocks' scale_invs in fp8_block_scale_shape(R, C, blocks)'s layout (padding 0).
template <class Q, class T>
void quantize_blocks(Q* q, float* scale_inv, const T* x, int64_t R, int64_t C, int64_t row_stride, int64_t col_stride,
                     Fp8BlockShape blocks, float fp8_max_value) {
  const int64_t block_rows = blocks == Fp8BlockShape::tile_1x128 ? 1 : kFp8BlockSize;
  const Shape scale_shape = fp8_block_scale_shape(R, C, blocks);
  std::fill(scale_inv, scale_inv + shape_numel(scale_shape), 0.0f);
  const int64_t row_blocks = (R + block_rows - 1) / block_rows, col_blocks = (C + kFp8BlockSize - 1) / kFp8BlockSize;
#pragma omp parallel for if (worth_parallel(R * C))
  for (int64_t block = 0; block < row_blocks * col_blocks; ++block) {
    const int64_t rb = block / col_blocks, cb = block % col_blocks;
    const int64_t r0 = rb * block_rows, r1 = std::min(R, r0 + block_rows);
    const int64_t c0 = cb * kFp8BlockSize, c1 = std::min(C, c0 + kFp8BlockSize);
    uint32_t amax = 0;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c)
        amax = std::max(amax, magnitude_bits(float(load(x[r * row_stride + c * col_stride]))));
    const float scale = block_scale(std::bit_cast<float>(amax), fp8_max_value);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) q[r * C + c] = Q(float(load(x[r * row_stride + c * col_stride])) * scale);
    scale_inv[blocks == Fp8BlockShape::tile_1x128 ? cb * scale_shape[1] + r0 : rb * scale_shape[1] + cb] = 1.0f / scale;
  }
}

template <class T>
void quantize_blocks_into(Tensor& q, Tensor& scale_inv, const T* x, int64_t R, int64_t C, int64_t row_stride,
                          int64_t col_stride, Fp8BlockShape blocks) {
  const float max_value = fp8_max(q.dtype());
  dispatch_fp8(q.dtype(), [&]<class Q>(std::type_identity<Q>) {
    quantize_blocks(q.data<Q>(), scale_inv.data<float>(), x, R, C, row_stride, col_stride, blocks, max_value);
  });
}

}  // namespace

}  // namespace megatron::ops::cpu

namespace megatron::ops {

void cpu::fp8_amax(Tensor& amax, const Tensor& x) {
  checks::check_fp8_amax(amax, x, check_cpu, check_cpu_floating);
  dispatch_floating(x.dtype(), "fp8_amax",
                    [&]<class T>(std::type_identity<T>) { accumulate_amax(amax, amax_bits(x.data<T>(), x.numel())); });
}

void cpu::fp8_quantize(Tensor& q, Tensor& amax, const Tensor& x, const Tensor& scale) {
  checks::check_fp8_quantize(q, amax, x, scale, check_cpu, check_cpu_floating);
  const float s = scale.data<float>()[0];
  dispatch_floating(x.dtype(), "fp8_quantize", [&]<class T>(std::type_identity<T>) {
    dispatch_fp8(q.dtype(), [&]<class Q>(std::type_identity<Q>) { quantize(q.data<Q>(), x.data<T>(), x.numel(), s); });
    if (amax.defined()) accumulate_amax(amax, amax_bits(x.data<T>(), x.numel()));
  });
}

void cpu::fp8_quantize_transpose(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& scale) {
  checks::check_fp8_quantize_transpose(q, q_t, amax, x, scale, check_cpu, check_cpu_floating);
  if (q.defined()) cpu::fp8_quantize(q, amax, x, scale);
  const float s = scale.data<float>()[0];
  const int64_t rows = x.dim(0), cols = x.dim(1);
  dispatch_floating(x.dtype(), "fp8_quantize_transpose", [&]<class T>(std::type_identity<T>) {
    dispatch_fp8(q_t.dtype(), [&]<class Q>(std::type_identity<Q>) {
      quantize_transposed(q_t.data<Q>(), x.data<T>(), rows, cols, s);
    });
    if (amax.defined() && !q.defined()) accumulate_amax(amax, amax_bits(x.data<T>(), x.numel()));
  });
}

void cpu::fp8_quantize_blockwise(Tensor& q, Tensor& q_scale_inv, Tensor& q_t, Tensor& q_t_scale_inv, const Tensor& x,
                                 Fp8BlockShape blocks) {
  checks::check_fp8_quantize_blockwise(q, q_scale_inv, q_t, q_t_scale_inv, x, blocks, check_cpu, check_cpu_floating);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  dispatch_floating(x.dtype(), "fp8_quantize_blockwise", [&]<class T>(std::type_identity<T>) {
    if (q.defined()) quantize_blocks_into(q, q_scale_inv, x.data<T>(), rows, cols, cols, 1, blocks);
    // x^T: its row c is x's column c, its blocks run along x's rows.
    if (q_t.defined()) quantize_blocks_into(q_t, q_t_scale_inv, x.data<T>(), cols, rows, 1, cols, blocks);
  });
}

void cpu::fp8_update_scale(Tensor& scale, Tensor& scale_inv, Tensor& amax_history, DType fp8_dtype,
                           const Fp8Recipe& recipe) {
  checks::check_fp8_update_scale(scale, scale_inv, amax_history, fp8_dtype, recipe, check_cpu);
  float* history = amax_history.data<float>();
  const int64_t len = amax_history.numel();
  float amax = history[0];
  if (recipe.amax_compute_algo == AmaxComputeAlgo::max)
    for (int64_t i = 1; i < len; ++i)
      amax = std::bit_cast<float>(std::max(magnitude_bits(amax), magnitude_bits(history[i])));
  float& s = scale.data<float>()[0];
  // TE: sf = (fp8_max / amax) / 2^margin in f32, kept only where amax is finite and positive.
  if (std::isfinite(amax) && amax > 0.0f) s = (fp8_max(fp8_dtype) / amax) / std::ldexp(1.0f, int(recipe.margin));
  scale_inv.data<float>()[0] = 1.0f / s;
  // TE's roll by -1 (history[i] = history[i + 1], the first to the end), then history[0] = 0.
  const float first = history[0];
  for (int64_t i = 0; i + 1 < len; ++i) history[i] = history[i + 1];
  history[len - 1] = first;
  history[0] = 0.0f;
}

void cpu::fp8_update_scales(std::vector<Tensor>& scales, std::vector<Tensor>& scale_invs,
                            std::vector<Tensor>& amax_histories, const std::vector<DType>& fp8_dtypes,
                            const Fp8Recipe& recipe) {
  checks::check_fp8_update_scales(scales, scale_invs, amax_histories, fp8_dtypes, recipe, check_cpu);
  for (size_t i = 0; i < scales.size(); ++i)
    cpu::fp8_update_scale(scales[i], scale_invs[i], amax_histories[i], fp8_dtypes[i], recipe);
}

}  // namespace megatron::ops
