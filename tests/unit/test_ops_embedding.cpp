#include <gtest/gtest.h>

#include <vector>

#include "megatron/ops/embedding.h"
#include "op_test_util.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::EmbeddingParams;

namespace {

constexpr int64_t kB = 2, kS = 5, kV = 7, kC = 8;

// (B,S) ids with repeats (so backward must add, not assign) and every id in [0, kV).
Tensor make_tokens(const std::vector<int32_t>& ids = {3, 1, 6, 3, 0, 2, 3, 5, 4, 1}) {
  Tensor t = Tensor::empty({kB, kS}, DType::i32);
  for (size_t i = 0; i < ids.size(); ++i) t.data<int32_t>()[i] = ids[i];
  return t;
}

}  // namespace

TEST(Embedding, ForwardGathersRowsSequenceMajor) {
  const Tensor tokens = make_tokens(), w = randn({kV, kC}, DType::f32, 1);
  Tensor out = poisoned({kS, kB, kC}, DType::f32);
  ops::embedding_forward(out, tokens, w, {});
  // out[s, b, :] = w[tokens[b, s], :], an exact copy.
  for (int64_t s = 0; s < kS; ++s)
    for (int64_t b = 0; b < kB; ++b)
      for (int64_t c = 0; c < kC; ++c)
        ASSERT_EQ(out.item((s * kB + b) * kC + c), w.item(tokens.data<int32_t>()[b * kS + s] * kC + c))
            << s << "," << b << "," << c;
}

TEST(Embedding, AccumulateAddsPositionEmbedding) {
  const Tensor tokens = make_tokens(), w = randn({kV, kC}, DType::f64, 2);
  const Tensor base = randn({kS, kB, kC}, DType::f64, 3);
  Tensor gathered = Tensor::empty({kS, kB, kC}, DType::f64);
  ops::embedding_forward(gathered, tokens, w, {});
  Tensor out = base.clone();
  ops::embedding_forward(out, tokens, w, {0, true});
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.item(i), base.item(i) + gathered.item(i)) << i;
}

TEST(Embedding, VocabParallelShardsMaskForeignIdsAndSumToTheFullLookup) {
  const Tensor tokens = make_tokens(), w = randn({kV, kC}, DType::f64, 4);
  const Tensor dout = randn({kS, kB, kC}, DType::f64, 5);
  Tensor full = Tensor::empty({kS, kB, kC}, DType::f64), full_grad = Tensor::zeros({kV, kC}, DType::f64);
  ops::embedding_forward(full, tokens, w, {});
  ops::embedding_backward(full_grad, dout, tokens, {});

  // Two ranks own rows [0, 3) and [3, 7). Each writes zero rows for ids it does not own.
  Tensor sum = Tensor::zeros({kS, kB, kC}, DType::f64);
  for (const auto& [start, end] : {std::pair<int64_t, int64_t>{0, 3}, {3, kV}}) {
    const Tensor shard = w.slice(start, end).clone();
    Tensor out = poisoned({kS, kB, kC}, DType::f64);
    ops::embedding_forward(out, tokens, shard, {start, false});
    for (int64_t s = 0; s < kS; ++s) {
      for (int64_t b = 0; b < kB; ++b) {
        const int32_t id = tokens.data<int32_t>()[b * kS + s];
        for (int64_t c = 0; c < kC; ++c) {
          const double v = out.item((s * kB + b) * kC + c);
          if (id < start || id >= end) {
            ASSERT_EQ(v, 0.0) << "foreign id " << id << " on shard " << start;
          }
          sum.set_item((s * kB + b) * kC + c, sum.item((s * kB + b) * kC + c) + v);
        }
      }
    }
    // The shard's gradient is exactly the full gradient's rows it owns: foreign ids add nothing.
    Tensor grad = Tensor::zeros({end - start, kC}, DType::f64);
    ops::embedding_backward(grad, dout, tokens, {start, false});
    for (int64_t i = 0; i < grad.numel(); ++i) ASSERT_EQ(grad.item(i), full_grad.item(start * kC + i)) << i;
  }
  // The all-reduce of the shards' lookups is the full lookup (one nonzero term per element).
  for (int64_t i = 0; i < sum.numel(); ++i) ASSERT_EQ(sum.item(i), full.item(i)) << i;
}

TEST(Embedding, WeightGradientMatchesFiniteDifferencesAndAccumulates) {
  const Tensor tokens = make_tokens();
  Tensor w = randn({kV, kC}, DType::f64, 6);
  const Tensor r = randn({kS, kB, kC}, DType::f64, 7);
  const auto loss = [&] {
    Tensor out = Tensor::empty({kS, kB, kC}, DType::f64);
    ops::embedding_forward(out, tokens, w, {});
    return sum_product(out, r);
  };
  Tensor dw = Tensor::zeros({kV, kC}, DType::f64);
  ops::embedding_backward(dw, r, tokens, {});
  const Tensor numeric = numeric_grad(w, loss);
  EXPECT_TRUE(grad_close(dw, numeric));

  // A second backward adds the same gradient again (+=): at most one rounding per element in f64.
  const Tensor once = dw.clone();
  ops::embedding_backward(dw, r, tokens, {});
  Tensor twice = once.clone();
  for (int64_t i = 0; i < twice.numel(); ++i) twice.set_item(i, 2.0 * once.item(i));
  EXPECT_TRUE(all_close(dw, twice, 0x1p-52, 0.0));
}

TEST(Embedding, LowerPrecisionMatchesF64) {
  const Tensor tokens = make_tokens(), w = randn({kV, kC}, DType::f64, 8), dout = randn({kS, kB, kC}, DType::f64, 9);
  Tensor out64 = Tensor::empty({kS, kB, kC}, DType::f64), dw64 = Tensor::zeros({kV, kC}, DType::f64);
  ops::embedding_forward(out64, tokens, w, {});
  ops::embedding_backward(dw64, dout, tokens, {});
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    Tensor out = poisoned({kS, kB, kC}, dt), dw = Tensor::zeros({kV, kC}, DType::f32);
    ops::embedding_forward(out, tokens, w.to(dt), {});
    ops::embedding_backward(dw, dout.to(dt), tokens, {});
    // The lookup copies bf16-exact values: exact in every dtype.
    EXPECT_TRUE(all_close(out, out64, 0.0, 0.0)) << dtype_name(dt);
    // dweight is f32 for every dtype: each row sums at most 3 repeats of an id, so <= 3 f32 roundings.
    EXPECT_TRUE(matches_reference(dw, dw64, kUnitRoundoffF32, 3.0)) << dtype_name(dt);
  }
}

TEST(Embedding, RejectsBadArguments) {
  const Tensor tokens = make_tokens(), w = randn({kV, kC}, DType::f32, 1);
  Tensor wrong_shape = Tensor::empty({kB, kS, kC}, DType::f32);  // (B,S,C) instead of (S,B,C)
  EXPECT_TRUE(throws_error_naming([&] { ops::embedding_forward(wrong_shape, tokens, w, {}); }, "embedding out"));
  Tensor out = Tensor::empty({kS, kB, kC}, DType::f32);
  EXPECT_TRUE(
      throws_error_naming([&] { ops::embedding_forward(out, tokens.to(DType::f32), w, {}); }, "embedding tokens"));
  Tensor dw_bf16 = Tensor::zeros({kV, kC}, DType::bf16);
  EXPECT_TRUE(throws_error_naming([&] { ops::embedding_backward(dw_bf16, out, tokens, {}); }, "embedding dweight"));
}
