// megatron plan's activation model (planning/activation_model.h) against the engine: for each preset
// and setting, the bytes the plan says one micro-batch keeps for backward equal, to the byte, what a
// forward of the built model counts in its Saved structs (GPTModel::activation_bytes): dense GPT-2
// and LLaMA styles, f32 and bf16, MoE (top-2 in f32 and bf16, and DeepSeek routing with a shared expert,
// gated or not, in f32 and bf16), full
// recomputation (uniform 1 and 2, block 1), selective recomputation of core_attn, mlp, both, and layernorm,
// pipeline stages (first: embedding, no loss; last: stage input, loss), and FP8 (each recipe, bf16
// first and last layers, with recomputation and MoE). Exact: both count the same
// tensors' bytes, so any difference is a module the plan does not know.
#include <gtest/gtest.h>

#include <sstream>

#include "megatron/core/rng.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/planning/activation_model.h"
#include "megatron/planning/memory_plan.h"
#include "megatron/training/arguments.h"
#include "test_util.h"

using namespace megatron;
using megatron::testing::words;

namespace {

struct Case {
  std::string name;
  std::string flags;
  std::optional<pipeline_parallel::StageLayers> stage;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class PlanActivations : public ::testing::TestWithParam<Case> {};

TEST_P(PlanActivations, EqualWhatTheModelsSavedStructsHold) {
  const Case& c = GetParam();
  const TrainingArgs args =
      parse_training_args(words(c.flags +
                                " --micro-batch-size 2 --seq-length 32 --train-iters 1 --lr 1e-3 --mock-data "
                                "--tokenizer-type NullTokenizer --vocab-size 100" +
                                (c.flags.find("--device") == std::string::npos ? " --device cpu" : "")));
  const ParallelContext ctx = model_context(ParallelContext::single_process(), args.parallel);
  GPTModel model(args.model, ctx, Device::cpu(), c.stage);
  model.parameters().initialize(1);
  const int64_t B = args.micro_batch_size, S = args.model.seq_length;
  MicroBatch mb{Tensor::empty({B, S}, DType::i32), Tensor::empty({B, S}, DType::i32),
                Tensor::empty({B, S}, DType::f32), Tensor(), Tensor()};
  HostRng rng(3);
  for (int64_t i = 0; i < B * S; ++i) {
    mb.tokens.data<int32_t>()[i] = int32_t(rng.uniform_int(100));
    mb.labels.data<int32_t>()[i] = int32_t(rng.uniform_int(100));
    mb.loss_mask.data<float>()[i] = 1.0f;
  }
  const pipeline_parallel::StageLayers stage = model.stage();
  Tensor input;
  if (!stage.embedding) {
    input = Tensor::empty({S, B, args.model.hidden_size}, args.model.params_dtype);
    for (int64_t i = 0; i < input.numel(); ++i) input.set_item(i, 0.01 * double(i % 17));
  }
  GPTModel::Saved saved;
  LossSums sums;
  model.stage_forward(mb, input, {.training = true, .seed = 5, .step = 0}, saved, &sums);
  const planning::ActivationShape shape{.seq_length = S, .micro_batch = B};
  const planning::ChunkActivations planned =
      planning::chunk_activations(args.model, stage, shape, planning::PlanBackend::cpu);
  EXPECT_EQ(planned.counted(), model.activation_bytes());
}

const std::string kLlama = "--model-preset llama-tiny --num-layers 3";
const std::string kFp8Llama = kLlama + " --device cuda --bf16";
INSTANTIATE_TEST_SUITE_P(
    Presets, PlanActivations,
    ::testing::Values(
        Case{"gpt2_style", "--model-preset tiny --num-layers 3", {}},
        Case{"gpt2_style_no_dropout", "--model-preset tiny --attention-dropout 0 --hidden-dropout 0", {}},
        Case{"llama_style", kLlama, {}}, Case{"llama_bf16", kLlama + " --bf16", {}},
        Case{"llama_qk_layernorm", kLlama + " --qk-layernorm", {}},
        Case{"gpt2_qk_layernorm", "--model-preset tiny --num-layers 3 --qk-layernorm", {}},
        Case{"qk_layernorm_core_attn", kLlama + " --qk-layernorm --recompute-granularity selective", {}},
        Case{"moe", "--model-preset moe-tiny", {}}, Case{"moe_bf16", "--model-preset moe-tiny --bf16", {}},
        Case{"deepseek_shared_expert", "--model-preset deepseek-tiny", {}},
        Case{"gated_shared_expert", "--model-preset deepseek-tiny --moe-shared-expert-gate", {}},
        Case{"gated_shared_expert_bf16", "--model-preset deepseek-tiny --moe-shared-expert-gate --bf16", {}},
        Case{"shared_expert_bf16", "--model-preset deepseek-tiny --bf16", {}},
        Case{"gated_shared_expert_bf16_layernorm",
             "--model-preset deepseek-tiny --moe-shared-expert-gate --bf16 --recompute-granularity selective "
             "--recompute-modules layernorm",
             {}},
        Case{"moe_every_other_layer", "--model-preset moe-tiny --num-layers 4 --moe-layer-freq 2", {}},
        Case{"full_uniform_1",
             kLlama + " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
             {}},
        Case{"full_uniform_2",
             kLlama + " --recompute-granularity full --recompute-method uniform --recompute-num-layers 2",
             {}},
        Case{"full_block_1",
             kLlama + " --recompute-granularity full --recompute-method block --recompute-num-layers 1",
             {}},
        Case{"gpt2_full_block_2",
             "--model-preset tiny --num-layers 3 --recompute-granularity full --recompute-method block "
             "--recompute-num-layers 2",
             {}},
        Case{"selective_core_attn", kLlama + " --recompute-granularity selective", {}},
        Case{"selective_mlp", kLlama + " --recompute-granularity selective --recompute-modules mlp", {}},
        Case{"gpt2_selective_both",
             "--model-preset tiny --recompute-granularity selective --recompute-modules core_attn mlp",
             {}},
        Case{"selective_layernorm", kLlama + " --recompute-granularity selective --recompute-modules layernorm", {}},
        Case{"gpt2_selective_mlp_layernorm",
             "--model-preset tiny --recompute-granularity selective --recompute-modules mlp layernorm",
             {}},
        Case{"moe_selective_moe_act",
             "--model-preset moe-tiny --recompute-granularity selective --recompute-modules moe_act",
             {}},
        Case{"moe_selective_layernorm",
             "--model-preset moe-tiny --num-layers 4 --moe-layer-freq 2 --recompute-granularity selective "
             "--recompute-modules layernorm",
             {}},
        Case{"first_stage", kLlama, pipeline_parallel::StageLayers{0, 2, true, false}},
        Case{"last_stage", kLlama, pipeline_parallel::StageLayers{2, 1, false, true}},
        Case{"gpt2_middle_stage", "--model-preset tiny --num-layers 3",
             pipeline_parallel::StageLayers{1, 1, false, false}},
        // FP8 layers keep x^T casts in place of inputs (and of fc2's rebuilt input); the delayed
        // recipe's fused SwiGLU casts keep the same; first and last layers in bf16 keep the bf16 ones.
        // (FP8 flags are a GPU run's; the model is built on the CPU here, which emulates FP8.)
        Case{"fp8_delayed", kFp8Llama + " --fp8-format hybrid", {}},
        Case{"fp8_tensorwise", kFp8Llama + " --fp8-format e4m3 --fp8-recipe tensorwise", {}},
        Case{"fp8_blockwise_gpt2",
             "--model-preset tiny --num-layers 3 --device cuda --bf16 --fp8-format hybrid --fp8-recipe blockwise",
             {}},
        Case{"fp8_first_last_bf16",
             "--model-preset llama-tiny --num-layers 4 --device cuda --bf16 --fp8-format hybrid "
             "--first-last-layers-bf16",
             {}},
        Case{"fp8_selective_mlp",
             kFp8Llama + " --fp8-format hybrid --recompute-granularity selective --recompute-modules mlp",
             {}},
        Case{"fp8_selective_core_attn", kFp8Llama + " --fp8-format hybrid --recompute-granularity selective", {}},
        Case{"fp8_selective_mlp_layernorm",
             kFp8Llama + " --fp8-format hybrid --recompute-granularity selective --recompute-modules mlp layernorm",
             {}},
        Case{"fp8_full_block_1",
             kFp8Llama + " --fp8-format hybrid --recompute-granularity full --recompute-method block "
                         "--recompute-num-layers 1",
             {}},
        Case{"fp8_moe", "--model-preset moe-tiny --device cuda --bf16 --fp8-format hybrid", {}}),
    [](const ::testing::TestParamInfo<Case>& param_info) { return param_info.param.name; });

// The FP8 layers' weights cast once per step and kept (W and W^T, a byte an element each) count
// with the weights: llama-tiny, 4 layers, the first and last in bf16, so 2 FP8 layers of
// qkv 128 x 64 (2 groups x (2 + 2) heads x 16), proj 64 x 64, fc1 352 x 64, fc2 64 x 176 elements:
// 46080 a layer, 2 x 2 x 46080 bytes.
TEST(PlanMemory, Fp8WeightCastsCountWithTheWeights) {
  const std::string run =
      "--model-preset llama-tiny --num-layers 4 --device cuda --bf16 --micro-batch-size 2 "
      "--train-iters 1 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 100";
  const auto weights = [](const std::string& flags) {
    return planning::plan_memory(parse_training_args(words(flags)), planning::PlanBackend::cuda).stages[0].weights;
  };
  EXPECT_EQ(weights(run + " --fp8-format hybrid --first-last-layers-bf16") - weights(run), 2.0 * 2 * 46080);
  // --fp8-param-gather: W is the parameter's codes (a byte where bf16 took two) and only W^T is made
  // per step, so the FP8 weights cost what their bf16 copies did (the buckets' padding aside: the
  // distributed optimizer's layout puts them in buckets of their own, 64-element starts).
  const std::string distributed = run + " --use-distributed-optimizer --fp8-format hybrid --first-last-layers-bf16";
  EXPECT_NEAR(weights(distributed + " --fp8-param-gather"), weights(distributed) - 2.0 * 2 * 46080, 2.0 * 4096);
}

}  // namespace
