// Core attention on the CPU: one query row at a time, the scores of that row held in full (no
// tiling; the reference favours the textbook form). Softmax runs in float (double for f64) with
// the row maximum subtracted; backward recomputes the probabilities from the saved lse.
#include "megatron/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "megatron/core/rng.h"
#include "megatron/ops/checks/attention.h"
#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/cpu/dot_row.h"
#include "megatron/ops/dropout.h"

namespace megatron::ops::cpu {
namespace {

struct Dims {
  int64_t S, B, NH, G, HS;
  int64_t head_offset, total_heads;  // global query heads, for the dropout index
  int64_t q_offset(int64_t s, int64_t b, int64_t h) const { return ((s * B + b) * NH + h) * HS; }  // (S,B,NH,HS)
  int64_t kv_offset(int64_t s, int64_t b, int64_t g) const { return ((s * B + b) * G + g) * HS; }  // (S,B,G,HS)
  int64_t lse_offset(int64_t b, int64_t h, int64_t i) const { return (b * NH + h) * S + i; }       // (B,NH,S)
};

// Dropout multiplier of probability (b, h, i, j): 1/(1-p) when CounterRng's draw at element index
// ((b*total_heads + head_offset + h)*S + i)*S + j exceeds p, else 0 (attention.h).
template <class A>
A dropout_factor(const CounterRng& rng, const Dims& d, int64_t b, int64_t h, int64_t i, int64_t j, float p) {
  if (p == 0.0f) return A(1);
  const auto index = uint64_t(((b * d.total_heads + d.head_offset + h) * d.S + i) * d.S + j);
  return dropout_keep(rng, index, p) ? A(1) / (A(1) - A(p)) : A(0);
}

// Which keys query i of batch row b sees: j in [begin, end) — j <= i when causal and, for packed
// documents (cu_seqlens), j in i's document, the variable-length path visiting no other key — and
// of those the ones not hidden: of another segment where segment ids are given (the keys' own when
// key_segment_ids is), or before i - window with a sliding window.
struct KeyMask {
  bool causal;
  const int32_t* segments;      // (B,S) or null: the queries'
  const int32_t* key_segments;  // (B,S): the keys'; segments when the keys have no ids of their own
  int64_t window;               // -1: unlimited
  int64_t S;
  std::vector<int64_t> document_begin, document_end;  // (B,S) with cu_seqlens: each position's document
  int64_t begin(int64_t b, int64_t i) const { return document_begin.empty() ? 0 : document_begin[size_t(b * S + i)]; }
  int64_t end(int64_t b, int64_t i) const {
    const int64_t causal_end = causal ? i + 1 : S;
    return document_end.empty() ? causal_end : std::min(causal_end, document_end[size_t(b * S + i)]);
  }
  bool hidden(int64_t b, int64_t i, int64_t j) const {
    return (segments && key_segments[b * S + j] != segments[b * S + i]) || (window >= 0 && j < i - window);
  }
};

KeyMask key_mask(const AttentionParams& p, int64_t B, int64_t S) {
  const int32_t* segments = p.segment_ids.defined() ? p.segment_ids.data<int32_t>() : nullptr;
  const int32_t* keys = p.key_segment_ids.defined() ? p.key_segment_ids.data<int32_t>() : segments;
  KeyMask mask{p.causal, segments, keys, p.window, S, {}, {}};
  if (p.cu_seqlens.defined()) {  // document d covers tokens [cu[d], cu[d+1]) of the batch-major index b*S + s
    mask.document_begin.resize(size_t(B * S));
    mask.document_end.resize(size_t(B * S));
    const int32_t* cu = p.cu_seqlens.data<int32_t>();
    for (int64_t d = 0; d + 1 < p.cu_seqlens.dim(0); ++d) {
      for (int64_t t = cu[d]; t < cu[d + 1]; ++t) {
        const int64_t row_start = t / S * S;  // a document never crosses rows (checked)
        mask.document_begin[size_t(t)] = cu[d] - row_start;
        mask.document_end[size_t(t)] = cu[d + 1] - row_start;
      }
    }
  }
  return mask;
}

template <class T>
void attention_forward_kernel(T* out, compute_t<T>* lse, const T* q, const T* k, const T* v, const Dims& d,
                              const AttentionParams& p) {
  using A = compute_t<T>;
  const CounterRng rng{p.seed, p.stream};
  const A scale = A(p.softmax_scale);
  const KeyMask mask = key_mask(p, d.B, d.S);
  const int64_t r = d.NH / d.G;
#pragma omp parallel for collapse(2) if (worth_parallel(d.B * d.NH * d.S * d.S * d.HS))
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.NH; ++h) {
      const int64_t g = h / r;  // GQA: query head h reads kv group h / (NH/G)
      std::vector<A> score(size_t(d.S)), acc(size_t(d.HS));
      for (int64_t i = 0; i < d.S; ++i) {
        const T* qi = q + d.q_offset(i, b, h);
        const int64_t first = mask.begin(b, i), len = mask.end(b, i);
        // s_ij = scale * q_i . k_j;  lse_i = log sum_j exp(s_ij), with the row max m subtracted
        A m = -std::numeric_limits<A>::infinity();
        for (int64_t j = first; j < len; ++j) {
          score[size_t(j)] = mask.hidden(b, i, j) ? -std::numeric_limits<A>::infinity()
                                                  : scale * dot_row(qi, k + d.kv_offset(j, b, g), d.HS);
          m = std::max(m, score[size_t(j)]);
        }
        A sum = 0;
        for (int64_t j = first; j < len; ++j) sum += mask.hidden(b, i, j) ? A(0) : std::exp(score[size_t(j)] - m);
        const A l = m + std::log(sum);  // -inf for a row that sees no key
        // out_i = sum_j dropout(p_ij) v_j,  p_ij = exp(s_ij - lse_i)
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t j = first; j < len; ++j) {
          if (mask.hidden(b, i, j)) continue;
          const A pij = std::exp(score[size_t(j)] - l) * dropout_factor<A>(rng, d, b, h, i, j, p.dropout_p);
          const T* vj = v + d.kv_offset(j, b, g);
          for (int64_t e = 0; e < d.HS; ++e) acc[size_t(e)] += pij * load(vj[e]);
        }
        T* oi = out + d.q_offset(i, b, h);
        for (int64_t e = 0; e < d.HS; ++e) oi[e] = store<T>(acc[size_t(e)]);
        lse[d.lse_offset(b, h, i)] = l;
      }
    }
  }
}

