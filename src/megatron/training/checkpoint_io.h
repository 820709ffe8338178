#pragma once
// What a training checkpoint holds and how it maps onto the model, optimizer and loop state.
// The storage format itself lives in checkpointing/.
//
// Under data and model parallelism (every rank of ctx.world calls save and load):
//   save: every rank writes its own files into one staging directory (checkpointing/checkpoint.h
//         protocol): model weights from DP rank 0 of each model-parallel slice (the others hold
//         replicas; experts from expert-DP rank 0 of each EP rank, is_saved_replica), optimizer
//         state from Optimizer::sharded_state() (the same ranks' state, or every rank's
//         distributed-optimizer shard). World rank 0 creates the directory and
//         broadcasts its path; the ranks write and send their reports (files, sizes, CRC-32C,
//         tensor slices), or their error, to rank 0 (collectives, so a rank that never arrives is
//         named by the watchdog); rank 0 checks them, writes metadata.json last, renames the
//         directory into place and rewrites the tracker; then it broadcasts the outcome, so every
//         rank returns only once the checkpoint is published, or throws the first failing rank's
//         error. No rank holds another rank's data.
//   load: every rank reads the slices it holds now from whichever shards overlap them, so a
//         checkpoint saved at one DP or EP size (with or without the distributed optimizer)
//         resumes at any other: experts are held by global expert index.
// The tokenizer travels with the checkpoint: each save copies the files the run's tokenizer reads
// (TrainingArgs::tokenizer; vocab.json and merges.txt, tokenizer.json, tokenizer.model) into the
// iteration directory, checksummed with the rest, and records its type and vocabulary size
// ("tokenizer" in common.json), so that one iter_ directory is self-contained when moved or copied.
// Under tensor parallelism every TP rank saves its shards with their global offsets; a parameter
// replicated across TP (and its optimizer state) is saved by TP rank 0 only. A checkpoint loads
// at any TP whose padded vocabulary is the same (--make-vocab-size-divisible-by x TP).
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/checkpointing/checkpoint.h"
#include "megatron/core/progress.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/models/gpt/model_chunks.h"
#include "megatron/optimizer/lr_scheduler.h"
#include "megatron/optimizer/optimizer.h"
#include "megatron/training/arguments.h"

