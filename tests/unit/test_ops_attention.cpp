#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "megatron/core/rng.h"
#include "megatron/ops/attention.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::AttentionParams;

namespace {

constexpr int64_t kS = 5, kB = 2, kNH = 4, kG = 2, kHS = 4;

AttentionParams params(bool causal, float dropout) { return {causal, 0.5f, dropout, 1234, stream_id("attn")}; }

// Beside causal/full and dropout: document masking (segment ids), as under tensor parallelism
// query heads that are a slice [head_offset, head_offset + NH) of total_heads, sliding windows, and
// keys with segment ids of their own (a ring attention block), and the same documents packed
// (cu_seqlens, the variable-length path) instead of numbered.
struct Variant {
  bool causal;
  float dropout;
  bool segmented = false;
  int64_t head_offset = 0, total_heads = 0;
  int64_t window = -1;
  bool key_segmented = false;
  bool packed = false;
};

const Variant kVariants[] = {{true, 0.0f},
                             {false, 0.0f},
                             {true, 0.3f},
                             {false, 0.3f},
                             {true, 0.3f, true},
                             {false, 0.0f, true},
                             {true, 0.3f, false, 4, 12},
                             {true, 0.3f, false, 0, 0, 1},
                             {true, 0.0f, true, 0, 0, 2},
                             {false, 0.0f, false, 0, 0, 0},
                             {false, 0.0f, true, 0, 0, -1, true},
                             {true, 0.3f, true, 0, 0, -1, true},
                             {true, 0.0f, false, 0, 0, -1, false, true},
                             {false, 0.0f, false, 0, 0, -1, false, true},
                             {true, 0.3f, false, 4, 12, -1, false, true},
                             {true, 0.0f, false, 0, 0, 1, false, true}};

// Documents of lengths 2, 3 (row 0) and 1, 3, 1 (row 1); ids need only compare equal.
Tensor segment_ids() { return Tensor::from_vector({0, 0, 1, 1, 1, 3, 4, 4, 4, 7}, {kB, kS}, DType::i32); }
// The keys' own documents against those queries: every query still sees at least one key causally.
Tensor key_segment_ids() { return Tensor::from_vector({0, 1, 1, 1, 2, 3, 4, 4, 7, 7}, {kB, kS}, DType::i32); }

AttentionParams params(const Variant& v) {
  AttentionParams p = params(v.causal, v.dropout);
  p.head_offset = v.head_offset;
  p.total_heads = v.total_heads;
  if (v.segmented) p.segment_ids = segment_ids();
  if (v.key_segmented) p.key_segment_ids = key_segment_ids();
  if (v.packed) p.cu_seqlens = ops::packed_cu_seqlens(segment_ids());
  p.window = v.window;
  return p;
}

std::string describe(const Variant& v) {
  return std::string("causal ") + (v.causal ? "1" : "0") + " dropout " + std::to_string(v.dropout) + " segmented " +
         (v.segmented ? "1" : "0") + " heads from " + std::to_string(v.head_offset) + " window " +
         std::to_string(v.window) + " key segments " + (v.key_segmented ? "1" : "0") + " packed " +
         (v.packed ? "1" : "0");
}

struct AttentionRun {
  Tensor out, lse, dq, dk, dv;
};

AttentionRun run_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                           const AttentionParams& p) {
  const DType dt = q.dtype(), st = dt == DType::f64 ? DType::f64 : DType::f32;
  AttentionRun r{poisoned(q.shape(), dt), poisoned({kB, kNH, kS}, st), poisoned(q.shape(), dt), poisoned(k.shape(), dt),
                 poisoned(v.shape(), dt)};
  ops::attention_forward(r.out, r.lse, q, k, v, p);
  ops::attention_backward(r.dq, r.dk, r.dv, dout, q, k, v, r.out, r.lse, p);
  return r;
}

