#pragma once
// What a training checkpoint holds and how it maps onto the model, optimizer and loop state.
// The storage format itself lives in checkpointing/.
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

void save_training_checkpoint(const TrainingArgs& args, GPTModel& model, const AdamWOptimizer* optimizer,
                              const OptimizerParamScheduler& scheduler, const TrainingProgress& progress);

// Loads the latest checkpoint under args.load (or nothing when it holds none). Restores the
// model weights, and unless --finetune / --no-load-optim the optimizer, scheduler and progress.
// Returns whether a checkpoint was loaded.
bool load_training_checkpoint(const TrainingArgs& args, GPTModel& model, AdamWOptimizer* optimizer,
                              OptimizerParamScheduler* scheduler, TrainingProgress* progress);

// Model weights only, and the arguments the checkpoint was trained with (for generate).
TrainingArgs read_checkpoint_args(const std::string& load_dir);
void load_model_weights(const std::string& load_dir, GPTModel& model);

}  // namespace megatron