namespace megatron {

struct TrainingProgress {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
};

// Which checkpoint of load_dir a run loads (Megatron's rules, and ours where Megatron would start
// from scratch over existing checkpoints):
//   --ckpt-step N (ckpt_step > 0): iteration N, which must exist;
//   otherwise the tracker's iteration (latest_checkpointed_iteration.txt);
//   without a tracker (a crash between publishing a directory and rewriting the tracker, or a
//   tracker deleted by hand): the newest iter_* directory. Megatron would start from scratch here
//   and, with the same --save, overwrite them.
// nullopt when load_dir holds neither. A chosen checkpoint that is not complete
// (checkpointing::checkpoint_is_complete) throws, listing the earlier complete iterations and
// --ckpt-step; a run never falls back to an older checkpoint by itself.
struct CheckpointChoice {
  enum class By { ckpt_step, tracker, newest_directory };
  int64_t iteration = 0;
  By by = By::tracker;
};
std::optional<CheckpointChoice> checkpoint_to_load(const std::string& load_dir, int64_t ckpt_step);

// Checks, before any work, the checkpoint directories of a training run: the checkpoint --load
// resumes from (checkpoint_to_load), and that --save does not hold checkpoints of another run:
// a --save directory holding checkpoints is written only by a run that resumes from it
// (--load the same directory, as Megatron users resume), so a fresh run never replaces them.
void check_checkpoint_directories(const TrainingArgs& args);

// What a checkpoint holds of a model: every parameter of its registry (one GPTModel's, or every
// chunk's of this pipeline rank), its MoE routers' expert biases and its FP8 linear layers' recipe
// state (fp8_checkpoint.h). Implicit: either is passed where a checkpoint function takes a model.
struct CheckpointedModel {
  CheckpointedModel(GPTModel& model)
      : config(model.config()),
        parameters(model.parameters()),
        moe_layers(model.moe_layers()),
        fp8_linears(model.fp8_linears()),
        device(model.device()),
        ctx(model.context()) {}
  CheckpointedModel(ModelChunks& chunks)
      : config(chunks.config()),
        parameters(chunks.parameters()),
        moe_layers(chunks.moe_layers()),
        fp8_linears(chunks.fp8_linears()),
        device(chunks.device()),
        ctx(chunks.chunk(0).context()) {}
  const TransformerConfig& config;
  ParameterRegistry& parameters;
  std::vector<moe::MoELayer*> moe_layers;
  std::vector<tensor_parallel::Fp8Linear*> fp8_linears;
  Device device;
  const ParallelContext& ctx;
};

// One save of the protocol above in its steps, so that the files can be written on another thread
// while training goes on (--async-save, async_checkpoint.h):
//   constructor (collective): takes this rank's state (with Snapshot::host_copy, into host memory
//     of its own, so training may go on changing the model); the root stages the directory and
//     the tokenizer's files and tells every rank where it is;
//   write() (no collective, any one thread): writes this rank's files;
//   publish() (collective): the root checks every rank's report and publishes; every rank returns
//     once the checkpoint is published, or throws the first failing rank's error.
// A save destroyed unpublished leaves its staging directory (removed by the next save) and the
// previous checkpoint in place.
class TrainingCheckpointSave {
 public:
  enum class Snapshot { none, host_copy };
  TrainingCheckpointSave(const TrainingArgs& args, const CheckpointedModel& model, const Optimizer* optimizer,
                         const OptimizerParamScheduler& scheduler, const TrainingProgress& progress,
                         const ParallelContext& ctx, Snapshot snapshot, const checkpointing::SaveOptions& options = {});
  ~TrainingCheckpointSave();
  TrainingCheckpointSave(const TrainingCheckpointSave&) = delete;
  TrainingCheckpointSave& operator=(const TrainingCheckpointSave&) = delete;

  int64_t iteration() const { return iteration_; }
  void write();
  void publish();

 private:
  // Runs a step unless an earlier one failed; a failure is kept (as "rank R: what") and the rank
  // then only takes part in the collectives.
  void attempt(const std::function<void()>& step);

