#include "megatron/context_parallel/ring_attention.h"

#include <array>
#include <utility>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/ops/elementwise.h"

namespace megatron::context_parallel {

std::vector<RingBlock> ring_step_blocks(int64_t step, int64_t rank, int64_t size) {
  MEGATRON_CHECK(step >= 0 && step < size && rank >= 0 && rank < size,
                 "ring step " << step << " of rank " << rank << " outside a ring of " << size);
  if (step == 0) return {};
  const int64_t src = (rank - step + size) % size;
  // Chunk src precedes chunk r, which precedes 2C-1-r, which precedes 2C-1-src (src < r), and the
  // mirror image for src > r: the true positions decide which blocks are wholly visible.
  if (src < rank) return {{0, 0}, {1, 0}};
  return {{1, 0}, {1, 1}};
}

namespace {

void check_ring_params(const ops::AttentionParams& p, const Tensor& q) {
  MEGATRON_CHECK(p.causal, "ring attention is built for causal attention (GPT models) only");
  MEGATRON_CHECK(p.dropout_p == 0.0f, "ring attention has no attention dropout yet (dropout_p " << p.dropout_p << ")");
  MEGATRON_CHECK(p.window < 0, "ring attention has no sliding window yet (window " << p.window << ")");
  MEGATRON_CHECK(!p.key_segment_ids.defined(), "ring attention sets the blocks' key_segment_ids itself");
  MEGATRON_CHECK(q.ndim() == 4 && q.dim(0) % 2 == 0,
                 "ring attention: q must be (2L,B,NH,HS), the rank's two chunks, got " << shape_str(q.shape()));
}

// Rows [half·L, (half+1)·L) of a (B,NH..,2L) tensor (lse, segment ids) whose last dim is the
// sequence, as a tensor of its own: two transposes through (2L, rest), so any backend serves it.
Tensor sequence_half(const Tensor& t, int half) {
  const int64_t S = t.dim(-1), L = S / 2, rest = t.numel() / S;
  Tensor sequence_major = Tensor::empty({S, rest}, t.dtype(), t.device());
  ops::transpose01(sequence_major, t.view({rest, S}));
  Tensor out = Tensor::empty({rest, L}, t.dtype(), t.device());
  ops::transpose01(out, sequence_major.slice(half * L, (half + 1) * L));
  Shape shape = t.shape();
  shape.back() = L;
  return out.view(shape);
}

// What travels around the ring: a rank's keys and values and, with document masking, the segment
// ids of its two chunks.
struct KvBlock {
  Tensor k, v;
  std::array<Tensor, 2> segments;  // (B,L) each, undefined without document masking

  std::vector<Tensor> tensors() const {
    std::vector<Tensor> t{k, v};
    for (const Tensor& s : segments)
      if (s.defined()) t.push_back(s);
    return t;
  }
  KvBlock empty_like() const {
    KvBlock b{Tensor::empty(k.shape(), k.dtype(), k.device()), Tensor::empty(v.shape(), v.dtype(), v.device()), {}};
    for (int h = 0; h < 2; ++h)
      if (segments[size_t(h)].defined())
        b.segments[size_t(h)] = Tensor::empty(segments[size_t(h)].shape(), DType::i32, k.device());
    return b;
  }
};

// Sends `send` to the next rank of the ring and receives into `recv` from the previous one.
CommHandlePtr ring_exchange_async(Communicator& cp, const std::vector<Tensor>& send, const std::vector<Tensor>& recv) {
  const int next = (cp.rank() + 1) % cp.size(), prev = (cp.rank() + cp.size() - 1) % cp.size();
  std::vector<P2POp> ops;
  for (const Tensor& t : send) ops.push_back({P2POp::Kind::send, t, next});
  for (const Tensor& t : recv) ops.push_back({P2POp::Kind::recv, t, prev});
  return cp.batch_p2p_async(ops);
}

// The local q's and the held kv's chunk halves and the block's attention parameters.
struct BlockOperands {
  Tensor q, k, v;
  ops::AttentionParams params;
};
BlockOperands block_operands(const RingBlock& b, const Tensor& q, const KvBlock& kv,
                             const std::array<Tensor, 2>& q_segments, const ops::AttentionParams& params) {
  const int64_t L = q.dim(0) / 2;
  ops::AttentionParams p = params;
  p.causal = false;
  p.segment_ids = q_segments[size_t(b.q_half)];
  p.key_segment_ids = kv.segments[size_t(b.kv_half)];
  return {q.slice(b.q_half * L, (b.q_half + 1) * L), kv.k.slice(b.kv_half * L, (b.kv_half + 1) * L),
          kv.v.slice(b.kv_half * L, (b.kv_half + 1) * L), p};
}

// Two receive buffers used in turn, so the block a step computes on is never the one the next
// step's transfer writes, and the caller's own keys and values are only ever sent.
class RingBuffers {
 public:
  explicit RingBuffers(const KvBlock& own) : buffers_{own.empty_like(), own.empty_like()} {}
  // The buffer step `step` (>= 1) computes on, received during step - 1.
  KvBlock& receive(int64_t step) { return buffers_[size_t(step % 2)]; }

