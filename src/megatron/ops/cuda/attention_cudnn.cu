// Attention through cuDNN's graph API: the forward and backward graphs (attention_cudnn.h has
// their maths), the plan cache and the routing rules. The graphs have the shapes cuDNN's fused
// flash-attention engines recognise (those cudnn-frontend's composite SDPA nodes lower to): the
// causal mask as GEN_INDEX rows and columns, CMP_GE and BINARY_SELECT with -inf; softmax as
// max / sub / exp / sum / div with the stats max + log(sum); the transposed operands as strides
// (k^T, v^T) or reshapes (p^T, ds^T); the backward's dq through an f32 accumulator tensor and
// D = rowsum(dout * out) through an f32 tensor, both in our workspace. Packed documents add the
// ragged batch (attention_cudnn.h) as cudnn-frontend's SDPA nodes lower it: ragged offsets on the
// operands, the matmuls' M/N/K overrides by the actual lengths, and the padding mask (GEN_INDEX,
// CMP_LT against the lengths, LOGICAL_AND, BINARY_SELECT) after the scale.
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
#include "megatron/ops/cuda/cudnn_ragged_batch.h"
#include "megatron/ops/cuda/op_paths.h"

namespace megatron::ops::cuda {
namespace {

using megatron::cuda::CudnnGraph;
using megatron::cuda::CudnnMatmul;
using megatron::cuda::CudnnPlan;
using megatron::cuda::CudnnRagged;
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
  // Packed documents (the ragged batch), int32 in the workspace: actual lengths, element offsets.
  kSeqLenQ,
  kSeqLenKv,
  kQOffsets,
  kKOffsets,
  kVOffsets,
  kOutOffsets,
  kStatsOffsets,
  kDkHeads,  // backward, packed GQA: dk, dv per query head before the sum over each group
  kDvHeads,
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
  Dims4 q_dims, kv_dims, kt_dims, scores, scores_t_strides, scores_strides, rows, row_strides, stats_strides, q_packed;
  Dims4 q_strides, k_strides, kt_strides, v_strides, vt_strides, out_strides;
};

Shapes shapes_of(const CudnnAttention& a) {
  const int64_t B = a.B, NH = a.NH, G = a.G, S = a.S, HS = a.HS;
  // A packed batch entry (document) spans S positions, where it starts comes from its ragged offset.
  const auto batch_stride = [&a](const std::array<int64_t, 3>& st) {
    return std::array<int64_t, 3>{a.packed() ? a.S * st[2] : st[0], st[1], st[2]};
  };
  const auto q = batch_stride(a.q_strides);
  const auto k = batch_stride(a.k_strides);
  const auto v = batch_stride(a.v_strides);
  const auto o = batch_stride(a.out_strides);
  return Shapes{
      .q_dims = {B, NH, S, HS},
      .kv_dims = {B, G, S, HS},
      .kt_dims = {B, G, HS, S},
      .scores = {B, NH, S, S},
      .scores_t_strides = {NH * S * S, S * S, 1, S},  // (keys, queries) view of the scores
      .scores_strides = {NH * S * S, S * S, S, 1},
      .rows = {B, NH, S, 1},
      .row_strides = {NH * S, S, 1, 1},  // lse (B,NH,S), and on-chip row values
      // The softmax stats in memory: lse, or packed, token-major (tokens, NH) at ragged offsets.
      .stats_strides = a.packed() ? Dims4{S * NH, 1, NH, 1} : Dims4{NH * S, S, 1, 1},
      .q_packed = {NH * S * HS, S * HS, HS, 1},
      .q_strides = {q[0], q[1], q[2], 1},
      .k_strides = {k[0], k[1], k[2], 1},
      .kt_strides = {k[0], k[1], 1, k[2]},
      .v_strides = {v[0], v[1], v[2], 1},
      .vt_strides = {v[0], v[1], 1, v[2]},
      .out_strides = {o[0], o[1], o[2], 1},
  };
}

// The ragged batch's tensors of one graph: each entry's actual length (B,1,1,1) (bound twice, as
// the queries' and the keys') and the ragged offsets (B+1,1,1,1) of each operand and of the stats
// (lse, and the backward's D); none for a regular batch, where the helpers below give no offsets,
// no matmul overrides and no padding mask.
struct Ragged {
  bool on = false;
  CudnnTensor seq_q, seq_kv, q, k, v, out, stats;
  CudnnRagged offsets(const CudnnTensor& t) const { return on ? &t : nullptr; }
  // Matmul sizes: M queries x N keys (q k^T, dout v^T), M queries over K keys (p v, ds k), M keys
  // over K queries (p^T dout, ds^T q).
  CudnnMatmul queries_by_keys() const { return on ? CudnnMatmul{.m = &seq_q, .n = &seq_kv} : CudnnMatmul{}; }
  CudnnMatmul queries_over_keys() const { return on ? CudnnMatmul{.m = &seq_q, .k = &seq_kv} : CudnnMatmul{}; }
  CudnnMatmul keys_over_queries() const { return on ? CudnnMatmul{.m = &seq_kv, .k = &seq_q} : CudnnMatmul{}; }
};

Ragged ragged_tensors(CudnnGraph& g, const CudnnAttention& a) {
  if (!a.packed()) return {};
  const Dims4 lengths = {a.B, 1, 1, 1}, offsets = {a.B + 1, 1, 1, 1}, unit = {1, 1, 1, 1};
  return Ragged{.on = true,
                .seq_q = g.tensor(kSeqLenQ, CUDNN_DATA_INT32, lengths, unit),
                .seq_kv = g.tensor(kSeqLenKv, CUDNN_DATA_INT32, lengths, unit),
                .q = g.tensor(kQOffsets, CUDNN_DATA_INT32, offsets, unit),
                .k = g.tensor(kKOffsets, CUDNN_DATA_INT32, offsets, unit),
                .v = g.tensor(kVOffsets, CUDNN_DATA_INT32, offsets, unit),
                .out = g.tensor(kOutOffsets, CUDNN_DATA_INT32, offsets, unit),
                .stats = g.tensor(kStatsOffsets, CUDNN_DATA_INT32, offsets, unit)};
}

// s_ij where row i < len_q and column j < len_kv of its batch entry, the masked value elsewhere.
CudnnTensor padding_mask(CudnnGraph& g, const CudnnTensor& s, const Ragged& r, const CudnnTensor& masked) {
  const CudnnTensor row =
      g.pointwise_virtual(CUDNN_POINTWISE_GEN_INDEX, s, {.math = CUDNN_DATA_INT32, .axis = 2}, CUDNN_DATA_INT32);
  const CudnnTensor col =
      g.pointwise_virtual(CUDNN_POINTWISE_GEN_INDEX, s, {.math = CUDNN_DATA_INT32, .axis = 3}, CUDNN_DATA_INT32);
  const CudnnTensor row_in =
      g.pointwise_virtual(CUDNN_POINTWISE_CMP_LT, row, {.b = &r.seq_q, .math = CUDNN_DATA_BOOLEAN}, CUDNN_DATA_BOOLEAN);
  const CudnnTensor col_in = g.pointwise_virtual(CUDNN_POINTWISE_CMP_LT, col,
                                                 {.b = &r.seq_kv, .math = CUDNN_DATA_BOOLEAN}, CUDNN_DATA_BOOLEAN);
  const CudnnTensor keep = g.pointwise_virtual(CUDNN_POINTWISE_LOGICAL_AND, row_in,
                                               {.b = &col_in, .math = CUDNN_DATA_BOOLEAN}, CUDNN_DATA_BOOLEAN);
  return g.pointwise_virtual(CUDNN_POINTWISE_BINARY_SELECT, s, {.b = &masked, .t = &keep});
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
// Packed: masked beyond each entry's lengths as well.
CudnnTensor scores(CudnnGraph& g, const Shapes& sh, const CudnnTensor& q, const CudnnTensor& kt,
                   const CudnnTensor& scale, const Ragged& r, const CudnnTensor& masked) {
  const CudnnTensor qk = g.matmul_virtual(q, kt, sh.scores, sh.scores_strides, CUDNN_DATA_FLOAT, r.queries_by_keys());
  const CudnnTensor scaled = g.pointwise_virtual(CUDNN_POINTWISE_MUL, qk, {.b = &scale});
  return r.on ? padding_mask(g, scaled, r, masked) : scaled;
}

// The masked-score scalar is bound when a mask uses it.
bool uses_mask(const CudnnAttention& a) { return a.causal || a.packed(); }

// Elements one operand spans: rows x positions x heads of HS under strides {row, head, position}
// (the size of a buffer laid out like it).
int64_t span_elements(const std::array<int64_t, 3>& strides, int64_t rows, int64_t heads, int64_t positions,
                      int64_t HS) {
  return (rows - 1) * strides[0] + (heads - 1) * strides[1] + (positions - 1) * strides[2] + HS;
}

// Packed GQA: dk or dv per query head, laid out like dk, dv with r = NH/G times their rows and
// positions (what cuDNN assumes when it scales dk's ragged offsets by r for them).
std::array<int64_t, 3> per_query_head_strides(const CudnnAttention& a, const std::array<int64_t, 3>& kv) {
  const int64_t r = a.NH / a.G;
  return {kv[0] * r, kv[1], kv[2] * r};
}
Dims4 packed_strides(const CudnnAttention& a, const std::array<int64_t, 3>& st) {
  return {a.S * st[2], st[1], st[2], 1};
}

std::unique_ptr<CudnnPlan> forward_plan(const CudnnAttention& a, cudnnHandle_t handle, std::string* why) {
  const Shapes sh = shapes_of(a);
  const cudnnDataType_t io = cudnn_dtype(a.dtype);
  CudnnGraph g;
  const Ragged r = ragged_tensors(g, a);
  const CudnnTensor q = g.tensor(kQ, io, sh.q_dims, sh.q_strides, r.offsets(r.q));
  const CudnnTensor kt = g.tensor(kK, io, sh.kt_dims, sh.kt_strides, r.offsets(r.k));
  const CudnnTensor v = g.tensor(kV, io, sh.kv_dims, sh.v_strides, r.offsets(r.v));
  const CudnnTensor out = g.tensor(kOut, io, sh.q_dims, sh.out_strides, r.offsets(r.out));
  const CudnnTensor lse = g.tensor(kLse, CUDNN_DATA_FLOAT, sh.rows, sh.stats_strides, r.offsets(r.stats));
  const CudnnTensor scale = g.scalar(kScale, CUDNN_DATA_FLOAT);
  const CudnnTensor masked = uses_mask(a) ? g.scalar(kNegInf, CUDNN_DATA_FLOAT) : CudnnTensor{};
  CudnnTensor s = scores(g, sh, q, kt, scale, r, masked);
  if (a.causal) s = causal_mask(g, s, masked);
  const CudnnTensor max = g.reduction_virtual(CUDNN_REDUCE_TENSOR_MAX, s, sh.rows, sh.row_strides);
  const CudnnTensor shifted = g.pointwise_virtual(CUDNN_POINTWISE_SUB, s, {.b = &max});
  const CudnnTensor e = g.pointwise_virtual(CUDNN_POINTWISE_EXP, shifted);
  const CudnnTensor sum = g.reduction_virtual(CUDNN_REDUCE_TENSOR_ADD, e, sh.rows, sh.row_strides);
  const CudnnTensor log_sum = g.pointwise_virtual(CUDNN_POINTWISE_LOG, sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, lse, {.b = &log_sum});
  const CudnnTensor p = g.pointwise_virtual(CUDNN_POINTWISE_DIV, e, {.b = &sum}, io);  // P V runs in the io dtype
  g.matmul(p, v, out, r.queries_over_keys());
  return g.build(handle, why);
}

std::unique_ptr<CudnnPlan> backward_plan(const CudnnAttention& a, cudnnHandle_t handle, std::string* why) {
  const Shapes sh = shapes_of(a);
  const cudnnDataType_t io = cudnn_dtype(a.dtype);
  const bool gqa = a.G != a.NH;
  CudnnGraph g;
  const Ragged r = ragged_tensors(g, a);
  const CudnnTensor q = g.tensor(kQ, io, sh.q_dims, sh.q_strides, r.offsets(r.q));
  const CudnnTensor kt = g.tensor(kK, io, sh.kt_dims, sh.kt_strides, r.offsets(r.k));
  const CudnnTensor vt = g.tensor(kV, io, sh.kt_dims, sh.vt_strides, r.offsets(r.v));
  const CudnnTensor out = g.tensor(kOut, io, sh.q_dims, sh.out_strides, r.offsets(r.out));
  const CudnnTensor dout = g.tensor(kDout, io, sh.q_dims, sh.out_strides, r.offsets(r.out));
  const CudnnTensor lse = g.tensor(kLse, CUDNN_DATA_FLOAT, sh.rows, sh.stats_strides, r.offsets(r.stats));
  const CudnnTensor dq = g.tensor(kDq, io, sh.q_dims, sh.q_strides, r.offsets(r.q));
  const CudnnTensor dk = g.tensor(kDk, io, sh.kv_dims, sh.k_strides, r.offsets(r.k));
  const CudnnTensor dv = g.tensor(kDv, io, sh.kv_dims, sh.v_strides, r.offsets(r.v));
  const CudnnTensor row_dot = g.tensor(kRowDot, CUDNN_DATA_FLOAT, sh.rows, sh.stats_strides, r.offsets(r.stats));
  // Packed: ragged like dq, and D like the stats (sized by the tokens; cudnn-frontend's
  // max_total_seq_len form).
  const CudnnTensor dq_accum = a.deterministic ? CudnnTensor{}
                               : r.on          ? g.tensor(kDqAccum, CUDNN_DATA_FLOAT, sh.q_dims, sh.q_strides, &r.q)
                                               : g.tensor(kDqAccum, CUDNN_DATA_FLOAT, sh.q_dims, sh.q_packed);
  const CudnnTensor scale = g.scalar(kScale, CUDNN_DATA_FLOAT);
  const CudnnTensor one = g.scalar(kOne, CUDNN_DATA_FLOAT);
  const CudnnTensor masked = uses_mask(a) ? g.scalar(kNegInf, CUDNN_DATA_FLOAT) : CudnnTensor{};
  const Dims4 per_query_head = {a.B, a.NH, a.S, a.HS};
  // GQA's dk, dv per query head, summed per group: on chip, or packed in the workspace, ragged like
  // dk, dv (cudnn-frontend's max_total_seq_len form).
  const auto group_sum = [&](int64_t uid, const CudnnTensor& a_op, const CudnnTensor& b_op, const CudnnTensor& grad,
                             const std::array<int64_t, 3>& strides, const CudnnTensor& offsets) {
    if (!gqa) return g.matmul(a_op, b_op, grad, r.keys_over_queries());
    const CudnnTensor heads =
        r.on ? g.tensor(uid, io, per_query_head, packed_strides(a, per_query_head_strides(a, strides)), &offsets)
             : g.virtual_tensor(io, per_query_head, sh.q_packed);
    g.matmul(a_op, b_op, heads, r.keys_over_queries());
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, heads, grad);
  };

  // D = rowsum(dout * out) (times 1: the place of the dropout scale in cuDNN's pattern).
  const CudnnTensor dout_out = g.pointwise_virtual(CUDNN_POINTWISE_MUL, dout, {.b = &out});
  const CudnnTensor dot = g.reduction_virtual(CUDNN_REDUCE_TENSOR_ADD, dout_out, sh.rows, sh.row_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, dot, row_dot, {.b = &one});

  // p = exp(s - lse), masked; dv = p^T dout (GQA: over all query heads, then summed per group).
  CudnnTensor s = scores(g, sh, q, kt, scale, r, masked);
  s = g.pointwise_virtual(CUDNN_POINTWISE_SUB, s, {.b = &lse});
  // cuDNN 9.0-9.9 wants the padding mask again once the stats are subtracted (as cudnn-frontend).
  if (r.on && cudnn_version() >= 90000 && cudnn_version() < 91000) s = padding_mask(g, s, r, masked);
  if (a.causal) s = causal_mask(g, s, masked);
  const CudnnTensor p = g.pointwise_virtual(CUDNN_POINTWISE_EXP, s);
  const CudnnTensor p_t = g.reshape_virtual(p, io, sh.scores, sh.scores_t_strides);
  group_sum(kDvHeads, p_t, dout, dv, a.v_strides, r.v);

  // ds = p (dout v^T - D) scale; dk = ds^T q; dq = ds k.
  const CudnnTensor dp =
      g.matmul_virtual(dout, vt, sh.scores, sh.scores_strides, CUDNN_DATA_FLOAT, r.queries_by_keys());
  const CudnnTensor dp_centered = g.pointwise_virtual(CUDNN_POINTWISE_SUB, dp, {.b = &row_dot});
  const CudnnTensor dp_p = g.pointwise_virtual(CUDNN_POINTWISE_MUL, dp_centered, {.b = &p});
  const CudnnTensor ds = g.pointwise_virtual(CUDNN_POINTWISE_MUL, dp_p, {.b = &scale});
  const CudnnTensor ds_t = g.reshape_virtual(ds, io, sh.scores, sh.scores_t_strides);
  group_sum(kDkHeads, ds_t, q, dk, a.k_strides, r.k);
  const CudnnTensor k = g.reshape_virtual(kt, io, sh.kv_dims, sh.k_strides, r.offsets(r.k));
  if (a.deterministic) {
    g.matmul(ds, k, dq, r.queries_over_keys());
  } else {
    g.matmul(ds, k, dq_accum, r.queries_over_keys());
    g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
  }
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
                      int64_t(std::bit_cast<uint32_t>(a.softmax_scale)), a.packed_rows, a.packed_row_length,
                      int64_t(a.deterministic)})
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
  // A descriptor cuDNN rejects while the graph is built (an attribute or an operation's finalize,
  // named in the error) means no plan as well: the ragged graphs' attributes are newer than the
  // rest, and a release without them must fall back, not fail.
  const char* pass = "forward";
  try {
    plans->forward = forward_plan(a, ctx.cudnn(), &why);
    pass = "backward";
    if (plans->forward) plans->backward = backward_plan(a, ctx.cudnn(), &why);
  } catch (const megatron::Error& e) {
    why = e.what();
  }
  if (!plans->forward || !plans->backward) {
    plans->why_not = std::string(pass) + " graph: " + why;
    LOG_WARN("cuDNN attention: no plan for B=" << a.B << " NH=" << a.NH << " G=" << a.G << " S=" << a.S << " HS="
                                               << a.HS << " " << dtype_name(a.dtype) << (a.causal ? " causal" : " full")
                                               << (a.packed() ? " packed documents (ragged batch)" : "") << " (cuDNN "
                                               << cudnn_version() << "; " << plans->why_not
                                               << "; attribute numbers as in cudnn_graph.h); using the built-in "
                                               << "attention kernels");
  }
  return *cache.plans.emplace(key, std::move(plans)).first->second;
}

