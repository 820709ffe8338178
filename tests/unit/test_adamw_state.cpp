// AdamWState with optimizer CPU offload against the same state without it, on the CPU backend:
// the offloaded pipeline (chunks of a few elements, so segments split pieces and chunks pack
// several, two staging slots reused many times) must give the same bits, since the same AdamW op
// runs on the same values. Its copies are deferred until a wait asks for them (offload_copies.h),
// so an update that read a slot before its copy was waited for, or an upload left unwaited, would
// show as different values here.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "megatron/core/param_remainder.h"
#include "megatron/optimizer/adamw_state.h"
#include "megatron/optimizer/offload_copies.h"

using namespace megatron;

namespace {

// The index space: pieces with padding between them, as a flat buffer lays out parameters.
struct Range {
  int64_t begin, end;
  bool decay;
  bool decoupled_lr = false;
};
// The first piece and the fourth at --decoupled-lr's rate (the embedding, the output layer); the
// first lies in the offloaded part at every fraction below, the fourth on the device at 0.5.
const std::vector<Range> kPieces{
    {0, 5, true, true}, {8, 25, false}, {32, 35, true}, {40, 70, true, true}, {72, 79, false}};
constexpr int64_t kNumel = 80;

struct Model {
  Tensor params, grads;  // the flat buffers
  std::unique_ptr<AdamWState> state;

  // ignore_decoupled: every piece at the learning rate `lr` (the reference of the decoupled test).
  Model(DType params_dtype, const AdamWStateOptions& offload, bool ignore_decoupled = false) {
    std::vector<float> init(static_cast<size_t>(kNumel));
    for (size_t i = 0; i < init.size(); ++i) init[i] = std::sin(0.37f * float(i));
    params = Tensor::from_vector(init, {kNumel}, params_dtype);
    grads = Tensor::zeros({kNumel}, DType::f32);
    std::vector<AdamWState::Piece> pieces;
    for (const Range& r : kPieces)
      pieces.push_back({r.begin, r.end, grads.slice(r.begin, r.end), params.slice(r.begin, r.end), r.decay,
                        r.decoupled_lr && !ignore_decoupled});
    state = std::make_unique<AdamWState>(pieces, kNumel, Device::cpu(), params_dtype, DType::f32, offload);
  }
  void step(int64_t t, const StepRates& rates = {1e-2f, 0.1f, 3e-3f}) {
    std::vector<float> g(static_cast<size_t>(kNumel));
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::cos(0.11f * float(i) * float(t)) * float(t);
    grads.copy_from(Tensor::from_vector(g, {kNumel}, DType::f32));
    state->step({.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .grad_scale = 0.5f, .step = t}, rates);
  }
};

}  // namespace

TEST(AdamWStateOffload, ChunkedPipelineEqualsTheUpdateWithoutOffloadBitForBit) {
  for (DType params_dtype : {DType::f32, DType::bf16})
    for (double fraction : {1.0, 0.5})
      for (int64_t chunk : {int64_t(1), int64_t(8), int64_t(13), int64_t(1000)}) {
        SCOPED_TRACE(std::string(dtype_name(params_dtype)) + " fraction " + std::to_string(fraction) + " chunk " +
                     std::to_string(chunk));
        Model reference(params_dtype, {});
        Model offloaded(params_dtype, {.cpu_offload = true, .offload_fraction = fraction, .chunk_elements = chunk});
        ASSERT_GT(offloaded.state->host_bytes(), 0u);
        for (int64_t t = 1; t <= 3; ++t) {
          reference.step(t);
          offloaded.step(t);
          EXPECT_EQ(reference.params.to_vector(), offloaded.params.to_vector()) << "parameters after step " << t;
          for (const Range& r : kPieces) {
            EXPECT_EQ(reference.state->exp_avg(r.begin, r.end).to_vector(),
                      offloaded.state->exp_avg(r.begin, r.end).to_vector());
            EXPECT_EQ(reference.state->exp_avg_sq(r.begin, r.end).to_vector(),
                      offloaded.state->exp_avg_sq(r.begin, r.end).to_vector());
          }
        }
      }
}

