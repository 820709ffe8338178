// Attention through cuDNN's graph API: the forward and backward graphs (attention_cudnn.h has
// their maths), the plan cache and the routing rules. The graphs have the shapes cuDNN's fused
// flash-attention engines recognise (those cudnn-frontend's composite SDPA nodes lower to): the
// causal mask as GEN_INDEX rows and columns, CMP_GE and BINARY_SELECT with -inf; softmax as
// max / sub / exp / sum / div with the stats max + log(sum); the transposed operands as strides
// (k^T, v^T) or reshapes (p^T, ds^T); the backward's dq through an f32 accumulator tensor and
// D = rowsum(dout * out) through an f32 tensor, both in our workspace.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "megatron/core/logging.h"
#include "megatron/core/tensor.h"
#include "megatron/cuda_runtime/context.h"
#include "megatron/cuda_runtime/cuda_check.h"
#include "megatron/ops/cuda/attention_cudnn.h"
#include "megatron/ops/cuda/cudnn_plan.h"
#include "megatron/ops/cuda/op_paths.h"

namespace megatron::ops::cuda {
namespace {

using megatron::cuda::CudnnGraph;
using megatron::cuda::CudnnPlan;
using megatron::cuda::CudnnTensor;
using Dims4 = std::vector<int64_t>;

// Uids of the tensors bound at execution (virtual tensors are numbered by CudnnGraph).
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kOut,
  kLse,
  kScale,
  kNegInf,
  kOne,
  kDout,
  kDq,
  kDk,
  kDv,
  kRowDot,   // backward: D = rowsum(dout * out), f32 in the workspace
  kDqAccum,  // backward: dq accumulated in f32 in the workspace
};

size_t cudnn_version() { return cudnnGetVersion(); }

cudnnDataType_t cudnn_dtype(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    case DType::f16:
      return CUDNN_DATA_HALF;
    default:
      break;
  }
  MEGATRON_FAIL("cuDNN attention: dtype " << dtype_name(dtype) << " has no cuDNN graph; use bf16 or f16");
}

// The masked-score value: cuDNN before 9.10 wants the lowest float, later releases -inf.
float masked_score() {
  return cudnn_version() < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
}

// Shapes in cuDNN's [B, H, S, D] order.
struct Shapes {
  Dims4 q_dims, kv_dims, kt_dims, scores, scores_t_strides, scores_strides, rows, row_strides, q_packed;
  Dims4 q_strides, k_strides, kt_strides, v_strides, vt_strides, out_strides;
};

Shapes shapes_of(const CudnnAttention& a) {
  const int64_t B = a.B, NH = a.NH, G = a.G, S = a.S, HS = a.HS;
  const auto& q = a.q_strides;
  const auto& k = a.k_strides;
  const auto& v = a.v_strides;
  const auto& o = a.out_strides;
  return Shapes{
      .q_dims = {B, NH, S, HS},
      .kv_dims = {B, G, S, HS},
      .kt_dims = {B, G, HS, S},
      .scores = {B, NH, S, S},
      .scores_t_strides = {NH * S * S, S * S, 1, S},  // (keys, queries) view of the scores
      .scores_strides = {NH * S * S, S * S, S, 1},
      .rows = {B, NH, S, 1},
      .row_strides = {NH * S, S, 1, 1},  // lse (B,NH,S)
      .q_packed = {NH * S * HS, S * HS, HS, 1},
      .q_strides = {q[0], q[1], q[2], 1},
      .k_strides = {k[0], k[1], k[2], 1},
      .kt_strides = {k[0], k[1], 1, k[2]},
      .v_strides = {v[0], v[1], v[2], 1},
      .vt_strides = {v[0], v[1], 1, v[2]},
      .out_strides = {o[0], o[1], o[2], 1},
  };
}

