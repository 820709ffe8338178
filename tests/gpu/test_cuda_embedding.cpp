// Embedding lookup on CUDA against the CPU op.
//   forward: a copy (or one float addition, rounded once) per element: bitwise equal.
//   backward (deterministic): each id's rows added in token order, as the CPU op: bitwise equal.
//   backward: float atomics add a row's contributions in any order. A row receiving r additions
//   onto its start value has error <= gamma_r (|start| + sum |dout|) < (r + 1) u32 (...) for
//   recursive summation in any order; checked elementwise against the CPU op in f64, the |.| sums
//   coming from the CPU op on absolute values.
#include <algorithm>
#include <map>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/embedding.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaEmbedding : public CudaTest {};

// (B,S) ids in [0, id_range): with vocab_start > 0 and V_local < id_range some are masked.
Tensor random_tokens(int64_t B, int64_t S, int64_t id_range, uint64_t seed) {
  Tensor t = Tensor::empty({B, S}, DType::i32);
  HostRng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_item(i, double(rng.uniform_int(uint64_t(id_range))));
  return t;
}

struct Case {
  int64_t B, S, C, V;
  int64_t vocab_start;
};
// C = 8 / 64: whole 16-byte packs for bf16/f16; C = 13: the scalar path; small V: repeated ids.
const Case kCases[] = {{1, 1, 8, 4, 0}, {3, 5, 13, 11, 4}, {2, 17, 64, 37, 0}, {4, 9, 8, 5, 2}, {8, 64, 96, 50, 10}};

}  // namespace

TEST_F(CudaEmbedding, ForwardWritesAndAccumulatesWithVocabMasking) {
  uint64_t seed = 1;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const Case& c : kCases) {
      for (const bool accumulate : {false, true}) {
        for (const int64_t misalign : {0, 1}) {
          Pair tokens = pair_of(random_tokens(c.B, c.S, c.vocab_start + c.V + 3, seed++));
          Pair weight = random_pair({c.V, c.C}, dtype, seed++, 1.0, misalign);
          Pair out = accumulate ? random_pair({c.S, c.B, c.C}, dtype, seed++) : poisoned_pair({c.S, c.B, c.C}, dtype);
          const ops::EmbeddingParams p{c.vocab_start, accumulate};
          ops::cpu::embedding_forward(out.cpu, tokens.cpu, weight.cpu, p);
          ops::cuda::embedding_forward(out.gpu, tokens.gpu, weight.gpu, p);
          EXPECT_TRUE(equals_cpu(out)) << dtype_name(dtype) << " B" << c.B << " S" << c.S << " C" << c.C << " V" << c.V
                                       << " start " << c.vocab_start << (accumulate ? " accumulate" : "")
                                       << " misalign " << misalign;
        }
      }
    }
  }
}

TEST_F(CudaEmbedding, BackwardAccumulatesIntoFp32Rows) {
  uint64_t seed = 100;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const Case& c : kCases) {
      const Tensor ids = random_tokens(c.B, c.S, c.vocab_start + c.V + 3, seed++);
      std::map<int32_t, int64_t> uses;
      for (int64_t i = 0; i < ids.numel(); ++i) ++uses[int32_t(ids.item(i))];
      int64_t most = 0;
      for (const auto& [id, count] : uses) most = std::max(most, count);

      Pair tokens = pair_of(ids);
      Pair dout = random_pair({c.S, c.B, c.C}, dtype, seed++);
      Pair dweight = random_pair({c.V, c.C}, DType::f32, seed++);  // main grads accumulate
      const ops::EmbeddingParams p{c.vocab_start, false};
      Tensor ref = f64(dweight.cpu), abs_sum = abs_f64(dweight.cpu);
      ops::cpu::embedding_backward(ref, f64(dout.cpu), tokens.cpu, p);
      ops::cpu::embedding_backward(abs_sum, abs_f64(dout.cpu), tokens.cpu, p);
      Tensor bound = Tensor::empty(ref.shape(), DType::f64);
      for (int64_t i = 0; i < bound.numel(); ++i)
        bound.set_item(i, double(most + 1) * kUnitRoundoffF32 * abs_sum.item(i));
      ops::cuda::embedding_backward(dweight.gpu, dout.gpu, tokens.gpu, p);
      EXPECT_TRUE(within_bound(dweight, ref, bound))
          << dtype_name(dtype) << " B" << c.B << " S" << c.S << " C" << c.C << " V" << c.V << " most uses " << most;
    }
  }
}

// --deterministic-mode's backward adds each id's rows in token order, as the CPU op: the same f32
// roundings, so the CPU op's bits. Heavily repeated ids (a few ids over thousands of tokens, the
// order atomics would vary most), vocabulary masking, the scalar path (C = 13, a misaligned dout)
// and 16-byte packs.
TEST_F(CudaEmbedding, DeterministicBackwardEqualsTheCpuOpBitForBit) {
  const Case cases[] = {{8, 512, 64, 5, 0}, {4, 1024, 768, 300, 100}, {3, 5, 13, 11, 4}, {16, 256, 96, 50, 10}};
  uint64_t seed = 300;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const Case& c : cases) {
      for (const int64_t misalign : {0, 1}) {
        Pair tokens = pair_of(random_tokens(c.B, c.S, c.vocab_start + c.V + 3, seed++));
        Pair dout = random_pair({c.S, c.B, c.C}, dtype, seed++, 1.0, misalign);
        Pair dweight = random_pair({c.V, c.C}, DType::f32, seed++);
        const ops::EmbeddingParams p{.vocab_start = c.vocab_start, .deterministic = true};
        ops::cpu::embedding_backward(dweight.cpu, dout.cpu, tokens.cpu, p);
        ops::cuda::embedding_backward(dweight.gpu, dout.gpu, tokens.gpu, p);
        EXPECT_TRUE(equals_cpu(dweight)) << dtype_name(dtype) << " B" << c.B << " S" << c.S << " C" << c.C << " V"
                                         << c.V << " start " << c.vocab_start << " misalign " << misalign;
      }
    }
  }
}

TEST_F(CudaEmbedding, RejectsWrongTokenDtype) {
  Tensor tokens = Tensor::zeros({2, 3}, DType::f32, gpu());
  Tensor weight = Tensor::zeros({5, 8}, DType::f32, gpu());
  Tensor out = Tensor::zeros({3, 2, 8}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::embedding_forward(out, tokens, weight, {}); }, "embedding tokens"));
}
