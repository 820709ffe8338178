// The grouped GEMM (ops/grouped_gemm.h) on CUDA: against the CPU reference run in f64 on the same
// bf16-exact values, with the error bound of test_cuda_gemm.cpp (2 (K + 2) u32 times the same
// products on absolute values, plus one 16-bit rounding of the output); against the per-expert
// loop of cuBLASLt linear ops (within one bf16 rounding); and its speed beside that loop, printed (8 experts, llama-1b
// widths).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/gemm.h"
#include "megatron/ops/grouped_gemm.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaGroupedGemm : public CudaTest {};

Tensor bound_of(const Tensor& abs_result, const Tensor& ref, int64_t k, DType out_dtype) {
  Tensor bound = Tensor::empty(ref.shape(), DType::f64);
  const double u = out_dtype == DType::f32 ? 0.0 : unit_roundoff(out_dtype);
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double e = 2.0 * double(k + 2) * kUnitRoundoffF32 * abs_result.item(i);
    bound.set_item(i, e * (1.0 + u) + u * std::fabs(ref.item(i)));
  }
  return bound;
}

int64_t total(const std::vector<int64_t>& counts) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

void check_forward_and_backward(DType dtype, const std::vector<int64_t>& counts, int64_t in, int64_t out) {
  const int64_t N = total(counts), E = int64_t(counts.size());
  const Pair x = random_pair({N, in}, dtype, 1), w = random_pair({E, out, in}, dtype, 2, 0.5);
  const Pair dy = random_pair({N, out}, dtype, 3);
  // forward: K = in
  Pair y = poisoned_pair({N, out}, dtype);
  ops::cuda::grouped_linear_forward(y.gpu, x.gpu, w.gpu, counts);
  Tensor ref = Tensor::empty({N, out}, DType::f64), abs_ref = Tensor::empty({N, out}, DType::f64);
  ops::cpu::grouped_linear_forward(ref, f64(x.cpu), f64(w.cpu), counts);
  ops::cpu::grouped_linear_forward(abs_ref, abs_f64(x.cpu), abs_f64(w.cpu), counts);
  EXPECT_TRUE(within_bound(y, ref, bound_of(abs_ref, ref, in, dtype))) << dtype_name(dtype) << " forward";
  EXPECT_TRUE(y.guards_intact());

  // backward: dx (K = out) overwritten, dW (K = rows of the expert, at most N) accumulated in f32
  Pair dx = poisoned_pair({N, in}, dtype), dw = random_pair({E, out, in}, DType::f32, 4);
  ops::cuda::grouped_linear_backward(dx.gpu, dw.gpu, dy.gpu, x.gpu, w.gpu, counts);
  Tensor dx_ref = Tensor::empty({N, in}, DType::f64), dx_abs = Tensor::empty({N, in}, DType::f64);
  Tensor dw_ref = f64(dw.cpu), dw_abs = abs_f64(dw.cpu), none;
  ops::cpu::grouped_linear_backward(dx_ref, dw_ref, f64(dy.cpu), f64(x.cpu), f64(w.cpu), counts);
  ops::cpu::grouped_linear_backward(dx_abs, dw_abs, abs_f64(dy.cpu), abs_f64(x.cpu), abs_f64(w.cpu), counts);
  EXPECT_TRUE(within_bound(dx, dx_ref, bound_of(dx_abs, dx_ref, out, dtype))) << dtype_name(dtype) << " dx";
  EXPECT_TRUE(within_bound(dw, dw_ref, bound_of(dw_abs, dw_ref, N + 1, DType::f32))) << dtype_name(dtype) << " dW";
}

}  // namespace

TEST_F(CudaGroupedGemm, MatchesTheCpuReferenceWithEmptyAndUnevenExperts) {
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    check_forward_and_backward(dtype, {5, 0, 17, 1}, 24, 40);
    check_forward_and_backward(dtype, {64, 32, 0, 96, 8, 8, 0, 48}, 128, 96);
  }
}

TEST_F(CudaGroupedGemm, EqualsThePerExpertLoopAndReportsSpeed) {
  // 8 experts, top-2 of 8192 tokens spread unevenly; fc1 of a SwiGLU expert at llama-1b widths.
  const std::vector<int64_t> counts{2560, 1536, 2048, 3072, 1024, 2560, 2048, 1536};
  const int64_t N = total(counts), E = 8, in = 2048, out = 2 * 5632;
  const Pair x = random_pair({N, in}, DType::bf16, 11), w = random_pair({E, out, in}, DType::bf16, 12, 0.02);
  Tensor grouped = Tensor::empty({N, out}, DType::bf16, gpu()), looped = Tensor::empty({N, out}, DType::bf16, gpu());
  const auto run_loop = [&] {
    int64_t begin = 0;
    for (int64_t e = 0; e < E; begin += counts[size_t(e)], ++e) {
      Tensor y_e = looped.slice(begin, begin + counts[size_t(e)]);
      ops::cuda::linear_forward(y_e, x.gpu.slice(begin, begin + counts[size_t(e)]), w.gpu.select(e), Tensor());
    }
  };
  const auto run_grouped = [&] { ops::cuda::grouped_linear_forward(grouped, x.gpu, w.gpu, counts); };
  run_loop();
  run_grouped();
  // Both sum the same 2048 products in FP32 and round once to bf16; the accumulation orders may
  // differ, by ~2048 u32 relative at most, far below bf16's spacing, so the results differ by at
  // most one bf16 step (2^-7 relative) where the rounding falls on either side of a midpoint.
  const Tensor g = grouped.to(Device::cpu()).to(DType::f64), l = looped.to(Device::cpu()).to(DType::f64);
  int64_t bad = 0;
  for (int64_t i = 0; i < g.numel(); ++i)
    bad += std::fabs(g.item(i) - l.item(i)) > 0x1p-7 * std::fabs(l.item(i)) + 1e-30;
  EXPECT_EQ(bad, 0);

  const auto time_ms = [](auto&& fn) {
    for (int i = 0; i < 3; ++i) fn();
    cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) fn();
    cuda::synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 20;
  };
  const double loop_ms = time_ms(run_loop), grouped_ms = time_ms(run_grouped);
  const double tflops = 2.0 * double(N) * double(in) * double(out) / 1e12;
  std::printf(
      "grouped GEMM 8 experts, %lld rows, %lldx%lld bf16: grouped %.3f ms (%.0f TFLOP/s), per-expert loop "
      "%.3f ms (%.0f TFLOP/s)\n",
      static_cast<long long>(N), static_cast<long long>(out), static_cast<long long>(in), grouped_ms,
      tflops / (grouped_ms * 1e-3), loop_ms, tflops / (loop_ms * 1e-3));
}
