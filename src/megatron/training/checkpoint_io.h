#pragma once
// What a training checkpoint holds and how it maps onto the model, optimizer and loop state.
// The storage format itself lives in checkpointing/.
//
// Under data and model parallelism (every rank of ctx.world calls save and load):
//   save: every rank writes its own files into one staging directory (checkpointing/checkpoint.h
//         protocol): model weights from DP rank 0 of each model-parallel slice (the others hold
//         replicas), optimizer state from Optimizer::sharded_state() (DP rank 0's whole state, or
//         every rank's distributed-optimizer shard). World rank 0 creates the directory and
//         broadcasts its path; the ranks write and send their reports (files, sizes, CRC-32C,
//         tensor slices), or their error, to rank 0 (collectives, so a rank that never arrives is
//         named by the watchdog); rank 0 checks them, writes metadata.json last, renames the
//         directory into place and rewrites the tracker; then it broadcasts the outcome, so every
//         rank returns only once the checkpoint is published, or throws the first failing rank's
//         error. No rank holds another rank's data.
//   load: every rank reads the slices it holds now from whichever shards overlap them, so a
//         checkpoint saved at one DP size (with or without the distributed optimizer) resumes at
//         any other.
// The tokenizer travels with the checkpoint: each save copies the files the run's tokenizer reads
// (TrainingArgs::tokenizer; vocab.json and merges.txt, tokenizer.json, tokenizer.model) into the
// iteration directory, checksummed with the rest, and records its type and vocabulary size
// ("tokenizer" in common.json), so that one iter_ directory is self-contained when moved or copied.
// Under tensor parallelism every TP rank saves its shards with their global offsets; a parameter
// replicated across TP (and its optimizer state) is saved by TP rank 0 only. A checkpoint loads
// at any TP whose padded vocabulary is the same (--make-vocab-size-divisible-by x TP).
#include <cstdint>
#include <string>

#include "megatron/models/gpt/gpt_model.h"
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

// options.on_stage is called on every rank at the stages it reaches (fault injection for tests).
void save_training_checkpoint(const TrainingArgs& args, GPTModel& model, const Optimizer* optimizer,
                              const OptimizerParamScheduler& scheduler, const TrainingProgress& progress,
                              const ParallelContext& ctx, const checkpointing::SaveOptions& options = {});

// Loads the latest checkpoint under args.load (or nothing when it holds none). Restores the
// model weights, and unless --finetune / --no-load-optim the optimizer, scheduler and progress.
// Returns whether a checkpoint was loaded.
bool load_training_checkpoint(const TrainingArgs& args, GPTModel& model, Optimizer* optimizer,
                              OptimizerParamScheduler* scheduler, TrainingProgress* progress);

// The tokenizer a run uses (TrainingArgs::tokenizer): the tokenizer flags as given when they are
// complete (tokenizer_options_complete), else completed from the tokenizer saved in the checkpoint
// that load_dir's run would load, its files that checkpoint's own copies (complete_tokenizer_options:
// with no --tokenizer-type, or the saved one, flags not given take the saved values).
datasets::TokenizerOptions run_tokenizer_options(const datasets::TokenizerOptions& given, const std::string& load_dir);

// Model weights only, and the arguments the checkpoint was trained with (for generate), to build
// the model at any TP on a world of TP ranks: the checkpoint's own TP, PP and sequence parallelism
// are replaced (generation runs without SP: the weights are the same, and SP would need every
// step's growing sequence to divide by TP), its padded vocabulary is kept. The training rules of
// the layout (heads, query groups, FFN size and the padded vocabulary divisible by TP) are checked
// and a broken one throws, naming the value and the fix. The tokenizer flags name the
// checkpoint's own copy of its tokenizer (when it holds one), so the arguments are valid wherever
// the directory now lies. Every rank of the model calls load_model_weights, which reads the slices
// the rank holds.
TrainingArgs read_checkpoint_args(const std::string& load_dir, int64_t tensor_model_parallel_size = 1);
void load_model_weights(const std::string& load_dir, GPTModel& model);

}  // namespace megatron
