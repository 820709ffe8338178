#pragma once
// Core attention with grouped-query heads (flash-attention contract), and Megatron's fused QKV
// layout. Backward overwrites dq, dk, dv (dqkv). dtypes: f32, bf16, f16 and f64 on the CPU; f32,
// bf16 and f16 on CUDA.
#include <cstdint>

#include "megatron/core/rng.h"
#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

struct AttentionParams {
  bool causal = true;
  float softmax_scale = 1.0f;  // usually 1/sqrt(HS)
  float dropout_p = 0.0f;
  uint64_t seed = 0;
  uint64_t stream = 0;
  int64_t head_offset = 0;   // global index of this rank's first query head (dropout index)
  int64_t total_heads = 0;   // global number of query heads; 0 = NH (no tensor parallelism)
  Tensor segment_ids{};      // undefined = one document per sequence
  Tensor key_segment_ids{};  // the keys' own segment ids where they differ from the queries'; undefined = segment_ids
  Tensor cu_seqlens{};       // packed documents (the variable-length path); undefined = one per sequence
  int64_t window = -1;       // sliding window: query i sees keys j >= i - window; -1 = unlimited
  int64_t max_seqlen = 0;    // with cu_seqlens: a bound on the documents' lengths; 0 = S (see below)
  // The backward's bits the same on every run (Megatron's --deterministic-mode): the CPU op always
  // is; on CUDA, dq is then summed without float atomics (cuDNN's dP-workspace kernels, or our
  // generic kernels), at some speed and, on cuDNN, a (B,NH,S,S) 16-bit workspace.
  bool deterministic = false;
};

// q (S,B,NH,HS); k, v (S,B,G,HS) with NH % G == 0; query head h reads kv group h / (NH/G).
// out (S,B,NH,HS) = softmax(scale * q k^T [+ causal mask]) v, with dropout on the
// probabilities (mask from CounterRng{seed, stream}, element index ((b*NH + h)*S + i)*S + j,
// kept when uniform > p, kept values scaled by 1/(1-p)). Under tensor parallelism a rank holds
// query heads [head_offset, head_offset + NH) of total_heads: h and NH in that index are the
// global ones, so the masks, like the model, do not depend on TP.
// segment_ids (B,S) i32, optional (document masking, Megatron's --reset-attention-mask): query i
// sees key j only when both carry the same segment id (and, causally, j <= i). A query row that
// sees no key gets out = 0, lse = -inf.
// key_segment_ids (B,S) i32, optional, only with segment_ids: the keys' segment ids when the keys
// are other positions than the queries (a block of context parallelism's ring attention, whose
// query and key chunks come from different places of the sequence): query i then sees key j when
// segment_ids[b,i] == key_segment_ids[b,j].
// cu_seqlens (N+1) i32, optional, not with segment_ids (packed documents, flash attention's varlen
// cu_seqlens and Megatron's PackedSeqParams for the THD format, generalised to B rows): the
// cumulative lengths of N documents laid end to end over the batch-major token index t = b*S + s:
// 0 = cu[0] <= cu[1] <= ... <= cu[N] = B*S, every row start b*S among them (a document never
// crosses rows; B = 1 is Megatron's THD). Query (i, b) sees key (j, b) when both lie in one
// document: the masks of segment ids numbering the documents, computed without them. The
// variable-length path does work proportional to sum_d len_d^2, not S^2: the CPU loops over each
// query's document only; the CUDA kernels skip the key tiles outside a query tile's documents
// and mask only the tiles that straddle a boundary, cuDNN's ragged batch runs a document per batch
// entry (ops/cuda/attention_cudnn.h). max_seqlen (Megatron's PackedSeqParams max_seqlen_q, flash
// attention's max_seqlen) bounds the documents' lengths for cuDNN's graph shape; 0 means S. Values
// are checked where they are readable (a CPU tensor: check_cu_seqlens below); a CUDA tensor and
// its max_seqlen must come from checked host values (longest_document below).
// window >= 0 (sliding-window attention, Megatron's --window-size, left size): query i also hides
// keys j < i - window, so it sees at most window + 1 keys causally.
// lse (B,NH,S) f32 (f64 for f64 q): log-sum-exp of each row of the scaled scores, returned so
// backward recomputes the probabilities instead of storing them.
MEGATRON_OP(attention_forward, void(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionParams& params));
MEGATRON_OP(attention_backward,
            void(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                 const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& params));

