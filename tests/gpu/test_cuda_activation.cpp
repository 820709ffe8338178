// CUDA GELU and SwiGLU against the CPU op run in f64 on the same (bf16-exact) inputs, on the
// 16-byte-pack and scalar paths, with every output poisoned.
#include <gtest/gtest.h>

#include <string>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/activation.h"

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

TEST_F(CudaActivation, RejectsF64AndBadShapes) {
  Tensor x = Tensor::zeros({4, 8}, DType::f64, gpu()), y = Tensor::zeros({4, 8}, DType::f64, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::gelu_forward(y, x); }, "f64"));
  Tensor xs = Tensor::zeros({4, 7}, DType::f32, gpu()), ys = Tensor::zeros({4, 3}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::swiglu_forward(ys, xs); }, "2F"));
}
