#pragma once
// The grouped GEMM of the MoE experts (--moe-grouped-gemm): rows of x are grouped by expert,
// expert e owning counts[e] consecutive rows (counts sum to the rows) and its weight weight[e]
// of the (E, out, in) stack. One call covers every expert (one cuBLAS grouped launch on CUDA); the
// per-expert loop of linear ops (gemm.h) computes the same. As gemm.h, backward overwrites dX and
// accumulates dW into the fp32 main grad; an expert without rows adds nothing.
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

// y (N,out): rows of e = x rows of e (N_e,in) @ weight[e]^T
MEGATRON_OP(grouped_linear_forward,
            void(Tensor& y, const Tensor& x, const Tensor& weight, const std::vector<int64_t>& counts));
// dx (N,in): rows of e = dy rows of e @ weight[e]       (overwrites; skipped when dx undefined)
// dweight (E,out,in): [e] += dy_e^T @ x_e               (accumulates; skipped when undefined)
MEGATRON_OP(grouped_linear_backward, void(Tensor& dx, Tensor& dweight, const Tensor& dy, const Tensor& x,
                                          const Tensor& weight, const std::vector<int64_t>& counts));

}  // namespace megatron::ops
