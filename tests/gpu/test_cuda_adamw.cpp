// AdamW on CUDA against the CPU op. The kernel performs the reference's float operations in the
// same order with correctly rounded division and square root and no fused multiply-adds, and the
// bias corrections come from the same double expression, so master, moments and the compute copy
// must be bitwise equal to the CPU's (x86-64 has no FMA for the CPU compiler to contract into).
#include <cmath>
#include <cstring>
#include <utility>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/adamw.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaAdamW : public CudaTest {};

// A second moment is non-negative: squares of random values.
Tensor squares(const Shape& shape, uint64_t seed) {
  Tensor t = randn(shape, DType::f32, seed, 0.1);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_item(i, t.item(i) * t.item(i));
  return t;
}

struct State {
  Pair master, exp_avg, exp_avg_sq, grad, model;
};

State make_state(int64_t n, DType model_dtype, bool with_model, int64_t misalign, uint64_t seed,
                 int64_t model_misalign = 0) {
  State s;
  s.master = random_pair({n}, DType::f32, seed, 1.0, misalign);
  s.exp_avg = random_pair({n}, DType::f32, seed + 1, 0.1);
  s.exp_avg_sq = pair_of(squares({n}, seed + 2));
  s.grad = random_pair({n}, DType::f32, seed + 3);
  if (with_model) s.model = poisoned_pair({n}, model_dtype, model_misalign);
  return s;
}

}  // namespace

TEST_F(CudaAdamW, StepMatchesCpuBitwise) {
  const int64_t sizes[] = {1, 5, 1003, (1 << 16) + 1};
  const struct {
    DType dtype;
    bool defined;
  } models[] = {{DType::bf16, true}, {DType::f32, true}, {DType::f16, true}, {DType::f32, false}};
  uint64_t seed = 10;
  for (const int64_t n : sizes) {
    for (const auto& model : models) {
      // The master's and the compute copy's 16-byte alignment each choose vector or scalar access.
      for (const auto& [misalign, model_misalign] : {std::pair<int64_t, int64_t>{0, 0}, {1, 0}, {0, 1}, {1, 1}}) {
        for (const int64_t step : {1, 7}) {
          State s = make_state(n, model.dtype, model.defined, misalign, seed += 5, model_misalign);
          ops::AdamWParams p;
          p.lr = 3e-3f;
          p.beta1 = 0.9f;
          p.beta2 = 0.95f;
          p.eps = 1e-8f;
          p.weight_decay = 0.1f;
          p.grad_scale = 0.5f;
          p.step = step;
          ops::cpu::adamw_step(s.master.cpu, s.exp_avg.cpu, s.exp_avg_sq.cpu, s.grad.cpu, s.model.cpu, p);
          ops::cuda::adamw_step(s.master.gpu, s.exp_avg.gpu, s.exp_avg_sq.gpu, s.grad.gpu, s.model.gpu, p);
          const std::string what =
              "n=" + std::to_string(n) + " model=" + (model.defined ? dtype_name(model.dtype) : "none") +
              " misalign=" + std::to_string(misalign) + " model_misalign=" + std::to_string(model_misalign) +
              " step=" + std::to_string(step);
          EXPECT_TRUE(equals_cpu(s.master)) << "master " << what;
          EXPECT_TRUE(equals_cpu(s.exp_avg)) << "exp_avg " << what;
          EXPECT_TRUE(equals_cpu(s.exp_avg_sq)) << "exp_avg_sq " << what;
          if (model.defined) {
            EXPECT_TRUE(equals_cpu(s.model)) << "model_param " << what;
          }
        }
      }
    }
  }
}

// Masters kept as remainders beside bf16 parameters: random low halves (any u16) and parameters
// joined, updated, split, as the CPU does.
TEST_F(CudaAdamW, RemainderStepMatchesCpuBitwise) {
  uint64_t seed = 500;
  for (const int64_t n : {int64_t(1), int64_t(9), int64_t(1003), int64_t(1 << 16) + 3}) {
    for (const int64_t misalign : {0, 1}) {
      Tensor remainders = Tensor::empty({n}, DType::u16);
      for (int64_t i = 0; i < n; ++i) remainders.data<uint16_t>()[i] = uint16_t((i * 40503u + seed) & 0xffffu);
      State s = make_state(n, DType::bf16, true, misalign, seed += 5);
      s.model = random_pair({n}, DType::bf16, seed + 4, 1.0, misalign);
      Pair rem = pair_of(remainders, misalign);
      const ops::AdamWParams p{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3};
      ops::cpu::adamw_step(rem.cpu, s.exp_avg.cpu, s.exp_avg_sq.cpu, s.grad.cpu, s.model.cpu, p);
      ops::cuda::adamw_step(rem.gpu, s.exp_avg.gpu, s.exp_avg_sq.gpu, s.grad.gpu, s.model.gpu, p);
      const std::string what = "n=" + std::to_string(n) + " misalign=" + std::to_string(misalign);
      EXPECT_TRUE(equals_cpu(rem)) << "remainders " << what;
      EXPECT_TRUE(equals_cpu(s.model)) << "bf16 parameters " << what;
      EXPECT_TRUE(equals_cpu(s.exp_avg)) << "exp_avg " << what;
      EXPECT_TRUE(equals_cpu(s.exp_avg_sq)) << "exp_avg_sq " << what;
    }
  }
}

