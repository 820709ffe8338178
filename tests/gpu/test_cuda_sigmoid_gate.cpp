// The sigmoid gate (ops/sigmoid_gate.h) on CUDA against the CPU op run in f64 on the same values.
// The GPU sums in float: a row's dot product of H terms errs by at most H u32 of the sum of the
// terms' magnitudes, dw's sum of N rows' products by (N + H) u32 of its terms'; 16-bit outputs
// round once more (u of their dtype). The bounds: 4 (N + H) u32 of the largest result for f32
// outputs, 4 u of the dtype for 16-bit ones (the float error then lies two orders below it); the
// inputs keep every dot product's terms of the result's order (w scaled by 1/4).
#include "gpu/cuda_test_util.h"
#include "megatron/ops/sigmoid_gate.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaSigmoidGate : public CudaTest {};

}  // namespace

TEST_F(CudaSigmoidGate, MatchesTheCpu) {
  uint64_t seed = 1;
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    // One row; rows of an odd width; more rows than one of dw's chunks (256) holds.
    for (const auto& [N, H] : {std::array<int64_t, 2>{1, 8}, {37, 130}, {300, 256}}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " N=" << N << " H=" << H);
      const double u = dtype == DType::f32 ? 4.0 * double(N + H) * kUnitRoundoffF32 : 4.0 * unit_roundoff(dtype);
      const double u_f32 = 4.0 * double(N + H) * kUnitRoundoffF32;
      const Pair x = random_pair({N, H}, dtype, seed++), w = random_pair({H}, dtype, seed++, 0.25);
      const Pair out = random_pair({N, H}, dtype, seed++), dy = random_pair({N, H}, dtype, seed++);

      Pair y = poisoned_pair({N, H}, dtype), score = poisoned_pair({N}, DType::f32);
      ops::cuda::sigmoid_gate_forward(y.gpu, score.gpu, out.gpu, x.gpu, w.gpu);
      Tensor y_ref = Tensor::empty({N, H}, DType::f64), score_ref = Tensor::empty({N}, DType::f64);
      ops::cpu::sigmoid_gate_forward(y_ref, score_ref, f64(out.cpu), f64(x.cpu), f64(w.cpu));
      EXPECT_TRUE(matches(score, score_ref, u_f32, 1.0)) << "score";
      EXPECT_TRUE(matches(y, y_ref, u, 1.0)) << "y";

      // The backward from the GPU's own scores (the CPU reference recomputes them in f64).
      Pair dout = poisoned_pair({N, H}, dtype), dx = poisoned_pair({N, H}, dtype);
      Pair dw = random_pair({H}, DType::f32, seed++);  // accumulated onto
      Tensor dout_ref = Tensor::empty({N, H}, DType::f64), dx_ref = Tensor::empty({N, H}, DType::f64);
      Tensor dw_ref = f64(dw.cpu);
      ops::cuda::sigmoid_gate_backward(dout.gpu, dx.gpu, dw.gpu, dy.gpu, out.gpu, x.gpu, w.gpu, score.gpu);
      ops::cpu::sigmoid_gate_backward(dout_ref, dx_ref, dw_ref, f64(dy.cpu), f64(out.cpu), f64(x.cpu), f64(w.cpu),
                                      score_ref);
      EXPECT_TRUE(matches(dout, dout_ref, u, 1.0)) << "dout";
      EXPECT_TRUE(matches(dx, dx_ref, u, 1.0)) << "dx";
      EXPECT_TRUE(matches(dw, dw_ref, u_f32, 1.0)) << "dw";
    }
  }
}