// Offsets in the workspace of one launch: cuDNN's part, then our tensors, each at a 256-byte
// boundary.
constexpr int64_t round_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Workspace bytes from the caching allocator, on the current device (freed in stream order).
Tensor workspace(int64_t bytes, int device) {
  return Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::u8, Device::cuda(device));
}

// Consecutive 256-byte aligned pieces of one workspace.
class WorkspaceLayout {
 public:
  int64_t add(int64_t bytes) {
    const int64_t at = size_;
    size_ += round_up(bytes);
    return at;
  }
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
};

// ---- packed documents: the bucketed graph and the arrays a launch binds -----------------------

int64_t next_power_of_two(int64_t n) { return int64_t(std::bit_ceil(uint64_t(std::max<int64_t>(n, 1)))); }

// `a` (of the operands' own B, S) as the ragged batch of params.cu_seqlens' documents.
CudnnAttention packed_form(CudnnAttention a, const AttentionParams& params) {
  if (!params.cu_seqlens.defined()) return a;
  const int64_t documents = params.cu_seqlens.numel() - 1;
  const int64_t longest = params.max_seqlen > 0 ? params.max_seqlen : a.S;
  a.packed_rows = a.B;
  a.packed_row_length = a.S;
  a.B = next_power_of_two(documents);
  a.S = std::min(next_power_of_two(std::max<int64_t>(longest, 64)), (a.S + 63) / 64 * 64);
  return a;
}