// One task per (batch, kv group): the group's r query heads are its only writers of dk, dv.
template <class T>
void attention_backward_kernel(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                               const compute_t<T>* lse, const Dims& d, const AttentionParams& p) {
  using A = compute_t<T>;
  const CounterRng rng{p.seed, p.stream};
  const A scale = A(p.softmax_scale);
  const KeyMask key_mask_of = key_mask(p, d.B, d.S);
  const int64_t r = d.NH / d.G;
#pragma omp parallel for collapse(2) if (worth_parallel(d.B * d.NH * d.S * d.S * d.HS))
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t g = 0; g < d.G; ++g) {
      std::vector<A> dk_acc(size_t(d.S * d.HS), A(0)), dv_acc(size_t(d.S * d.HS), A(0)), dq_acc(size_t(d.HS));
      for (int64_t h = g * r; h < (g + 1) * r; ++h) {
        for (int64_t i = 0; i < d.S; ++i) {
          const T* qi = q + d.q_offset(i, b, h);
          const T* doi = dout + d.q_offset(i, b, h);
          const int64_t first = key_mask_of.begin(b, i), len = key_mask_of.end(b, i);
          const A l = lse[d.lse_offset(b, h, i)];
          // D_i = dout_i . out_i = sum_j p_ij dP_ij: the row term of the softmax backward
          const A D = dot_row(doi, out + d.q_offset(i, b, h), d.HS);
          std::fill(dq_acc.begin(), dq_acc.end(), A(0));
          for (int64_t j = first; j < len; ++j) {
            if (key_mask_of.hidden(b, i, j)) continue;
            const T* kj = k + d.kv_offset(j, b, g);
            const T* vj = v + d.kv_offset(j, b, g);
            const A pij = std::exp(scale * dot_row(qi, kj, d.HS) - l);
            const A mask = dropout_factor<A>(rng, d, b, h, i, j, p.dropout_p);
            // out_i = sum_j p_ij mask_ij v_j:  dv_j += p_ij mask_ij dout_i,  dP_ij = mask_ij dout_i . v_j
            const A dp = mask * dot_row(doi, vj, d.HS);
            // softmax: dS_ij = p_ij (dP_ij - D_i);  s_ij = scale q_i . k_j
            const A ds = pij * (dp - D);
            for (int64_t e = 0; e < d.HS; ++e) {
              dv_acc[size_t(j * d.HS + e)] += pij * mask * load(doi[e]);
              dq_acc[size_t(e)] += scale * ds * load(kj[e]);
              dk_acc[size_t(j * d.HS + e)] += scale * ds * load(qi[e]);
            }
          }
          T* dqi = dq + d.q_offset(i, b, h);
          for (int64_t e = 0; e < d.HS; ++e) dqi[e] = store<T>(dq_acc[size_t(e)]);
        }
      }
      for (int64_t j = 0; j < d.S; ++j) {
        for (int64_t e = 0; e < d.HS; ++e) {
          dk[d.kv_offset(j, b, g) + e] = store<T>(dk_acc[size_t(j * d.HS + e)]);
          dv[d.kv_offset(j, b, g) + e] = store<T>(dv_acc[size_t(j * d.HS + e)]);
        }
      }
    }
  }
}

