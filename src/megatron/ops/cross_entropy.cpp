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

// Not an op on tensors (no backend pair, no profiler scope); the CPU ops raise at the call, so only
// CUDA has a record.
void cross_entropy_check_targets([[maybe_unused]] Device device) {
#ifdef MEGATRON_WITH_CUDA
  if (device.is_cuda()) cuda::cross_entropy_check_targets(device);
#endif
}

}  // namespace megatron::ops