// The textbook definition in double, written apart from the kernel: for each (b, h) the full
// score matrix, p = exp(s) / sum exp(s) over allowed keys (causal, same document, inside the
// window), dropout mask
// from the documented element index (global head), out = p' v, with query head h reading kv
// group h / (NH/G).
void reference_attention(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionParams& p) {
  const CounterRng rng{p.seed, p.stream};
  const int64_t total_heads = p.total_heads == 0 ? kNH : p.total_heads;
  const Tensor& key_documents = p.key_segment_ids.defined() ? p.key_segment_ids : p.segment_ids;
  // Packed documents: the document of token t = b*S + s is the number of boundaries cu[1..N] at or before it.
  const auto packed_document = [&](int64_t t) {
    int64_t d = 0;
    for (int64_t n = 1; n < p.cu_seqlens.dim(0); ++n) d += p.cu_seqlens.item(n) <= double(t) ? 1 : 0;
    return d;
  };
  const auto same_document = [&](int64_t b, int64_t i, int64_t j) {
    if (p.cu_seqlens.defined()) return packed_document(b * kS + i) == packed_document(b * kS + j);
    return !p.segment_ids.defined() || p.segment_ids.item(b * kS + i) == key_documents.item(b * kS + j);
  };
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t h = 0; h < kNH; ++h) {
      const int64_t g = h / (kNH / kG);
      for (int64_t i = 0; i < kS; ++i) {
        std::vector<double> e(kS, 0.0);
        double total = 0.0;
        for (int64_t j = 0; j < kS; ++j) {
          if ((p.causal && j > i) || !same_document(b, i, j) || (p.window >= 0 && i - j > p.window)) continue;
          double s = 0.0;
          for (int64_t d = 0; d < kHS; ++d)
            s += q.item(((i * kB + b) * kNH + h) * kHS + d) * k.item(((j * kB + b) * kG + g) * kHS + d);
          e[size_t(j)] = std::exp(p.softmax_scale * s);
          total += e[size_t(j)];
        }
        lse.set_item((b * kNH + h) * kS + i, std::log(total));
        for (int64_t d = 0; d < kHS; ++d) {
          double o = 0.0;
          for (int64_t j = 0; j < kS; ++j) {
            const auto index = uint64_t(((b * total_heads + p.head_offset + h) * kS + i) * kS + j);
            const bool kept = rng.uniform(index) > p.dropout_p;
            const double mask = kept ? 1.0 / (1.0 - double(p.dropout_p)) : 0.0;
            o += e[size_t(j)] / total * mask * v.item(((j * kB + b) * kG + g) * kHS + d);
          }
          out.set_item(((i * kB + b) * kNH + h) * kHS + d, o);
        }
      }
    }
  }
}

}  // namespace

// Attention over all keys is the log-sum-exp merge of attentions over two disjoint key sets (here
// the keys' own segment ids pick each set), also for a block of rows at an offset, leaving the
// other rows as they were.
TEST(Attention, MergeOfTwoKeySetsEqualsAttentionOverBoth) {
  const Tensor q = randn({kS, kB, kNH, kHS}, DType::f64, 31), k = randn({kS, kB, kG, kHS}, DType::f64, 32);
  const Tensor v = randn({kS, kB, kG, kHS}, DType::f64, 33);
  const auto over = [&](const std::vector<float>& key_set) {
    AttentionParams p = params(false, 0.0f);
    p.segment_ids = Tensor::zeros({kB, kS}, DType::i32);  // every query in set 0
    p.key_segment_ids = Tensor::from_vector(key_set, {kB, kS}, DType::i32);
    AttentionRun r{Tensor::empty(q.shape(), DType::f64), Tensor::empty({kB, kNH, kS}, DType::f64), {}, {}, {}};
    ops::attention_forward(r.out, r.lse, q, k, v, p);
    return r;
  };
  const std::vector<float> first = {0, 1, 0, 1, 1, 1, 0, 0, 1, 0}, second = {1, 0, 1, 0, 0, 0, 1, 1, 0, 1};
  const AttentionRun all = over(std::vector<float>(size_t(kB * kS), 0.0f)), b = over(second);
  AttentionRun a = over(first);
  ops::attention_merge(a.out, a.lse, b.out, b.lse, 0);
  // A merge is a few operations on values of order 1 per element.
  EXPECT_TRUE(matches_reference(a.out, all.out, 0x1p-53, 16.0));
  EXPECT_TRUE(matches_reference(a.lse, all.lse, 0x1p-53, 16.0));

  constexpr int64_t kFrom = 2, kRows = kS - kFrom;  // merge rows [2, 5) only
  AttentionRun c = over(first);
  const AttentionRun d = over(second);
  Tensor rows_lse = Tensor::empty({kB, kNH, kRows}, DType::f64);
  for (int64_t bh = 0; bh < kB * kNH; ++bh)
    for (int64_t i = 0; i < kRows; ++i) rows_lse.set_item(bh * kRows + i, d.lse.item(bh * kS + kFrom + i));
  const Tensor before = c.out.clone(), before_lse = c.lse.clone();
  ops::attention_merge(c.out, c.lse, d.out.slice(kFrom, kS).clone(), rows_lse, kFrom);
  EXPECT_TRUE(matches_reference(c.out.slice(kFrom, kS), all.out.slice(kFrom, kS), 0x1p-53, 16.0));
  EXPECT_TRUE(matches_reference(c.out.slice(0, kFrom), before.slice(0, kFrom), 0x1p-53, 0.0));
  for (int64_t bh = 0; bh < kB * kNH; ++bh)
    for (int64_t i = 0; i < kS; ++i)
      EXPECT_NEAR(c.lse.item(bh * kS + i), (i < kFrom ? before_lse : all.lse).item(bh * kS + i), 1e-14);
}

