#include "megatron/training/local_checkpoint.h"

#include <cstdio>

#include "megatron/checkpointing/retention.h"
#include "megatron/checkpointing/save_directory.h"
#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/core/strings.h"

namespace megatron {

namespace {
// The stored flags a local checkpoint must share with the run that loads it: each rank reads back
// exactly the slices it wrote.
const char* const kLayoutFlags[] = {"--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                    "--context-parallel-size", "--expert-model-parallel-size",
                                    "--use-distributed-optimizer"};
constexpr const char* kWorldSizeKey = "world_size";

// The iteration of this rank's newest complete local checkpoint, -1 without one.
int64_t local_iteration(const std::string& rank_dir) {
  const std::optional<int64_t> tracked = checkpointing::read_tracker(rank_dir);
  return tracked && *tracked >= 0 && checkpointing::checkpoint_is_complete(rank_dir, *tracked) ? *tracked : -1;
}

// Why the local checkpoint cannot resume this run ("" when it can); the same on every rank, as
// every rank reads the same run's flags.
std::string layout_mismatch(const nlohmann::json& common, const TrainingArgs& args, const ParallelContext& ctx) {
  const nlohmann::json& saved = common.at("args");
  const nlohmann::json now = [&] {
    nlohmann::json j;
    for (const auto& [flag, value] : training_args_to_flags(args)) j[flag] = value;
    return j;
  }();
  if (common.value(kWorldSizeKey, int64_t(-1)) != ctx.world->size())
    return concat("it was saved by ", common.value(kWorldSizeKey, int64_t(-1)), " ranks, this run has ",
                  ctx.world->size());
  for (const char* flag : kLayoutFlags)
    if (saved.value(flag, std::string()) != now.value(flag, std::string()))
      return concat("it was saved with ", flag, " ", saved.value(flag, std::string()), ", this run has ",
                    now.value(flag, std::string()));
  return "";
}
}  // namespace

std::string local_checkpoint_directory(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d", rank);
  return dir + "/" + name;
}

void check_local_checkpoint_directory(const TrainingArgs& args, int rank) {
  if (args.non_persistent_ckpt_type != "local") return;
  const std::string dir = local_checkpoint_directory(args.non_persistent_local_ckpt_dir, rank);
  const int64_t held = local_iteration(dir);
  MEGATRON_CHECK(held < 0 || !args.load.empty(), "--non-persistent-local-ckpt-dir "
                                                     << args.non_persistent_local_ckpt_dir
                                                     << " holds a local checkpoint (iteration " << held << " in " << dir
                                                     << ") and this run does not resume (no --load): its saves would "
                                                     << "replace it. To continue that run, pass --load with its --save "
                                                     << "directory; to start a new run, give a new directory");
  checkpointing::prepare_save_directory(dir, ".write_probe");
}

void save_local_checkpoint(const TrainingArgs& args, const CheckpointedModel& model, const Optimizer* optimizer,
                           const OptimizerParamScheduler& scheduler, const TrainingProgress& progress,
                           const ParallelContext& ctx) {
  const std::string dir = local_checkpoint_directory(args.non_persistent_local_ckpt_dir, ctx.world->rank());
  nlohmann::json common = training_common_state(args, optimizer, scheduler, progress);
  common[kWorldSizeKey] = ctx.world->size();
  std::vector<checkpointing::ShardedTensor> optim;
  if (optimizer && !args.no_save_optim) optim = optimizer->sharded_state(Optimizer::StateCopies::this_rank);
  // Partial: a distributed-optimizer rank holds a shard of each tensor's state.
  checkpointing::save_checkpoint(dir, progress.iteration, model_state(model, Optimizer::StateCopies::this_rank, ctx),
                                 optim, common, {.on_stage = {}, .partial = true});
  checkpointing::remove_old_checkpoints(dir, 1);
  LOG_INFO("  saved local checkpoint from iteration " << progress.iteration << " to "
                                                      << args.non_persistent_local_ckpt_dir);
}

bool load_local_checkpoint(const TrainingArgs& args, const CheckpointedModel& model, Optimizer* optimizer,
                           OptimizerParamScheduler* scheduler, TrainingProgress* progress, const ParallelContext& ctx) {
  if (args.non_persistent_ckpt_type != "local" || args.load.empty() || args.ckpt_step > 0 || args.finetune)
    return false;
  const std::string dir = local_checkpoint_directory(args.non_persistent_local_ckpt_dir, ctx.world->rank());
  // Max over the world of (iteration, -iteration): the newest and the oldest of the ranks'.
  Tensor bounds = Tensor::empty({2}, DType::f64);
  const int64_t mine = local_iteration(dir);
  bounds.set_item(0, double(mine));
  bounds.set_item(1, -double(mine));
  Tensor reduced = bounds.to(model.device);
  ctx.world->all_reduce(reduced, ReduceOp::max);
  const auto newest = int64_t(reduced.item(0)), oldest = int64_t(-reduced.item(1));
  if (newest < 0) return false;
  const std::optional<CheckpointChoice> persistent = checkpoint_to_load(args.load, 0);
  const int64_t persistent_iteration = persistent ? persistent->iteration : -1;
  if (newest <= persistent_iteration) return false;
  if (oldest != newest) {
    LOG_WARN("not resuming from the local checkpoints in " << args.non_persistent_local_ckpt_dir << " (iteration "
                                                           << newest << "): some ranks hold none of that iteration "
                                                           << "(oldest: " << oldest << "); loading --load "
                                                           << args.load);
    return false;
  }
  const checkpointing::CheckpointReader reader = checkpointing::CheckpointReader::open(dir, newest);
  if (const std::string why = layout_mismatch(reader.common(), args, ctx); !why.empty()) {
    LOG_WARN("not resuming from the local checkpoint of iteration "
             << newest << " in " << args.non_persistent_local_ckpt_dir << ": " << why << "; loading --load "
             << args.load);
    return false;
  }
  restore_training_state(reader, args, model, optimizer, scheduler, progress);
  LOG_INFO(" loaded local checkpoint from " << args.non_persistent_local_ckpt_dir << " at iteration " << newest
                                            << " (newer than --load " << args.load << "'s "
                                            << (persistent ? std::to_string(persistent_iteration) : "none") << ")");
  return true;
}

}  // namespace megatron
