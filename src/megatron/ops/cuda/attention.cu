// Attention on CUDA, shared part: the routing of each call to cuDNN's fused kernels or ours
// (cudnn_attention_applies decides), the CUDA side of the argument checks (limits, dtypes; the
// rules both backends share are in ops/checks/attention.h) and the fused-QKV split/merge copies.
#include <array>

#include "megatron/ops/checks/attention.h"
#include "megatron/ops/cuda/attention_common.cuh"
#include "megatron/ops/cuda/attention_cudnn.h"
#include "megatron/ops/cuda/attention_flash.h"
#include "megatron/ops/cuda/kernel_util.cuh"

namespace megatron::ops::cuda {
namespace attention_detail {

Dims cuda_dims(const checks::AttentionDims& d, const Tensor& q, const AttentionParams& p) {
  // Kernels index positions and heads in int and elements in int64.
  MEGATRON_CHECK(d.S < (int64_t(1) << 31) && d.B * d.NH < 65536 && d.HS < 65536,
                 "attention: shape " << shape_str(q.shape()) << " exceeds the CUDA kernels' limits (S < 2^31, B*NH < "
                                     << "65536, HS < 65536); split the batch");
  const int64_t total_heads = p.total_heads == 0 ? d.NH : p.total_heads;
  MEGATRON_CHECK(d.B * total_heads < 65536, "attention: batch "
                                                << d.B << " x " << total_heads
                                                << " heads exceeds the CUDA dropout index limit; split the batch");
  return Dims{int(d.S), int(d.B), int(d.NH), int(d.G), int(d.HS), int(p.head_offset), int(total_heads)};
}

namespace {
// CUDA attention kernels exist for the dtypes dispatch_storage takes (f32, bf16, f16).
void check_cuda_attention_dtype(const Tensor& q, const char* op) {
  dispatch_storage(q.dtype(), op, []<class T>(std::type_identity<T>) {});
}
}  // namespace

const checks::AttentionBackend kCudaAttention{check_cuda, check_cuda_attention_dtype};

}  // namespace attention_detail

namespace {

using attention_detail::Dims;

// The fused layout of qkv_head. One thread per unit U of the fused tensor (16 bytes when every
// head is whole 16-byte words, else one element); to_qkv picks the direction (merge) or its
// reverse (split).
template <class U>
__global__ void qkv_copy_kernel(U* qkv, U* q, U* k, U* v, int64_t SB, int G, int r, int64_t head_units, bool to_qkv) {
  const int64_t total = SB * G * (r + 2) * head_units;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t fused_head = idx / head_units, u = idx % head_units;
    const int64_t sbg = fused_head / (r + 2), t = fused_head % (r + 2);
    const QkvHead h = qkv_head(sbg / G, sbg % G, t, G, r);  // h.fused == fused_head
    U* tensor = h.tensor == 0 ? q : h.tensor == 1 ? k : v;
    if (tensor == nullptr) continue;  // not copied (copy_query_heads)
    U* head = tensor + h.separate * head_units;
    if (to_qkv) {
      qkv[idx] = head[u];
    } else {
      head[u] = qkv[idx];
    }
  }
}

// A tensor's data, or null where it is undefined (a head not copied).
void* raw_or_null(Tensor& t) { return t.defined() ? t.raw() : nullptr; }

template <class U>
void launch_qkv_copy(Tensor& qkv, Tensor& q, Tensor& k, Tensor& v, const Dims& d, bool to_qkv) {
  const int64_t head_units = int64_t(d.HS) * int64_t(q.element_size()) / int64_t(sizeof(U));
  const int64_t SB = int64_t(d.S) * d.B;
  const int64_t total = SB * d.G * (d.group_size() + 2) * head_units;
  qkv_copy_kernel<U><<<grid_for(total), kThreads, 0, stream()>>>(static_cast<U*>(qkv.raw()), static_cast<U*>(q.raw()),
                                                                 static_cast<U*>(raw_or_null(k)), static_cast<U*>(raw_or_null(v)), SB,
                                                                 d.G, d.group_size(), head_units, to_qkv);
  CUDA_CHECK_LAUNCH();
}

// Byte copies between qkv and q, k, v, so any dtype works (as on the CPU); k and v may be
// undefined (not copied). The caller has checked the shapes.
void copy_heads(Tensor& qkv, Tensor& q, Tensor& k, Tensor& v, const Dims& d, bool to_qkv) {
  if (qkv.numel() == 0) return;
  const size_t head_bytes = size_t(d.HS) * q.element_size();
  const bool whole_words = head_bytes % 16 == 0 && is_aligned16(qkv.raw()) && is_aligned16(q.raw()) &&
                           is_aligned16(raw_or_null(k)) && is_aligned16(raw_or_null(v));
  if (whole_words) return launch_qkv_copy<uint4>(qkv, q, k, v, d, to_qkv);
  switch (q.element_size()) {
    case 1:
      return launch_qkv_copy<uint8_t>(qkv, q, k, v, d, to_qkv);
    case 2:
      return launch_qkv_copy<uint16_t>(qkv, q, k, v, d, to_qkv);
    case 4:
      return launch_qkv_copy<uint32_t>(qkv, q, k, v, d, to_qkv);
    case 8:
      return launch_qkv_copy<uint64_t>(qkv, q, k, v, d, to_qkv);
    default:
      break;
  }
  MEGATRON_FAIL("qkv split/merge: dtype " << dtype_name(q.dtype()) << " has an element size of " << q.element_size()
                                          << " bytes, which the copy kernel does not handle");
}

void qkv_copy(Tensor& qkv, Tensor& q, Tensor& k, Tensor& v, bool to_qkv) {
  copy_heads(qkv, q, k, v, attention_detail::cuda_dims(checks::check_qkv_fused(qkv, q, k, v, check_cuda), q), to_qkv);
}

// q, k, v of the fused projection qkv (S,B,G,(r+2)*HS), r = NH/G query heads a group, where
// cuDNN reads them (cudnn_attention_fused): k and v in place; q too for MHA (r = 1). GQA's query
// heads are not one stride apart (a group's r heads, then the next group's), so they go through
// `copy` (S,B,NH,HS), which q then points at (place_query_heads_apart).
struct FusedOperands {
  Tensor copy;
  char *q, *k, *v;
};
FusedOperands fused_operands(const Tensor& qkv, const checks::AttentionDims& d) {
  char* base = static_cast<char*>(const_cast<void*>(qkv.raw()));
  const int64_t r = d.NH / d.G, head = d.HS * int64_t(qkv.element_size());
  return {Tensor(), base, base + r * head, base + (r + 1) * head};
}
void place_query_heads_apart(FusedOperands& f, const checks::AttentionDims& d, const Tensor& like) {
  if (d.NH == d.G) return;
  f.copy = Tensor::empty({d.S, d.B, d.NH, d.HS}, like.dtype(), like.device());
  f.q = static_cast<char*>(f.copy.raw());
}
// GQA's query heads between the fused tensor and f.copy (to_fused: into the fused tensor).
void copy_query_heads(Tensor& fused, FusedOperands& f, const checks::AttentionDims& d, bool to_fused) {
  if (!f.copy.defined()) return;
  Tensor none;
  copy_heads(fused, f.copy, none, none, attention_detail::cuda_dims(d, f.copy), to_fused);
}
}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionParams& params) {
  const checks::AttentionDims d =
      checks::check_attention_forward(out, lse, q, k, v, params, attention_detail::kCudaAttention);
  const CudnnAttention a = cudnn_attention_separate(d, q.dtype(), params);
  if (q.numel() > 0 && cudnn_attention_applies(a, params, {out.raw(), lse.raw(), q.raw(), k.raw(), v.raw()}))
    return cudnn_attention_forward(a, out.raw(), lse.data<float>(), q.raw(), k.raw(), v.raw(), params.cu_seqlens);
  flash_attention_forward(out, lse, q, k, v, params);
}

