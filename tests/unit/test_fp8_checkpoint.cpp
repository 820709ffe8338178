// The FP8 recipe state in checkpoints (training/fp8_checkpoint.h): a tiny LLaMA-style model trained
// a few steps in emulated FP8 saves each FP8 linear layer's scales and amax histories once, under
// Transformer Engine's _extra_state names, and a new model loads them back exactly; runs that
// differ from the one that saved (bf16, tensorwise, another history length, other bf16 layers)
// load what applies and say in the log what they did.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megatron/checkpointing/checkpoint.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/training/checkpoint_io.h"
#include "test_util.h"
#include "tiny_models.h"

using namespace megatron;
using megatron::testing::TempDir;

namespace {

TransformerConfig tiny(const Fp8Config& fp8, int64_t layers = 2) {
  TransformerConfig c = megatron::testing::llama_style(DType::bf16);
  c.num_layers = layers;
  c.attention_dropout = c.hidden_dropout = 0.0f;
  c.fp8 = fp8;
  return c;
}

Fp8Config delayed(int64_t history = 4) {
  Fp8Config fp8;
  fp8.fp8_format = "hybrid";
  fp8.fp8_amax_history_len = history;
  fp8.fp8_amax_compute_algo = "max";
  return fp8;
}

// `steps` forward-backward passes, each followed by the recipe's update, so every FP8 operand holds
// scales and a history of its own.
void train(GPTModel& model, int steps) {
  const TransformerConfig& c = model.config();
  const int64_t B = 2, S = c.seq_length;
  for (int step = 0; step < steps; ++step) {
    Tensor tokens = Tensor::empty({B, S}, DType::i32), labels = Tensor::empty({B, S}, DType::i32);
    Tensor mask = Tensor::empty({B, S}, DType::f32);
    mask.fill(1.0);
    for (int64_t i = 0; i < B * S; ++i) {
      tokens.data<int32_t>()[i] = int32_t((i * 7 + step * 3) % c.vocab_size);
      labels.data<int32_t>()[i] = int32_t((i * 7 + step * 3 + 1) % c.vocab_size);
    }
    model.parameters().zero_grads();
    model.forward_backward(tokens, labels, mask, 1.0f / float(B * S), {.training = true, .step = uint64_t(step)});
    model.update_fp8_scales();
  }
}

// Saves `model` (weights and FP8 state, one replica) as iteration 1 of `dir`.
void save(GPTModel& model, const std::string& dir) {
  const ParallelContext ctx = ParallelContext::single_process();
  checkpointing::save_checkpoint(dir, 1, model_state(model, Optimizer::StateCopies::one_replica, ctx), {},
                                 nlohmann::json::object());
}

struct LoadLog {
  std::string out, err;
};

// Loads `dir` into `model` as --load does, with what it logged.
LoadLog load(GPTModel& model, const std::string& dir) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  load_model_weights(dir, model);
  LoadLog log;
  log.out = ::testing::internal::GetCapturedStdout();
  log.err = ::testing::internal::GetCapturedStderr();
  return log;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void expect_same_state(const tensor_parallel::Fp8Linear& a, const tensor_parallel::Fp8Linear& b) {
  const tensor_parallel::Fp8Linear::RecipeState sa = a.recipe_state(), sb = b.recipe_state();
  EXPECT_EQ(sa.scale_fwd.to_vector(), sb.scale_fwd.to_vector()) << a.name();
  EXPECT_EQ(sa.amax_history_fwd.to_vector(), sb.amax_history_fwd.to_vector()) << a.name();
  EXPECT_EQ(sa.scale_bwd.to_vector(), sb.scale_bwd.to_vector()) << a.name();
  EXPECT_EQ(sa.amax_history_bwd.to_vector(), sb.amax_history_bwd.to_vector()) << a.name();
}

const char* const kLinears[] = {"self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1",
                                "mlp.linear_fc2"};

}  // namespace