// The ragged batch's int32 arrays in a launch's workspace: lengths, then the offsets of q, k, v,
// out and the stats; and the stats themselves, token-major f32.
struct RaggedArrays {
  int64_t lengths, offsets[kRaggedTensors], stats;
  static RaggedArrays place(const CudnnAttention& a, WorkspaceLayout& ws) {
    RaggedArrays r{};
    r.lengths = ws.add(a.B * int64_t(sizeof(int32_t)));
    for (int64_t& o : r.offsets) o = ws.add((a.B + 1) * int64_t(sizeof(int32_t)));
    r.stats = ws.add(stats_elements(a) * int64_t(sizeof(float)));
    return r;
  }
  // The packed stats' (and D's) elements: one per token and query head.
  static int64_t stats_elements(const CudnnAttention& a) { return a.packed_rows * a.packed_row_length * a.NH; }
};

RaggedBatch ragged_batch(const CudnnAttention& a, const Tensor& cu_seqlens) {
  MEGATRON_CHECK(cu_seqlens.defined() && cu_seqlens.device().is_cuda() && cu_seqlens.dtype() == DType::i32,
                 "cuDNN attention: a packed graph needs cu_seqlens, i32 on the GPU");
  const int64_t documents = cu_seqlens.numel() - 1;
  MEGATRON_CHECK(documents >= 1 && documents <= a.B, "cuDNN attention: " << documents << " documents for a graph of "
                                                                         << a.B << " batch entries; build the graph "
                                                                         << "from the same params");
  return RaggedBatch{cu_seqlens.data<int32_t>(), documents, a.B, a.packed_rows, a.packed_row_length};
}

