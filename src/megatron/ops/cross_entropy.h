#pragma once
// Softmax cross-entropy over the vocabulary, whole or split across tensor-parallel ranks
// (Megatron's vocab-parallel cross-entropy: no rank ever holds the full logits).
//
// A rank's logits (N,V_local) are the columns [start, start + V_local) of a vocabulary of `size`
// ids (VocabShard; {} is the whole vocabulary). The forward is two ops around one all-gather of
// the per-rank partials over TP. This is Megatron's three all-reduces (max, target logit, sum of
// exp) in one collective: the partial sums are rescaled to the global max after the exchange
// instead of before.
// dtypes: logits f32/bf16/f16 (f64 on the CPU); partial, lse and losses f32 (f64 for f64 logits).
// Targets are i32 in [0, size) (under vocab parallelism: the padded whole vocabulary; a target in
// another rank's columns is normal). An out-of-range target is an error: the CPU ops raise it at
// the call. A CUDA kernel cannot raise without a host synchronisation: it gives the row a NaN
// loss (and gradient) and records the target (the lowest such row, its id and the vocabulary) on
// the device, and cross_entropy_check_targets raises the CPU's error for it once the host has
// synchronised with the kernels anyway (the model calls it right after reading back the loss).
#include <cstdint>

#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

struct VocabShard {
  int64_t start = 0;  // global id of this rank's first column
  int64_t size = 0;   // ids in the whole vocabulary; 0: the logits hold all of it (start 0)
};

// partial (3,N), row n of this rank's columns:
//   [0][n] m = max_v x_v
//   [1][n] s = sum_v exp(x_v - m)
//   [2][n] t = x_target if the target is one of this rank's columns, else 0
MEGATRON_OP(cross_entropy_partial_forward,
            void(Tensor& partial, const Tensor& logits, const Tensor& targets, const VocabShard& shard));
// partials (R,3,N) of the R ranks ->
//   lse (N) = M + log sum_r s_r exp(m_r - M),  M = max_r m_r
//   losses (N) = lse - sum_r t_r              (per token, no mask applied)
MEGATRON_OP(cross_entropy_combine, void(Tensor& losses, Tensor& lse, const Tensor& partials));
// dlogits (N,V_local) = (softmax(logits) - onehot(target)) * loss_mask[i] * grad_scale with the
// saved global lse; the one-hot falls on the rank owning the target, so the backward needs no
// communication. loss_mask (N) may be undefined (all ones); it is f32, or f64 with f64 logits.
// dlogits may alias logits, so no second copy exists.
MEGATRON_OP(cross_entropy_backward,
            void(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                 const Tensor& loss_mask, float grad_scale, const VocabShard& shard));

// Both forward ops with R = 1 (one rank, the whole vocabulary): losses and lse (N).
void cross_entropy_forward(Tensor& losses, Tensor& lse, const Tensor& logits, const Tensor& targets);
// Raises the out-of-range target error for a target that a CUDA op on `device` recorded since the
// last check, and clears the record; nothing on the CPU. Costs no synchronisation (it reads a flag
// in mapped host memory) unless a target was recorded; it sees the ops the host has already
// waited for, so call it after a read-back of their results.
void cross_entropy_check_targets(Device device);
namespace cuda {  // ops/cuda/cross_entropy.cu, built with the CUDA backend
void cross_entropy_check_targets(Device device);
}  // namespace cuda

}  // namespace megatron::ops
