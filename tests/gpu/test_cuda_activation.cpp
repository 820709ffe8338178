// CUDA GELU and SwiGLU against the CPU op run in f64 on the same (bf16-exact) inputs, on the
// 16-byte-pack and scalar paths, with every output poisoned; SwiGLU with its output cast to FP8
// against the unfused CUDA pair bit for bit, and against the CPU within one FP8 code.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/activation.h"
#include "megatron/ops/fp8.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaActivation : public CudaTest {};

struct Case {
  int64_t N, F, misalign;  // F = 40 and 512 take packs; F = 13 and the shifted case take scalars
};
const Case kCases[] = {{37, 40, 0}, {8, 512, 0}, {9, 13, 0}, {16, 64, 1}};

// f32: each output is at most ~10 float operations plus one tanhf or expf (CUDA: 2 ulp at most),
// so 16 u covers it; the max|ref| term of `matches` absorbs the cancellation in 1 + tanh(u) for
// negative x. bf16/f16: one rounding of the result; factor 2 leaves room for the f32 part.
double factor_for(DType dt) { return dt == DType::f32 ? 16.0 : 2.0; }

}  // namespace

TEST_F(CudaActivation, GeluMatchesCpuF64) {
  uint64_t seed = 200;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const Case& c : kCases) {
      const std::string what = std::string(dtype_name(dt)) + " n=" + std::to_string(c.N * c.F);
      const Pair x = random_pair({c.N, c.F}, dt, ++seed, 3.0, c.misalign);
      const Pair dy = random_pair({c.N, c.F}, dt, ++seed, 1.0, c.misalign);
      Pair y = poisoned_pair({c.N, c.F}, dt, c.misalign), dx = poisoned_pair({c.N, c.F}, dt, c.misalign);
      ops::cuda::gelu_forward(y.gpu, x.gpu);
      ops::cuda::gelu_backward(dx.gpu, dy.gpu, x.gpu);
      Tensor ry = poisoned({c.N, c.F}, DType::f64), rdx = poisoned({c.N, c.F}, DType::f64);
      ops::cpu::gelu_forward(ry, f64(x.cpu));
      ops::cpu::gelu_backward(rdx, f64(dy.cpu), f64(x.cpu));
      EXPECT_TRUE(matches(y, ry, unit_roundoff(dt), factor_for(dt))) << what << " y";
      EXPECT_TRUE(matches(dx, rdx, unit_roundoff(dt), factor_for(dt))) << what << " dx";
    }
  }
}

TEST_F(CudaActivation, SwigluMatchesCpuF64) {
  uint64_t seed = 300;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const Case& c : kCases) {
      const std::string what = std::string(dtype_name(dt)) + " N=" + std::to_string(c.N) + " F=" + std::to_string(c.F);
      const Pair x = random_pair({c.N, 2 * c.F}, dt, ++seed, 3.0, c.misalign);
      const Pair dy = random_pair({c.N, c.F}, dt, ++seed, 1.0, c.misalign);
      Pair y = poisoned_pair({c.N, c.F}, dt, c.misalign), dx = poisoned_pair({c.N, 2 * c.F}, dt, c.misalign);
      ops::cuda::swiglu_forward(y.gpu, x.gpu);
      ops::cuda::swiglu_backward(dx.gpu, dy.gpu, x.gpu);
      Tensor ry = poisoned({c.N, c.F}, DType::f64), rdx = poisoned({c.N, 2 * c.F}, DType::f64);
      ops::cpu::swiglu_forward(ry, f64(x.cpu));
      ops::cpu::swiglu_backward(rdx, f64(dy.cpu), f64(x.cpu));
      EXPECT_TRUE(matches(y, ry, unit_roundoff(dt), factor_for(dt))) << what << " y";
      EXPECT_TRUE(matches(dx, rdx, unit_roundoff(dt), factor_for(dt))) << what << " dx";
    }
  }
}

namespace {

// Bytes of two FP8 tensors (host copies): identical, or (near) every code within one step of the
// other's (FP8 codes of one sign are ordered as integers).
::testing::AssertionResult fp8_codes(const Tensor& actual, const Tensor& ref, bool exact) {
  const Tensor a = actual.to(Device::cpu()), r = ref.to(Device::cpu());
  const auto* pa = static_cast<const uint8_t*>(a.raw());
  const auto* pr = static_cast<const uint8_t*>(r.raw());
  int64_t differing = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (pa[i] == pr[i]) continue;
    ++differing;
    const bool one_step = (pa[i] & 0x80) == (pr[i] & 0x80) && std::abs(int(pa[i] & 0x7f) - int(pr[i] & 0x7f)) == 1;
    if (exact || !one_step)
      return ::testing::AssertionFailure()
             << "code " << i << ": 0x" << std::hex << int(pa[i]) << " against 0x" << int(pr[i]);
  }
  // expf and the CPU's exp may round a bf16 result across a tie; rarely.
  if (differing * 100 > a.numel())
    return ::testing::AssertionFailure() << differing << " of " << a.numel() << " codes differ by one step";
  return ::testing::AssertionSuccess();
}