// The variable-length path equals the document mask it replaces: out, lse, dq, dk, dv with packed
// documents (cu_seqlens) against the same documents numbered (segment ids), in f64, for B = 3 rows
// of S = 40 holding documents of 1 to 23 tokens, GQA, causal and not.
TEST(Attention, PackedDocumentsEqualDocumentMasks) {
  constexpr int64_t S = 40, B = 3, NH = 4, G = 2, HS = 8;
  const std::vector<std::vector<int64_t>> lengths = {{7, 1, 23, 9}, {40}, {3, 3, 17, 16, 1}};
  Tensor segments = Tensor::empty({B, S}, DType::i32);
  for (int64_t b = 0; b < B; ++b) {
    int64_t s = 0;
    for (size_t d = 0; d < lengths[size_t(b)].size(); ++d)
      for (int64_t n = 0; n < lengths[size_t(b)][d]; ++n) segments.data<int32_t>()[b * S + s++] = int32_t(10 * b + d);
    ASSERT_EQ(s, S);
  }
  const Tensor cu = ops::packed_cu_seqlens(segments);
  ASSERT_EQ(cu.numel(), 4 + 1 + 5 + 1);
  const Tensor q = randn({S, B, NH, HS}, DType::f64, 70), k = randn({S, B, G, HS}, DType::f64, 71);
  const Tensor v = randn({S, B, G, HS}, DType::f64, 72), dout = randn(q.shape(), DType::f64, 73);
  for (const bool causal : {true, false}) {
    AttentionParams masked = params(causal, 0.0f), packed = params(causal, 0.0f);
    masked.segment_ids = segments;
    packed.cu_seqlens = cu;
    const auto run = [&](const AttentionParams& p) {
      AttentionRun r{poisoned(q.shape(), DType::f64), poisoned({B, NH, S}, DType::f64), poisoned(q.shape(), DType::f64),
                     poisoned(k.shape(), DType::f64), poisoned(v.shape(), DType::f64)};
      ops::attention_forward(r.out, r.lse, q, k, v, p);
      ops::attention_backward(r.dq, r.dk, r.dv, dout, q, k, v, r.out, r.lse, p);
      return r;
    };
    const AttentionRun want = run(masked), got = run(packed);
    // The same terms in the same order, only the mask's exact zeros left out: equal but for
    // reassociation, within 4 f64 u.
    const std::string what = causal ? "causal" : "full";
    EXPECT_TRUE(matches_reference(got.out, want.out, 0x1p-53, 4.0)) << what << " out";
    EXPECT_TRUE(matches_reference(got.lse, want.lse, 0x1p-53, 4.0)) << what << " lse";
    EXPECT_TRUE(matches_reference(got.dq, want.dq, 0x1p-53, 4.0)) << what << " dq";
    EXPECT_TRUE(matches_reference(got.dk, want.dk, 0x1p-53, 4.0)) << what << " dk";
    EXPECT_TRUE(matches_reference(got.dv, want.dv, 0x1p-53, 4.0)) << what << " dv";
  }
}

