// Cross-entropy on CUDA against the CPU op run in f64 on the same (bf16-exact) logits. The whole-
// vocabulary forward is the vocab-parallel partial forward and combine with one rank.
//   forward, factor 64 (of u32, relative to |ref| + max|ref|): each exp term carries its
//     argument's rounding (|x - max| u, |x - max| < 20 for these 2 N(0,1) logits) and expf's
//     2 ulp; the sum adds up to V/256 terms per thread, 8 tree levels and one rescale per thread,
//     so the sum is within ~50 u relative and lse (and loss = lse - x_t) within ~50 u + 2 u |lse|.
//   backward, f32: softmax terms within ~20 u relative (argument rounding + expf), the target
//     term subtracts 1 and the mask scales: within ~22 u |scale|; factor 64 of u32 relative to the
//     row-wise scale (max|ref| ~ |scale|). bf16/f16: one final rounding dominates: factor 2 of u.
// Out-of-range targets: after a read-back, cross_entropy_check_targets raises exactly the CPU op's
// error (whole vocabulary, a vocab-parallel shard, and the model at its loss read-back).
#include <cmath>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/ops/cross_entropy.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaCrossEntropy : public CudaTest {};

constexpr double kForwardFactor = 64.0;

Tensor random_targets(int64_t N, int64_t V, uint64_t seed) {
  Tensor t = Tensor::empty({N}, DType::i32);
  HostRng rng(seed);
  for (int64_t i = 0; i < N; ++i) t.set_item(i, double(rng.uniform_int(uint64_t(V))));
  return t;
}

// Mask values 1, 0 and 0.5 (a weighted token), cycling.
Tensor mask_of(int64_t N) {
  Tensor m = Tensor::empty({N}, DType::f32);
  for (int64_t i = 0; i < N; ++i) m.set_item(i, i % 3 == 0 ? 1.0 : (i % 3 == 1 ? 0.0 : 0.5));
  return m;
}

const int64_t kRows[] = {1, 7, 33};
const int64_t kVocab[] = {1, 5, 127, 1000, 4099};

}  // namespace

TEST_F(CudaCrossEntropy, ForwardLossAndLse) {
  uint64_t seed = 1;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const int64_t N : kRows) {
      for (const int64_t V : kVocab) {
        for (const int64_t misalign : {0, 1}) {
          Pair logits = random_pair({N, V}, dtype, seed++, 2.0, misalign);
          Pair targets = pair_of(random_targets(N, V, seed++));
          Pair losses = poisoned_pair({N}, DType::f32), lse = poisoned_pair({N}, DType::f32);
          Tensor losses_ref = Tensor::empty({N}, DType::f64), lse_ref = Tensor::empty({N}, DType::f64);
          ops::cross_entropy_forward(losses_ref, lse_ref, f64(logits.cpu), targets.cpu);  // on the CPU
          ops::cross_entropy_forward(losses.gpu, lse.gpu, logits.gpu, targets.gpu);       // partial + combine on CUDA
          const std::string what = std::string(dtype_name(dtype)) + " N=" + std::to_string(N) +
                                   " V=" + std::to_string(V) + " misalign=" + std::to_string(misalign);
          EXPECT_TRUE(matches(lse, lse_ref, kUnitRoundoffF32, kForwardFactor)) << "lse " << what;
          EXPECT_TRUE(matches(losses, losses_ref, kUnitRoundoffF32, kForwardFactor)) << "losses " << what;
        }
      }
    }
  }
}

