#pragma once
// Megatron's --check-for-nan-in-loss-and-grad, on by default (--no-check-for-nan-in-loss-and-grad
// turns it off): a run whose loss or gradients stop being finite ends with an error naming the
// iteration, before that iteration saves a checkpoint, instead of skipping every remaining step,
// saving the broken model and exiting 0.
//
// What is checked, and where Megatron checks it:
//   the loss: each micro-batch's local loss sum, before the data-parallel reduction, as Megatron's
//     loss_func ("found NaN in local forward loss calculation", Inf likewise); and each evaluation's
//     loss, since loss_func serves evaluation too;
//   the gradients: Megatron checks each bucket's local norm before the gradient reduction; here the
//     optimizer's global norm and overflow flag are checked, the same on every rank, so every rank
//     stops at the same step.
// Loss scaling: with fp16's dynamic scaling Megatron turns the check off, because non-finite
// gradients are how the scaler learns to back off, and the overflow skips stay. But an overflow at
// the minimum scale (--min-loss-scale) cannot be cured by backing off, and every later step would
// be skipped too, so that one stops the run. A static scale (--loss-scale) cannot back off at all:
// as in Megatron, whose check stays on there, its first overflow stops the run.
#include <cstdint>

#include "megatron/optimizer/optimizer.h"
#include "megatron/training/arguments.h"

namespace megatron {

class NanCheck {
 public:
  explicit NanCheck(const TrainingArgs& args);

  // iteration: the 1-based iteration being run (Megatron's numbering in the log line).
  void micro_batch_loss(double loss_sum, double num_tokens, int64_t iteration, int rank) const;
  // loss_scale: the scale this step's gradients were computed with (before the scaler's update).
  void optimizer_step(const OptimizerStepResult& step, float loss_scale, int64_t iteration) const;
  void validation_loss(double loss, int64_t iteration) const;

 private:
  bool check_loss_;       // the check is on and the scaler (if any) is not dynamic
  bool check_grads_;      // the check is on
  bool dynamic_scaling_;  // fp16 without --loss-scale
  float min_loss_scale_;
};

}  // namespace megatron