// CPU kernels exist for the dtypes dispatch_floating takes.
void check_cpu_attention_dtype(const Tensor& q, const char* op) {
  dispatch_floating(q.dtype(), op, []<class T>(std::type_identity<T>) {});
}

constexpr checks::AttentionBackend kCpuAttention{check_cpu, check_cpu_attention_dtype};

Dims dims_of(const checks::AttentionDims& d, const AttentionParams& p = {}) {
  return Dims{d.S, d.B, d.NH, d.G, d.HS, p.head_offset, p.total_heads == 0 ? d.NH : p.total_heads};
}

// Copies heads between qkv and q, k, v (split: to_qkv false; merge: to_qkv true) in the layout
// qkv_head describes, byte for byte, so any dtype works.
void qkv_copy(Tensor& qkv, Tensor& q, Tensor& k, Tensor& v, bool to_qkv) {
  const Dims d = dims_of(checks::check_qkv_fused(qkv, q, k, v, check_cpu));
  const int64_t r = d.NH / d.G;
  const size_t head_bytes = size_t(d.HS) * q.element_size();
  auto* fused = static_cast<char*>(qkv.raw());
  char* const separate[3] = {static_cast<char*>(q.raw()), static_cast<char*>(k.raw()), static_cast<char*>(v.raw())};
#pragma omp parallel for if (worth_parallel(qkv.numel()))
  for (int64_t sb = 0; sb < d.S * d.B; ++sb) {
    for (int64_t g = 0; g < d.G; ++g) {
      for (int64_t t = 0; t < r + 2; ++t) {
        const QkvHead h = qkv_head(sb, g, t, d.G, r);
        char* fused_head = fused + size_t(h.fused) * head_bytes;
        char* head = separate[h.tensor] + size_t(h.separate) * head_bytes;
        if (to_qkv) {
          std::memcpy(fused_head, head, head_bytes);
        } else {
          std::memcpy(head, fused_head, head_bytes);
        }
      }
    }
  }
}