// s_ij for j <= i, the masked value (-inf) for j > i.
CudnnTensor causal_mask(CudnnGraph& g, const CudnnTensor& s, const CudnnTensor& masked) {
  const CudnnTensor row = g.pointwise_virtual(CUDNN_POINTWISE_GEN_INDEX, s, {.axis = 2}, CUDNN_DATA_INT32);
  const CudnnTensor col = g.pointwise_virtual(CUDNN_POINTWISE_GEN_INDEX, s, {.axis = 3}, CUDNN_DATA_INT32);
  const CudnnTensor keep =
      g.pointwise_virtual(CUDNN_POINTWISE_CMP_GE, row, {.b = &col, .math = CUDNN_DATA_BOOLEAN}, CUDNN_DATA_BOOLEAN);
  return g.pointwise_virtual(CUDNN_POINTWISE_BINARY_SELECT, s, {.b = &masked, .t = &keep});
}

// scale q k^T: the scores of both graphs (masked by the caller).
CudnnTensor scores(CudnnGraph& g, const Shapes& sh, const CudnnTensor& q, const CudnnTensor& kt,
                   const CudnnTensor& scale) {
  const CudnnTensor qk = g.matmul_virtual(q, kt, sh.scores, sh.scores_strides);
  return g.pointwise_virtual(CUDNN_POINTWISE_MUL, qk, {.b = &scale});
}

std::unique_ptr<CudnnPlan> forward_plan(const CudnnAttention& a, cudnnHandle_t handle, std::string* why) {
  const Shapes sh = shapes_of(a);
  const cudnnDataType_t io = cudnn_dtype(a.dtype);
  CudnnGraph g;
  const CudnnTensor q = g.tensor(kQ, io, sh.q_dims, sh.q_strides);
  const CudnnTensor kt = g.tensor(kK, io, sh.kt_dims, sh.kt_strides);
  const CudnnTensor v = g.tensor(kV, io, sh.kv_dims, sh.v_strides);
  const CudnnTensor out = g.tensor(kOut, io, sh.q_dims, sh.out_strides);
  const CudnnTensor lse = g.tensor(kLse, CUDNN_DATA_FLOAT, sh.rows, sh.row_strides);
  const CudnnTensor scale = g.scalar(kScale, CUDNN_DATA_FLOAT);
  CudnnTensor s = scores(g, sh, q, kt, scale);
  if (a.causal) s = causal_mask(g, s, g.scalar(kNegInf, CUDNN_DATA_FLOAT));
  const CudnnTensor max = g.reduction_virtual(CUDNN_REDUCE_TENSOR_MAX, s, sh.rows, sh.row_strides);
  const CudnnTensor shifted = g.pointwise_virtual(CUDNN_POINTWISE_SUB, s, {.b = &max});
  const CudnnTensor e = g.pointwise_virtual(CUDNN_POINTWISE_EXP, shifted);
  const CudnnTensor sum = g.reduction_virtual(CUDNN_REDUCE_TENSOR_ADD, e, sh.rows, sh.row_strides);
  const CudnnTensor log_sum = g.pointwise_virtual(CUDNN_POINTWISE_LOG, sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, lse, {.b = &log_sum});
  const CudnnTensor p = g.pointwise_virtual(CUDNN_POINTWISE_DIV, e, {.b = &sum}, io);  // P V runs in the io dtype
  g.matmul(p, v, out);
  return g.build(handle, why);
}

