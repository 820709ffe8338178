// multirank-np: 2
// Imported Hugging Face checkpoints at TP = 2 (tests/hf/tiny/, every family): each rank loads its
// slices (query groups, MLP columns, vocabulary rows) and its columns of the logits match
// transformers' within the single-rank bound (hf/hf_test_util.h), for a checkpoint imported at
// TP = 2 and one imported at TP = 1 and resharded on load, loaded as `megatron train --load CKPT
// --finetune` at TP = 2 loads it (no model flags; the stored vocabulary is HF's rows, whatever
// the TP it was imported at). A vocabulary TP 2 does not divide moves between TP 1 and TP 2 (its
// padding row added or dropped on load); the optimizer state of such a move is refused. Qwen3's
// q/k norms, Mixtral's, Qwen2-MoE's and Qwen3-MoE's experts at TP 2 against the float64 oracle
// (hf/llama_family_oracle.h).
#include <algorithm>
#include <functional>
#include <memory>

#include "hf/hf_test_util.h"
#include "hf/llama_family_oracle.h"
#include "megatron/hf_bridge/convert.h"
#include "megatron/optimizer/lr_scheduler.h"
#include "megatron/optimizer/optimizer.h"
#include "megatron/parallel/parallel_args.h"
#include "megatron/training/arguments.h"
#include "megatron/training/checkpoint_io.h"
#include "multirank/multirank_util.h"