 private:
  std::array<KvBlock, 2> buffers_;
};

KvBlock own_kv(const Tensor& k, const Tensor& v, const ops::AttentionParams& params) {
  KvBlock own{k, v, {}};
  if (params.segment_ids.defined())
    for (int h = 0; h < 2; ++h) own.segments[size_t(h)] = sequence_half(params.segment_ids, h);
  return own;
}

DType lse_dtype(const Tensor& q) { return q.dtype() == DType::f64 ? DType::f64 : DType::f32; }

// Every rank's keys, values and segment ids, all-gathered once (--cp-comm-type allgather): rank j's
// KvBlock views rows [2jL, 2(j+1)L) of the gathered k and v, in its local order.
struct GatheredKv {
  Tensor k, v;                 // (C*2L,B,G,HS): rank j's rows, chunk j then chunk 2C-1-j
  std::vector<KvBlock> ranks;  // views into k, v; segment halves with document masking
};
GatheredKv gather_kv(const Tensor& k, const Tensor& v, const ops::AttentionParams& params, Communicator& cp) {
  const int64_t C = cp.size(), rows = k.dim(0);
  GatheredKv all{Tensor::empty({C * rows, k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), k.device()),
                 Tensor::empty({C * rows, v.dim(1), v.dim(2), v.dim(3)}, v.dtype(), v.device()),
                 {}};
  cp.all_gather(all.k, k);
  cp.all_gather(all.v, v);
  Tensor segments;  // (C,B,2L): rank j's segment ids
  if (params.segment_ids.defined()) {
    segments = Tensor::empty({C, params.segment_ids.dim(0), params.segment_ids.dim(1)}, DType::i32, k.device());
    cp.all_gather(segments, params.segment_ids);
  }
  for (int64_t j = 0; j < C; ++j) {
    KvBlock b{all.k.slice(j * rows, (j + 1) * rows), all.v.slice(j * rows, (j + 1) * rows), {}};
    if (segments.defined()) {
      const Tensor own = segments.slice(j, j + 1).view(params.segment_ids.shape());
      for (int h = 0; h < 2; ++h) b.segments[size_t(h)] = sequence_half(own, h);
    }
    all.ranks.push_back(b);
  }
  return all;
}

}  // namespace

void ring_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                            const ops::AttentionParams& params, Communicator& cp) {
  check_ring_params(params, q);
  const int64_t C = cp.size(), r = cp.rank(), L = q.dim(0) / 2;
  // Step 0: the causal diagonal. The local order of the two chunks is their true order, so the
  // causal mask of the local rows is the true one; this fills out and lse.
  ops::attention_forward(out, lse, q, k, v, params);
  if (C == 1) return;
  const KvBlock own = own_kv(k, v, params);
  RingBuffers ring(own);
  Tensor block_out = Tensor::empty({L, q.dim(1), q.dim(2), q.dim(3)}, q.dtype(), q.device());
  Tensor block_lse = Tensor::empty({q.dim(1), q.dim(2), L}, lse_dtype(q), q.device());
  CommHandlePtr transfer = ring_exchange_async(cp, own.tensors(), ring.receive(1).tensors());
  for (int64_t step = 1; step < C; ++step) {
    transfer->wait();
    const KvBlock& held = ring.receive(step);
    // The next step's keys and values travel while this step's blocks run.
    if (step + 1 < C) transfer = ring_exchange_async(cp, held.tensors(), ring.receive(step + 1).tensors());
    for (const RingBlock& b : ring_step_blocks(step, r, C)) {
      const BlockOperands o = block_operands(b, q, held, own.segments, params);
      ops::attention_forward(block_out, block_lse, o.q, o.k, o.v, o.params);
      ops::attention_merge(out, lse, block_out, block_lse, b.q_half * L);
    }
  }
}