// The packed-documents form of segment ids (B,S) i32 on the CPU whose documents are contiguous
// runs (a document's id differs from the one before it; the loader's ids from EOD tokens are):
// cu_seqlens (N+1) i32 on the CPU, a boundary at every change of id and at every row start.
// Errors when an id reappears after another (a document that is not one run), naming the place.
Tensor packed_cu_seqlens(const Tensor& segment_ids);
// Rejects cu_seqlens (a CPU tensor) that break the rules above for B rows of S positions, or hold a
// document longer than max_seqlen (0 = S), naming the first broken one.
void check_cu_seqlens(const Tensor& cu_seqlens, int64_t B, int64_t S, int64_t max_seqlen = 0);
// The longest document of cu_seqlens (a CPU tensor): AttentionParams::max_seqlen.
int64_t longest_document(const Tensor& cu_seqlens);

// The log-sum-exp merge of two attentions of the same queries over disjoint sets of keys (context
// parallelism's ring attention): rows [row_offset, row_offset + Sb) of out (S,B,NH,HS) and
// lse (B,NH,S) hold one partial result, block_out (Sb,B,NH,HS) and block_lse (B,NH,Sb) the other;
// those rows become the attention over both key sets:
//   lse' = log(exp(lse) + exp(block_lse)),  out' = out exp(lse - lse') + block_out exp(block_lse - lse').
// A row that saw no key of one side (its lse is -inf) takes the other side's values. lse and
// block_lse are f32 (f64 for f64 out), as attention_forward returns them.
MEGATRON_OP(attention_merge,
            void(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse, int64_t row_offset));

// Fused QKV (Megatron's per-query-group layout): qkv (S,B,G,(r+2)*HS), r = NH/G; each group
// holds its r query heads, then one key head, then one value head (qkv_head below). split copies
// them out to q (S,B,NH,HS), k, v (S,B,G,HS); merge is its backward (overwrites dqkv).
MEGATRON_OP(qkv_split, void(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv));
MEGATRON_OP(qkv_merge, void(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv));

// Attention on the q, k, v that split would cut from qkv (NH = num_heads), the backward
// overwriting dqkv with the merge of dq, dk, dv: by definition (and on the CPU) split + attention
// (+ merge), attention_*_qkv_by_definition below; CUDA reads q, k, v in place and writes dqkv in
// place where cuDNN runs the MHA layout (G == NH), sparing the copies.
MEGATRON_OP(attention_forward_qkv,
            void(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t num_heads, const AttentionParams& params));
MEGATRON_OP(attention_backward_qkv, void(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                         const Tensor& lse, int64_t num_heads, const AttentionParams& params));

// ---- the fused layout, written once for both backends and their callers ----------------------

// Head t of query group g in row sb (= s*B + b), in units of one head (HS elements): the fused
// qkv holds it at head index `fused` = (sb*G + g)*(r+2) + t; it is query head (sb*G + g)*r + t of
// q (S,B,NH,HS) for t < r, and head sb*G + g of k (t = r) or v (t = r + 1).
struct QkvHead {
  int64_t fused;
  int tensor;  // 0: q, 1: k, 2: v
  int64_t separate;
};
MEGATRON_HD QkvHead qkv_head(int64_t sb, int64_t g, int64_t t, int64_t G, int64_t r) {
  const int64_t fused = (sb * G + g) * (r + 2) + t;
  if (t < r) return {fused, 0, (sb * G + g) * r + t};
  return {fused, int(t - r) + 1, sb * G + g};
}

// Uninitialised q (S,B,NH,HS), k and v (S,B,G,HS) for the split of qkv (S,B,G,(NH/G+2)*HS),
// NH = num_heads, in qkv's dtype and on its device (the shapes of dq, dk, dv as well).
struct SplitQkv {
  Tensor q, k, v;
};
SplitQkv empty_split_qkv(const Tensor& qkv, int64_t num_heads);

// attention_forward_qkv / attention_backward_qkv by their definition, on the backend that owns
// qkv (split, attention, merge through that backend's ops): all of the CPU's, and CUDA's where
// cuDNN cannot read the fused layout. The caller has checked the arguments.
void attention_forward_qkv_by_definition(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t num_heads,
                                         const AttentionParams& params);
void attention_backward_qkv_by_definition(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                          const Tensor& lse, int64_t num_heads, const AttentionParams& params);

}  // namespace megatron::ops
