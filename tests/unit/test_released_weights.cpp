// DDP's released weights (DdpConfig::release_weights_after_backward): each bucket's 16-bit weights
// give their memory back once the step's last backward is done with them, and the optimizer's
// update takes it again and writes them from its f32 masters. Checked against the same model and
// optimizer keeping its weights, bit for bit: the values rewritten from the masters are what the
// update writes anyway (ops::cast rounds as AdamW's copy does), and a skipped step must leave
// them as they were.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "megatron/core/memory.h"
#include "megatron/distributed/ddp.h"
#include "megatron/distributed/distributed_optimizer.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/optimizer/grad_scaler.h"
#include "megatron/optimizer/optimizer.h"
#include "test_util.h"
#include "tiny_models.h"

using namespace megatron;
using megatron::testing::error_of;

namespace {

// GPT-2 style (tied output layer) or LLaMA style (untied), 3 layers: buckets of about 1000
// elements give several.
TransformerConfig tiny_config(DType dtype, bool untied) {
  TransformerConfig c = untied ? megatron::testing::llama_style(dtype) : megatron::testing::gpt2_style(dtype);
  c.num_layers = 3;
  return c;
}

struct TinyBatch {
  Tensor tokens = Tensor::empty({2, 6}, DType::i32), mask = Tensor::empty({2, 6}, DType::f32);
  explicit TinyBatch(int shift) {
    for (int64_t i = 0; i < 12; ++i) {
      tokens.data<int32_t>()[i] = int32_t((7 * i + 3 + shift) % 24);
      mask.data<float>()[i] = 1.0f;
    }
  }
};

// A model with DDP over buckets of about 1000 elements and an optimizer; `release` is the only
// difference between the two a test compares.
struct Trainer {
  const ParallelContext ctx = ParallelContext::single_process();
  GPTModel model;
  std::unique_ptr<DistributedDataParallel> ddp_;  // after the initialisation, which needs the flat buffer
  DistributedDataParallel& ddp;
  std::unique_ptr<Optimizer> optimizer;