// Hand-worked: documents [0, 2), [2, 5) in row 0 and [5, 6), [6, 9), [9, 10) in row 1; an id
// running on over a row start still ends its document there; an id back after another is refused.
TEST(Attention, PackedCuSeqlensFromSegmentIds) {
  const Tensor cu = ops::packed_cu_seqlens(segment_ids());
  ASSERT_EQ(cu.numel(), 6);
  const int32_t want[] = {0, 2, 5, 6, 9, 10};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(cu.data<int32_t>()[i], want[i]) << i;
  const Tensor over_rows = ops::packed_cu_seqlens(Tensor::from_vector({0, 0, 1, 1, 1, 2}, {2, 3}, DType::i32));
  ASSERT_EQ(over_rows.numel(), 5);
  const int32_t want_rows[] = {0, 2, 3, 5, 6};
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(over_rows.data<int32_t>()[i], want_rows[i]) << i;
  EXPECT_EQ(ops::longest_document(cu), 3);  // [2, 5) and [6, 9)
  EXPECT_EQ(ops::longest_document(over_rows), 2);
  EXPECT_TRUE(throws_error_naming(
      [] { ops::packed_cu_seqlens(Tensor::from_vector({0, 1, 0, 0}, {1, 4}, DType::i32)); }, "reappears"));
}

TEST(Attention, RejectsBadCuSeqlens) {
  const Tensor q = randn({kS, kB, kNH, kHS}, DType::f32, 1), v = randn({kS, kB, kG, kHS}, DType::f32, 2);
  Tensor out = Tensor::empty(q.shape(), DType::f32), lse = Tensor::empty({kB, kNH, kS}, DType::f32);
  const auto with = [&](std::vector<float> cu) {
    AttentionParams p = params(true, 0.0f);
    p.cu_seqlens = Tensor::from_vector(cu, {int64_t(cu.size())}, DType::i32);
    return p;
  };
  const auto fails = [&](const AttentionParams& p, const std::string& naming) {
    return throws_error_naming([&] { ops::attention_forward(out, lse, q, v, v, p); }, naming);
  };
  AttentionParams both = with({0, 5, 10});
  both.segment_ids = segment_ids();
  EXPECT_TRUE(fails(both, "segment_ids both given"));
  EXPECT_TRUE(fails(with({0, 5, 9}), "B*S = 10"));          // short of B*S
  EXPECT_TRUE(fails(with({0, 3, 7, 10}), "crosses the row start 5"));
  EXPECT_TRUE(fails(with({0, 5, 4, 10}), "never decrease"));
  EXPECT_TRUE(fails(with({10}), "N >= 1 documents"));
  // max_seqlen bounds the documents' lengths (0: S), and only with cu_seqlens.
  AttentionParams bounded = with({0, 2, 5, 8, 10});
  bounded.max_seqlen = 3;
  ops::attention_forward(out, lse, q, v, v, bounded);
  bounded.max_seqlen = 2;
  EXPECT_TRUE(fails(bounded, "longer than max_seqlen = 2"));
  bounded.max_seqlen = kS + 1;
  EXPECT_TRUE(fails(bounded, "must be in [0, S = 5]"));
  AttentionParams unpacked = params(true, 0.0f);
  unpacked.max_seqlen = 3;
  EXPECT_TRUE(fails(unpacked, "without cu_seqlens"));
}

