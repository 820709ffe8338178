// Reductions on CUDA against the CPU op. Both sum in double and round once into the f32
// accumulator (acc = float(acc + total)); the double sums differ only in order (relative error
// ~n 2^-53, far below f32's), so the two results are the same float or neighbours:
// |gpu - cpu| <= 2 u32 |cpu|, which is matches_cpu with factor 1 (tolerance u (|r| + max|r|) = 2u|r|
// for one element). Counts are exact.
#include <limits>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/elementwise.h"
#include "megatron/ops/gemm.h"
#include "megatron/ops/reduce.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaReduce : public CudaTest {};

const int64_t kSizes[] = {1, 7, 1000, 4099, (1 << 20) + 5};
const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

// The accumulator starts non-zero: the ops add (+=) to it.
Pair accumulator(double start) { return pair_of(Tensor::from_vector({float(start)}, {1})); }

}  // namespace

TEST_F(CudaReduce, SumSquaresAccumulates) {
  uint64_t seed = 1;
  for (const DType dtype : kDtypes) {
    for (const int64_t n : kSizes) {
      for (const int64_t misalign : {0, 1}) {
        Pair x = random_pair({n}, dtype, seed++, 1.0, misalign);
        Pair acc = accumulator(2.5);
        ops::cpu::sum_squares(acc.cpu, x.cpu);
        ops::cuda::sum_squares(acc.gpu, x.gpu);
        EXPECT_TRUE(matches_cpu(acc, kUnitRoundoffF32, 1.0)) << dtype_name(dtype) << " n=" << n << " m=" << misalign;
      }
    }
  }
}

TEST_F(CudaReduce, DotAccumulates) {
  uint64_t seed = 100;
  for (const DType dtype : kDtypes) {
    for (const int64_t n : kSizes) {
      for (const int64_t misalign : {0, 1}) {
        Pair a = random_pair({n}, dtype, seed++, 1.0, misalign);
        Pair b = random_pair({n}, dtype, seed++);
        Pair acc = accumulator(-1.25);
        ops::cpu::dot(acc.cpu, a.cpu, b.cpu);
        ops::cuda::dot(acc.gpu, a.gpu, b.gpu);
        EXPECT_TRUE(matches_cpu(acc, kUnitRoundoffF32, 1.0)) << dtype_name(dtype) << " n=" << n << " m=" << misalign;
      }
    }
  }
}

TEST_F(CudaReduce, CountNonfiniteIsExact) {
  for (const DType dtype : kDtypes) {
    for (const int64_t n : kSizes) {
      Tensor host = randn({n}, dtype, uint64_t(n));
      // Non-finite values at the head, the middle and the tail (the scalar remainder).
      const double specials[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                 -std::numeric_limits<double>::infinity()};
      const int64_t where[] = {0, n / 2, n - 1};
      for (int i = 0; i < 3; ++i) host.set_item(where[i], specials[i]);
      for (const int64_t misalign : {0, 1}) {
        Pair x = pair_of(host, misalign);
        Pair acc = accumulator(4.0);
        ops::cpu::count_nonfinite(acc.cpu, x.cpu);
        ops::cuda::count_nonfinite(acc.gpu, x.gpu);
        EXPECT_TRUE(equals_cpu(acc)) << dtype_name(dtype) << " n=" << n;
      }
    }
  }
}

// count_zeros as the CPU counts them, into f32 and f64 accumulators (f64: exact past 2^24).
TEST_F(CudaReduce, CountZerosIsExact) {
  for (const DType dtype : kDtypes) {
    for (const int64_t n : kSizes) {
      Tensor host = randn({n}, dtype, uint64_t(n) + 5);
      for (const int64_t at : {int64_t(0), n / 3, n / 2, n - 1}) host.set_item(at, at % 2 == 0 ? 0.0 : -0.0);
      for (const int64_t misalign : {0, 1}) {
        Pair x = pair_of(host, misalign);
        Pair acc = accumulator(4.0);
        ops::cpu::count_zeros(acc.cpu, x.cpu);
        ops::cuda::count_zeros(acc.gpu, x.gpu);
        EXPECT_TRUE(equals_cpu(acc)) << dtype_name(dtype) << " n=" << n;
        Tensor acc64 = Tensor::zeros({1}, DType::f64, gpu());
        ops::cuda::count_zeros(acc64, x.gpu);
        EXPECT_EQ(acc64.to(Device::cpu()).item(0), acc.cpu.item(0) - 4.0) << dtype_name(dtype) << " n=" << n;
      }
    }
  }
  const int64_t many = (int64_t(1) << 24) + 3;
  Tensor zeros = Tensor::zeros({many}, DType::bf16, gpu()), acc64 = Tensor::zeros({1}, DType::f64, gpu());
  ops::cuda::count_zeros(acc64, zeros);
  EXPECT_EQ(acc64.to(Device::cpu()).item(0), double(many));
}