// Of 3 layers with the first and the last in bf16 only layer 1 runs in FP8: its 4 linear layers
// save 4 tensors each, and a new model loads every scale and history bit for bit.
TEST(Fp8Checkpoint, EachFp8LayerSavesItsRecipeStateOnceAndLoadsItBack) {
  Fp8Config fp8 = delayed();
  fp8.first_last_layers_bf16 = true;
  const ParallelContext ctx = ParallelContext::single_process();
  GPTModel trained(tiny(fp8, 3), ctx), resumed(tiny(fp8, 3), ctx);
  trained.parameters().initialize(3);
  train(trained, 3);

  std::vector<std::string> saved;
  for (const checkpointing::ShardedTensor& t : model_state(trained, Optimizer::StateCopies::one_replica, ctx))
    if (has(t.name, "_extra_state")) saved.push_back(t.name);
  std::vector<std::string> expected;
  for (const char* linear : kLinears)
    for (const char* field : {"scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"})
      expected.push_back(std::string("decoder.layers.1.") + linear + "._extra_state." + field);
  EXPECT_EQ(saved, expected);

  TempDir dir;
  save(trained, dir.path());
  const checkpointing::CheckpointReader reader = checkpointing::CheckpointReader::open(dir.path(), 1);
  EXPECT_EQ(reader.info("decoder.layers.1.mlp.linear_fc1._extra_state.amax_history_fwd").global_shape, (Shape{4, 2}));
  EXPECT_EQ(reader.info("decoder.layers.1.mlp.linear_fc1._extra_state.amax_history_bwd").global_shape, (Shape{4, 1}));
  const LoadLog log = load(resumed, dir.path());
  EXPECT_FALSE(has(log.out + log.err, "FP8")) << log.out << log.err;  // nothing to say: all of it loaded
  ASSERT_EQ(resumed.fp8_linears().size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(resumed.fp8_linears()[i]->name(), std::string("decoder.layers.1.") + kLinears[i]);
    EXPECT_NE(trained.fp8_linears()[i]->input().scale.item(), 1.0);  // trained: not the starting state
    expect_same_state(*trained.fp8_linears()[i], *resumed.fp8_linears()[i]);
    EXPECT_EQ(resumed.fp8_linears()[i]->weight().scale_inv.item(), trained.fp8_linears()[i]->weight().scale_inv.item());
  }
}

// A bf16 checkpoint loaded by a delayed-FP8 run: the recipe starts afresh (TE loads a module's empty
// extra state so), said in the log; and the other way round, or under tensorwise, the saved state
// is left unused, said too.
TEST(Fp8Checkpoint, StateMissingOrUnusedIsSaidInTheLog) {
  const ParallelContext ctx = ParallelContext::single_process();
  TempDir bf16_dir, fp8_dir;
  {
    GPTModel bf16(tiny({}), ctx), fp8(tiny(delayed()), ctx);
    bf16.parameters().initialize(3);
    fp8.parameters().initialize(3);
    train(bf16, 1);
    train(fp8, 2);
    save(bf16, bf16_dir.path());
    save(fp8, fp8_dir.path());
  }
  GPTModel from_bf16(tiny(delayed()), ctx);
  const LoadLog fresh = load(from_bf16, bf16_dir.path());
  EXPECT_TRUE(has(fresh.out, "holds no FP8 recipe state")) << fresh.out;
  EXPECT_TRUE(has(fresh.out, "the delayed scaling of 8 FP8 linear layers starts afresh")) << fresh.out;
  for (const tensor_parallel::Fp8Linear* linear : from_bf16.fp8_linears())
    EXPECT_FALSE(linear->input().scale.defined()) << linear->name();  // created at the first cast, scale 1

  GPTModel bf16_run(tiny({}), ctx);
  const LoadLog unused = load(bf16_run, fp8_dir.path());
  EXPECT_TRUE(has(unused.out,
                  "holds the delayed FP8 recipe state of 8 linear layers this run does not scale with "
                  "delayed FP8 (it trains without FP8, no --fp8-format): it is not loaded"))
      << unused.out;

  Fp8Config tensorwise;
  tensorwise.fp8_format = "e4m3";
  tensorwise.fp8_recipe = "tensorwise";
  GPTModel tensorwise_run(tiny(tensorwise), ctx);
  const LoadLog current = load(tensorwise_run, fp8_dir.path());
  EXPECT_TRUE(has(current.out, "(--fp8-recipe tensorwise, which keeps no state between steps)")) << current.out;
  for (const tensor_parallel::Fp8Linear* linear : tensorwise_run.fp8_linears())
    EXPECT_FALSE(linear->input().scale.defined()) << linear->name();
}

