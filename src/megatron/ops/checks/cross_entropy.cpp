#include "megatron/ops/checks/cross_entropy.h"

namespace megatron::ops::checks {
namespace {

CrossEntropyDims check_logits_and_targets(const Tensor& logits, const Tensor& targets, const VocabShard& shard,
                                          const char* op, const CrossEntropyBackend& backend) {
  check_defined(logits, "cross_entropy logits");
  backend.device(logits, "cross_entropy logits");
  MEGATRON_CHECK(logits.ndim() == 2, "cross_entropy logits must be (N,V), got " << shape_str(logits.shape()));
  backend.logits_dtype(logits, op);
  const int64_t N = logits.dim(0), V = logits.dim(1);
  MEGATRON_CHECK(V > 0, "cross_entropy logits " << shape_str(logits.shape()) << " have an empty vocabulary");
  const int64_t vocab = shard.size == 0 ? V : shard.size;
  MEGATRON_CHECK(shard.start >= 0 && shard.start + V <= vocab && (shard.size != 0 || shard.start == 0),
                 "cross_entropy vocab shard: columns [" << shard.start << ", " << shard.start + V
                                                        << ") do not lie in a vocabulary of " << vocab
                                                        << " ids; give start and the whole vocabulary's size");
  check_defined(targets, "cross_entropy targets");
  backend.device(targets, "cross_entropy targets");
  check_shape(targets, {N}, "cross_entropy targets");
  check_dtype(targets, DType::i32, "cross_entropy targets");
  return {N, V, vocab};
}

void check_stat(const Tensor& t, int64_t N, DType dtype, const char* name, TensorCheck device) {
  check_defined(t, name);
  device(t, name);
  check_shape(t, {N}, name);
  check_dtype(t, dtype, name);
}

}  // namespace

CrossEntropyDims check_cross_entropy_partial_forward(const Tensor& partial, const Tensor& logits, const Tensor& targets,
                                                     const VocabShard& shard, const CrossEntropyBackend& backend) {
  const CrossEntropyDims dims =
      check_logits_and_targets(logits, targets, shard, "cross_entropy_partial_forward", backend);
  check_defined(partial, "cross_entropy partial");
  backend.device(partial, "cross_entropy partial");
  check_shape(partial, {3, dims.N}, "cross_entropy partial");
  check_dtype(partial, accum_dtype(logits.dtype()), "cross_entropy partial");
  return dims;
}

CombineDims check_cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& partials,
                                        TensorCheck device) {
  check_defined(partials, "cross_entropy partials");
  device(partials, "cross_entropy partials");
  MEGATRON_CHECK(
      partials.ndim() == 3 && partials.dim(1) == 3 && partials.dim(0) >= 1,
      "cross_entropy partials must be (R,3,N), one (3,N) partial per rank, got " << shape_str(partials.shape()));
  MEGATRON_CHECK(partials.dtype() == DType::f32 || partials.dtype() == DType::f64,
                 "cross_entropy partials have dtype " << dtype_name(partials.dtype()) << ", expected f32 (or f64)");
  const int64_t N = partials.dim(2);
  check_stat(losses, N, partials.dtype(), "cross_entropy losses", device);
  check_stat(lse, N, partials.dtype(), "cross_entropy lse", device);
  return {N, partials.dim(0)};
}

CrossEntropyDims check_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                                              const Tensor& lse, const Tensor& loss_mask, const VocabShard& shard,
                                              const CrossEntropyBackend& backend) {
  const CrossEntropyDims dims = check_logits_and_targets(logits, targets, shard, "cross_entropy_backward", backend);
  const DType acc = accum_dtype(logits.dtype());
  check_stat(lse, dims.N, acc, "cross_entropy lse", backend.device);
  check_defined(dlogits, "cross_entropy dlogits");
  backend.device(dlogits, "cross_entropy dlogits");
  check_shape(dlogits, logits.shape(), "cross_entropy dlogits");
  check_dtype(dlogits, logits.dtype(), "cross_entropy dlogits");
  if (loss_mask.defined()) {
    backend.device(loss_mask, "cross_entropy loss_mask");
    check_shape(loss_mask, {dims.N}, "cross_entropy loss_mask");
    MEGATRON_CHECK(loss_mask.dtype() == DType::f32 || loss_mask.dtype() == acc,
                   "cross_entropy loss_mask has dtype " << dtype_name(loss_mask.dtype()) << ", expected f32"
                                                        << (acc == DType::f64 ? " or f64" : ""));
  }
  return dims;
}

void fail_target_outside_vocabulary(int64_t target, int64_t row, int64_t vocab) {
  MEGATRON_FAIL("cross_entropy target " << target << " at row " << row << " is outside the vocabulary [0, " << vocab
                                        << "); check the data and the vocab size");
}

}  // namespace megatron::ops::checks