TEST(Attention, ForwardMatchesTextbookDefinition) {
  const Tensor q = randn({kS, kB, kNH, kHS}, DType::f64, 1), k = randn({kS, kB, kG, kHS}, DType::f64, 2);
  const Tensor v = randn({kS, kB, kG, kHS}, DType::f64, 3);
  for (const Variant& variant : kVariants) {
    const AttentionParams p = params(variant);
    Tensor out = poisoned(q.shape(), DType::f64), lse = poisoned({kB, kNH, kS}, DType::f64);
    ops::attention_forward(out, lse, q, k, v, p);
    Tensor ref_out = Tensor::zeros(q.shape(), DType::f64), ref_lse = Tensor::zeros({kB, kNH, kS}, DType::f64);
    reference_attention(ref_out, ref_lse, q, k, v, p);
    // Both in double over S = 5 keys and HS = 4 channels: a few tens of roundings at most.
    EXPECT_TRUE(matches_reference(out, ref_out, 0x1p-53, 64.0)) << describe(variant);
    EXPECT_TRUE(matches_reference(lse, ref_lse, 0x1p-53, 64.0)) << describe(variant);
  }
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  for (const Variant& variant : kVariants) {
    const AttentionParams p = params(variant);
    Tensor q = randn({kS, kB, kNH, kHS}, DType::f64, 10), k = randn({kS, kB, kG, kHS}, DType::f64, 11);
    Tensor v = randn({kS, kB, kG, kHS}, DType::f64, 12);
    const Tensor r = randn(q.shape(), DType::f64, 13);
    // The dropout mask depends only on (seed, stream, index), so L is a smooth function of q, k, v.
    const auto loss = [&] {
      Tensor out = Tensor::empty(q.shape(), DType::f64), lse = Tensor::empty({kB, kNH, kS}, DType::f64);
      ops::attention_forward(out, lse, q, k, v, p);
      return sum_product(out, r);
    };
    const AttentionRun run = run_attention(q, k, v, r, p);
    const std::string what = describe(variant);
    EXPECT_TRUE(grad_close(run.dq, numeric_grad(q, loss))) << what << " dq";
    EXPECT_TRUE(grad_close(run.dk, numeric_grad(k, loss))) << what << " dk";
    EXPECT_TRUE(grad_close(run.dv, numeric_grad(v, loss))) << what << " dv";
  }
}

TEST(Attention, LowerPrecisionMatchesF64) {
  const Tensor q = randn({kS, kB, kNH, kHS}, DType::f64, 20), k = randn({kS, kB, kG, kHS}, DType::f64, 21);
  const Tensor v = randn({kS, kB, kG, kHS}, DType::f64, 22), dout = randn(q.shape(), DType::f64, 23);
  for (const Variant& variant : kVariants) {
    const AttentionParams p = params(variant);
    const AttentionRun ref = run_attention(q, k, v, dout, p);
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const AttentionRun run = run_attention(q.to(dt), k.to(dt), v.to(dt), dout.to(dt), p);
      const std::string what = std::string(dtype_name(dt)) + " " + describe(variant);
      // f32: scores are HS-term dot products, the softmax sums S terms, outputs and gradients
      // sum S (and r = NH/G heads for dk, dv) more: under 64 roundings of the operand scale.
      // bf16/f16: inputs exact and arithmetic f32, so the error is the rounding of the outputs (u),
      // plus, in backward, of `out` which enters D_i = dout_i . out_i (a few u): factor 8.
      const double u = unit_roundoff(dt), factor = dt == DType::f32 ? 64.0 : 8.0;
      EXPECT_TRUE(matches_reference(run.lse, ref.lse, kUnitRoundoffF32, 16.0)) << what << " lse (f32 for all)";
      EXPECT_TRUE(matches_reference(run.out, ref.out, u, factor)) << what << " out";
      EXPECT_TRUE(matches_reference(run.dq, ref.dq, u, factor)) << what << " dq";
      EXPECT_TRUE(matches_reference(run.dk, ref.dk, u, factor)) << what << " dk";
      EXPECT_TRUE(matches_reference(run.dv, ref.dv, u, factor)) << what << " dv";
    }
  }
}

TEST(Attention, HeadSlicesReproduceTheFullRunWithDropout) {
  // Tensor parallelism: TP ranks holding heads [0, 2) and [2, 4) (kv groups [0, 1) and [1, 2)) of
  // the 4-head problem, told their head offset, compute exactly the full run's heads.
  const Tensor q = randn({kS, kB, kNH, kHS}, DType::f32, 60), k = randn({kS, kB, kG, kHS}, DType::f32, 61);
  const Tensor v = randn({kS, kB, kG, kHS}, DType::f32, 62);
  const AttentionParams full = params(true, 0.3f);
  Tensor out = poisoned(q.shape(), DType::f32), lse = poisoned({kB, kNH, kS}, DType::f32);
  ops::attention_forward(out, lse, q, k, v, full);
  const int64_t half = kNH / 2;
  for (int64_t rank = 0; rank < 2; ++rank) {
    const auto slice_heads = [&](const Tensor& t, int64_t heads, int64_t first) {
      Tensor part = Tensor::empty({kS, kB, heads, kHS}, DType::f32);
      for (int64_t sb = 0; sb < kS * kB; ++sb)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < kHS; ++d)
            part.set_item((sb * heads + h) * kHS + d, t.item((sb * t.dim(2) + first + h) * kHS + d));
      return part;
    };
    AttentionParams p = full;
    p.head_offset = rank * half;
    p.total_heads = kNH;
    const Tensor q_part = slice_heads(q, half, rank * half);
    Tensor out_part = poisoned(q_part.shape(), DType::f32), lse_part = poisoned({kB, half, kS}, DType::f32);
    ops::attention_forward(out_part, lse_part, q_part, slice_heads(k, kG / 2, rank * kG / 2),
                           slice_heads(v, kG / 2, rank * kG / 2), p);
    EXPECT_TRUE(all_close(out_part, slice_heads(out, half, rank * half), 0.0, 0.0)) << "rank " << rank;
  }
}