std::unique_ptr<CudnnPlan> backward_plan(const CudnnAttention& a, cudnnHandle_t handle, std::string* why) {
  const Shapes sh = shapes_of(a);
  const cudnnDataType_t io = cudnn_dtype(a.dtype);
  const bool gqa = a.G != a.NH;
  CudnnGraph g;
  const CudnnTensor q = g.tensor(kQ, io, sh.q_dims, sh.q_strides);
  const CudnnTensor kt = g.tensor(kK, io, sh.kt_dims, sh.kt_strides);
  const CudnnTensor vt = g.tensor(kV, io, sh.kt_dims, sh.vt_strides);
  const CudnnTensor out = g.tensor(kOut, io, sh.q_dims, sh.out_strides);
  const CudnnTensor dout = g.tensor(kDout, io, sh.q_dims, sh.out_strides);
  const CudnnTensor lse = g.tensor(kLse, CUDNN_DATA_FLOAT, sh.rows, sh.row_strides);
  const CudnnTensor dq = g.tensor(kDq, io, sh.q_dims, sh.q_strides);
  const CudnnTensor dk = g.tensor(kDk, io, sh.kv_dims, sh.k_strides);
  const CudnnTensor dv = g.tensor(kDv, io, sh.kv_dims, sh.v_strides);
  const CudnnTensor row_dot = g.tensor(kRowDot, CUDNN_DATA_FLOAT, sh.rows, sh.row_strides);
  const CudnnTensor dq_accum = g.tensor(kDqAccum, CUDNN_DATA_FLOAT, sh.q_dims, sh.q_packed);
  const CudnnTensor scale = g.scalar(kScale, CUDNN_DATA_FLOAT);
  const CudnnTensor one = g.scalar(kOne, CUDNN_DATA_FLOAT);

  // D = rowsum(dout * out) (times 1: the place of the dropout scale in cuDNN's pattern).
  const CudnnTensor dout_out = g.pointwise_virtual(CUDNN_POINTWISE_MUL, dout, {.b = &out});
  const CudnnTensor dot = g.reduction_virtual(CUDNN_REDUCE_TENSOR_ADD, dout_out, sh.rows, sh.row_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, dot, row_dot, {.b = &one});

  // p = exp(s - lse), masked; dv = p^T dout (GQA: over all query heads, then summed per group).
  CudnnTensor s = scores(g, sh, q, kt, scale);
  s = g.pointwise_virtual(CUDNN_POINTWISE_SUB, s, {.b = &lse});
  if (a.causal) s = causal_mask(g, s, g.scalar(kNegInf, CUDNN_DATA_FLOAT));
  const CudnnTensor p = g.pointwise_virtual(CUDNN_POINTWISE_EXP, s);
  const CudnnTensor p_t = g.reshape_virtual(p, io, sh.scores, sh.scores_t_strides);
  const Dims4 per_query_head = {a.B, a.NH, a.S, a.HS};
  if (gqa) {
    const CudnnTensor dv_heads = g.matmul_virtual(p_t, dout, per_query_head, sh.q_packed, io);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_heads, dv);
  } else {
    g.matmul(p_t, dout, dv);
  }

  // ds = p (dout v^T - D) scale; dk = ds^T q; dq = ds k.
  const CudnnTensor dp = g.matmul_virtual(dout, vt, sh.scores, sh.scores_strides);
  const CudnnTensor dp_centered = g.pointwise_virtual(CUDNN_POINTWISE_SUB, dp, {.b = &row_dot});
  const CudnnTensor dp_p = g.pointwise_virtual(CUDNN_POINTWISE_MUL, dp_centered, {.b = &p});
  const CudnnTensor ds = g.pointwise_virtual(CUDNN_POINTWISE_MUL, dp_p, {.b = &scale});
  const CudnnTensor ds_t = g.reshape_virtual(ds, io, sh.scores, sh.scores_t_strides);
  if (gqa) {
    const CudnnTensor dk_heads = g.matmul_virtual(ds_t, q, per_query_head, sh.q_packed, io);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_heads, dk);
  } else {
    g.matmul(ds_t, q, dk);
  }
  const CudnnTensor k = g.reshape_virtual(kt, io, sh.kv_dims, sh.k_strides);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
  return g.build(handle, why);
}

// ---- plan cache -----------------------------------------------------------------------------

