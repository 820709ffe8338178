#pragma once
// All-to-all context parallelism (Megatron's --cp-comm-type a2a, DeepSpeed-Ulysses): an all-to-all
// over the CP group trades the sequence split for a head split. A rank holding its two chunks of
// the sequence (load_balance.h) for every head sends head group j to rank j and receives, from
// every rank, that rank's chunks for its own heads: the whole sequence for NH/C query heads and
// G/C key/value heads. The chunks are put back in their true order and ordinary causal attention
// runs (with the whole sequence's segment ids, gathered the same way); a second all-to-all returns
// the output, and the lse, to the sequence split. Backward repeats the forward's all-to-alls for
// q, k, v, out, lse and dout (communication instead of memory: nothing beyond the op's operands is
// saved), runs the attention backward, and returns dq, dk, dv the same way.
//
// The functions keep the attention op's contract on the local rows (ops/attention.h), like the
// ring (ring_attention.h), so a layer swaps one for the other. Heads and key/value heads (this TP
// rank's) must divide by C; the arguments check this before any work.
#include "megatron/ops/attention.h"
#include "megatron/parallel/comm.h"

namespace megatron::context_parallel {

void all_to_all_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const ops::AttentionParams& params, Communicator& cp);
void all_to_all_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                   const ops::AttentionParams& params, Communicator& cp);

// Megatron's --cp-comm-type a2a+p2p (hierarchical, Transformer Engine's a2a+p2p): the same head
// exchange over `a2a`, the first level of --hierarchical-context-parallel-sizes (consecutive CP
// ranks), around ring attention (ring_attention.h) over `p2p`, the second level. After the
// exchange a rank holds its group's 2·|a2a| chunks in true order, which are chunks p and 2P-1-p of
// the sequence cut into 2P (P = |p2p|, p its ring rank): the ring's own layout, so the ring runs
// unchanged on them for H/|a2a| heads. Heads and key/value heads must divide by |a2a|.
void hierarchical_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const ops::AttentionParams& params, Communicator& a2a, Communicator& p2p);
void hierarchical_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                     const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                     const ops::AttentionParams& params, Communicator& a2a, Communicator& p2p);

}  // namespace megatron::context_parallel
