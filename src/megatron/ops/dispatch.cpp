// Public op entry points: route each call to the backend that owns its tensors' memory.
// The first tensor argument decides; backends check that the others live on the same device.
#include "megatron/ops/activation.h"
#include "megatron/ops/adamw.h"
#include "megatron/ops/attention.h"
#include "megatron/ops/checks/common.h"
#include "megatron/ops/cross_entropy.h"
#include "megatron/ops/dropout.h"
#include "megatron/ops/elementwise.h"
#include "megatron/ops/embedding.h"
#include "megatron/ops/gemm.h"
#include "megatron/ops/norm.h"
#include "megatron/ops/profiler.h"
#include "megatron/ops/reduce.h"
#include "megatron/ops/rope.h"

namespace megatron::ops {

// Every op call is timed while the op profiler records (ops/profiler.h); otherwise the scope
// costs one branch.
#ifdef MEGATRON_WITH_CUDA
#define MEGATRON_DISPATCH(first, fn, ...)                         \
  do {                                                            \
    const OpProfiler::Scope profile_scope(#fn, (first).device()); \
    if ((first).device().is_cuda()) return cuda::fn(__VA_ARGS__); \
    return cpu::fn(__VA_ARGS__);                                  \
  } while (0)
#else
namespace {
void require_cpu_backend(const Tensor& t, const char* op) {
  MEGATRON_CHECK(t.device().is_cpu(), op << " got a CUDA tensor but this build has no CUDA backend; "
                                         << "rebuild with the CUDA toolkit or run with --device cpu");
}
}  // namespace
#define MEGATRON_DISPATCH(first, fn, ...)                         \
  do {                                                            \
    require_cpu_backend(first, #fn);                              \
    const OpProfiler::Scope profile_scope(#fn, (first).device()); \
    return cpu::fn(__VA_ARGS__);                                  \
  } while (0)
#endif

void matmul(Tensor& c, const Tensor& a, const Tensor& b, const MatmulParams& p) {
  MEGATRON_DISPATCH(c, matmul, c, a, b, p);
}
void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  MEGATRON_DISPATCH(y, linear_forward, y, x, w, bias);
}
void linear_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w) {
  MEGATRON_DISPATCH(dy, linear_backward, dx, dw, db, dy, x, w);
}
void linear_gelu_forward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& w, const Tensor& bias) {
  MEGATRON_DISPATCH(y, linear_gelu_forward, y, pre, x, w, bias);
}
void gelu_linear_backward(Tensor& dpre, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                          const Tensor& pre) {
  MEGATRON_DISPATCH(dy, gelu_linear_backward, dpre, dw, db, dy, x, w, pre);
}

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& w, const EmbeddingParams& p) {
  MEGATRON_DISPATCH(out, embedding_forward, out, tokens, w, p);
}
void embedding_backward(Tensor& dw, const Tensor& dout, const Tensor& tokens, const EmbeddingParams& p) {
  MEGATRON_DISPATCH(dw, embedding_backward, dw, dout, tokens, p);
}

void norm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                  const NormParams& p) {
  MEGATRON_DISPATCH(y, norm_forward, y, mean, rstd, x, w, b, p);
}
void norm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                   const Tensor& mean, const Tensor& rstd, const NormParams& p) {
  MEGATRON_DISPATCH(dy, norm_backward, dx, dw, db, dy, x, w, mean, rstd, p);
}
void add_norm_forward(Tensor& h, Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& residual,
                      const Tensor& w, const Tensor& b, const NormParams& p) {
  MEGATRON_DISPATCH(y, add_norm_forward, h, y, mean, rstd, x, residual, w, b, p);
}
void add_norm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& dh, const Tensor& h,
                       const Tensor& w, const Tensor& mean, const Tensor& rstd, const NormParams& p) {
  MEGATRON_DISPATCH(dy, add_norm_backward, dx, dw, db, dy, dh, h, w, mean, rstd, p);
}

void gelu_forward(Tensor& y, const Tensor& x) { MEGATRON_DISPATCH(y, gelu_forward, y, x); }
void gelu_backward(Tensor& dx, const Tensor& dy, const Tensor& x) { MEGATRON_DISPATCH(dx, gelu_backward, dx, dy, x); }
void swiglu_forward(Tensor& y, const Tensor& x) { MEGATRON_DISPATCH(y, swiglu_forward, y, x); }
void swiglu_backward(Tensor& dx, const Tensor& dy, const Tensor& x) {
  MEGATRON_DISPATCH(dx, swiglu_backward, dx, dy, x);
}

