#pragma once
// Argument checks of the (vocab-parallel) cross-entropy (ops/cross_entropy.h), shared by
// ops/cpu/cross_entropy.cpp and ops/cuda/cross_entropy.cu. Target values are not checked here:
// the CPU checks them in the op, a CUDA kernel records a bad one for cross_entropy_check_targets;
// both raise fail_target_outside_vocabulary's error.
#include "megatron/ops/checks/common.h"
#include "megatron/ops/cross_entropy.h"

namespace megatron::ops::checks {

struct CrossEntropyBackend {
  TensorCheck device;
  // Rejects a logits dtype the backend has no kernel for; called with the op's name before the
  // checks whose expected dtype derives from the logits'.
  TensorCheck logits_dtype;
};

// Logits (N, V_local) of a vocabulary of `vocab` ids.
struct CrossEntropyDims {
  int64_t N, V_local, vocab;
};
CrossEntropyDims check_cross_entropy_partial_forward(const Tensor& partial, const Tensor& logits, const Tensor& targets,
                                                     const VocabShard& shard, const CrossEntropyBackend& backend);
// partials (R,3,N) -> losses, lse (N). Returns {N, R}.
struct CombineDims {
  int64_t N, R;
};
CombineDims check_cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& partials,
                                        TensorCheck device);
CrossEntropyDims check_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                                              const Tensor& lse, const Tensor& loss_mask, const VocabShard& shard,
                                              const CrossEntropyBackend& backend);

// The error for target id `target` of row `row` outside [0, vocab): one text on both backends.
[[noreturn]] void fail_target_outside_vocabulary(int64_t target, int64_t row, int64_t vocab);

}  // namespace megatron::ops::checks