  std::string save_dir_;
  int64_t iteration_;
  int64_t keep_last_;
  Communicator* world_;
  Device device_;
  checkpointing::SaveOptions options_;
  nlohmann::json common_;
  std::vector<checkpointing::ShardedTensor> weights_, optim_;
  std::optional<checkpointing::CheckpointStaging> staging_;  // the root's
  std::string staging_dir_;
  nlohmann::json report_;
  std::string failure_;
};

// All three steps at once. options.on_stage is called on every rank at the stages it reaches
// (fault injection for tests).
void save_training_checkpoint(const TrainingArgs& args, const CheckpointedModel& model, const Optimizer* optimizer,
                              const OptimizerParamScheduler& scheduler, const TrainingProgress& progress,
                              const ParallelContext& ctx, const checkpointing::SaveOptions& options = {});

// A checkpoint of weights only, written by one process (a converter): shards_by_writer[r] are the
// shards model-parallel rank r would save (replicated parameters in writer 0's only), saved as
// iteration `iteration` (checkpointing::kReleaseIteration for Megatron's release/) of save_dir
// with the arguments and tokenizer of `args` and the progress of a run that has not started.
// Published atomically, as every save.
void save_weights_checkpoint(const std::string& save_dir, const TrainingArgs& args, int64_t iteration,
                             const std::vector<std::vector<checkpointing::ShardedTensor>>& shards_by_writer);

// The pieces save_training_checkpoint writes, for other stores of the same state (per-rank local
// checkpoints, local_checkpoint.h): this rank's weights and FP8 recipe state (one_replica: one
// copy of every element over the world, a collective over the FP8 layers' amax groups; this_rank:
// all it holds, no collective) and common.json's state (iteration, data position, scheduler,
// optimizer step, loss scaler, the run's flags).
std::vector<checkpointing::ShardedTensor> model_state(const CheckpointedModel& model, Optimizer::StateCopies copies,
                                                      const ParallelContext& ctx);
nlohmann::json training_common_state(const TrainingArgs& args, const Optimizer* optimizer,
                                     const OptimizerParamScheduler& scheduler, const TrainingProgress& progress);
// Restores from an opened checkpoint what load_training_checkpoint restores from --load's.
// --dist-ckpt-strictness (Megatron's values; in its words "unexpected" are weights this rank's model
// holds that the checkpoint lacks, "missing" weights the checkpoint holds that no rank's model
// does; weights are the parameters, and among the unused also the routers' expert biases, not the
// FP8 recipe state, which fp8_checkpoint.h handles):
//   lacked weights: assume_ok_unexpected (the default), raise_unexpected, raise_all: an Error
//     listing them before any tensor is read; log_*: a warning listing them, return_*, ignore_all:
//     none; these keep their initial values. Their optimizer state cannot be restored: with it to
//     restore (no --finetune or --no-load-optim) a load that lacks weights is an Error;
//   unused weights (*_all): log_all warns, raise_all fails on every rank, naming them (a
//     collective over ctx.world: the ranks' weights are gathered); the others ignore them.
void restore_training_state(const checkpointing::CheckpointReader& reader, const TrainingArgs& args,
                            const CheckpointedModel& model, Optimizer* optimizer, OptimizerParamScheduler* scheduler,
                            TrainingProgress* progress);

// Loads checkpoint_to_load(args.load, args.ckpt_step) (or nothing when it holds none). Restores the
// model weights, and unless --finetune / --no-load-optim the optimizer, scheduler and progress;
// --override-ckpt-iteration N then sets the progress to iteration N and N x --global-batch-size
// consumed samples (Megatron's rewind of the data loader; a warning where the checkpoint's batch
// size differs), the scheduler staying the checkpoint's.
// Returns whether a checkpoint was loaded.
bool load_training_checkpoint(const TrainingArgs& args, const CheckpointedModel& model, Optimizer* optimizer,
                              OptimizerParamScheduler* scheduler, TrainingProgress* progress);

// The tokenizer a run uses (TrainingArgs::tokenizer): the tokenizer flags as given when they are
// complete (tokenizer_options_complete), else completed from the tokenizer saved in the checkpoint
// that load_dir's run would load (checkpoint_to_load(load_dir, ckpt_step)), its files that
// checkpoint's own copies (complete_tokenizer_options: with no --tokenizer-type, or the saved one,
// flags not given take the saved values).
datasets::TokenizerOptions run_tokenizer_options(const datasets::TokenizerOptions& given, const std::string& load_dir,
                                                 int64_t ckpt_step);

// The arguments the checkpoint checkpoint_to_load(load_dir, ckpt_step) chooses was trained with,
// as stored (its layout included; world_size and data_parallel_size, which are no flags, describe
// one replica of it), except that the tokenizer flags name the checkpoint's own copy of its
// tokenizer's files (when it holds one), so the arguments are valid wherever the directory now
// lies. A caller that runs the model under another layout (generate) decides it from these: the
// checkpoint loads at any TP that splits the stored model, its padded vocabulary included
// (validate_tensor_parallel_split; an imported vocabulary, --true-vocab-size, pads for the run's
// TP instead: loading adds or drops padding rows). load_model_weights then reads the slices the
// model's rank holds, from the same checkpoint, one progress step per parameter on `progress` (a
// test hook; by default a reporter of its own, as --load's).
TrainingArgs read_checkpoint_args(const std::string& load_dir, int64_t ckpt_step = 0);
// The flags (name, value text) the checkpoint checkpoint_to_load(load_dir, ckpt_step) chooses was
// saved with, as stored; empty when load_dir holds no checkpoint.
std::vector<std::pair<std::string, std::string>> saved_flags(const std::string& load_dir, int64_t ckpt_step);
void load_model_weights(const std::string& load_dir, const CheckpointedModel& model, int64_t ckpt_step = 0,
                        ProgressReporter* progress = nullptr);

}  // namespace megatron