void ring_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse, const ops::AttentionParams& params,
                             Communicator& cp) {
  check_ring_params(params, q);
  const int64_t C = cp.size(), r = cp.rank(), L = q.dim(0) / 2;
  // Step 0 overwrites dq and starts the gradients of this rank's own keys and values.
  Tensor dk_held = Tensor::empty(k.shape(), k.dtype(), k.device());
  Tensor dv_held = Tensor::empty(v.shape(), v.dtype(), v.device());
  ops::attention_backward(dq, dk_held, dv_held, dout, q, k, v, out, lse, params);
  if (C == 1) {
    ops::cast(dk, dk_held);
    ops::cast(dv, dv_held);
    return;
  }
  const KvBlock own = own_kv(k, v, params);
  RingBuffers ring(own);
  const std::array<Tensor, 2> lse_halves{sequence_half(lse, 0), sequence_half(lse, 1)};
  Tensor dk_next = Tensor::empty(k.shape(), k.dtype(), k.device());
  Tensor dv_next = Tensor::empty(v.shape(), v.dtype(), v.device());
  Tensor dq_block = Tensor::empty({L, q.dim(1), q.dim(2), q.dim(3)}, q.dtype(), q.device());
  Tensor dk_block = Tensor::empty({L, k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), k.device());
  Tensor dv_block = Tensor::empty(dk_block.shape(), k.dtype(), k.device());
  CommHandlePtr transfer = ring_exchange_async(cp, own.tensors(), ring.receive(1).tensors());
  for (int64_t step = 1; step < C; ++step) {
    transfer->wait();
    const KvBlock& held = ring.receive(step);
    // The gradients of the keys and values just left behind follow them to the next rank.
    ring_exchange_async(cp, {dk_held, dv_held}, {dk_next, dv_next})->wait();
    std::swap(dk_held, dk_next);
    std::swap(dv_held, dv_next);
    if (step + 1 < C) transfer = ring_exchange_async(cp, held.tensors(), ring.receive(step + 1).tensors());
    for (const RingBlock& b : ring_step_blocks(step, r, C)) {
      const BlockOperands o = block_operands(b, q, held, own.segments, params);
      const Tensor rows_out = out.slice(b.q_half * L, (b.q_half + 1) * L);
      const Tensor rows_dout = dout.slice(b.q_half * L, (b.q_half + 1) * L);
      ops::attention_backward(dq_block, dk_block, dv_block, rows_dout, o.q, o.k, o.v, rows_out,
                              lse_halves[size_t(b.q_half)], o.params);
      Tensor dq_rows = dq.slice(b.q_half * L, (b.q_half + 1) * L);
      Tensor dk_rows = dk_held.slice(b.kv_half * L, (b.kv_half + 1) * L);
      Tensor dv_rows = dv_held.slice(b.kv_half * L, (b.kv_half + 1) * L);
      ops::add_scaled(dq_rows, dq_block, 1.0f);
      ops::add_scaled(dk_rows, dk_block, 1.0f);
      ops::add_scaled(dv_rows, dv_block, 1.0f);
    }
  }
  // The last step held the keys and values of rank r+1: their finished gradients go home, and
  // this rank's own come from rank r-1.
  ring_exchange_async(cp, {dk_held, dv_held}, {dk, dv})->wait();
}

