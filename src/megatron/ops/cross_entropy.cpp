// The whole vocabulary on one rank: the vocab-parallel forward with a single partial.
#include "megatron/ops/cross_entropy.h"

#include "megatron/ops/checks/common.h"

namespace megatron::ops {

void cross_entropy_forward(Tensor& losses, Tensor& lse, const Tensor& logits, const Tensor& targets) {
  checks::check_defined(logits, "cross_entropy logits");
  const int64_t N = logits.ndim() >= 1 ? logits.dim(0) : 0;
  Tensor partial = Tensor::empty({3, N}, checks::accum_dtype(logits.dtype()), logits.device());
  cross_entropy_partial_forward(partial, logits, targets, {});
  cross_entropy_combine(losses, lse, partial.view({1, 3, N}));
}

}  // namespace megatron::ops