// Computes the arrays in the workspace at `base` from cu_seqlens and appends their bindings to
// uids/data.
void bind_ragged(const CudnnAttention& a, const Tensor& cu_seqlens, const RaggedArrays& at, char* base,
                 std::vector<int64_t>& uids, std::vector<void*>& data) {
  const auto strides = [](const std::array<int64_t, 3>& st) { return RowStrides{st[0], st[2]}; };
  const RowStrides stats{a.packed_row_length * a.NH, a.NH};  // (tokens, NH)
  int32_t* lengths = reinterpret_cast<int32_t*>(base + at.lengths);
  std::array<int32_t*, kRaggedTensors> offsets{};
  for (size_t i = 0; i < offsets.size(); ++i) offsets[i] = reinterpret_cast<int32_t*>(base + at.offsets[i]);
  ragged_batch_arrays(ragged_batch(a, cu_seqlens),
                      {strides(a.q_strides), strides(a.k_strides), strides(a.v_strides), strides(a.out_strides), stats},
                      lengths, offsets);
  for (int64_t uid : {kSeqLenQ, kSeqLenKv}) {
    uids.push_back(uid);
    data.push_back(lengths);
  }
  const int64_t offset_uids[kRaggedTensors] = {kQOffsets, kKOffsets, kVOffsets, kOutOffsets, kStatsOffsets};
  for (size_t i = 0; i < offsets.size(); ++i) {
    uids.push_back(offset_uids[i]);
    data.push_back(offsets[i]);
  }
}