namespace {

::testing::AssertionResult run_backward(DType dtype, int64_t N, int64_t V, bool in_place, bool with_mask,
                                        int64_t misalign, uint64_t seed) {
  Pair logits = random_pair({N, V}, dtype, seed, 2.0, misalign);
  Pair targets = pair_of(random_targets(N, V, seed + 1));
  // Both backends read the same saved lse (the CPU forward's).
  Tensor losses_cpu = Tensor::empty({N}, DType::f32), lse_cpu = Tensor::empty({N}, DType::f32);
  ops::cross_entropy_forward(losses_cpu, lse_cpu, logits.cpu, targets.cpu);
  Pair lse = pair_of(lse_cpu);
  Pair mask = with_mask ? pair_of(mask_of(N)) : Pair{};
  const float grad_scale = 0.37f;

  Tensor ref = Tensor::empty({N, V}, DType::f64);
  ops::cpu::cross_entropy_backward(ref, f64(logits.cpu), targets.cpu, f64(lse.cpu),
                                   with_mask ? f64(mask.cpu) : Tensor(), grad_scale, {});
  Pair dlogits = in_place ? logits : poisoned_pair({N, V}, dtype, misalign);
  ops::cuda::cross_entropy_backward(dlogits.gpu, logits.gpu, targets.gpu, lse.gpu, mask.gpu, grad_scale, {});
  const double u = unit_roundoff(dtype);
  const double factor = dtype == DType::f32 ? 64.0 : 2.0;
  return matches(dlogits, ref, u, factor)
         << " (" << dtype_name(dtype) << " N=" << N << " V=" << V << (in_place ? " in place" : "")
         << (with_mask ? " masked" : "") << " misalign=" << misalign << ")";
}

}  // namespace

TEST_F(CudaCrossEntropy, BackwardSeparateOutput) {
  uint64_t seed = 100;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const int64_t N : kRows) {
      for (const int64_t V : kVocab) {
        for (const int64_t misalign : {0, 1}) EXPECT_TRUE(run_backward(dtype, N, V, false, true, misalign, seed += 3));
      }
    }
  }
}

TEST_F(CudaCrossEntropy, BackwardInPlaceOverLogits) {
  uint64_t seed = 200;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const int64_t V : {5, 1000, 4099}) {
      EXPECT_TRUE(run_backward(dtype, 9, V, true, true, 0, seed += 3));
      EXPECT_TRUE(run_backward(dtype, 9, V, true, false, 1, seed += 3));
    }
  }
}

namespace {

// Columns [begin, begin + width) of (N,V) host logits.
Tensor columns(const Tensor& logits, int64_t begin, int64_t width) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  Tensor out = Tensor::empty({N, width}, logits.dtype());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < width; ++j) out.set_item(n * width + j, logits.item(n * V + begin + j));
  return out;
}

}  // namespace

// The vocab-parallel pieces on CUDA, R ranks' column shards: each shard's partial forward, the
// combine of the stacked partials and each shard's backward, against the CPU ops in f64 on the
// same shards. Tolerances as above: a shard's partial is a shorter version of the whole-row
// reduction, and the combine adds R rescaled partial sums (a few u more than the 64 allow for).
TEST_F(CudaCrossEntropy, VocabParallelShards) {
  uint64_t seed = 300;
  struct Case {
    int64_t N, V, R;
  };
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const Case c : {Case{7, 1000, 2}, Case{33, 4100, 4}, Case{5, 12, 3}}) {
      const std::string what = std::string(dtype_name(dtype)) + " N=" + std::to_string(c.N) +
                               " V=" + std::to_string(c.V) + " R=" + std::to_string(c.R);
      const int64_t width = c.V / c.R;
      const Tensor logits = randn({c.N, c.V}, dtype, seed++, 2.0);
      Pair targets = pair_of(random_targets(c.N, c.V, seed++));
      Pair partials = poisoned_pair({c.R, 3, c.N}, DType::f32);
      Tensor partials_ref = Tensor::empty({c.R, 3, c.N}, DType::f64);
      std::vector<Pair> shards;
      for (int64_t r = 0; r < c.R; ++r) {
        const ops::VocabShard shard{.start = r * width, .size = c.V};
        shards.push_back(pair_of(columns(logits, r * width, width), r % 2));
        Tensor partial = partials.gpu.select(r), partial_ref = partials_ref.select(r);
        ops::cuda::cross_entropy_partial_forward(partial, shards.back().gpu, targets.gpu, shard);
        ops::cpu::cross_entropy_partial_forward(partial_ref, f64(shards.back().cpu), targets.cpu, shard);
      }
      Pair losses = poisoned_pair({c.N}, DType::f32), lse = poisoned_pair({c.N}, DType::f32);
      Tensor losses_ref = Tensor::empty({c.N}, DType::f64), lse_ref = Tensor::empty({c.N}, DType::f64);
      ops::cuda::cross_entropy_combine(losses.gpu, lse.gpu, partials.gpu);
      ops::cpu::cross_entropy_combine(losses_ref, lse_ref, partials_ref);
      EXPECT_TRUE(matches(lse, lse_ref, kUnitRoundoffF32, kForwardFactor)) << "lse " << what;
      EXPECT_TRUE(matches(losses, losses_ref, kUnitRoundoffF32, kForwardFactor)) << "losses " << what;

      // Both backends' backward read the same lse (the GPU's).
      Pair saved_lse = pair_of(lse.gpu.to(Device::cpu()));
      Pair mask = pair_of(mask_of(c.N));
      for (int64_t r = 0; r < c.R; ++r) {
        const ops::VocabShard shard{.start = r * width, .size = c.V};
        Tensor ref = Tensor::empty({c.N, width}, DType::f64);
        ops::cpu::cross_entropy_backward(ref, f64(shards[size_t(r)].cpu), targets.cpu, f64(saved_lse.cpu),
                                         f64(mask.cpu), 0.37f, shard);
        Pair dlogits = poisoned_pair({c.N, width}, dtype, r % 2);
        ops::cuda::cross_entropy_backward(dlogits.gpu, shards[size_t(r)].gpu, targets.gpu, saved_lse.gpu, mask.gpu,
                                          0.37f, shard);
        EXPECT_TRUE(matches(dlogits, ref, unit_roundoff(dtype), dtype == DType::f32 ? 64.0 : 2.0))
            << "dlogits " << what << " rank " << r;
      }
    }
  }
}

