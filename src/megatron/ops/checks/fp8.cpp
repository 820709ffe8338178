#include "megatron/ops/checks/fp8.h"

#include <string>
#include <utility>

namespace megatron::ops::checks {
namespace {

void check_scalar_f32(const Tensor& t, const char* name, TensorCheck device) {
  check_numel(t, 1, name);
  device(t, name);
  check_dtype(t, DType::f32, name);
}

}  // namespace

void check_fp8_amax(const Tensor& amax, const Tensor& x, TensorCheck device, TensorCheck x_dtype) {
  check_scalar_f32(amax, "fp8 amax", device);
  check_defined(x, "fp8 x");
  device(x, "fp8 x");
  x_dtype(x, "fp8 x");
}

void check_fp8_quantize(const Tensor& q, const Tensor& amax, const Tensor& x, const Tensor& scale, TensorCheck device,
                        TensorCheck x_dtype) {
  if (amax.defined()) check_scalar_f32(amax, "fp8_quantize amax", device);
  check_scalar_f32(scale, "fp8_quantize scale", device);
  check_defined(x, "fp8_quantize x");
  device(x, "fp8_quantize x");
  x_dtype(x, "fp8_quantize x");
  check_defined(q, "fp8_quantize q");
  device(q, "fp8_quantize q");
  MEGATRON_CHECK(dtype_is_fp8(q.dtype()),
                 "fp8_quantize q has dtype " << dtype_name(q.dtype()) << "; expected e4m3 or e5m2");
  check_shape(q, x.shape(), "fp8_quantize q");
}

void check_fp8_casts(const Tensor& q, const Tensor& q_t, const Tensor& amax, const Tensor& scale, int64_t rows,
                     int64_t cols, const char* op, TensorCheck device) {
  const std::string name = op;
  if (amax.defined()) check_scalar_f32(amax, (name + " amax").c_str(), device);
  check_scalar_f32(scale, (name + " scale").c_str(), device);
  check_defined(q_t, (name + " q_t").c_str());
  device(q_t, (name + " q_t").c_str());
  MEGATRON_CHECK(dtype_is_fp8(q_t.dtype()),
                 op << " q_t has dtype " << dtype_name(q_t.dtype()) << "; expected e4m3 or e5m2");
  check_shape(q_t, {cols, rows}, (name + " q_t").c_str());
  if (!q.defined()) return;
  device(q, (name + " q").c_str());
  check_dtype(q, q_t.dtype(), (name + " q").c_str());
  check_shape(q, {rows, cols}, (name + " q").c_str());
}

void check_fp8_quantize_transpose(const Tensor& q, const Tensor& q_t, const Tensor& amax, const Tensor& x,
                                  const Tensor& scale, TensorCheck device, TensorCheck x_dtype) {
  check_defined(x, "fp8_quantize_transpose x");
  MEGATRON_CHECK(x.ndim() == 2, "fp8_quantize_transpose x has shape " << shape_str(x.shape()) << "; expected 2-D");
  device(x, "fp8_quantize_transpose x");
  x_dtype(x, "fp8_quantize_transpose x");
  check_fp8_casts(q, q_t, amax, scale, x.dim(0), x.dim(1), "fp8_quantize_transpose", device);
}

void check_fp8_update_scale(const Tensor& scale, const Tensor& scale_inv, const Tensor& amax_history, DType fp8_dtype,
                            const Fp8Recipe& recipe, TensorCheck device) {
  check_scalar_f32(scale, "fp8_update_scale scale", device);
  check_scalar_f32(scale_inv, "fp8_update_scale scale_inv", device);
  check_numel(amax_history, recipe.amax_history_len, "fp8_update_scale amax_history");
  device(amax_history, "fp8_update_scale amax_history");
  check_dtype(amax_history, DType::f32, "fp8_update_scale amax_history");
  MEGATRON_CHECK(dtype_is_fp8(fp8_dtype), "fp8_update_scale: " << dtype_name(fp8_dtype) << " is not e4m3 or e5m2");
  MEGATRON_CHECK(recipe.margin >= 0 && recipe.margin < 127,
                 "fp8_update_scale: margin " << recipe.margin << " must lie in [0, 127)");
}

void check_fp8_update_scales(const std::vector<Tensor>& scales, const std::vector<Tensor>& scale_invs,
                             const std::vector<Tensor>& amax_histories, const std::vector<DType>& fp8_dtypes,
                             const Fp8Recipe& recipe, TensorCheck device) {
  MEGATRON_CHECK(scale_invs.size() == scales.size() && amax_histories.size() == scales.size() &&
                     fp8_dtypes.size() == scales.size(),
                 "fp8_update_scales: " << scales.size() << " scales, " << scale_invs.size() << " scale_invs, "
                                       << amax_histories.size() << " amax histories and " << fp8_dtypes.size()
                                       << " dtypes; expected one of each per tensor");
  for (size_t i = 0; i < scales.size(); ++i)
    check_fp8_update_scale(scales[i], scale_invs[i], amax_histories[i], fp8_dtypes[i], recipe, device);
}

MatmulDims check_fp8_matmul(const Tensor& c, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                            const Tensor& b_scale_inv, const MatmulParams& params, TensorCheck device) {
  for (const auto& [t, name] : {std::pair{&a, "fp8_matmul A"}, std::pair{&b, "fp8_matmul B"}}) {
    check_defined(*t, name);
    device(*t, name);
    MEGATRON_CHECK(dtype_is_fp8(t->dtype()),
                   name << " has dtype " << dtype_name(t->dtype()) << "; expected e4m3 or e5m2");
  }
  MEGATRON_CHECK(!(a.dtype() == DType::e5m2 && b.dtype() == DType::e5m2),
                 "fp8_matmul: A and B are both e5m2, which FP8 tensor cores do not multiply; quantise one to e4m3");
  check_scalar_f32(a_scale_inv, "fp8_matmul A scale_inv", device);
  check_scalar_f32(b_scale_inv, "fp8_matmul B scale_inv", device);
  check_defined(c, "fp8_matmul C");
  device(c, "fp8_matmul C");
  MEGATRON_CHECK(c.dtype() == DType::bf16 || c.dtype() == DType::f16 || c.dtype() == DType::f32,
                 "fp8_matmul C has dtype " << dtype_name(c.dtype()) << "; expected bf16, f16 or f32");
  return check_matmul_dims(c, a, b, params, "fp8_matmul");
}

namespace {

const char* block_name(Fp8BlockShape blocks) { return blocks == Fp8BlockShape::tile_1x128 ? "1x128" : "128x128"; }

// An FP8 tensor of `shape` and its block scale_inv, on the backend's device.
void check_block_scaled(const Tensor& q, const Tensor& scale_inv, const Shape& shape, Fp8BlockShape blocks,
                        const std::string& name, TensorCheck device) {
  check_defined(q, name.c_str());
  device(q, name.c_str());
  MEGATRON_CHECK(dtype_is_fp8(q.dtype()), name << " has dtype " << dtype_name(q.dtype()) << "; expected e4m3 or e5m2");
  check_shape(q, shape, name.c_str());
  const std::string scale_name = name + " scale_inv";
  check_defined(scale_inv, scale_name.c_str());
  device(scale_inv, scale_name.c_str());
  check_dtype(scale_inv, DType::f32, scale_name.c_str());
  MEGATRON_CHECK(scale_inv.shape() == fp8_block_scale_shape(shape[0], shape[1], blocks),
                 scale_name << " has shape " << shape_str(scale_inv.shape()) << "; " << block_name(blocks)
                            << " blocks of " << shape_str(shape) << " take "
                            << shape_str(fp8_block_scale_shape(shape[0], shape[1], blocks))
                            << " (ops/fp8.h: fp8_block_scale_shape)");
}

int64_t blocks_of(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }
int64_t round_up4(int64_t n) { return (n + 3) / 4 * 4; }

}  // namespace

void check_fp8_quantize_blockwise(const Tensor& q, const Tensor& q_scale_inv, const Tensor& q_t,
                                  const Tensor& q_t_scale_inv, const Tensor& x, Fp8BlockShape blocks,
                                  TensorCheck device, TensorCheck x_dtype) {
  check_defined(x, "fp8_quantize_blockwise x");
  device(x, "fp8_quantize_blockwise x");
  x_dtype(x, "fp8_quantize_blockwise x");
  MEGATRON_CHECK(x.ndim() == 2, "fp8_quantize_blockwise x has shape " << shape_str(x.shape()) << "; expected 2-D");
  MEGATRON_CHECK(q.defined() || q_t.defined(), "fp8_quantize_blockwise: q and q_t are both undefined; nothing to do");
  if (q.defined()) check_block_scaled(q, q_scale_inv, x.shape(), blocks, "fp8_quantize_blockwise q", device);
  if (q_t.defined())
    check_block_scaled(q_t, q_t_scale_inv, {x.dim(1), x.dim(0)}, blocks, "fp8_quantize_blockwise q_t", device);
  if (q.defined() && q_t.defined()) check_dtype(q_t, q.dtype(), "fp8_quantize_blockwise q_t");
}

MatmulDims check_fp8_matmul_blockwise(const Tensor& c, const Tensor& a, const Tensor& a_scale_inv,
                                      Fp8BlockShape a_blocks, const Tensor& b, const Tensor& b_scale_inv,
                                      Fp8BlockShape b_blocks, const MatmulParams& params, TensorCheck device) {
  MEGATRON_CHECK(params.trans_a == Transpose::no && params.trans_b == Transpose::yes,
                 "fp8_matmul_blockwise takes A (M,K) and B (N,K), both quantised along K: pass trans_a no and "
                 "trans_b yes (a block-scaled operand cannot be transposed after its cast; quantise the other "
                 "layout with fp8_quantize_blockwise's q_t)");
  MEGATRON_CHECK(!(a_blocks == Fp8BlockShape::block_128x128 && b_blocks == Fp8BlockShape::block_128x128),
                 "fp8_matmul_blockwise: A and B are both in 128x128 blocks, which neither cuBLASLt nor Transformer "
                 "Engine multiplies; quantise one of them in 1x128 tiles");
  MEGATRON_CHECK(!params.fp8_fast_accumulation,
                 "fp8_matmul_blockwise: fp8_fast_accumulation applies to per-tensor scaled fp8_matmul only (a "
                 "block-scaled GEMM applies its scales to fp32 partial sums of each 128-wide K block)");
  MEGATRON_CHECK(a.defined() && b.defined() && a.ndim() == 2 && b.ndim() == 2,
                 "fp8_matmul_blockwise takes defined 2-D A and B");
  check_block_scaled(a, a_scale_inv, a.shape(), a_blocks, "fp8_matmul_blockwise A", device);
  check_block_scaled(b, b_scale_inv, b.shape(), b_blocks, "fp8_matmul_blockwise B", device);
  MEGATRON_CHECK(!(a.dtype() == DType::e5m2 && b.dtype() == DType::e5m2),
                 "fp8_matmul_blockwise: A and B are both e5m2, which FP8 tensor cores do not multiply; quantise one "
                 "to e4m3");
  check_defined(c, "fp8_matmul_blockwise C");
  device(c, "fp8_matmul_blockwise C");
  MEGATRON_CHECK(c.dtype() == DType::bf16 || c.dtype() == DType::f16 || c.dtype() == DType::f32,
                 "fp8_matmul_blockwise C has dtype " << dtype_name(c.dtype()) << "; expected bf16, f16 or f32");
  return check_matmul_dims(c, a, b, params, "fp8_matmul_blockwise");
}

}  // namespace megatron::ops::checks

namespace megatron::ops {

Shape fp8_block_scale_shape(int64_t rows, int64_t cols, Fp8BlockShape blocks) {
  using checks::blocks_of;
  using checks::round_up4;
  if (blocks == Fp8BlockShape::tile_1x128) return {blocks_of(cols), round_up4(rows)};
  return {blocks_of(rows), round_up4(blocks_of(cols))};
}

}  // namespace megatron::ops
