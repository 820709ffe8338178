#pragma once
// Core attention through cuDNN's fused flash-attention graphs (graph API, ops/cuda/cudnn_plan.h):
// on Hopper, cuDNN's wgmma/TMA kernels are 1.4-2.4x faster than our mma.sync kernels
// (docs/PERFORMANCE.md, "Attention kernels"). The CUDA attention ops route here when
// cudnn_attention_applies() says so, else run our kernels; both follow ops/attention.h's contract.
//
// Graphs, in cuDNN's [B, H, S, D] order (q, out: H = NH; k, v: H = G, broadcast over the query
// heads of each group):
//   forward   s = scale q k^T (causal: s_ij = -inf for j > i); lse = max_j s + log sum_j exp(s - max)
//             (cuDNN's softmax "stats"), p = exp(s - max) / sum; out = p v
//   backward  D_i = sum_e dout_ie out_ie; p = exp(s - lse); dv = p^T dout; ds = p (dout v^T - D) scale;
//             dk = ds^T q; dq = ds k (accumulated in f32 in the workspace, then rounded; written
//             directly where the run asks for the same bits every time: CudnnAttention::deterministic)
// The backward reads the forward's lse and out, so it is exact w.r.t. our contract whichever
// kernels produced them. GQA: dk, dv are summed over each group's query heads inside the graph.
//
// Operands are addressed through strides: separate tensors (q, out (S,B,NH,HS); k, v (S,B,G,HS))
// or read in place from the fused projection (S,B,G,(r+2)*HS), each group [r query heads | k | v]:
// k and v (and dk, dv written in place into dqkv) always, q and dq too for MHA (r = 1); GQA's
// query heads go through a (S,B,NH,HS) copy. lse (B,NH,S) f32.
//
// Packed documents (AttentionParams::cu_seqlens) run as cuDNN's ragged batch, TransformerEngine's
// THD form of the same graphs: the documents are the batch (B = their number, S = the longest),
// each operand's batch entry d starts at the element offset of its document's first token (a
// RAGGED_OFFSET_DESC tensor per operand, computed on the GPU from cu_seqlens, so no copy and no
// host sync), and each entry's actual length bounds the matmuls (GEMM M/N/K overrides) and masks
// the scores beyond it (the padding mask: row < len_q and column < len_kv). The softmax stats and
// the backward's D are ragged too, token-major (tokens, NH) in the workspace (the layout cuDNN's
// ragged stats take), copied into lse (B,NH,S) after the forward and out of it before the
// backward; the backward's dq accumulator and GQA's per-query-head dk, dv are ragged like dq, dk,
// dv: every buffer is sized by the tokens, not documents x longest. Plans are cached by shape, so
// the shape is bucketed: documents rounded up to a power of two (entries past the real ones have
// length 0), the longest document (params.max_seqlen, or S) to a power of two of at least 64, at
// most S rounded up to 64: a training run builds a few plans per (document count, longest
// length) octave, not one per micro-batch.
//
// Plans are built once per graph (the key: every field of CudnnAttention, and the device) and
// cached for the life of the process; each call takes its workspace from the caching allocator and
// runs on the current stream. Free of CUDA headers, so tests and host code can include it.
#include <array>
#include <cstdint>
#include <initializer_list>

#include "megatron/core/dtype.h"
#include "megatron/ops/attention.h"
#include "megatron/ops/checks/attention.h"

namespace megatron::ops::cuda {

// One attention problem as cuDNN sees it: everything that shapes its graphs.
struct CudnnAttention {
  int64_t B = 0, NH = 0, G = 0, S = 0, HS = 0;  // packed: B documents of at most S tokens (bucketed)
  DType dtype = DType::bf16;
  bool causal = true;
  float softmax_scale = 1.0f;
  // Element strides (batch, head, position) of q and dq, k and dk, v and dv, out and dout; the
  // head-dim stride is 1.
  std::array<int64_t, 3> q_strides{}, k_strides{}, v_strides{}, out_strides{};
  // Packed documents: the operands' own B and S, over which cu_seqlens runs (the batch stride
  // above is then a row's); 0 = a regular batch.
  int64_t packed_rows = 0, packed_row_length = 0;
  // The backward writes dq straight from its matmul instead of through the f32 accumulator:
  // cuDNN then runs its dP-workspace kernels, without atomics (cudnn-frontend's
  // set_deterministic_algorithm on Hopper); they hold dP, (B,NH,S,S) 16-bit, in the workspace.
  bool deterministic = false;
  bool packed() const { return packed_row_length > 0; }
  bool operator==(const CudnnAttention&) const = default;
};

// q, out (S,B,NH,HS); k, v (S,B,G,HS): separate tensors. Both forms take the packed documents'
// ragged batch where params.cu_seqlens is given (its document count is read from its shape).
CudnnAttention cudnn_attention_separate(const checks::AttentionDims& d, DType dtype, const AttentionParams& params);
// k and v inside the fused projection qkv (S,B,G,(NH/G+2)*HS) at element offsets r*HS and
// (r+1)*HS of each group (r = NH/G); q there too (offset 0) for MHA (r = 1), else separate
// (S,B,NH,HS) (a group's query heads are not one stride apart); out (S,B,NH,HS).
CudnnAttention cudnn_attention_fused(const checks::AttentionDims& d, DType dtype, const AttentionParams& params);

// The routing decision of the CUDA attention ops: true when `a` runs on cuDNN. Rules: bf16 or f16;
// head dim 64 or 128 (the ones measured; others keep our kernels); no attention dropout (our mask
// is counter-based and must match the CPU's, which cuDNN's RNG cannot); no segment-id document
// masking, no sliding window (our kernels); every operand address 16-byte aligned; packed documents
// (cu_seqlens) only in one row (B = 1, Megatron's THD: with several rows the (S,B,...) layout
// interleaves them, so a document would not start at a whole token), on cuDNN 9.6 or later (ragged
// GQA, token-sized backward accumulators) on sm_90 or newer, with element offsets below 2^31 and the
// graph's documents x longest (bucketed) at most kPackedPaddingLimit times the tokens (cuDNN's grid
// covers the former; beyond, it would be mostly tiles past the documents' ends); and cuDNN has
// forward and backward plans
// for the graphs on this GPU (built here on first use; a graph cuDNN rejects, at any attribute or
// finalize, is logged once with the reason and keeps our kernels).
inline constexpr int64_t kPackedPaddingLimit = 64;
// The version and device part of that rule: cuDNN 9.6 or later and an sm_90 or newer current GPU.
bool cudnn_ragged_batch_supported();
// The loaded cuDNN's version (cudnnGetVersion: major*10000 + minor*100 + patch).
int64_t cudnn_runtime_version();
bool cudnn_attention_applies(const CudnnAttention& a, const AttentionParams& params,
                             std::initializer_list<const void*> operands);

// The graphs above; require cudnn_attention_applies(a, ...). Addresses are those of the operands'
// first elements (for the fused layout: qkv or GQA's query copy, then qkv + r*HS and qkv + (r+1)*HS;
// the same for dqkv);
// cu_seqlens is params.cu_seqlens (on the GPU) where `a` is packed, else undefined.
void cudnn_attention_forward(const CudnnAttention& a, void* out, float* lse, const void* q, const void* k,
                             const void* v, const Tensor& cu_seqlens);
void cudnn_attention_backward(const CudnnAttention& a, void* dq, void* dk, void* dv, const void* dout, const void* q,
                              const void* k, const void* v, const void* out, const float* lse,
                              const Tensor& cu_seqlens);

}  // namespace megatron::ops::cuda