TEST(Attention, OutputsFullyWrittenAndGradientsOverwrite) {
  const Tensor q = randn({kS, kB, kNH, kHS}, DType::f32, 30), k = randn({kS, kB, kG, kHS}, DType::f32, 31);
  const Tensor v = randn({kS, kB, kG, kHS}, DType::f32, 32), dout = randn(q.shape(), DType::f32, 33);
  const AttentionParams p = params(true, 0.3f);
  const AttentionRun run = run_attention(q, k, v, dout, p);  // every output started as NaN
  for (const Tensor* t : {&run.out, &run.lse, &run.dq, &run.dk, &run.dv}) ASSERT_TRUE(all_finite(*t));
  Tensor dq = filled(q.shape(), DType::f32, 9.0), dk = filled(k.shape(), DType::f32, 9.0);
  Tensor dv = filled(v.shape(), DType::f32, 9.0);
  ops::attention_backward(dq, dk, dv, dout, q, k, v, run.out, run.lse, p);
  EXPECT_TRUE(all_close(dq, run.dq, 0.0, 0.0));
  EXPECT_TRUE(all_close(dk, run.dk, 0.0, 0.0));
  EXPECT_TRUE(all_close(dv, run.dv, 0.0, 0.0));
}

TEST(Attention, ParallelRunMatchesSerialRunBitwise) {
  // B * NH * S^2 * HS = 2 * 4 * 48^2 * 8 is far above the serial threshold.
  const int64_t S = 48, HS = 8;
  const Tensor q = randn({S, kB, kNH, HS}, DType::f32, 50), k = randn({S, kB, kG, HS}, DType::f32, 51);
  const Tensor v = randn({S, kB, kG, HS}, DType::f32, 52), dout = randn(q.shape(), DType::f32, 53);
  const AttentionParams p = params(true, 0.3f);
  std::vector<Tensor> runs[2];
  for (int t : {0, 1}) {
    with_threads(t == 0 ? 1 : 2, [&] {
      Tensor out = poisoned(q.shape(), DType::f32), lse = poisoned({kB, kNH, S}, DType::f32);
      Tensor dq = poisoned(q.shape(), DType::f32), dk = poisoned(k.shape(), DType::f32);
      Tensor dv = poisoned(v.shape(), DType::f32);
      ops::attention_forward(out, lse, q, k, v, p);
      ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, p);
      runs[t] = {out, lse, dq, dk, dv};
    });
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_TRUE(all_finite(runs[1][i])) << i;
    EXPECT_TRUE(all_close(runs[1][i], runs[0][i], 0.0, 0.0)) << i;
  }
}

