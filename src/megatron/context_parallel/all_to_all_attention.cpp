#include "megatron/context_parallel/all_to_all_attention.h"

#include <functional>

#include "megatron/context_parallel/ring_attention.h"
#include "megatron/core/error.h"
#include "megatron/ops/elementwise.h"

namespace megatron::context_parallel {

namespace {

// Rows of 2C equal chunks between rank order (rank j's local halves: chunks j and 2C-1-j) and the
// sequence's true order, either way; any dtype. Under a2a+p2p the C ranks of an all-to-all group
// are consecutive CP ranks p·C .. p·C+C-1 (rank_layout.h), so the same order puts their chunks
// together as chunks p and 2P-1-p of 2P: the ring's local layout over the P groups.
void reorder_chunks(Tensor& dst, const Tensor& src, int64_t C, bool to_true_order) {
  const Tensor from = src.view({2 * C, -1});
  Tensor to = dst.view({2 * C, -1});
  for (int64_t j = 0; j < C; ++j) {
    for (int64_t half = 0; half < 2; ++half) {
      const int64_t rank_row = 2 * j + half, true_row = half == 0 ? j : 2 * C - 1 - j;
      Tensor d = to.slice(to_true_order ? true_row : rank_row, (to_true_order ? true_row : rank_row) + 1);
      d.copy_from(from.slice(to_true_order ? rank_row : true_row, (to_true_order ? rank_row : true_row) + 1));
    }
  }
}

// x (2L,B,H,HS), this rank's chunks of every head -> (2CL,B,H/C,HS), the group's chunks in true
// order (the whole sequence for plain a2a) for this rank's head group (heads [rank·H/C, (rank+1)·H/C)).
Tensor to_heads(const Tensor& x, Communicator& cp) {
  const int64_t C = cp.size(), S2 = x.dim(0), B = x.dim(1), Hc = x.dim(2) / C, HS = x.dim(3);
  Tensor by_group = Tensor::empty({C, S2 * B, Hc * HS}, x.dtype(), x.device());  // chunk j: head group j
  ops::transpose01(by_group, x.view({S2 * B, C, Hc * HS}));
  Tensor by_rank = Tensor::empty(by_group.shape(), x.dtype(), x.device());  // chunk j: rank j's rows
  cp.all_to_all(by_rank, by_group);
  Tensor full = Tensor::empty({C * S2, B, Hc, HS}, x.dtype(), x.device());
  reorder_chunks(full, by_rank, C, /*to_true_order=*/true);
  return full;
}

// The inverse: full (S,B,H/C,HS) of this rank's head group -> x (2L,B,H,HS), written in place.
void from_heads(Tensor& x, const Tensor& full, Communicator& cp) {
  const int64_t C = cp.size(), S2 = full.dim(0) / C, B = full.dim(1), Hc = full.dim(2), HS = full.dim(3);
  Tensor by_rank = Tensor::empty({C, S2 * B, Hc * HS}, full.dtype(), full.device());
  reorder_chunks(by_rank, full, C, /*to_true_order=*/false);
  Tensor by_group = Tensor::empty(by_rank.shape(), full.dtype(), full.device());
  cp.all_to_all(by_group, by_rank);
  Tensor rows = x.view({S2 * B, C, Hc * HS});
  ops::transpose01(rows, by_group);
}

// lse (B,NH,2L) of the local rows <-> (B,NH/C,S) of this rank's heads, through the sequence-major
// (2L,B,NH,1) form the head exchange takes.
Tensor lse_to_heads(const Tensor& lse, Communicator& cp) {
  const int64_t B = lse.dim(0), NH = lse.dim(1), S2 = lse.dim(2);
  Tensor sequence_major = Tensor::empty({S2, B * NH}, lse.dtype(), lse.device());
  ops::transpose01(sequence_major, lse.view({B * NH, S2}));
  const Tensor full = to_heads(sequence_major.view({S2, B, NH, 1}), cp);  // (S,B,NH/C,1)
  Tensor heads = Tensor::empty({B, full.dim(2), full.dim(0)}, lse.dtype(), lse.device());
  Tensor heads_rows = heads.view({B * full.dim(2), full.dim(0)});
  ops::transpose01(heads_rows, full.view({full.dim(0), B * full.dim(2)}));
  return heads;
}

void lse_from_heads(Tensor& lse, const Tensor& heads, Communicator& cp) {
  const int64_t B = heads.dim(0), NHc = heads.dim(1), S = heads.dim(2), NH = lse.dim(1), S2 = lse.dim(2);
  Tensor full = Tensor::empty({S, B, NHc, 1}, heads.dtype(), heads.device());
  Tensor full_rows = full.view({S, B * NHc});
  ops::transpose01(full_rows, heads.view({B * NHc, S}));
  Tensor local = Tensor::empty({S2, B, NH, 1}, heads.dtype(), heads.device());
  from_heads(local, full, cp);
  Tensor lse_rows = lse.view({B * NH, S2});
  ops::transpose01(lse_rows, local.view({S2, B * NH}));
}

// The group's segment ids (B,2CL) in true order from each rank's (B,2L).
Tensor gather_segments(const Tensor& local, Communicator& cp) {
  const int64_t C = cp.size(), B = local.dim(0), S2 = local.dim(1);
  Tensor sequence_major = Tensor::empty({S2, B}, DType::i32, local.device());
  ops::transpose01(sequence_major, local);
  Tensor by_rank = Tensor::empty({C, S2, B}, DType::i32, local.device());
  cp.all_gather(by_rank, sequence_major);
  Tensor in_order = Tensor::empty({C * S2, B}, DType::i32, local.device());
  reorder_chunks(in_order, by_rank, C, /*to_true_order=*/true);
  Tensor segments = Tensor::empty({B, C * S2}, DType::i32, local.device());
  ops::transpose01(segments, in_order);
  return segments;
}

// The attention parameters of the group's rows for this rank's head group.
ops::AttentionParams group_rows_params(const ops::AttentionParams& params, int64_t heads, Communicator& cp) {
  MEGATRON_CHECK(!params.key_segment_ids.defined(), "all-to-all attention takes the queries' segment ids only");
  ops::AttentionParams p = params;
  if (params.segment_ids.defined()) p.segment_ids = gather_segments(params.segment_ids, cp);
  p.total_heads = params.total_heads == 0 ? heads : params.total_heads;
  p.head_offset = params.head_offset + cp.rank() * (heads / cp.size());
  return p;
}

void check_heads(const Tensor& q, const Tensor& k, int64_t C) {
  MEGATRON_CHECK(q.ndim() == 4 && k.ndim() == 4 && q.dim(2) % C == 0 && k.dim(2) % C == 0,
                 "all-to-all attention splits the " << q.dim(2) << " query heads and " << k.dim(2)
                                                    << " key/value heads over " << C
                                                    << " context-parallel ranks: both must divide by it");
}

DType lse_dtype(const Tensor& q) { return q.dtype() == DType::f64 ? DType::f64 : DType::f32; }

// Attention over the group's rows of this rank's head group (the op's contract): the op itself
// (a2a), or the ring over the other hierarchical level (a2a+p2p).
using AttendForward = std::function<void(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const ops::AttentionParams& params)>;
using AttendBackward =
    std::function<void(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& out, const Tensor& lse, const ops::AttentionParams& params)>;

void exchanged_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const ops::AttentionParams& params, Communicator& cp, const AttendForward& attend) {
  const int64_t C = cp.size();
  if (C == 1) return attend(out, lse, q, k, v, params);
  check_heads(q, k, C);
  const ops::AttentionParams p = group_rows_params(params, q.dim(2), cp);
  const Tensor q_heads = to_heads(q, cp), k_heads = to_heads(k, cp), v_heads = to_heads(v, cp);
  Tensor out_heads = Tensor::empty(q_heads.shape(), q.dtype(), q.device());
  Tensor lse_heads = Tensor::empty({q.dim(1), q_heads.dim(2), q_heads.dim(0)}, lse_dtype(q), q.device());
  attend(out_heads, lse_heads, q_heads, k_heads, v_heads, p);
  from_heads(out, out_heads, cp);
  lse_from_heads(lse, lse_heads, cp);
}

void exchanged_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const ops::AttentionParams& params,
                        Communicator& cp, const AttendBackward& attend) {
  const int64_t C = cp.size();
  if (C == 1) return attend(dq, dk, dv, dout, q, k, v, out, lse, params);
  check_heads(q, k, C);
  const ops::AttentionParams p = group_rows_params(params, q.dim(2), cp);
  const Tensor q_heads = to_heads(q, cp), k_heads = to_heads(k, cp), v_heads = to_heads(v, cp);
  const Tensor out_heads = to_heads(out, cp), dout_heads = to_heads(dout, cp), lse_heads = lse_to_heads(lse, cp);
  Tensor dq_heads = Tensor::empty(q_heads.shape(), q.dtype(), q.device());
  Tensor dk_heads = Tensor::empty(k_heads.shape(), k.dtype(), k.device());
  Tensor dv_heads = Tensor::empty(v_heads.shape(), v.dtype(), v.device());
  attend(dq_heads, dk_heads, dv_heads, dout_heads, q_heads, k_heads, v_heads, out_heads, lse_heads, p);
  from_heads(dq, dq_heads, cp);
  from_heads(dk, dk_heads, cp);
  from_heads(dv, dv_heads, cp);
}

}  // namespace