// Saved with a history of 4 steps, loaded with --fp8-amax-history-len 2: the first 2 rows of each
// history are kept (Transformer Engine's adjust_amax_history_length), with a warning naming both
// lengths and the flag that keeps the saved one.
TEST(Fp8Checkpoint, AnotherHistoryLengthIsCutAsTransformerEngineWithAWarning) {
  const ParallelContext ctx = ParallelContext::single_process();
  TempDir dir;
  GPTModel trained(tiny(delayed(4)), ctx), shorter(tiny(delayed(2)), ctx);
  trained.parameters().initialize(3);
  train(trained, 3);
  save(trained, dir.path());
  const LoadLog log = load(shorter, dir.path());
  EXPECT_TRUE(has(log.err, "holds FP8 amax histories of 4 steps and this run has --fp8-amax-history-len 2")) << log.err;
  EXPECT_TRUE(has(log.err, "pass --fp8-amax-history-len 4 to resume with the saved histories whole")) << log.err;
  for (size_t i = 0; i < trained.fp8_linears().size(); ++i) {
    const tensor_parallel::Fp8Linear &saved = *trained.fp8_linears()[i], &loaded = *shorter.fp8_linears()[i];
    EXPECT_EQ(loaded.grad_output().amax_history.to_vector(),
              (std::vector<float>{float(saved.grad_output().amax_history.item(0)),
                                  float(saved.grad_output().amax_history.item(1))}))
        << saved.name();
    EXPECT_EQ(loaded.weight().scale.item(), saved.weight().scale.item()) << saved.name();
  }
}

// Saved with layer 0 in bf16 (--first-last-layers-bf16, 1 at the start, none at the end), loaded by
// a run with both layers in FP8: layer 1 resumes its state, layer 0 starts afresh with a warning
// naming its linear layers. The other way round layer 0's saved state is unused, said in the log.
TEST(Fp8Checkpoint, LayersInBf16OnOneSideStartAfreshOrLeaveTheirStateUnused) {
  const ParallelContext ctx = ParallelContext::single_process();
  Fp8Config first_bf16 = delayed();
  first_bf16.first_last_layers_bf16 = true;
  first_bf16.num_layers_at_end_in_bf16 = 0;
  TempDir partial_dir, full_dir;
  GPTModel partial(tiny(first_bf16), ctx), full(tiny(delayed()), ctx);
  partial.parameters().initialize(3);
  full.parameters().initialize(3);
  train(partial, 2);
  train(full, 2);
  save(partial, partial_dir.path());
  save(full, full_dir.path());

  GPTModel all_fp8(tiny(delayed()), ctx);
  const LoadLog log = load(all_fp8, partial_dir.path());
  EXPECT_TRUE(has(log.err,
                  "holds no FP8 recipe state for decoder.layers.0.self_attention.linear_qkv, "
                  "decoder.layers.0.self_attention.linear_proj, decoder.layers.0.mlp.linear_fc1, "
                  "decoder.layers.0.mlp.linear_fc2 (bf16 layers of the run that saved it)"))
      << log.err;
  ASSERT_EQ(all_fp8.fp8_linears().size(), 8u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_FALSE(all_fp8.fp8_linears()[i]->input().scale.defined());
    expect_same_state(*partial.fp8_linears()[i], *all_fp8.fp8_linears()[4 + i]);
  }

  GPTModel first_in_bf16(tiny(first_bf16), ctx);
  const LoadLog unused = load(first_in_bf16, full_dir.path());
  EXPECT_TRUE(has(unused.out,
                  "of 4 linear layers this run does not scale with delayed FP8 (they are bf16 layers "
                  "here, --first-last-layers-bf16)"))
      << unused.out;
  for (size_t i = 0; i < 4; ++i) expect_same_state(*full.fp8_linears()[4 + i], *first_in_bf16.fp8_linears()[i]);
}