Tensor fp8_scalar(float v) { return Tensor::from_vector({v}, {1}).to(gpu()); }

}  // namespace

// The fused casts write what swiglu_forward / swiglu_backward followed by fp8_quantize_transpose
// write (the contract: the activation rounded to its dtype, then cast), bit for bit on the GPU, on
// the vector path (F a multiple of 8), ragged tiles, the element path (F = 13 and 20), rows not
// multiples of 8 (the backward casts dgate and dup, its two column blocks, from one read); and the
// CPU's fused op within one code (its exp differs from the GPU's expf in the last float bit).
TEST_F(CudaActivation, SwigluWithFp8CastMatchesTheUnfusedPair) {
  uint64_t seed = 500;
  for (const auto& [N, F] : {std::pair<int64_t, int64_t>{128, 64}, {70, 40}, {9, 13}, {64, 20}, {200, 512}})
    for (DType dt : {DType::bf16, DType::f32})
      for (DType q_dtype : {DType::e4m3, DType::e5m2}) {
        const std::string what =
            std::to_string(N) + "x" + std::to_string(F) + " " + dtype_name(dt) + " -> " + dtype_name(q_dtype);
        const Pair x = random_pair({N, 2 * F}, dt, ++seed, 3.0);
        const Pair dy = random_pair({N, F}, dt, ++seed, 1.0);
        const Tensor scale = fp8_scalar(37.0f);
        for (bool backward : {false, true}) {
          const int64_t cols = backward ? 2 * F : F;
          Tensor q = Tensor::empty({N, cols}, q_dtype, gpu()), q_t = Tensor::empty({cols, N}, q_dtype, gpu());
          Tensor uq = Tensor::empty({N, cols}, q_dtype, gpu()), uq_t = Tensor::empty({cols, N}, q_dtype, gpu());
          Tensor amax = fp8_scalar(0.0f), unfused_amax = fp8_scalar(0.0f), y = Tensor::empty({N, cols}, dt, gpu());
          if (backward) {
            ops::cuda::swiglu_backward_fp8(q, q_t, amax, dy.gpu, x.gpu, scale);
            ops::cuda::swiglu_backward(y, dy.gpu, x.gpu);
          } else {
            ops::cuda::swiglu_forward_fp8(q, q_t, amax, x.gpu, scale);
            ops::cuda::swiglu_forward(y, x.gpu);
          }
          ops::cuda::fp8_quantize_transpose(uq, uq_t, unfused_amax, y, scale);
          const std::string which = what + (backward ? " backward" : " forward");
          EXPECT_TRUE(fp8_codes(q, uq, true)) << which;
          EXPECT_TRUE(fp8_codes(q_t, uq_t, true)) << which;
          EXPECT_EQ(amax.item(), unfused_amax.item()) << which;

          Tensor cq = Tensor::empty({N, cols}, q_dtype), cq_t = Tensor::empty({cols, N}, q_dtype);
          Tensor camax = Tensor::from_vector({0.0f}, {1}), cscale = Tensor::from_vector({37.0f}, {1});
          if (backward)
            ops::cpu::swiglu_backward_fp8(cq, cq_t, camax, dy.cpu, x.cpu, cscale);
          else
            ops::cpu::swiglu_forward_fp8(cq, cq_t, camax, x.cpu, cscale);
          EXPECT_TRUE(fp8_codes(q, cq, false)) << which << " against the CPU";
          EXPECT_TRUE(fp8_codes(q_t, cq_t, false)) << which << " against the CPU";
          EXPECT_NEAR(amax.item(), camax.item(), 1e-2 * camax.item()) << which;
        }
      }
}

TEST_F(CudaActivation, RejectsF64AndBadShapes) {
  Tensor x = Tensor::zeros({4, 8}, DType::f64, gpu()), y = Tensor::zeros({4, 8}, DType::f64, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::gelu_forward(y, x); }, "f64"));
  Tensor xs = Tensor::zeros({4, 7}, DType::f32, gpu()), ys = Tensor::zeros({4, 3}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::swiglu_forward(ys, xs); }, "2F"));
}