// FP8 codes cast in the update (--fp8-param-gather, the delayed recipe): the CPU's update and then
// its fp8_quantize, byte for byte, and the same amax (an earlier amax kept where it is larger).
TEST_F(CudaAdamW, Fp8CodesStepMatchesTheCpuUpdateAndCast) {
  uint64_t seed = 900;
  for (const int64_t n : {int64_t(1), int64_t(9), int64_t(1003), int64_t(1 << 16) + 3})
    for (const int64_t misalign : {0, 1})
      for (const DType dtype : {DType::e4m3, DType::e5m2})
        for (const double earlier_amax : {0.0, 100.0}) {
          State s = make_state(n, DType::f32, false, misalign, seed += 5);
          Tensor codes_cpu = Tensor::zeros({n}, dtype), codes_gpu = Tensor::zeros({n}, dtype, gpu());
          Tensor amax = Tensor::empty({1}, DType::f32), scale = Tensor::empty({1}, DType::f32);
          amax.fill(earlier_amax);
          scale.fill(96.0);  // 1.3 x 96 reaches e4m3's saturation at 448 for the largest masters
          Pair amaxes = pair_of(amax), scales = pair_of(scale);
          const ops::AdamWParams p{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3};
          ops::cpu::adamw_step_fp8(s.master.cpu, s.exp_avg.cpu, s.exp_avg_sq.cpu, s.grad.cpu, codes_cpu, amaxes.cpu,
                                   scales.cpu, p);
          ops::cuda::adamw_step_fp8(s.master.gpu, s.exp_avg.gpu, s.exp_avg_sq.gpu, s.grad.gpu, codes_gpu, amaxes.gpu,
                                    scales.gpu, p);
          const std::string what = "n=" + std::to_string(n) + " misalign=" + std::to_string(misalign) + " " +
                                   dtype_name(dtype) + " earlier amax " + std::to_string(earlier_amax);
          EXPECT_TRUE(equals_cpu(s.master)) << "master " << what;
          EXPECT_TRUE(equals_cpu(s.exp_avg)) << "exp_avg " << what;
          EXPECT_TRUE(equals_cpu(s.exp_avg_sq)) << "exp_avg_sq " << what;
          EXPECT_TRUE(equals_cpu(amaxes)) << "amax " << what;
          const Tensor back = codes_gpu.to(Device::cpu());
          EXPECT_EQ(std::memcmp(back.raw(), codes_cpu.raw(), size_t(n)), 0) << "codes " << what;
        }
}