// Elements the operands of `a` span in memory: q (and dq), k (dk).
int64_t q_span(const CudnnAttention& a) {
  return span_elements(a.q_strides, a.packed_rows, a.NH, a.packed_row_length, a.HS);
}

}  // namespace

bool cudnn_ragged_batch_supported() {
  if (cudnn_version() < 90600) return false;
  int major = 0;
  CUDA_CHECK(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, megatron::cuda::current_context().device()));
  return major >= 9;
}

int64_t cudnn_runtime_version() { return int64_t(cudnn_version()); }

CudnnAttention cudnn_attention_separate(const checks::AttentionDims& d, DType dtype, const AttentionParams& params) {
  return packed_form(CudnnAttention{.B = d.B,
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
                                    .out_strides = {d.NH * d.HS, d.HS, d.B * d.NH * d.HS},
                                    .deterministic = params.deterministic},
                     params);
}

CudnnAttention cudnn_attention_fused(const checks::AttentionDims& d, DType dtype, const AttentionParams& params) {
  CudnnAttention a = cudnn_attention_separate(d, dtype, params);
  const int64_t head = (d.NH / d.G + 2) * d.HS;  // a group's [q.. | k | v] in qkv
  const std::array<int64_t, 3> fused = {d.G * head, head, d.B * d.G * head};
  a.k_strides = a.v_strides = fused;
  if (d.NH == d.G) a.q_strides = fused;
  return a;
}