namespace {

// The error an op (or the check) raises, or a note that it raised none.
template <class Op>
std::string error_of(Op&& op) {
  try {
    op();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string check_error() {
  return error_of([] { ops::cross_entropy_check_targets(gpu()); });
}

}  // namespace

// A target outside the vocabulary: the CUDA kernels give its row a NaN loss and record it; once the
// host has read results back, cross_entropy_check_targets raises the CPU op's error word for word
// (the lowest bad row, its id, the vocabulary) and clears the record. Forward and backward alike.
TEST_F(CudaCrossEntropy, OutOfRangeTargetRaisesTheCpuError) {
  const int64_t N = 6, V = 10;
  Pair logits = random_pair({N, V}, DType::bf16, 5);
  Tensor bad = random_targets(N, V, 6);
  bad.set_item(4, -3.0);
  bad.set_item(2, double(V));
  Pair targets = pair_of(bad);
  Pair losses = poisoned_pair({N}, DType::f32), lse = poisoned_pair({N}, DType::f32);
  const std::string expected =
      error_of([&] { ops::cross_entropy_forward(losses.cpu, lse.cpu, logits.cpu, targets.cpu); });
  ASSERT_NE(expected.find("cross_entropy target 10 at row 2 is outside the vocabulary [0, 10)"), std::string::npos)
      << expected;

  EXPECT_EQ(check_error(), "(no error)") << "nothing recorded before the launch";
  ops::cross_entropy_forward(losses.gpu, lse.gpu, logits.gpu, targets.gpu);
  const Tensor read_back = losses.gpu.to(Device::cpu());
  EXPECT_TRUE(std::isfinite(read_back.item(0)));
  EXPECT_TRUE(std::isnan(read_back.item(2)));
  EXPECT_TRUE(std::isnan(read_back.item(4)));
  EXPECT_EQ(check_error(), expected);
  EXPECT_EQ(check_error(), "(no error)") << "the check clears the record";

  Pair dlogits = poisoned_pair({N, V}, DType::bf16);
  const std::string expected_backward =
      error_of([&] { ops::cross_entropy_backward(dlogits.cpu, logits.cpu, targets.cpu, lse.cpu, Tensor(), 1.0f, {}); });
  EXPECT_EQ(expected_backward, expected);
  ops::cross_entropy_backward(dlogits.gpu, logits.gpu, targets.gpu, lse.gpu, Tensor(), 1.0f, {});
  dlogits.gpu.to(Device::cpu());
  EXPECT_EQ(check_error(), expected_backward);

  // Good targets afterwards raise nothing.
  Pair good = pair_of(random_targets(N, V, 7));
  ops::cross_entropy_forward(losses.gpu, lse.gpu, logits.gpu, good.gpu);
  losses.gpu.to(Device::cpu());
  EXPECT_EQ(check_error(), "(no error)");
}

// Under vocabulary parallelism a target in another rank's columns is normal; one outside the whole
// (padded) vocabulary is the error, on every rank's shard, as on the CPU.
TEST_F(CudaCrossEntropy, VocabParallelTargetOutsideTheWholeVocabularyRaises) {
  const int64_t N = 4, V = 12, width = 6;
  const Tensor logits = randn({N, V}, DType::bf16, 8, 2.0);
  Tensor t = Tensor::empty({N}, DType::i32);
  for (int64_t n = 0; n < N; ++n) t.set_item(n, double((n * 5) % V));  // 0, 5, 10, 3: both shards
  for (const bool bad : {false, true}) {
    if (bad) t.set_item(3, double(V));
    Pair targets = pair_of(t);
    for (int64_t r = 0; r < 2; ++r) {
      const ops::VocabShard shard{.start = r * width, .size = V};
      Pair shard_logits = pair_of(columns(logits, r * width, width));
      Pair partial = poisoned_pair({3, N}, DType::f32);
      const std::string expected =
          error_of([&] { ops::cpu::cross_entropy_partial_forward(partial.cpu, shard_logits.cpu, targets.cpu, shard); });
      ops::cuda::cross_entropy_partial_forward(partial.gpu, shard_logits.gpu, targets.gpu, shard);
      partial.gpu.to(Device::cpu());
      EXPECT_EQ(check_error(), expected) << "rank " << r << (bad ? ", target 12" : ", targets inside");
      if (bad) {
        EXPECT_NE(expected.find("target 12 at row 3 is outside the vocabulary [0, 12)"), std::string::npos) << expected;
      } else {
        EXPECT_EQ(expected, "(no error)");
      }
    }
  }
}

// The model raises it where it reads the loss back, before the backward: the GPU's message is the
// CPU model's, for training and for evaluation.
TEST_F(CudaCrossEntropy, ModelRaisesTheCpuErrorAtTheLossReadBack) {
  TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = 32;
  c.num_attention_heads = c.num_query_groups = 2;
  c.kv_channels = 16;
  c.ffn_hidden_size = 64;
  c.vocab_size = c.padded_vocab_size = 32;
  c.max_position_embeddings = c.seq_length = 8;
  c.params_dtype = DType::bf16;
  const int64_t B = 2, S = 8;
  Tensor tokens = random_targets(B * S, c.vocab_size, 9).view({B, S});
  Tensor labels = random_targets(B * S, c.vocab_size, 10).view({B, S});
  labels.set_item(1 * S + 3, 40.0);  // sequence-major row 3 * B + 1 = 7
  Tensor mask = Tensor::empty({B, S}, DType::f32);
  mask.fill(1.0);
  const ParallelContext ctx = ParallelContext::single_process();
  std::vector<std::string> messages;
  for (const Device device : {Device::cpu(), gpu()}) {
    GPTModel model(c, ctx, device);
    model.parameters().initialize(1);
    messages.push_back(error_of([&] { model.forward_backward(tokens, labels, mask, 1.0f, {.seed = 3}); }));
    messages.push_back(error_of([&] { model.evaluate(tokens, labels, mask); }));
  }
  EXPECT_NE(messages[0].find("target 40 at row 7 is outside the vocabulary [0, 32)"), std::string::npos) << messages[0];
  EXPECT_EQ(messages[1], messages[0]);
  EXPECT_EQ(messages[2], messages[0]) << "GPU forward_backward";
  EXPECT_EQ(messages[3], messages[0]) << "GPU evaluate";
}
