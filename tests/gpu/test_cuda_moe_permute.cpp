// The MoE permutation ops (ops/moe_permute.h) on CUDA against the CPU op.
//   permute: a copy, or one float product rounded once: bitwise equal to the CPU.
//   unpermute: a sum over at most E weighted rows in expert order; CUDA fuses each product into
//     the sum (fmaf), so the two may differ within (E + 1) u32 times the sum of |terms|, plus one
//     rounding to a 16-bit output; checked against the CPU op in f64 with the |.| sums from the CPU
//     op on absolute values.
//   weight backward: an H-term dot product, (H + 1) u32 times the same on absolute values.
#include <cmath>

#include "gpu/cuda_test_util.h"
#include "megatron/core/rng.h"
#include "megatron/ops/moe_permute.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaMoePermute : public CudaTest {};

// A random top-k routing of T tokens over E experts as the two index tables.
struct Routing {
  Tensor row_token, token_rows;
  int64_t rows = 0;
};

Routing random_routing(int64_t T, int64_t E, int64_t k, uint64_t seed) {
  HostRng rng(seed);
  std::vector<std::vector<int32_t>> tokens_of(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> experts(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) experts[size_t(e)] = e;
    rng.shuffle(experts.begin(), experts.end());
    for (int64_t j = 0; j < k; ++j) tokens_of[size_t(experts[size_t(j)])].push_back(int32_t(t));
  }
  Routing r{Tensor::empty({T * k}, DType::i32), Tensor::empty({T, E}, DType::i32), T * k};
  for (int64_t i = 0; i < T * E; ++i) r.token_rows.set_item(i, -1);
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int32_t t : tokens_of[size_t(e)]) {
      r.row_token.set_item(row, t);
      r.token_rows.set_item(t * E + e, double(row++));
    }
  return r;
}

Tensor bound_of(const Tensor& abs_result, const Tensor& ref, int64_t terms, DType out_dtype) {
  Tensor bound = Tensor::empty(ref.shape(), DType::f64);
  const double u = out_dtype == DType::f32 ? 0.0 : unit_roundoff(out_dtype);
  // Below the smallest normal number, rounding to the output dtype errs by up to half the
  // subnormal spacing, not by u relative: 2^-25 for f16 (small weighted sums land there), 2^-134
  // for bf16.
  const double subnormal_half_step = out_dtype == DType::f16    ? std::ldexp(1.0, -25)
                                     : out_dtype == DType::bf16 ? std::ldexp(1.0, -134)
                                                                : 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double e = double(terms + 1) * kUnitRoundoffF32 * abs_result.item(i);
    bound.set_item(i, e * (1.0 + u) + u * std::fabs(ref.item(i)) + subnormal_half_step);
  }
  return bound;
}

}  // namespace

TEST_F(CudaMoePermute, MatchesTheCpu) {
  uint64_t seed = 1;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const auto& [T, E, k, H] : {std::array<int64_t, 4>{1, 2, 1, 8}, {37, 8, 2, 130}, {64, 16, 4, 256}}) {
      const Routing r = random_routing(T, E, k, seed++);
      const Pair row_token = pair_of(r.row_token), token_rows = pair_of(r.token_rows);
      const Pair x = random_pair({T, H}, dtype, seed++), row_w = random_pair({r.rows}, DType::f32, seed++);
      const Pair w = random_pair({T, E}, DType::f32, seed++);

      Pair rows = poisoned_pair({r.rows, H}, dtype);
      ops::cpu::moe_permute(rows.cpu, x.cpu, row_token.cpu, row_w.cpu);
      ops::cuda::moe_permute(rows.gpu, x.gpu, row_token.gpu, row_w.gpu);
      EXPECT_TRUE(equals_cpu(rows)) << dtype_name(dtype) << " permute";

      Pair out = poisoned_pair({T, H}, dtype);
      ops::cuda::moe_unpermute(out.gpu, rows.gpu, token_rows.gpu, w.gpu);
      Tensor ref = Tensor::empty({T, H}, DType::f64), abs_ref = Tensor::empty({T, H}, DType::f64);
      ops::cpu::moe_unpermute(ref, f64(rows.cpu), r.token_rows, f64(w.cpu));
      ops::cpu::moe_unpermute(abs_ref, abs_f64(rows.cpu), r.token_rows, abs_f64(w.cpu));
      EXPECT_TRUE(within_bound(out, ref, bound_of(abs_ref, ref, k, dtype))) << dtype_name(dtype) << " unpermute";

      const Pair dout = random_pair({T, H}, dtype, seed++);
      Pair dw = poisoned_pair({T, E}, DType::f32);
      ops::cuda::moe_unpermute_weight_backward(dw.gpu, dout.gpu, rows.gpu, token_rows.gpu);
      Tensor dw_ref = Tensor::empty({T, E}, DType::f64), dw_abs = Tensor::empty({T, E}, DType::f64);
      ops::cpu::moe_unpermute_weight_backward(dw_ref, f64(dout.cpu), f64(rows.cpu), r.token_rows);
      ops::cpu::moe_unpermute_weight_backward(dw_abs, abs_f64(dout.cpu), abs_f64(rows.cpu), r.token_rows);
      EXPECT_TRUE(within_bound(dw, dw_ref, bound_of(dw_abs, dw_ref, H, DType::f32))) << dtype_name(dtype) << " dweight";
    }
  }
}