struct Key {
  CudnnAttention a;
  int device;
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& key) const {
    const CudnnAttention& a = key.a;
    size_t h = std::hash<int>{}(key.device);
    const auto mix = [&h](int64_t v) { h = h * 1000003u ^ std::hash<int64_t>{}(v); };
    for (int64_t v : {a.B, a.NH, a.G, a.S, a.HS, int64_t(a.dtype), int64_t(a.causal),
                      int64_t(std::bit_cast<uint32_t>(a.softmax_scale))})
      mix(v);
    for (const auto* strides : {&a.q_strides, &a.k_strides, &a.v_strides, &a.out_strides})
      for (int64_t v : *strides) mix(v);
    return h;
  }
};

// Both plans of one graph key, or the reason cuDNN has none.
struct Plans {
  std::unique_ptr<CudnnPlan> forward, backward;
  std::string why_not;
};

// Plans live for the process (never erased, so references stay valid outside the lock). One mutex
// serialises plan building and launches: a launch binds the device's one cuDNN handle to the
// caller's stream (cudnnSetStream) and must not interleave with another thread's.
struct PlanCache {
  std::mutex mutex;
  std::unordered_map<Key, std::unique_ptr<Plans>, KeyHash> plans;
};
PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

// The plans of `a` on the current device, built on first use. Call with the cache locked.
const Plans& plans_for(PlanCache& cache, const CudnnAttention& a, megatron::cuda::DeviceContext& ctx) {
  const Key key{a, ctx.device()};
  auto it = cache.plans.find(key);
  if (it != cache.plans.end()) return *it->second;
  auto plans = std::make_unique<Plans>();
  std::string why;
  plans->forward = forward_plan(a, ctx.cudnn(), &why);
  if (plans->forward) plans->backward = backward_plan(a, ctx.cudnn(), &why);
  if (!plans->forward || !plans->backward) {
    plans->why_not = std::string(plans->forward ? "backward " : "forward ") + why;
    LOG_WARN("cuDNN attention: no plan for B=" << a.B << " NH=" << a.NH << " G=" << a.G << " S=" << a.S << " HS="
                                               << a.HS << " " << dtype_name(a.dtype) << (a.causal ? " causal" : " full")
                                               << " (" << plans->why_not << "); using the built-in attention kernels");
  }
  return *cache.plans.emplace(key, std::move(plans)).first->second;
}

// Offsets in the workspace of one launch: cuDNN's part, then our f32 tensors, each at a 256-byte
// boundary.
constexpr int64_t round_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Workspace bytes from the caching allocator, on the current device (freed in stream order).
Tensor workspace(int64_t bytes, int device) {
  return Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::u8, Device::cuda(device));
}

}  // namespace

CudnnAttention cudnn_attention_separate(const checks::AttentionDims& d, DType dtype, const AttentionParams& params) {
  return CudnnAttention{.B = d.B,
                        .NH = d.NH,
                        .G = d.G,
                        .S = d.S,
                        .HS = d.HS,
                        .dtype = dtype,
                        .causal = params.causal,
                        .softmax_scale = params.softmax_scale,
                        .q_strides = {d.NH * d.HS, d.HS, d.B * d.NH * d.HS},
                        .k_strides = {d.G * d.HS, d.HS, d.B * d.G * d.HS},
                        .v_strides = {d.G * d.HS, d.HS, d.B * d.G * d.HS},
                        .out_strides = {d.NH * d.HS, d.HS, d.B * d.NH * d.HS}};
}

CudnnAttention cudnn_attention_fused_mha(int64_t S, int64_t B, int64_t NH, int64_t HS, DType dtype,
                                         const AttentionParams& params) {
  const std::array<int64_t, 3> fused = {NH * 3 * HS, 3 * HS, B * NH * 3 * HS};
  return CudnnAttention{.B = B,
                        .NH = NH,
                        .G = NH,
                        .S = S,
                        .HS = HS,
                        .dtype = dtype,
                        .causal = params.causal,
                        .softmax_scale = params.softmax_scale,
                        .q_strides = fused,
                        .k_strides = fused,
                        .v_strides = fused,
                        .out_strides = {NH * HS, HS, B * NH * HS}};
}