void rope_forward(Tensor& y, const Tensor& x, const RopeParams& p) { MEGATRON_DISPATCH(y, rope_forward, y, x, p); }
void rope_backward(Tensor& dx, const Tensor& dy, const RopeParams& p) {
  MEGATRON_DISPATCH(dx, rope_backward, dx, dy, p);
}

void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionParams& p) {
  MEGATRON_DISPATCH(out, attention_forward, out, lse, q, k, v, p);
}
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& p) {
  MEGATRON_DISPATCH(dq, attention_backward, dq, dk, dv, dout, q, k, v, out, lse, p);
}
void qkv_split(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv) { MEGATRON_DISPATCH(q, qkv_split, q, k, v, qkv); }
void qkv_merge(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  MEGATRON_DISPATCH(dqkv, qkv_merge, dqkv, dq, dk, dv);
}
void attention_forward_qkv(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t num_heads, const AttentionParams& p) {
  MEGATRON_DISPATCH(out, attention_forward_qkv, out, lse, qkv, num_heads, p);
}
void attention_backward_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t num_heads, const AttentionParams& p) {
  MEGATRON_DISPATCH(dqkv, attention_backward_qkv, dqkv, dout, qkv, out, lse, num_heads, p);
}

void cross_entropy_partial_forward(Tensor& partial, const Tensor& logits, const Tensor& targets,
                                   const VocabShard& shard) {
  MEGATRON_DISPATCH(partial, cross_entropy_partial_forward, partial, logits, targets, shard);
}
void cross_entropy_combine(Tensor& losses, Tensor& lse, const Tensor& partials) {
  MEGATRON_DISPATCH(losses, cross_entropy_combine, losses, lse, partials);
}
// The whole vocabulary on one rank: the vocab-parallel forward with a single partial.
void cross_entropy_forward(Tensor& losses, Tensor& lse, const Tensor& logits, const Tensor& targets) {
  checks::check_defined(logits, "cross_entropy logits");
  const int64_t N = logits.ndim() >= 1 ? logits.dim(0) : 0;
  Tensor partial = Tensor::empty({3, N}, checks::accum_dtype(logits.dtype()), logits.device());
  cross_entropy_partial_forward(partial, logits, targets, {});
  cross_entropy_combine(losses, lse, partial.view({1, 3, N}));
}
void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& loss_mask, float grad_scale, const VocabShard& shard) {
  MEGATRON_DISPATCH(dlogits, cross_entropy_backward, dlogits, logits, targets, lse, loss_mask, grad_scale, shard);
}
// Not an op on tensors (no profiler scope); the CPU ops raise at the call, so only CUDA has a record.
void cross_entropy_check_targets([[maybe_unused]] Device device) {
#ifdef MEGATRON_WITH_CUDA
  if (device.is_cuda()) cuda::cross_entropy_check_targets(device);
#endif
}

void dropout_forward(Tensor& y, const Tensor& x, const DropoutParams& p) {
  MEGATRON_DISPATCH(y, dropout_forward, y, x, p);
}
void dropout_backward(Tensor& dx, const Tensor& dy, const DropoutParams& p) {
  MEGATRON_DISPATCH(dx, dropout_backward, dx, dy, p);
}

void add(Tensor& out, const Tensor& a, const Tensor& b) { MEGATRON_DISPATCH(out, add, out, a, b); }
void add_scaled(Tensor& out, const Tensor& x, float alpha) { MEGATRON_DISPATCH(out, add_scaled, out, x, alpha); }
void scale(Tensor& out, const Tensor& x, float alpha) { MEGATRON_DISPATCH(out, scale, out, x, alpha); }
void cast(Tensor& out, const Tensor& x) { MEGATRON_DISPATCH(out, cast, out, x); }
void transpose01(Tensor& out, const Tensor& in) { MEGATRON_DISPATCH(out, transpose01, out, in); }

void sum_squares(Tensor& acc, const Tensor& x) { MEGATRON_DISPATCH(acc, sum_squares, acc, x); }
void dot(Tensor& acc, const Tensor& a, const Tensor& b) { MEGATRON_DISPATCH(acc, dot, acc, a, b); }
void count_nonfinite(Tensor& acc, const Tensor& x) { MEGATRON_DISPATCH(acc, count_nonfinite, acc, x); }

void adamw_step(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad, Tensor& model_param, const AdamWParams& p) {
  MEGATRON_DISPATCH(master, adamw_step, master, m, v, grad, model_param, p);
}

#undef MEGATRON_DISPATCH

}  // namespace megatron::ops