void all_to_all_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const ops::AttentionParams& params, Communicator& cp) {
  exchanged_forward(out, lse, q, k, v, params, cp, ops::attention_forward);
}

void all_to_all_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                   const ops::AttentionParams& params, Communicator& cp) {
  exchanged_backward(dq, dk, dv, dout, q, k, v, out, lse, params, cp, ops::attention_backward);
}

void hierarchical_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const ops::AttentionParams& params, Communicator& a2a, Communicator& p2p) {
  exchanged_forward(out, lse, q, k, v, params, a2a,
                    [&p2p](Tensor& o, Tensor& l, const Tensor& qh, const Tensor& kh, const Tensor& vh,
                           const ops::AttentionParams& p) { ring_attention_forward(o, l, qh, kh, vh, p, p2p); });
}

void hierarchical_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                     const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                     const ops::AttentionParams& params, Communicator& a2a, Communicator& p2p) {
  exchanged_backward(
      dq, dk, dv, dout, q, k, v, out, lse, params, a2a,
      [&p2p](Tensor& dqh, Tensor& dkh, Tensor& dvh, const Tensor& douth, const Tensor& qh, const Tensor& kh,
             const Tensor& vh, const Tensor& outh, const Tensor& lseh, const ops::AttentionParams& p) {
        ring_attention_backward(dqh, dkh, dvh, douth, qh, kh, vh, outh, lseh, p, p2p);
      });
}

}  // namespace megatron::context_parallel