// --decoupled-lr: the marked pieces take the decoupled rate and the others the plain one, on the
// device and in the offloaded part, with f32 masters and with remainders: the same bits as states
// with no piece marked, stepped at one rate or the other.
TEST(AdamWStateDecoupledLr, MarkedPiecesStepAtTheDecoupledRate) {
  const StepRates rates{1e-2f, 0.1f, 3e-3f};
  for (const AdamWStateOptions& options :
       {AdamWStateOptions{}, AdamWStateOptions{.cpu_offload = true, .offload_fraction = 0.5, .chunk_elements = 8},
        AdamWStateOptions{.store_param_remainders = true}}) {
    SCOPED_TRACE("offload " + std::to_string(options.cpu_offload) + " remainders " +
                 std::to_string(options.store_param_remainders));
    Model decoupled(DType::bf16, options);
    Model at_lr(DType::bf16, options, /*ignore_decoupled=*/true), at_decoupled(DType::bf16, options, true);
    for (int64_t t = 1; t <= 3; ++t) {
      decoupled.step(t, rates);
      at_lr.step(t, {rates.lr, rates.weight_decay});
      at_decoupled.step(t, {*rates.decoupled_lr, rates.weight_decay});
    }
    for (const Range& r : kPieces) {
      const Model& want = r.decoupled_lr ? at_decoupled : at_lr;
      EXPECT_EQ(decoupled.params.slice(r.begin, r.end).to_vector(), want.params.slice(r.begin, r.end).to_vector())
          << "piece [" << r.begin << ", " << r.end << ")";
      EXPECT_EQ(decoupled.state->master_values(r.begin, r.end).to_vector(),
                want.state->master_values(r.begin, r.end).to_vector());
    }
    // The control: the two rates move the parameters apart.
    EXPECT_NE(at_lr.params.to_vector(), at_decoupled.params.to_vector());
  }
}

// The CPU queue is what makes the test above check the ordering: a copy lands only when a wait
// covers it, in queue order.
TEST(AdamWStateOffload, CpuCopiesLandOnlyWhenAWaitCoversThem) {
  OffloadCopies copies(Device::cpu());
  Tensor a = Tensor::zeros({2}, DType::f32), b = Tensor::zeros({2}, DType::f32);
  copies.after_compute();
  copies.copy(a, Tensor::from_vector({1, 2}, {2}));
  const OffloadCopies::Mark first = copies.mark();
  copies.copy(b, Tensor::from_vector({3, 4}, {2}));
  const OffloadCopies::Mark second = copies.mark();
  EXPECT_EQ(a.to_vector(), (std::vector<float>{0, 0}));
  copies.host_wait(first);
  EXPECT_EQ(a.to_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(b.to_vector(), (std::vector<float>{0, 0}));
  copies.compute_waits(second);
  EXPECT_EQ(b.to_vector(), (std::vector<float>{3, 4}));
}

// --use-precision-aware-optimizer: masters kept as remainders beside bf16 parameters (on the
// device part; an offloaded part keeps f32) take the same updates as f32 masters, bit for bit, in
// half the bytes; a checkpoint's f32 masters load into them exactly.
TEST(AdamWStateRemainders, MastersEqualTheF32MastersInHalfTheBytes) {
  const auto masters_of = [](const Model& m) {
    std::vector<float> all;
    for (const Range& r : kPieces)
      for (float x : m.state->master_values(r.begin, r.end).to_vector()) all.push_back(x);
    return all;
  };
  for (double fraction : {0.0, 0.5}) {
    SCOPED_TRACE("offload fraction " + std::to_string(fraction));
    const bool offload = fraction > 0.0;
    Model reference(DType::bf16, {.cpu_offload = offload, .offload_fraction = fraction});
    Model remainders(DType::bf16,
                     {.cpu_offload = offload, .offload_fraction = fraction, .store_param_remainders = true});
    // The offloaded part ([0, host_end): f32 masters and moments, 12 bytes an element) keeps f32.
    const int64_t host_end = int64_t(reference.state->host_bytes() / 12);
    EXPECT_EQ(remainders.state->host_bytes(), reference.state->host_bytes());
    EXPECT_EQ(reference.state->device_bytes() - remainders.state->device_bytes(), size_t(2 * (kNumel - host_end)));
    for (int64_t t = 1; t <= 4; ++t) {
      reference.step(t);
      remainders.step(t);
      const std::vector<float> want = masters_of(reference), got = masters_of(remainders);
      ASSERT_EQ(want.size(), got.size());
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(got[i])) << "master " << i << " step " << t;
      for (const Range& r : kPieces) {
        EXPECT_EQ(reference.state->exp_avg(r.begin, r.end).to_vector(),
                  remainders.state->exp_avg(r.begin, r.end).to_vector());
      }
    }
    // Loading a checkpoint's masters (the reference's) into a fresh state overrules its parameters.
    Model loaded(DType::bf16, {.cpu_offload = offload, .offload_fraction = fraction, .store_param_remainders = true});
    for (const Range& r : kPieces) {
      const Tensor saved = reference.state->master_values(r.begin, r.end).clone();
      loaded.state->load_master(r.begin, r.end, [&](Tensor& t) { t.copy_from(saved); });
    }
    const std::vector<float> want = masters_of(reference), got = masters_of(loaded);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(got[i])) << "loaded master " << i;
    for (const Range& r : kPieces) {
      if (r.begin < host_end) continue;  // offloaded masters load into their f32 copy alone
      for (int64_t i = r.begin; i < r.end; ++i) {
        const float master = float(reference.state->master_values(i, i + 1).item(0));
        EXPECT_EQ(loaded.params.data<bf16>()[i].bits, split_master(master).param) << "parameter " << i;
      }
    }
  }
}