void cuda::attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& params) {
  const checks::AttentionDims d =
      checks::check_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, params, attention_detail::kCudaAttention);
  const CudnnAttention a = cudnn_attention_separate(d, q.dtype(), params);
  const std::initializer_list<const void*> operands = {dq.raw(), dk.raw(), dv.raw(),  dout.raw(), q.raw(),
                                                       k.raw(),  v.raw(),  out.raw(), lse.raw()};
  if (q.numel() > 0 && cudnn_attention_applies(a, params, operands))
    return cudnn_attention_backward(a, dq.raw(), dk.raw(), dv.raw(), dout.raw(), q.raw(), k.raw(), v.raw(), out.raw(),
                                    lse.data<float>(), params.cu_seqlens);
  flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, params);
}

void cuda::qkv_split(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv) {
  // qkv is only read on this path; qkv_copy takes it mutable to share the index arithmetic with merge.
  Tensor fused = qkv;
  qkv_copy(fused, q, k, v, false);
}

void cuda::qkv_merge(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  Tensor q = dq, k = dk, v = dv;  // read only on this path (shallow handles, no copies)
  qkv_copy(dqkv, q, k, v, true);
}

void cuda::attention_forward_qkv(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t num_heads,
                                 const AttentionParams& params) {
  const checks::AttentionDims d =
      checks::check_attention_forward_qkv(out, lse, qkv, num_heads, params, attention_detail::kCudaAttention);
  const CudnnAttention a = cudnn_attention_fused(d, qkv.dtype(), params);
  FusedOperands f = fused_operands(qkv, d);
  if (qkv.numel() > 0 && cudnn_attention_applies(a, params, {out.raw(), lse.raw(), qkv.raw(), f.k, f.v})) {
    Tensor source = qkv;  // read only (copy_heads takes the fused side mutable for the merge)
    place_query_heads_apart(f, d, qkv);
    copy_query_heads(source, f, d, false);
    return cudnn_attention_forward(a, out.raw(), lse.data<float>(), f.q, f.k, f.v, params.cu_seqlens);
  }
  attention_forward_qkv_by_definition(out, lse, qkv, num_heads, params);
}

void cuda::attention_backward_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                  const Tensor& lse, int64_t num_heads, const AttentionParams& params) {
  const checks::AttentionDims d = checks::check_attention_backward_qkv(dqkv, dout, qkv, out, lse, num_heads, params,
                                                                       attention_detail::kCudaAttention);
  const CudnnAttention a = cudnn_attention_fused(d, qkv.dtype(), params);
  FusedOperands f = fused_operands(qkv, d), df = fused_operands(dqkv, d);
  if (qkv.numel() > 0 &&
      cudnn_attention_applies(a, params,
                              {dqkv.raw(), df.k, df.v, dout.raw(), qkv.raw(), f.k, f.v, out.raw(), lse.raw()})) {
    Tensor source = qkv;
    place_query_heads_apart(f, d, qkv);
    place_query_heads_apart(df, d, dqkv);
    copy_query_heads(source, f, d, false);
    cudnn_attention_backward(a, df.q, df.k, df.v, dout.raw(), f.q, f.k, f.v, out.raw(), lse.data<float>(),
                             params.cu_seqlens);
    return copy_query_heads(dqkv, df, d, true);  // dq into its heads of dqkv
  }
  attention_backward_qkv_by_definition(dqkv, dout, qkv, out, lse, num_heads, params);
}

}  // namespace megatron::ops
