// CUDA fill_normal against the CPU op: the same Philox counters and Box-Muller, with CUDA's logf
// (1 ulp) and cosf (2 ulp) against the host's: within 32 float roundoffs of |v| <= 5.8 in f32,
// and one bf16 rounding step in bf16 (a float difference that small can flip its rounding).
#include <gtest/gtest.h>

#include <string>

#include "gpu/cuda_test_util.h"
#include "megatron/core/rng.h"
#include "megatron/ops/random.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaRandom : public CudaTest {};

}  // namespace

TEST_F(CudaRandom, FillNormalMatchesTheCpu) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (uint64_t offset : {uint64_t(0), uint64_t(4096), uint64_t(1) << 33}) {
      const ops::RandomParams p{.seed = 21, .stream = stream_id("random-gpu-test"), .offset = offset};
      Pair t = poisoned_pair({5, 1001}, dt, 1);
      ops::cuda::fill_normal(t.gpu, p);
      ops::cpu::fill_normal(t.cpu, p);
      const double roundoff = dt == DType::f32 ? 0x1p-24 : 0x1p-8;
      EXPECT_TRUE(matches_cpu(t, roundoff, dt == DType::f32 ? 32.0 : 2.0))
          << dtype_name(dt) << " offset " << offset;
    }
  }
}