void all_gather_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const ops::AttentionParams& params, Communicator& cp) {
  check_ring_params(params, q);
  const int64_t C = cp.size(), r = cp.rank(), L = q.dim(0) / 2;
  ops::attention_forward(out, lse, q, k, v, params);  // the ring's step 0: the rank's own chunks
  if (C == 1) return;
  const GatheredKv all = gather_kv(k, v, params, cp);
  const KvBlock& own = all.ranks[size_t(r)];
  Tensor block_out = Tensor::empty({L, q.dim(1), q.dim(2), q.dim(3)}, q.dtype(), q.device());
  Tensor block_lse = Tensor::empty({q.dim(1), q.dim(2), L}, lse_dtype(q), q.device());
  for (int64_t step = 1; step < C; ++step) {
    const KvBlock& held = all.ranks[size_t((r - step + C) % C)];
    for (const RingBlock& b : ring_step_blocks(step, r, C)) {
      const BlockOperands o = block_operands(b, q, held, own.segments, params);
      ops::attention_forward(block_out, block_lse, o.q, o.k, o.v, o.params);
      ops::attention_merge(out, lse, block_out, block_lse, b.q_half * L);
    }
  }
}

void all_gather_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                   const ops::AttentionParams& params, Communicator& cp) {
  check_ring_params(params, q);
  const int64_t C = cp.size(), r = cp.rank(), L = q.dim(0) / 2, rows = k.dim(0);
  if (C == 1) return ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, params);
  // Every rank's keys' gradients, this rank's share: its step 0 into its own rows, then each block's.
  Tensor dk_all = Tensor::zeros({C * rows, k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), k.device());
  Tensor dv_all = Tensor::zeros(dk_all.shape(), v.dtype(), v.device());
  Tensor dk_own = dk_all.slice(r * rows, (r + 1) * rows), dv_own = dv_all.slice(r * rows, (r + 1) * rows);
  ops::attention_backward(dq, dk_own, dv_own, dout, q, k, v, out, lse, params);
  const GatheredKv all = gather_kv(k, v, params, cp);
  const KvBlock& own = all.ranks[size_t(r)];
  const std::array<Tensor, 2> lse_halves{sequence_half(lse, 0), sequence_half(lse, 1)};
  Tensor dq_block = Tensor::empty({L, q.dim(1), q.dim(2), q.dim(3)}, q.dtype(), q.device());
  Tensor dk_block = Tensor::empty({L, k.dim(1), k.dim(2), k.dim(3)}, k.dtype(), k.device());
  Tensor dv_block = Tensor::empty(dk_block.shape(), k.dtype(), k.device());
  for (int64_t step = 1; step < C; ++step) {
    const int64_t src = (r - step + C) % C;
    for (const RingBlock& b : ring_step_blocks(step, r, C)) {
      const BlockOperands o = block_operands(b, q, all.ranks[size_t(src)], own.segments, params);
      ops::attention_backward(dq_block, dk_block, dv_block, dout.slice(b.q_half * L, (b.q_half + 1) * L), o.q, o.k,
                              o.v, out.slice(b.q_half * L, (b.q_half + 1) * L), lse_halves[size_t(b.q_half)],
                              o.params);
      const int64_t key_row = src * rows + b.kv_half * L;
      Tensor dq_rows = dq.slice(b.q_half * L, (b.q_half + 1) * L);
      Tensor dk_rows = dk_all.slice(key_row, key_row + L), dv_rows = dv_all.slice(key_row, key_row + L);
      ops::add_scaled(dq_rows, dq_block, 1.0f);
      ops::add_scaled(dk_rows, dk_block, 1.0f);
      ops::add_scaled(dv_rows, dv_block, 1.0f);
    }
  }
  // Each owner receives the sum of every rank's share of its keys' gradients.
  cp.reduce_scatter(dk, dk_all);
  cp.reduce_scatter(dv, dv_all);
}

}  // namespace megatron::context_parallel