bool cudnn_attention_applies(const CudnnAttention& a, const AttentionParams& params,
                             std::initializer_list<const void*> operands) {
  if (a.dtype != DType::bf16 && a.dtype != DType::f16) return false;
  if (a.HS != 64 && a.HS != 128) return false;
  if (params.dropout_p != 0.0f) return false;      // our mask contract (counter-based, as on the CPU)
  if (params.segment_ids.defined()) return false;  // document masking: our kernels
  if (params.cu_seqlens.defined()) return false;   // packed documents: our kernels (attention_cudnn.h)
  if (params.window >= 0) return false;            // sliding window: our kernels
  for (const void* p : operands)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return plans_for(cache, a, megatron::cuda::current_context()).why_not.empty();
}

void cudnn_attention_forward(const CudnnAttention& a, void* out, float* lse, const void* q, const void* k,
                             const void* v) {
  megatron::cuda::DeviceContext& ctx = megatron::cuda::current_context();
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const Plans& plans = plans_for(cache, a, ctx);
  MEGATRON_CHECK(plans.why_not.empty(), "cuDNN attention forward: cuDNN has no plan for this graph ("
                                            << plans.why_not << "); route through cudnn_attention_applies");
  Tensor ws = workspace(plans.forward->workspace_bytes(), ctx.device());
  float scale = a.softmax_scale, masked = masked_score();
  std::vector<int64_t> uids = {kQ, kK, kV, kOut, kLse, kScale};
  std::vector<void*> data = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, lse, &scale};
  if (a.causal) {
    uids.push_back(kNegInf);
    data.push_back(&masked);
  }
  plans.forward->execute(ctx.cudnn(), megatron::cuda::current_stream(), uids, data, ws.raw());
  count_op_path(OpPath::attention_forward_cudnn);
}

void cudnn_attention_backward(const CudnnAttention& a, void* dq, void* dk, void* dv, const void* dout, const void* q,
                              const void* k, const void* v, const void* out, const float* lse) {
  megatron::cuda::DeviceContext& ctx = megatron::cuda::current_context();
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const Plans& plans = plans_for(cache, a, ctx);
  MEGATRON_CHECK(plans.why_not.empty(), "cuDNN attention backward: cuDNN has no plan for this graph ("
                                            << plans.why_not << "); route through cudnn_attention_applies");
  const int64_t plan_bytes = round_up(plans.backward->workspace_bytes());
  const int64_t row_dot_bytes = round_up(a.B * a.NH * a.S * int64_t(sizeof(float)));
  const int64_t dq_accum_bytes = a.B * a.NH * a.S * a.HS * int64_t(sizeof(float));
  Tensor ws = workspace(plan_bytes + row_dot_bytes + dq_accum_bytes, ctx.device());
  char* base = static_cast<char*>(ws.raw());
  void* row_dot = base + plan_bytes;
  void* dq_accum = base + plan_bytes + row_dot_bytes;
  const cudaStream_t stream = megatron::cuda::current_stream();
  // cuDNN zeroes the dq accumulator itself from 9.6 on.
  if (cudnn_version() < 90600) CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, size_t(dq_accum_bytes), stream));
  float scale = a.softmax_scale, one = 1.0f, masked = masked_score();
  std::vector<int64_t> uids = {kQ, kK, kV, kOut, kDout, kLse, kDq, kDk, kDv, kRowDot, kDqAccum, kScale, kOne};
  std::vector<void*> data = {const_cast<void*>(q),
                             const_cast<void*>(k),
                             const_cast<void*>(v),
                             const_cast<void*>(out),
                             const_cast<void*>(dout),
                             const_cast<float*>(lse),
                             dq,
                             dk,
                             dv,
                             row_dot,
                             dq_accum,
                             &scale,
                             &one};
  if (a.causal) {
    uids.push_back(kNegInf);
    data.push_back(&masked);
  }
  plans.backward->execute(ctx.cudnn(), stream, uids, data, base);
  count_op_path(OpPath::attention_backward_cudnn);
}

}  // namespace megatron::ops::cuda
