// multirank-np: 2 4
// Per-rank checkpoint writers (training/checkpoint_io.h): every rank writes its own files into the
// shared staging directory (the weights once, optimizer shards from every rank of the distributed
// optimizer), rank 0 publishes, and a failure of any rank while writing fails the save on every
// rank with that rank's error while the previous checkpoint stays the latest.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "megatron/checkpointing/checkpoint.h"
#include "megatron/distributed/ddp.h"
#include "megatron/distributed/distributed_optimizer.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/training/checkpoint_io.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> run_argv(const std::string& save, bool distributed_optimizer,
                                  const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = minimal_train_argv({"--save", save, "--save-interval", "1"});
  if (distributed_optimizer) argv.push_back("--use-distributed-optimizer");
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// A model and optimizer laid out for this world's DP size, ready to be saved.
struct SavedRun {
  SavedRun(const ParallelContext& ctx, bool distributed_optimizer, const std::string& save,
           const std::vector<std::string>& extra = {})
      : args(parse_training_args(run_argv(save, distributed_optimizer, extra), ctx.world->size())),
        model(args.model, ctx),
        ddp(model.parameters(), ctx, {.use_distributed_optimizer = distributed_optimizer}),
        scheduler(args.optimizer, args.train_iters, args.global_batch_size) {
    model.parameters().initialize(uint64_t(args.seed));
    if (distributed_optimizer)
      optimizer = std::make_unique<DistributedOptimizer>(ddp, ctx, AdamWHyper{});
    else
      optimizer = std::make_unique<AdamWOptimizer>(model.parameters(), ctx, AdamWHyper{});
  }
  TrainingArgs args;
  GPTModel model;
  DistributedDataParallel ddp;
  OptimizerParamScheduler scheduler;
  std::unique_ptr<Optimizer> optimizer;
};

class CheckpointIo : public ::testing::Test {
 protected:
  void SetUp() override {
    st_ = make_state({}, 30);
    owner_ = st_.ctx.world->rank() == 0 ? std::make_unique<TempDir>() : nullptr;
    dir_ = shared_directory(owner_.get());
  }
  void TearDown() override { st_.ctx.world->barrier(); }  // rank 0 removes the directory last

  void save(SavedRun& run, int64_t iteration, const checkpointing::SaveOptions& options = {}) {
    save_training_checkpoint(run.args, run.model, run.optimizer.get(), run.scheduler, {.iteration = iteration}, st_.ctx,
                             options);
  }

  ParallelState st_;
  std::unique_ptr<TempDir> owner_;
  std::string dir_;
};

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string rank_file(const char* kind, int rank) {
  char text[64];
  std::snprintf(text, sizeof text, "%s_rank_%05d.safetensors", kind, rank);
  return text;
}

TEST_F(CheckpointIo, WeightsAreWrittenOnceAndOptimizerShardsByEveryRank) {
  const int n = st_.ctx.world->size();
  for (const bool distributed : {false, true}) {
    const std::string save_dir = dir_ + (distributed ? "/dist" : "/replicated");
    SavedRun run(st_.ctx, distributed, save_dir);
    save(run, 1);
    std::vector<std::string> expected = {"common.json", "metadata.json", rank_file("model", 0)};
    for (int r = 0; r < (distributed ? n : 1); ++r) expected.push_back(rank_file("optim", r));
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(files_in(save_dir + "/iter_0000001"), expected) << (distributed ? "distributed" : "replicated");
    const auto metadata = nlohmann::json::parse(std::ifstream(save_dir + "/iter_0000001/metadata.json"));
    EXPECT_EQ(metadata.at("world_size"), n);
    // What rank 0 published reads back on every rank, each from the others' files too.
    const checkpointing::CheckpointReader reader = checkpointing::CheckpointReader::open(save_dir, 1);
    for (const auto& p : run.model.parameters().params()) {
      Tensor loaded = Tensor::empty(p->data.shape(), p->data.dtype());
      reader.load(p->spec.name, Shape(p->data.shape().size(), 0), loaded);
      EXPECT_EQ(loaded.to_vector(), p->data.to_vector()) << p->spec.name;
    }
  }
}