bool cudnn_attention_applies(const CudnnAttention& a, const AttentionParams& params,
                             std::initializer_list<const void*> operands) {
  if (a.dtype != DType::bf16 && a.dtype != DType::f16) return false;
  if (a.HS != 64 && a.HS != 128) return false;
  if (params.dropout_p != 0.0f) return false;      // our mask contract (counter-based, as on the CPU)
  if (params.segment_ids.defined()) return false;  // document masking: our kernels
  if (params.window >= 0) return false;            // sliding window: our kernels
  if (a.packed() != params.cu_seqlens.defined()) return false;  // `a` built from other params
  if (a.packed()) {
    const int64_t tokens = a.packed_rows * a.packed_row_length;
    // One row (Megatron's THD): a document then starts at a whole token of the (S,B,...) layout;
    // with B > 1 rows interleave, and cuDNN's ragged offsets are token starts, not arbitrary ones.
    if (a.packed_rows != 1) return false;
    if (!cudnn_ragged_batch_supported()) return false;
    // int32 offsets; a grid mostly of tiles past the documents' ends.
    const int64_t int32_limit = int64_t(1) << 31;
    if (q_span(a) >= int32_limit ||
        span_elements(a.k_strides, a.packed_rows, a.G, a.packed_row_length, a.HS) >= int32_limit)
      return false;
    if (a.B * a.S > kPackedPaddingLimit * tokens) return false;
  }
  for (const void* p : operands)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return plans_for(cache, a, megatron::cuda::current_context()).why_not.empty();
}

