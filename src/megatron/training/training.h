#pragma once
// pretrain(): Megatron's training loop for GPT on one process (the parallel runtime plugs in
// through ParallelContext): data, model, optimizer, schedule, logging, evaluation, checkpoints.
#include <vector>

#include "megatron/training/arguments.h"

namespace megatron {

struct TrainingSummary {
  int64_t iterations_run = 0;
  std::vector<double> train_losses;  // lm loss of every iteration run, in order
  std::vector<double> valid_losses;  // each evaluation's loss, in order
};

TrainingSummary pretrain(const TrainingArgs& args);

}  // namespace megatron