// The last rank fails while writing (at each of its stages); every rank throws that rank's error,
// the tracker keeps naming iteration 1, and rank 0 removes the unpublished staging directory.
TEST_F(CheckpointIo, AFailingRankFailsTheSaveOnEveryRankAndKeepsThePreviousCheckpoint) {
  const int n = st_.ctx.world->size(), rank = st_.ctx.world->rank();
  SavedRun run(st_.ctx, true, dir_);
  save(run, 1);
  for (const std::string stage : checkpointing::kWriterSaveStages) {
    SCOPED_TRACE(stage);
    checkpointing::SaveOptions options;
    options.on_stage = [&](const std::string& s) {
      if (s == stage && rank == n - 1) throw std::runtime_error("injected failure at " + s);
    };
    const std::string error = error_of([&] { save(run, 2, options); });
    EXPECT_NE(error.find("could not save the checkpoint of iteration 2"), std::string::npos) << error;
    EXPECT_NE(error.find("rank " + std::to_string(n - 1) + ": injected failure at " + stage), std::string::npos)
        << error;
    st_.ctx.world->barrier();
    EXPECT_EQ(checkpointing::read_tracker(dir_), 1);
    EXPECT_EQ(checkpointing::list_checkpoints(dir_), std::vector<int64_t>{1});
    for (const std::string& name : files_in(dir_)) EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
    checkpointing::CheckpointReader::open(dir_, 1);
    st_.ctx.world->barrier();  // every rank has looked before the next save stages again
  }
  save(run, 2);  // and the next save succeeds
  EXPECT_EQ(checkpointing::read_tracker(dir_), 2);
}