  Trainer(const TransformerConfig& config, bool release, bool distributed, std::unique_ptr<GradScaler> scaler)
      : model(config, ctx),
        ddp_((model.parameters().initialize(5),
              std::make_unique<DistributedDataParallel>(model.parameters(), ctx,
                                                        DdpConfig{.use_distributed_optimizer = distributed,
                                                                  .bucket_size = 1000,
                                                                  .release_weights_after_backward = release}))),
        ddp(*ddp_) {
    const AdamWHyper hyper{.clip_grad = 1.0};
    if (distributed) {
      optimizer = std::make_unique<DistributedOptimizer>(ddp, ctx, hyper, std::move(scaler));
    } else {
      optimizer = std::make_unique<AdamWOptimizer>(model.parameters(), ctx, hyper, std::move(scaler));
    }
  }
  ParameterRegistry& registry() { return model.parameters(); }
  size_t released_parts() {
    size_t n = 0;
    for (size_t k = 0; k < registry().param_buffers().size(); ++k) n += !registry().params_held(k);
    return n;
  }
  // The step's micro-batches; returns the bytes the CPU allocator held more after them than after
  // zero_grad().
  int64_t forward_backward(int step, int micro_batches) {
    ddp.zero_grad();
    const int64_t before = int64_t(memory_stats(Device::cpu()).current_bytes);
    for (int m = 0; m < micro_batches; ++m) {
      const TinyBatch batch(step * micro_batches + m);
      ddp.set_last_micro_batch(m + 1 == micro_batches);
      model.forward_backward(batch.tokens, batch.tokens, batch.mask, 0.1f * optimizer->loss_scale(),
                             {.training = true, .seed = 1, .step = uint64_t(step * micro_batches + m)});
    }
    ddp.finish_grad_sync();
    return int64_t(memory_stats(Device::cpu()).current_bytes) - before;
  }
  std::vector<std::vector<float>> weights() {
    std::vector<std::vector<float>> w;
    for (const auto& p : registry().params()) w.push_back(p->data.to_vector());
    return w;
  }
};

// Both optimizers, tied and untied output layers, two micro-batches a step (the weights stay until
// the second one's backward): three bf16 steps bit for bit as with the weights kept; every bucket
// released at the backward's end, 2 bytes a parameter element less held then; every weight back
// after the step, and the gradients given back.
TEST(ReleasedWeights, TrainBitForBitAsKeptWeightsWhileHoldingLessAfterTheBackward) {
  for (const bool distributed : {false, true})
    for (const bool untied : {false, true}) {
      const std::string name =
          std::string(distributed ? "distributed" : "replicated") + (untied ? ", untied" : ", tied");
      const TransformerConfig config = tiny_config(DType::bf16, untied);
      Trainer kept(config, false, distributed, nullptr), released(config, true, distributed, nullptr);
      ParameterRegistry& reg = released.registry();
      const size_t buckets = released.ddp.layout().buckets.size();
      ASSERT_GE(buckets, 4u) << name;
      ASSERT_EQ(reg.param_buffers().size(), buckets) << name << ": the parameters split like the gradients";
      EXPECT_EQ(kept.registry().param_buffers().size(), 1u) << name;
      int64_t weight_bytes = 0;
      for (const Tensor& part : reg.param_buffers()) weight_bytes += int64_t(part.nbytes());
      for (int step = 0; step < 3; ++step) {
        const int64_t kept_held = kept.forward_backward(step, 2);
        const int64_t released_held = released.forward_backward(step, 2);
        EXPECT_EQ(released.released_parts(), buckets) << name << ", step " << step;
        EXPECT_EQ(released_held, kept_held - weight_bytes) << name << ", step " << step;
        EXPECT_NE(error_of([&] { reg.params()[0]->data.item(0); }).find("memory was released"), std::string::npos);
        const OptimizerStepResult a = kept.optimizer->step({1e-2, 0.1}), b = released.optimizer->step({1e-2, 0.1});
        EXPECT_FALSE(b.skipped) << name;
        EXPECT_EQ(a.grad_norm, b.grad_norm) << name << ", step " << step;
        EXPECT_EQ(released.released_parts(), 0u) << name << ": every weight back after the step";
        for (size_t k = 0; k < buckets; ++k) EXPECT_FALSE(reg.grads_held(k)) << name << ": gradients of part " << k;
        EXPECT_EQ(released.weights(), kept.weights()) << name << ", step " << step;
      }
    }
}

// fp16 with a dynamic loss scale that starts far too high: the first steps overflow and are
// skipped, which must leave the released weights as they were (written again from the unchanged
// masters; the distributed optimizer gathers them), then the scale falls and the steps update.
TEST(ReleasedWeights, SkippedStepsLeaveTheWeightsAsTheyWere) {
  for (const bool distributed : {false, true}) {
    const TransformerConfig config = tiny_config(DType::f16, true);
    const auto scaler = [] {
      return std::make_unique<DynamicGradScaler>(DynamicGradScalerParams{
          .initial_scale = 1099511627776.0f, .min_scale = 1.0f, .growth_interval = 1000, .hysteresis = 1});
    };
    Trainer kept(config, false, distributed, scaler()), released(config, true, distributed, scaler());
    const std::vector<std::vector<float>> initial = released.weights();
    int skipped = 0, updated = 0;
    for (int step = 0; step < 40; ++step) {
      kept.forward_backward(step, 1);
      released.forward_backward(step, 1);
      ASSERT_GT(released.released_parts(), 0u);
      const OptimizerStepResult a = kept.optimizer->step({1e-2, 0.1}), b = released.optimizer->step({1e-2, 0.1});
      ASSERT_EQ(a.skipped, b.skipped) << "step " << step;
      EXPECT_EQ(released.released_parts(), 0u);
      if (b.skipped && updated == 0) {
        EXPECT_EQ(released.weights(), initial) << "skipped step " << step;
      }
      skipped += b.skipped;
      updated += !b.skipped;
      ASSERT_EQ(released.weights(), kept.weights())
          << (distributed ? "distributed" : "replicated") << ", step " << step;
    }
    EXPECT_GE(skipped, 5) << "2^40 needs many halvings";
    EXPECT_GE(updated, 5);
  }
}

// The configurations whose weights are not a separate copy refuse it, by name.
TEST(ReleasedWeights, FsdpRefusesThem) {
  const ParallelContext ctx = ParallelContext::single_process();
  GPTModel model(tiny_config(DType::bf16, true), ctx);
  const std::string error = error_of([&] {
    DistributedDataParallel ddp(
        model.parameters(), ctx,
        {.use_distributed_optimizer = true, .shard_grads = true, .release_weights_after_backward = true});
  });
  EXPECT_NE(error.find("not built with Megatron FSDP"), std::string::npos) << error;
}

}  // namespace