TEST(Attention, QkvSplitFollowsPerGroupLayout) {
  // interop-formats.md 4.2: NH = 4, G = 2, HS = 1 gives rows [q0, q1, k0, v0, q2, q3, k1, v1].
  const int64_t S = 2, B = 3, NH = 4, G = 2, HS = 1, r = NH / G;
  Tensor qkv = Tensor::empty({S, B, G, (r + 2) * HS}, DType::f32);
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.set_item(i, double(i));
  Tensor q = poisoned({S, B, NH, HS}, DType::f32), k = poisoned({S, B, G, HS}, DType::f32);
  Tensor v = poisoned({S, B, G, HS}, DType::f32);
  ops::qkv_split(q, k, v, qkv);
  for (int64_t sb = 0; sb < S * B; ++sb) {
    const double row = double(sb * 8);  // the 8 fused values of one token start here
    const double expect_q[] = {row + 0, row + 1, row + 4, row + 5}, expect_k[] = {row + 2, row + 6};
    const double expect_v[] = {row + 3, row + 7};
    for (int64_t h = 0; h < NH; ++h) ASSERT_EQ(q.item(sb * NH + h), expect_q[h]) << "q head " << h;
    for (int64_t g = 0; g < G; ++g) {
      ASSERT_EQ(k.item(sb * G + g), expect_k[g]) << "k head " << g;
      ASSERT_EQ(v.item(sb * G + g), expect_v[g]) << "v head " << g;
    }
  }
  // merge is the inverse (and the backward) of split.
  Tensor merged = poisoned(qkv.shape(), DType::f32);
  ops::qkv_merge(merged, q, k, v);
  EXPECT_TRUE(all_close(merged, qkv, 0.0, 0.0));
}

TEST(Attention, QkvSplitWithWiderHeads) {
  const int64_t S = 2, B = 1, NH = 6, G = 3, HS = 4, r = NH / G;
  const Tensor qkv = randn({S, B, G, (r + 2) * HS}, DType::bf16, 40);
  Tensor q = poisoned({S, B, NH, HS}, DType::bf16), k = poisoned({S, B, G, HS}, DType::bf16);
  Tensor v = poisoned({S, B, G, HS}, DType::bf16);
  ops::qkv_split(q, k, v, qkv);
  for (int64_t sb = 0; sb < S * B; ++sb)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t d = 0; d < HS; ++d) {
        const int64_t block = (sb * G + g) * (r + 2) * HS;
        for (int64_t t = 0; t < r; ++t)
          ASSERT_EQ(q.item((sb * NH + g * r + t) * HS + d), qkv.item(block + t * HS + d)) << g << "," << t;
        ASSERT_EQ(k.item((sb * G + g) * HS + d), qkv.item(block + r * HS + d));
        ASSERT_EQ(v.item((sb * G + g) * HS + d), qkv.item(block + (r + 1) * HS + d));
      }
}

TEST(Attention, EmptySplitQkvHasTheSplitShapes) {
  const int64_t S = 2, B = 3, NH = 6, G = 3, HS = 4, r = NH / G;
  const Tensor qkv = Tensor::empty({S, B, G, (r + 2) * HS}, DType::bf16);
  const ops::SplitQkv s = ops::empty_split_qkv(qkv, NH);
  EXPECT_EQ(s.q.shape(), (Shape{S, B, NH, HS}));
  EXPECT_EQ(s.k.shape(), (Shape{S, B, G, HS}));
  EXPECT_EQ(s.v.shape(), (Shape{S, B, G, HS}));
  for (const Tensor* t : {&s.q, &s.k, &s.v}) {
    EXPECT_EQ(t->dtype(), DType::bf16);
    EXPECT_EQ(t->device(), Device::cpu());
  }
}

TEST(Attention, RejectsBadArguments) {
  const Tensor q = randn({kS, kB, kNH, kHS}, DType::f32, 1), v = randn({kS, kB, kG, kHS}, DType::f32, 2);
  Tensor out = Tensor::empty(q.shape(), DType::f32), lse = Tensor::empty({kB, kNH, kS}, DType::f32);
  const Tensor k3 = randn({kS, kB, 3, kHS}, DType::f32, 3);  // 4 heads do not group over 3
  EXPECT_TRUE(throws_error_naming([&] { ops::attention_forward(out, lse, q, k3, k3, params(true, 0.0f)); }, "NH % G"));
  Tensor lse64 = Tensor::empty({kB, kNH, kS}, DType::f64);
  EXPECT_TRUE(
      throws_error_naming([&] { ops::attention_forward(out, lse64, q, v, v, params(true, 0.0f)); }, "attention lse"));
  EXPECT_TRUE(throws_error_naming([&] { ops::attention_forward(out, lse, q, v, v, params(true, 1.0f)); }, "dropout"));
  AttentionParams bad_segments = params(true, 0.0f);
  bad_segments.segment_ids = Tensor::zeros({kB, kS}, DType::i64);
  EXPECT_TRUE(throws_error_naming([&] { ops::attention_forward(out, lse, q, v, v, bad_segments); }, "segment_ids"));
  AttentionParams bad_heads = params(true, 0.0f);
  bad_heads.head_offset = 2;  // heads [2, 6) of 4
  EXPECT_TRUE(throws_error_naming([&] { ops::attention_forward(out, lse, q, v, v, bad_heads); }, "total_heads"));
  Tensor bad_qkv = Tensor::empty({kS, kB, kG, 3 * kHS}, DType::f32);  // needs (r+2)*HS = 4*HS
  Tensor q2 = q.clone(), k2 = v.clone(), v2 = v.clone();
  EXPECT_TRUE(throws_error_naming([&] { ops::qkv_split(q2, k2, v2, bad_qkv); }, "qkv"));
}