// The fp16 overflow chain of tests/unit/test_ops_reduce.cpp on the GPU: an f16 store beyond 65504
// (a cast, a cuBLASLt output) is Inf, the Inf reaches the fp32 main grad through the
// weight-gradient GEMM, and count_nonfinite counts it.
TEST_F(CudaReduce, CountsTheInfOfAnOverflowingF16Store) {
  Pair x = pair_of(Tensor::from_vector({1.0f, 65504.0f, 65519.99f, 65520.0f, -7e4f, 1e5f}, {6}));
  Pair h = poisoned_pair({6}, DType::f16);
  ops::cuda::cast(h.gpu, x.gpu);
  Pair acc = accumulator(0.0);
  ops::cuda::count_nonfinite(acc.gpu, h.gpu);
  EXPECT_EQ(acc.gpu.item(0), 3.0);

  // Row 0 of y = 256 * 256 + 256 * 256 = 131072 in every column, beyond f16's range; row 1 is 0.
  const int64_t in = 2, out = 3;
  Pair xs = pair_of(Tensor::from_vector({256, 256, 1, -1}, {2, in}, DType::f16));
  Pair w = pair_of(filled({out, in}, DType::f16, 256.0));
  Pair y = poisoned_pair({2, out}, DType::f16);
  ops::cuda::linear_forward(y.gpu, xs.gpu, w.gpu, Tensor());
  Pair y_count = accumulator(0.0);
  ops::cuda::count_nonfinite(y_count.gpu, y.gpu);
  EXPECT_EQ(y_count.gpu.item(0), double(out));

  Tensor dy_host = Tensor::zeros({2, out}, DType::f16);
  dy_host.set_item(1, std::numeric_limits<double>::infinity());
  Pair dy = pair_of(dy_host);
  Pair dx = poisoned_pair({2, in}, DType::f16);
  Pair dw = pair_of(Tensor::zeros({out, in}, DType::f32)), db = pair_of(Tensor::zeros({out}, DType::f32));
  ops::cuda::linear_backward(dx.gpu, dw.gpu, db.gpu, dy.gpu, xs.gpu, w.gpu, ops::GradWrite::accumulate);
  Pair dw_count = accumulator(0.0), db_count = accumulator(0.0);
  ops::cuda::count_nonfinite(dw_count.gpu, dw.gpu);
  ops::cuda::count_nonfinite(db_count.gpu, db.gpu);
  EXPECT_EQ(dw_count.gpu.item(0), double(in));  // the main-grad row dy's Inf touches: Inf * x
  EXPECT_EQ(db_count.gpu.item(0), 1.0);
}

TEST_F(CudaReduce, RepeatedRunsAreBitwiseEqual) {
  // No atomics: the same input reduces to the same bits every time (grad norms on resume).
  Pair x = random_pair({(1 << 22) + 3}, DType::bf16, 77);
  Pair first = accumulator(0.0), second = accumulator(0.0);
  ops::cuda::sum_squares(first.gpu, x.gpu);
  ops::cuda::sum_squares(second.gpu, x.gpu);
  EXPECT_EQ(first.gpu.item(0), second.gpu.item(0));
}

TEST_F(CudaReduce, RejectsWrongAccumulator) {
  Tensor x = Tensor::zeros({8}, DType::f32, gpu());
  Tensor acc2 = Tensor::zeros({2}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::sum_squares(acc2, x); }, "sum_squares acc"));
  Tensor x64 = Tensor::zeros({8}, DType::f64, gpu());
  Tensor acc = Tensor::zeros({1}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::sum_squares(acc, x64); }, "CPU-only"));
}