// --dist-ckpt-strictness, both ways round, with the query/key layernorms (--qk-layernorm) the
// weights one side lacks: a checkpoint with them loads into a model without them unless raise_all
// (which every rank refuses, naming them); one without them loads into a model with them only
// under a lenient value, the norms then keeping their initial ones and every other weight the
// saved values, and not beside optimizer state to restore.
TEST_F(CheckpointIo, DistCkptStrictnessDecidesOnWeightsOneSideLacks) {
  SavedRun with_norms(st_.ctx, false, dir_ + "/with_norms", {"--qk-layernorm"});
  save(with_norms, 1);
  SavedRun plain(st_.ctx, false, dir_ + "/plain");
  save(plain, 1);
  const auto args_for = [&](const std::string& load, bool qk_layernorm, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = minimal_train_argv({"--load", load});
    argv.insert(argv.end(), extra.begin(), extra.end());
    TrainingArgs args = parse_training_args(argv, st_.ctx.world->size());
    args.model.qk_layernorm = qk_layernorm;  // no flag turns a checkpoint's --qk-layernorm off
    return args;
  };
  TrainingProgress progress;
  const auto expect_saved_weights = [](GPTModel& loaded, GPTModel& saved) {
    for (const auto& p : loaded.parameters().params()) {
      if (p->spec.name.find("_layernorm.") != std::string::npos &&
          p->spec.name.find("self_attention.") != std::string::npos) {
        for (float v : p->data.to_vector())
          EXPECT_EQ(v, p->spec.init == InitMethod::ones ? 1.0f : 0.0f) << p->spec.name;
        continue;
      }
      const Parameter* s = nullptr;
      for (const auto& q : saved.parameters().params())
        if (q->spec.name == p->spec.name) s = q.get();
      ASSERT_NE(s, nullptr) << p->spec.name;
      EXPECT_EQ(p->data.to_vector(), s->data.to_vector()) << p->spec.name;
    }
  };

  // The checkpoint holds weights no rank's model does.
  for (const std::string strictness : {"assume_ok_unexpected", "log_unexpected", "log_all", "ignore_all"}) {
    SCOPED_TRACE(strictness);
    const TrainingArgs args = args_for(dir_ + "/with_norms", false, {"--dist-ckpt-strictness", strictness});
    GPTModel model(args.model, st_.ctx);
    model.parameters().initialize(7);
    EXPECT_TRUE(load_training_checkpoint(args, model, nullptr, nullptr, &progress));
    expect_saved_weights(model, with_norms.model);
  }
  {
    const TrainingArgs args = args_for(dir_ + "/with_norms", false, {"--dist-ckpt-strictness", "raise_all"});
    GPTModel model(args.model, st_.ctx);
    const std::string error = error_of([&] { load_training_checkpoint(args, model, nullptr, nullptr, &progress); });
    EXPECT_NE(error.find("weight(s) that no rank's model has: decoder.layers.0.self_attention.k_layernorm.bias"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("(--dist-ckpt-strictness raise_all)"), std::string::npos) << error;
  }

  // The model holds weights the checkpoint lacks.
  for (const std::string strictness : {"assume_ok_unexpected", "raise_unexpected", "raise_all"}) {
    const TrainingArgs args = args_for(dir_ + "/plain", true, {"--dist-ckpt-strictness", strictness});
    GPTModel model(args.model, st_.ctx);
    const std::string error = error_of([&] { load_training_checkpoint(args, model, nullptr, nullptr, &progress); });
    EXPECT_NE(error.find("lacks 8 weight(s) this model holds: decoder.layers.0.self_attention.q_layernorm.weight"),
              std::string::npos)
        << strictness << ": " << error;
  }
  for (const std::string strictness : {"log_unexpected", "log_all", "return_unexpected", "return_all", "ignore_all"}) {
    SCOPED_TRACE(strictness);
    const TrainingArgs args = args_for(dir_ + "/plain", true, {"--dist-ckpt-strictness", strictness});
    GPTModel model(args.model, st_.ctx);
    model.parameters().initialize(7);
    EXPECT_TRUE(load_training_checkpoint(args, model, nullptr, nullptr, &progress));
    expect_saved_weights(model, plain.model);
    // With the optimizer's state to restore as well, refused; --no-load-optim restores none.
    AdamWOptimizer optimizer(model.parameters(), st_.ctx, AdamWHyper{});
    const std::string error = error_of([&] { load_training_checkpoint(args, model, &optimizer, nullptr, &progress); });
    EXPECT_NE(error.find("fresh optimizer state for some parameters beside restored state for the others is not "
                         "built: add --no-load-optim"),
              std::string::npos)
        << error;
    TrainingArgs no_optim = args;
    no_optim.no_load_optim = true;
    EXPECT_TRUE(load_training_checkpoint(no_optim, model, &optimizer, nullptr, &progress));
  }
}

// --override-ckpt-iteration: the resumed progress is iteration N and N global batches of samples
// (Megatron's rewind), the checkpoint's own values without it.
TEST_F(CheckpointIo, OverrideCkptIterationRewindsTheProgress) {
  SavedRun run(st_.ctx, false, dir_);
  save_training_checkpoint(run.args, run.model, run.optimizer.get(), run.scheduler,
                           {.iteration = 7, .consumed_train_samples = 7 * run.args.global_batch_size}, st_.ctx);
  for (const bool rewind : {false, true}) {
    std::vector<std::string> argv = minimal_train_argv({"--load", dir_});
    if (rewind) argv.insert(argv.end(), {"--override-ckpt-iteration", "3"});
    const TrainingArgs args = parse_training_args(argv, st_.ctx.world->size());
    GPTModel model(args.model, st_.ctx);
    TrainingProgress progress;
    ASSERT_TRUE(load_training_checkpoint(args, model, nullptr, nullptr, &progress));
    EXPECT_EQ(progress.iteration, rewind ? 3 : 7);
    EXPECT_EQ(progress.consumed_train_samples, (rewind ? 3 : 7) * args.global_batch_size);
  }
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