void cudnn_attention_forward(const CudnnAttention& a, void* out, float* lse, const void* q, const void* k,
                             const void* v, const Tensor& cu_seqlens) {
  megatron::cuda::DeviceContext& ctx = megatron::cuda::current_context();
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const Plans& plans = plans_for(cache, a, ctx);
  MEGATRON_CHECK(plans.why_not.empty(), "cuDNN attention forward: cuDNN has no plan for this graph ("
                                            << plans.why_not << "); route through cudnn_attention_applies");
  WorkspaceLayout layout;
  const int64_t plan_at = layout.add(plans.forward->workspace_bytes());
  const RaggedArrays ragged = a.packed() ? RaggedArrays::place(a, layout) : RaggedArrays{};
  Tensor ws = workspace(layout.size(), ctx.device());
  char* base = static_cast<char*>(ws.raw());
  float* stats = a.packed() ? reinterpret_cast<float*>(base + ragged.stats) : lse;
  float scale = a.softmax_scale, masked = masked_score();
  std::vector<int64_t> uids = {kQ, kK, kV, kOut, kLse, kScale};
  std::vector<void*> data = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, stats, &scale};
  if (uses_mask(a)) {
    uids.push_back(kNegInf);
    data.push_back(&masked);
  }
  if (a.packed()) bind_ragged(a, cu_seqlens, ragged, base, uids, data);
  plans.forward->execute(ctx.cudnn(), megatron::cuda::current_stream(), uids, data, base + plan_at);
  if (a.packed()) {
    ragged_stats_copy(a.packed_rows, a.NH, a.packed_row_length, stats, lse, true);
    count_op_path(OpPath::attention_forward_cudnn_packed);
  } else {
    count_op_path(OpPath::attention_forward_cudnn);
  }
}

