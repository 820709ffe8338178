#pragma once
// Argument checks of the FP8 family (ops/fp8.h), shared by the CPU and CUDA backends.
#include <vector>

#include "megatron/ops/checks/common.h"
#include "megatron/ops/checks/gemm.h"
#include "megatron/ops/fp8.h"

namespace megatron::ops::checks {

bool is_fp8(DType dtype);
// amax (1) f32 and x of the backend's floating dtypes (`x_dtype`), on the backend's device.
void check_fp8_amax(const Tensor& amax, const Tensor& x, TensorCheck device, TensorCheck x_dtype);
// q an FP8 tensor of x's shape, scale (1) f32, amax (1) f32 or undefined.
void check_fp8_quantize(const Tensor& q, const Tensor& amax, const Tensor& x, const Tensor& scale, TensorCheck device,
                        TensorCheck x_dtype);
// x 2-D; q_t an FP8 tensor of x's transposed shape; q undefined or of x's shape and q_t's dtype;
// scale and amax as in check_fp8_quantize.
void check_fp8_quantize_transpose(const Tensor& q, const Tensor& q_t, const Tensor& amax, const Tensor& x,
                                  const Tensor& scale, TensorCheck device, TensorCheck x_dtype);
// The outputs of a cast of a (rows, cols) tensor in both layouts (fp8_quantize_transpose and the
// producers fused with it, as ops::swiglu_forward_fp8): q_t (cols, rows) FP8, q undefined or
// (rows, cols) of q_t's dtype, amax (1) f32 or undefined, scale (1) f32. `op` names the caller.
void check_fp8_casts(const Tensor& q, const Tensor& q_t, const Tensor& amax, const Tensor& scale, int64_t rows,
                     int64_t cols, const char* op, TensorCheck device);
void check_fp8_update_scale(const Tensor& scale, const Tensor& scale_inv, const Tensor& amax_history, DType fp8_dtype,
                            const Fp8Recipe& recipe, TensorCheck device);
// fp8_update_scales: the vectors of one length, each entry as check_fp8_update_scale's.
void check_fp8_update_scales(const std::vector<Tensor>& scales, const std::vector<Tensor>& scale_invs,
                             const std::vector<Tensor>& amax_histories, const std::vector<DType>& fp8_dtypes,
                             const Fp8Recipe& recipe, TensorCheck device);
// 2-D FP8 A and B (not both e5m2), (1) f32 scale_invs, C bf16/f16/f32 of op(A) op(B)'s shape.
MatmulDims check_fp8_matmul(const Tensor& c, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                            const Tensor& b_scale_inv, const MatmulParams& params, TensorCheck device);

// x 2-D; q (x's shape) and q_t (transposed) FP8 of one dtype, at least one defined, each with a
// defined f32 scale_inv of fp8_block_scale_shape's shape.
void check_fp8_quantize_blockwise(const Tensor& q, const Tensor& q_scale_inv, const Tensor& q_t,
                                  const Tensor& q_t_scale_inv, const Tensor& x, Fp8BlockShape blocks,
                                  TensorCheck device, TensorCheck x_dtype);
// As check_fp8_matmul, with block scale_invs of A's and B's shapes, A (M,K) and B (N,K) (trans_a
// no, trans_b yes), and not both 128x128.
MatmulDims check_fp8_matmul_blockwise(const Tensor& c, const Tensor& a, const Tensor& a_scale_inv,
                                      Fp8BlockShape a_blocks, const Tensor& b, const Tensor& b_scale_inv,
                                      Fp8BlockShape b_blocks, const MatmulParams& params, TensorCheck device);

}  // namespace megatron::ops::checks