// Many pieces in one op: each piece's CPU adamw_step (its own weight decay) bit for bit, across
// more pieces than one launch takes (kMaxPieces, 256), pieces of 0 to 3 chunks (8192 elements a
// chunk) and every vector tail, begins off 16-byte boundaries (scalar access for that piece), and
// compute copies of two dtypes in one call (one launch group each). The state between pieces and
// the copies' unused elements must stay as they were (the CPU reference leaves them).
TEST_F(CudaAdamW, PiecesMatchTheCpuPieceByPiece) {
  const int64_t sizes[] = {1, 7, 8, 9, 3072, 0, 8191, 8192, 8193, 20000, 16, 5};
  constexpr int kPieces = 300;
  enum class Masters { f32, remainders, none };
  for (const Masters kind : {Masters::f32, Masters::remainders, Masters::none}) {
    // Piece k: begin after a gap of k % 3 elements (1 and 2 leave the next begin unaligned).
    std::vector<int64_t> begins, counts;
    int64_t numel = 0;
    for (int k = 0; k < kPieces; ++k) {
      numel += k % 3;
      begins.push_back(numel);
      counts.push_back(sizes[size_t(k) % std::size(sizes)]);
      numel += counts.back();
    }
    uint64_t seed = 2000 + uint64_t(kind) * 100;
    Pair exp_avg = random_pair({numel}, DType::f32, seed, 0.1), exp_avg_sq = pair_of(squares({numel}, seed + 1));
    Pair master;
    if (kind == Masters::f32) master = random_pair({numel}, DType::f32, seed + 2);
    if (kind == Masters::remainders) {
      Tensor r = Tensor::empty({numel}, DType::u16);
      for (int64_t i = 0; i < numel; ++i) r.data<uint16_t>()[i] = uint16_t((i * 40503u + seed) & 0xffffu);
      master = pair_of(r);
    }
    // Gradients and compute copies: one buffer each, the pieces' views at their own offsets.
    Pair grads = random_pair({numel}, DType::f32, seed + 3);
    const DType first = kind == Masters::none ? DType::f32 : DType::bf16;
    const DType second = kind == Masters::f32 ? DType::f16 : first;
    Pair models[2] = {random_pair({numel}, first, seed + 4), random_pair({numel}, second, seed + 5)};
    std::vector<ops::AdamWPiece> pieces;
    ops::AdamWParams p{3e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.5f, 4};
    for (int k = 0; k < kPieces; ++k) {
      const int64_t b = begins[size_t(k)], e = b + counts[size_t(k)];
      Pair& model = models[k % 2];
      const float decay = k % 4 < 2 ? 0.1f : 0.0f;
      pieces.push_back({b, grads.gpu.slice(b, e), model.gpu.slice(b, e), decay});
      Tensor cpu_master = kind == Masters::none ? model.cpu.slice(b, e) : master.cpu.slice(b, e);
      Tensor m = exp_avg.cpu.slice(b, e), v = exp_avg_sq.cpu.slice(b, e), copy = model.cpu.slice(b, e), none;
      ops::AdamWParams own = p;
      own.weight_decay = decay;
      ops::cpu::adamw_step(cpu_master, m, v, grads.cpu.slice(b, e), kind == Masters::none ? none : copy, own);
    }
    Tensor no_master;
    ops::cuda::adamw_step_pieces(kind == Masters::none ? no_master : master.gpu, exp_avg.gpu, exp_avg_sq.gpu, pieces,
                                 p);
    const std::string what = kind == Masters::f32 ? "f32 masters" : kind == Masters::remainders ? "remainders" : "none";
    if (kind != Masters::none) {
      EXPECT_TRUE(equals_cpu(master)) << "masters, " << what;
    }
    EXPECT_TRUE(equals_cpu(exp_avg)) << "exp_avg, " << what;
    EXPECT_TRUE(equals_cpu(exp_avg_sq)) << "exp_avg_sq, " << what;
    EXPECT_TRUE(equals_cpu(models[0])) << "copies of the even pieces, " << what;
    EXPECT_TRUE(equals_cpu(models[1])) << "copies of the odd pieces, " << what;
  }
}

TEST_F(CudaAdamW, PiecesRejectAPieceOutsideTheState) {
  Tensor state = Tensor::zeros({16}, DType::f32, gpu()), grad = Tensor::zeros({8}, DType::f32, gpu());
  Tensor copy = Tensor::zeros({8}, DType::bf16, gpu()), fp8 = Tensor::zeros({8}, DType::e4m3, gpu());
  std::vector<ops::AdamWPiece> outside{{12, grad, copy, 0.0f}};
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::adamw_step_pieces(state, state, state, outside, {}); },
                                  "lies outside the state's 16 elements"));
  std::vector<ops::AdamWPiece> codes{{0, grad, fp8, 0.0f}};
  EXPECT_TRUE(
      throws_error_naming([&] { ops::cuda::adamw_step_pieces(state, state, state, codes, {}); }, "adamw_step_fp8"));
}

TEST_F(CudaAdamW, RejectsNonF32State) {
  Tensor master = Tensor::zeros({4}, DType::bf16, gpu());
  Tensor f = Tensor::zeros({4}, DType::f32, gpu());
  Tensor none;
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::adamw_step(master, f, f, f, none, {}); }, "adamw master"));
  Tensor m = Tensor::zeros({4}, DType::f32, gpu()), short_grad = Tensor::zeros({3}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::adamw_step(m, f, f, short_grad, none, {}); }, "adamw grad"));
  Tensor remainders = Tensor::zeros({4}, DType::u16, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::adamw_step(remainders, f, f, f, none, {}); }, "remainders"));
  // The CPU's rules (ops/checks/adamw.h): steps count from 1.
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::adamw_step(m, f, f, f, none, {.step = 0}); }, "step"));
}