// Rows [offset, offset + Sb) of (out, lse) merged with the block's (attention.h: attention_merge).
template <class T>
void attention_merge_kernel(T* out, compute_t<T>* lse, const T* block_out, const compute_t<T>* block_lse,
                            const checks::AttentionDims& d, int64_t Sb, int64_t offset) {
  using A = compute_t<T>;
  const A minus_inf = -std::numeric_limits<A>::infinity();
#pragma omp parallel for collapse(2) if (worth_parallel(Sb * d.B * d.NH * d.HS))
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.NH; ++h) {
      for (int64_t i = 0; i < Sb; ++i) {
        A& l = lse[(b * d.NH + h) * d.S + offset + i];
        const A lb = block_lse[(b * d.NH + h) * Sb + i];
        if (lb == minus_inf) continue;  // the block's keys are all hidden from this row
        // lse' = max + log(exp(l - max) + exp(lb - max)); a row with l = -inf takes the block's
        const A m = std::max(l, lb);
        const A merged = m + std::log(std::exp(l - m) + std::exp(lb - m));
        const A w = std::exp(l - merged), wb = std::exp(lb - merged);
        T* o = out + (((offset + i) * d.B + b) * d.NH + h) * d.HS;
        const T* ob = block_out + ((i * d.B + b) * d.NH + h) * d.HS;
        for (int64_t e = 0; e < d.HS; ++e) o[e] = store<T>(w * load(o[e]) + wb * load(ob[e]));
        l = merged;
      }
    }
  }
}

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionParams& params) {
  const Dims d = dims_of(checks::check_attention_forward(out, lse, q, k, v, params, kCpuAttention), params);
  dispatch_floating(q.dtype(), "attention_forward", [&]<class T>(std::type_identity<T>) {
    attention_forward_kernel<T>(out.data<T>(), lse.data<compute_t<T>>(), q.data<T>(), k.data<T>(), v.data<T>(), d,
                                params);
  });
}

void cpu::attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& params) {
  const Dims d =
      dims_of(checks::check_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, params, kCpuAttention), params);
  dispatch_floating(q.dtype(), "attention_backward", [&]<class T>(std::type_identity<T>) {
    attention_backward_kernel<T>(dq.data<T>(), dk.data<T>(), dv.data<T>(), dout.data<T>(), q.data<T>(), k.data<T>(),
                                 v.data<T>(), out.data<T>(), lse.data<compute_t<T>>(), d, params);
  });
}

void cpu::qkv_split(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv) {
  // qkv is only read on this path; qkv_copy takes it mutable to share the index arithmetic with merge.
  Tensor fused = qkv;
  qkv_copy(fused, q, k, v, false);
}

void cpu::qkv_merge(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  Tensor q = dq, k = dk, v = dv;  // read only on this path (shallow handles, no copies)
  qkv_copy(dqkv, q, k, v, true);
}

void cpu::attention_forward_qkv(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t num_heads,
                                const AttentionParams& params) {
  checks::check_attention_forward_qkv(out, lse, qkv, num_heads, params, kCpuAttention);
  attention_forward_qkv_by_definition(out, lse, qkv, num_heads, params);
}

void cpu::attention_backward_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                 const Tensor& lse, int64_t num_heads, const AttentionParams& params) {
  checks::check_attention_backward_qkv(dqkv, dout, qkv, out, lse, num_heads, params, kCpuAttention);
  attention_backward_qkv_by_definition(dqkv, dout, qkv, out, lse, num_heads, params);
}

void cpu::attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                          int64_t row_offset) {
  const checks::AttentionDims d = checks::check_attention_merge(out, lse, block_out, block_lse, row_offset, check_cpu);
  dispatch_floating(out.dtype(), "attention_merge", [&]<class T>(std::type_identity<T>) {
    attention_merge_kernel<T>(out.data<T>(), lse.data<compute_t<T>>(), block_out.data<T>(),
                              block_lse.data<compute_t<T>>(), d, block_out.dim(0), row_offset);
  });
}

}  // namespace megatron::ops