void cudnn_attention_backward(const CudnnAttention& a, void* dq, void* dk, void* dv, const void* dout, const void* q,
                              const void* k, const void* v, const void* out, const float* lse,
                              const Tensor& cu_seqlens) {
  megatron::cuda::DeviceContext& ctx = megatron::cuda::current_context();
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const Plans& plans = plans_for(cache, a, ctx);
  MEGATRON_CHECK(plans.why_not.empty(), "cuDNN attention backward: cuDNN has no plan for this graph ("
                                            << plans.why_not << "); route through cudnn_attention_applies");
  const int64_t f32 = int64_t(sizeof(float));
  const bool packed_gqa = a.packed() && a.G != a.NH;
  WorkspaceLayout layout;
  const int64_t plan_at = layout.add(plans.backward->workspace_bytes());
  const int64_t row_dot_at = layout.add((a.packed() ? RaggedArrays::stats_elements(a) : a.B * a.NH * a.S) * f32);
  // The dq accumulator: (B,NH,S,HS) contiguous, or for packed documents ragged like dq (its span);
  // none in the deterministic graph.
  const int64_t dq_accum_bytes = a.deterministic ? 0 : (a.packed() ? q_span(a) : a.B * a.NH * a.S * a.HS) * f32;
  const int64_t dq_accum_at = layout.add(dq_accum_bytes);
  // Packed GQA's per-query-head dk, dv (io dtype; f32-sized as cudnn-frontend sizes them).
  const int64_t heads_bytes =
      packed_gqa
          ? span_elements(per_query_head_strides(a, a.k_strides), a.packed_rows, a.NH, a.packed_row_length, a.HS) * f32
          : 0;
  const int64_t dk_heads_at = packed_gqa ? layout.add(heads_bytes) : 0;
  const int64_t dv_heads_at = packed_gqa ? layout.add(heads_bytes) : 0;
  const RaggedArrays ragged = a.packed() ? RaggedArrays::place(a, layout) : RaggedArrays{};
  Tensor ws = workspace(layout.size(), ctx.device());
  char* base = static_cast<char*>(ws.raw());
  void* row_dot = base + row_dot_at;
  void* dq_accum = base + dq_accum_at;
  const cudaStream_t stream = megatron::cuda::current_stream();
  // cuDNN zeroes the dq accumulator itself from 9.6 on.
  if (cudnn_version() < 90600 && dq_accum_bytes > 0)
    CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, size_t(dq_accum_bytes), stream));
  const float* stats = lse;
  if (a.packed()) {
    float* token_major = reinterpret_cast<float*>(base + ragged.stats);
    ragged_stats_copy(a.packed_rows, a.NH, a.packed_row_length, token_major, const_cast<float*>(lse), false);
    stats = token_major;
  }
  float scale = a.softmax_scale, one = 1.0f, masked = masked_score();
  std::vector<int64_t> uids = {kQ, kK, kV, kOut, kDout, kLse, kDq, kDk, kDv, kRowDot, kScale, kOne};
  std::vector<void*> data = {const_cast<void*>(q),
                             const_cast<void*>(k),
                             const_cast<void*>(v),
                             const_cast<void*>(out),
                             const_cast<void*>(dout),
                             const_cast<float*>(stats),
                             dq,
                             dk,
                             dv,
                             row_dot,
                             &scale,
                             &one};
  if (!a.deterministic) {
    uids.push_back(kDqAccum);
    data.push_back(dq_accum);
  }
  if (uses_mask(a)) {
    uids.push_back(kNegInf);
    data.push_back(&masked);
  }
  if (packed_gqa) {
    uids.insert(uids.end(), {kDkHeads, kDvHeads});
    data.insert(data.end(), {base + dk_heads_at, base + dv_heads_at});
  }
  if (a.packed()) bind_ragged(a, cu_seqlens, ragged, base, uids, data);
  plans.backward->execute(ctx.cudnn(), stream, uids, data, base + plan_at);
  count_op_path(a.packed() ? OpPath::attention_backward_cudnn_packed : OpPath::attention_backward_cudnn);
  if (a.deterministic) count_op_path(OpPath::attention_backward_cudnn_deterministic);
}

}  // namespace megatron::ops::cuda
