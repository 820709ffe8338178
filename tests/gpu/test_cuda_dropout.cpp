// CUDA dropout against the CPU op in the same dtype: both draw the keep decision from the same
// counter-based Philox stream and apply one float multiply, so the results are bitwise equal.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "gpu/cuda_test_util.h"
#include "megatron/core/rng.h"
#include "megatron/ops/dropout.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::DropoutParams;

namespace {

class CudaDropout : public CudaTest {};

}  // namespace

TEST_F(CudaDropout, MaskAndScaleEqualCpuBitwise) {
  uint64_t seed = 400;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    // 4096 aligned elements take 16-byte packs; 4099 elements in a shifted view take scalars.
    for (int64_t misalign : {0, 1}) {
      for (float prob : {0.0f, 0.2f, 0.9f}) {
        const std::string what =
            std::string(dtype_name(dt)) + " p=" + std::to_string(prob) + " misalign=" + std::to_string(misalign);
        const DropoutParams p{prob, 1234, stream_id("dropout-test")};
        const int64_t n = misalign == 0 ? 4096 : 4099;
        const Pair x = random_pair({n}, dt, ++seed, 1.0, misalign);
        Pair y = poisoned_pair({n}, dt, misalign), dx = poisoned_pair({n}, dt, misalign);
        ops::cuda::dropout_forward(y.gpu, x.gpu, p);
        ops::cpu::dropout_forward(y.cpu, x.cpu, p);
        EXPECT_TRUE(equals_cpu(y)) << what << " forward";
        ops::cuda::dropout_backward(dx.gpu, x.gpu, p);
        ops::cpu::dropout_backward(dx.cpu, x.cpu, p);
        EXPECT_TRUE(equals_cpu(dx)) << what << " backward";
      }
    }
  }
}

// A shard's mask starts at its offset (sequence parallelism): packed and scalar paths alike.
TEST_F(CudaDropout, OffsetEqualsCpuBitwise) {
  uint64_t seed = 500;
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t misalign : {0, 1}) {
      for (uint64_t offset : {uint64_t(1), uint64_t(4096), uint64_t(1) << 33}) {
        DropoutParams p{0.3f, 99, stream_id("dropout-offset-test")};
        p.offset = offset;
        const int64_t n = misalign == 0 ? 4096 : 4099;
        const Pair x = random_pair({n}, dt, ++seed, 1.0, misalign);
        Pair y = poisoned_pair({n}, dt, misalign);
        ops::cuda::dropout_forward(y.gpu, x.gpu, p);
        ops::cpu::dropout_forward(y.cpu, x.cpu, p);
        EXPECT_TRUE(equals_cpu(y)) << dtype_name(dt) << " offset " << offset << " misalign " << misalign;
      }
    }
  }
}

TEST_F(CudaDropout, InPlaceAndNanPropagation) {
  const DropoutParams p{0.5f, 7, stream_id("dropout-test")};
  Pair x = random_pair({1000}, DType::f32, 9);
  x.cpu.set_item(3, std::nan(""));  // dropped or kept, a NaN input must stay NaN (a multiply)
  Tensor x_gpu = x.cpu.to(gpu());
  ops::cuda::dropout_forward(x_gpu, x_gpu, p);
  ops::cpu::dropout_forward(x.cpu, x.cpu, p);
  const Tensor back = x_gpu.to(Device::cpu());
  EXPECT_TRUE(std::isnan(back.item(3)));
  for (int64_t i = 0; i < 1000; ++i) {
    if (i != 3) {
      ASSERT_EQ(back.item(i), x.cpu.item(i)) << i;
    }
  }
}

TEST_F(CudaDropout, RejectsBadProbabilityAndF64) {
  Tensor x = Tensor::zeros({8}, DType::f32, gpu()), y = Tensor::zeros({8}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::dropout_forward(y, x, {1.0f, 0, 0}); }, "dropout probability"));
  Tensor x64 = Tensor::zeros({8}, DType::f64, gpu()), y64 = Tensor::zeros({8}, DType::f64, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::dropout_forward(y64, x64, {0.1f, 0, 0}); }, "f64"));
}
