#pragma once
// Megatron's non-persistent checkpoints of type local (--non-persistent-save-interval N
// --non-persistent-ckpt-type local --non-persistent-local-ckpt-dir DIR): every N iterations each
// rank writes everything it holds (its weights and optimizer state, replicas included) to its own
// directory DIR/rank_RRRRR (node-local storage: no shared filesystem, no collective), a complete
// checkpoint of the usual format with its tracker, keeping only the newest. They are cheap and
// frequent; the persistent --save checkpoints stay the ones to keep, move and reshard.
//
// Resuming (--load, no --ckpt-step, no --finetune): when every rank holds a complete local
// checkpoint of the same iteration, saved under this layout (world size, TP, PP, CP, distributed
// optimizer), and it is newer than the one --load would load, every rank loads its own; otherwise
// the run loads --load's (a rank that lost its disk, a changed layout), saying why.
#include <string>

#include "megatron/training/checkpoint_io.h"

namespace megatron {

// DIR/rank_RRRRR.
std::string local_checkpoint_directory(const std::string& dir, int rank);

// Before any work, on every rank: its directory can take checkpoints, and holds none unless the
// run resumes (--load), as for --save.
void check_local_checkpoint_directory(const TrainingArgs& args, int rank);

// This rank's non-persistent checkpoint of progress.iteration; older ones of this rank are removed.
void save_local_checkpoint(const TrainingArgs& args, const CheckpointedModel& model, const Optimizer* optimizer,
                           const OptimizerParamScheduler& scheduler, const TrainingProgress& progress,
                           const ParallelContext& ctx);

// The rules above; a collective over ctx.world. Returns whether the local checkpoints were loaded.
bool load_local_checkpoint(const TrainingArgs& args, const CheckpointedModel& model, Optimizer* optimizer,
                           OptimizerParamScheduler* scheduler, TrainingProgress* progress, const ParallelContext& ctx);

}  // namespace megatron
