#pragma once
// Ring attention (Megatron's context parallelism with --cp-comm-type p2p; the ring itself lives in
// Transformer Engine there): causal attention over a sequence split over the CP group in the
// load-balanced layout (load_balance.h). Each rank holds q, k, v of its two chunks (local rows
// [0, L): chunk r, [L, 2L): chunk 2C-1-r). The keys and values (with their segment ids) travel
// around the ring: at step i a rank holds those of rank src = (r - i) mod C and computes
//   i = 0     : causal attention of its q over its own k, v (the diagonal blocks; one op call),
//   src < r   : both q chunks over the first kv chunk, unmasked (the second lies in the future),
//   src > r   : the second q chunk over both kv chunks, unmasked (the first q chunk sees none),
// each block an L x L call of ops::attention_forward, merged into the running (out, lse) by
// ops::attention_merge. The transfer of step i+1's keys and values runs beside step i's blocks.
// Backward is symmetric: the keys and values go round again beside each step's block backward,
// and the gradients of each rank's keys and values travel with them, each rank adding its blocks'
// share, back to their owner after the last step. Every block's backward reads the merged out and
// lse, so its probabilities are the full softmax's.
//
// The functions keep the op's contract (ops/attention.h) on the local rows: out (2L,B,NH,HS),
// lse (B,NH,2L) merged over the whole sequence; backward overwrites dq, dk, dv. What backward needs
// is the op's own operands (q, k, v, out, lse), so the caller's Saved holds them as it does for
// the op (transformer/attention.h). Supported: causal, GQA, document masking (segment_ids of the
// local rows); the callers refuse dropout and sliding windows under CP before any work.
#include "megatron/ops/attention.h"
#include "megatron/parallel/comm.h"

namespace megatron::context_parallel {

// One L x L block of a ring step: local query chunk `q_half` over the held key chunk `kv_half`
// (0: the owner's first chunk, 1: its second), unmasked.
struct RingBlock {
  int q_half = 0;
  int kv_half = 0;
  bool operator==(const RingBlock&) const = default;
};
// The unmasked blocks of step `step` on rank `rank` of `size` (step 0, the causal diagonal, has none).
std::vector<RingBlock> ring_step_blocks(int64_t step, int64_t rank, int64_t size);

void ring_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                            const ops::AttentionParams& params, Communicator& cp);
void ring_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse, const ops::AttentionParams& params,
                             Communicator& cp);

// The same blocks with the other transport, Megatron's --cp-comm-type allgather: every rank's keys,
// values (and segment ids) are all-gathered once instead of passed around, step i's blocks read
// rank (r - i) mod C's rows of the gathered copy, and backward adds every block's dk, dv into a
// gathered-size buffer (this rank's step 0 into its own rows) that one reduce-scatter sums back to
// the owners. Less overlap than the ring (the gather comes first) and C times the keys' memory, for
// fewer, larger transfers. Same contract and restrictions as the ring.
void all_gather_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const ops::AttentionParams& params, Communicator& cp);
void all_gather_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                   const ops::AttentionParams& params, Communicator& cp);

}  // namespace megatron::context_parallel