namespace megatron::testing {
namespace {

TEST(HfTensorParallel, LogitsMatchTransformersAtTp2) {
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
  const std::string dir = shared_directory(owner.get());
  const ParallelState st = make_state({.tp = 2}, 60);
  for (const char* family : kHfFamilies) {
    for (int64_t import_tp : {1, 2}) {
      const std::string ckpt = dir + "/" + family + "-tp" + std::to_string(import_tp);
      if (st.ctx.world->rank() == 0)
        hf_bridge::import_hf({.hf_dir = hf_fixture(family), .save = ckpt, .tensor_model_parallel_size = import_tp});
      st.ctx.world->barrier();
      // As `megatron train --load CKPT --finetune` at TP 2 would: model flags from the checkpoint,
      // its architecture (padded vocabulary included) checked on load.
      std::vector<std::string> flags = {"--tensor-model-parallel-size", "2"};
      for (const std::string& flag : tp_run_flags(family)) flags.push_back(flag);
      const TrainingArgs args = parse_training_args(finetune_argv(ckpt, flags), 2);
      const ParallelContext ctx = model_context(st.ctx, args.parallel);
      GPTModel model(args.model, ctx);
      ASSERT_TRUE(load_training_checkpoint(args, model, nullptr, nullptr, nullptr));
      const double error = max_logit_error(model, hf_reference(family));
      if (st.ctx.world->rank() == 0)
        std::printf("%s imported at TP %ld, run at TP 2: max |logit - transformers| = %.3g\n", family, long(import_tp),
                    error);
      EXPECT_LE(error, kLogitTolerance) << family << " imported at TP " << import_tp;
    }
  }
  st.ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

// A checkpoint `make_fixture` writes (from the fixture of `base`: its prompts), imported at TP 1
// and at TP 2 and run at TP 2 with `run_flags`: the logits match the float64 oracle's within the
// bound.
void expect_oracle_logits_at_tp2(const std::string& name, const std::string& base,
                                 const std::function<std::string(const TempDir&)>& make_fixture,
                                 const std::vector<std::string>& run_flags) {
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
  const std::string dir = shared_directory(owner.get());
  const ParallelState st = make_state({.tp = 2}, 60);
  const std::string hf = dir + "/" + base + "-edited";  // where edited_fixture of `base` writes
  if (st.ctx.world->rank() == 0) {
    ASSERT_EQ(make_fixture(*owner), hf);
    for (int64_t tp : {1, 2})
      hf_bridge::import_hf({.hf_dir = hf, .save = dir + "/tp" + std::to_string(tp), .tensor_model_parallel_size = tp});
  }
  st.ctx.world->barrier();
  const HfReference ref = oracle_reference(LlamaFamilyOracle(hf), hf_reference(base).input_ids);
  for (int64_t import_tp : {1, 2}) {
    std::vector<std::string> flags = {"--tensor-model-parallel-size", "2"};
    flags.insert(flags.end(), run_flags.begin(), run_flags.end());
    const TrainingArgs args = parse_training_args(finetune_argv(dir + "/tp" + std::to_string(import_tp), flags), 2);
    const ParallelContext ctx = model_context(st.ctx, args.parallel);
    GPTModel model(args.model, ctx);
    ASSERT_TRUE(load_training_checkpoint(args, model, nullptr, nullptr, nullptr));
    const double error = max_logit_error(model, ref);
    if (st.ctx.world->rank() == 0)
      std::printf("%s imported at TP %ld, run at TP 2: max |logit - oracle| = %.3g\n", name.c_str(), long(import_tp),
                  error);
    EXPECT_LE(error, kLogitTolerance) << name << " imported at TP " << import_tp;
  }
  st.ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

// Qwen3 (made from the Qwen2 fixture, hf/hf_test_util.h): each rank's q/k norms (replicated)
// applied to its own query groups.
TEST(HfTensorParallel, Qwen3LogitsMatchTheOracleAtTp2) {
  expect_oracle_logits_at_tp2("qwen3", "qwen2", qwen3_fixture, {});
}

// Mixtral (made from the Mistral fixture): each rank holding its share of every expert's fc1 and
// fc2 (expert tensor parallelism = TP); MoE under TP routes each rank's own tokens: sequence
// parallelism (Megatron's rule).
TEST(HfTensorParallel, MixtralLogitsMatchTheOracleAtTp2) {
  expect_oracle_logits_at_tp2("mixtral", "mistral", mixtral_fixture, {"--sequence-parallel"});
}

// Qwen3-MoE (made from the Qwen2 fixture): a dense layer beside a sparse one, its experts narrower
// than the dense MLP, each TP rank holding its share of both.
TEST(HfTensorParallel, Qwen3MoeLogitsMatchTheOracleAtTp2) {
  expect_oracle_logits_at_tp2("qwen3_moe", "qwen2", [](const TempDir& dir) { return qwen3_moe_fixture(dir, true); },
                              {"--sequence-parallel"});
}

// Qwen2-MoE (made from the Qwen2 fixture): QKV biases, and a gated shared expert split over TP beside
// the experts, its gate replicated.
TEST(HfTensorParallel, Qwen2MoeLogitsMatchTheOracleAtTp2) {
  expect_oracle_logits_at_tp2("qwen2_moe", "qwen2", qwen2_moe_fixture, {"--sequence-parallel"});
}

// GPT-2 with 321 rows (as GPT-2's 50257, odd): imported at TP 1 it holds 321 rows and runs at TP 2
// with 322, the padding row added as zeros (an import at TP 2 writes the same); imported at TP 2 it
// holds 322 rows and runs at TP 1 with 321, the padding row dropped. The logits of HF's columns
// match transformers' either way, and the padding column's logit is 0 (a zero row). Resuming the
// optimizer state across such a move is refused, naming the fix.
TEST(HfTensorParallel, OddVocabularyMovesBetweenTp1AndTp2) {
  std::unique_ptr<TempDir> owner;
  if (make_state({}).ctx.world->rank() == 0) owner = std::make_unique<TempDir>();
  const std::string dir = shared_directory(owner.get());
  const ParallelState st = make_state({.tp = 2}, 60);
  const HfReference ref = hf_reference("gpt2");
  if (st.ctx.world->rank() == 0) {
    const std::string odd = odd_vocabulary_gpt2(*owner);
    hf_bridge::import_hf({.hf_dir = odd, .save = dir + "/tp1", .tensor_model_parallel_size = 1});
    hf_bridge::import_hf({.hf_dir = odd, .save = dir + "/tp2", .tensor_model_parallel_size = 2});
    // TP 2's checkpoint at TP 1, on one process.
    const TrainingArgs args = parse_training_args(finetune_argv(dir + "/tp2"));
    const ParallelContext single = ParallelContext::single_process();
    GPTModel model(args.model, single);
    ASSERT_TRUE(load_training_checkpoint(args, model, nullptr, nullptr, nullptr));
    EXPECT_EQ(model.config().padded_vocab_size, 321);
    const double error = max_logit_error(model, ref);
    std::printf("vocabulary of 321 imported at TP 2, run at TP 1: max |logit - transformers| = %.3g\n", error);
    EXPECT_LE(error, kLogitTolerance);
  }
  st.ctx.world->barrier();

  // TP 1's checkpoint at TP 2.
  const TrainingArgs args = parse_training_args(finetune_argv(dir + "/tp1", {"--tensor-model-parallel-size", "2"}), 2);
  const ParallelContext ctx = model_context(st.ctx, args.parallel);
  GPTModel model(args.model, ctx);
  ASSERT_TRUE(load_training_checkpoint(args, model, nullptr, nullptr, nullptr));
  EXPECT_EQ(model.config().padded_vocab_size, 322);
  const Tensor logits = model.logits(prompt_tokens(ref));  // (T,P,161): rank 1 holds columns 161..321
  const double error = logit_error(logits, logits.dim(2) * ctx.tp_rank(), ref);
  if (ctx.tp_rank() == 1) {
    for (int64_t row = 0; row < logits.dim(0) * logits.dim(1); ++row)
      ASSERT_EQ(logits.item(row * logits.dim(2) + logits.dim(2) - 1), 0.0) << "the padding column at row " << row;
  }
  std::printf("vocabulary of 321 imported at TP 1, run at TP 2 (rank %d): max |logit - transformers| = %.3g\n",
              ctx.tp_rank(), error);
  EXPECT_LE(error, kLogitTolerance);

  // A checkpoint of TP 2 with optimizer state (its vocabulary padded to 322), resumed at TP 1.
  AdamWOptimizer optimizer(model.parameters(), ctx, AdamWHyper{});
  TrainingArgs saving = args;
  saving.save = dir + "/trained";
  const OptimizerParamScheduler scheduler(args.optimizer, args.train_iters, args.global_batch_size);
  save_training_checkpoint(saving, model, &optimizer, scheduler, {.iteration = 1}, ctx);
  if (st.ctx.world->rank() == 0) {
    std::vector<std::string> resume = finetune_argv(saving.save);
    resume.erase(std::find(resume.begin(), resume.end(), "--finetune"));
    const TrainingArgs resumed = parse_training_args(resume);
    const ParallelContext single = ParallelContext::single_process();
    GPTModel tp1(resumed.model, single);
    AdamWOptimizer tp1_optimizer(tp1.parameters(), single, AdamWHyper{});
    TrainingProgress progress;
    const std::string refusal =
        error_of([&] { load_training_checkpoint(resumed, tp1, &tp1_optimizer, nullptr, &progress); });
    EXPECT_NE(refusal.find("holds 322 vocabulary rows of embedding.word_embeddings.weight and this run pads to 321"),
              std::string::npos)
        << refusal;
    EXPECT_NE(refusal.find("--finetune or --no-load-optim"), std::string::npos) << refusal;
  }
  st.ctx.world->barrier();  // rank 0 removes the directory once everyone is done with it
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