// attention_forward_qkv / attention_backward_qkv are defined as split + attention (+ merge): the
// same arithmetic, so the results are equal bit for bit, for GQA and MHA, with dropout.
TEST(Attention, FusedQkvEqualsSplitAttentionMerge) {
  for (const int64_t G : {kG, kNH}) {
    const int64_t r = kNH / G;
    const Tensor qkv = randn({kS, kB, G, (r + 2) * kHS}, DType::f32, 60),
                 dout = randn({kS, kB, kNH, kHS}, DType::f32, 61);
    const AttentionParams p = params(true, 0.3f);
    Tensor q = Tensor::empty({kS, kB, kNH, kHS}, DType::f32), k = Tensor::empty({kS, kB, G, kHS}, DType::f32);
    Tensor v = Tensor::empty(k.shape(), DType::f32);
    ops::qkv_split(q, k, v, qkv);
    const AttentionRun ref = run_attention(q, k, v, dout, p);
    Tensor ref_dqkv = poisoned(qkv.shape(), DType::f32);
    ops::qkv_merge(ref_dqkv, ref.dq, ref.dk, ref.dv);

    Tensor out = poisoned(q.shape(), DType::f32), lse = poisoned({kB, kNH, kS}, DType::f32);
    Tensor dqkv = poisoned(qkv.shape(), DType::f32);
    ops::attention_forward_qkv(out, lse, qkv, kNH, p);
    ops::attention_backward_qkv(dqkv, dout, qkv, out, lse, kNH, p);
    EXPECT_TRUE(all_close(out, ref.out, 0.0, 0.0)) << "G=" << G;
    EXPECT_TRUE(all_close(lse, ref.lse, 0.0, 0.0)) << "G=" << G;
    EXPECT_TRUE(all_close(dqkv, ref_dqkv, 0.0, 0.0)) << "G=" << G;
  }
}

TEST(Attention, FusedQkvRejectsBadArguments) {
  const AttentionParams p = params(true, 0.0f);
  Tensor out = Tensor::empty({kS, kB, kNH, kHS}, DType::f32), lse = Tensor::empty({kB, kNH, kS}, DType::f32);
  const Tensor qkv3 = Tensor::empty({kS, kB, 3, 3 * kHS}, DType::f32);  // 4 heads do not group over 3
  EXPECT_TRUE(throws_error_naming([&] { ops::attention_forward_qkv(out, lse, qkv3, kNH, p); }, "NH % G"));
  const Tensor qkv_odd = Tensor::empty({kS, kB, kG, 4 * kHS + 1}, DType::f32);  // not (r+2)*HS
  EXPECT_TRUE(throws_error_naming([&] { ops::attention_forward_qkv(out, lse, qkv_odd, kNH, p); }, "(NH/G + 2)*HS"));
  const Tensor qkv = Tensor::empty({kS, kB, kG, 4 * kHS}, DType::f32);
  Tensor out_wide = Tensor::empty({kS, kB, kNH, 2 * kHS}, DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::attention_forward_qkv(out_wide, lse, qkv, kNH, p); }, "attention out"));
  Tensor dqkv = Tensor::empty({kS, kB, kG, 2 * kHS}, DType::f32);
  const Tensor dout = Tensor::empty(out.shape(), DType::f32);
  EXPECT_TRUE(throws_error_naming([&] { ops::attention_backward_qkv(dqkv, dout, qkv, out, lse, kNH, p); }, "dqkv"));
}
