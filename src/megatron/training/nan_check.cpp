#include "megatron/training/nan_check.h"

#include <cmath>
#include <string>

#include "megatron/core/error.h"

namespace megatron {

namespace {
const char* nan_or_inf(double value) { return std::isnan(value) ? "NaN" : "Inf"; }

// What a user does about a diverged run.
constexpr const char* kAdvice =
    ". Nothing of this iteration is saved; resume from the last checkpoint with a lower --lr (or a longer "
    "--lr-warmup-iters, or --clip-grad), or pass --no-check-for-nan-in-loss-and-grad to skip such iterations instead "
    "of stopping";
}  // namespace

NanCheck::NanCheck(const TrainingArgs& args)
    : check_loss_(args.check_for_nan_in_loss_and_grad && !(args.fp16 && !args.optimizer.loss_scale)),
      check_grads_(args.check_for_nan_in_loss_and_grad),
      dynamic_scaling_(args.fp16 && !args.optimizer.loss_scale),
      min_loss_scale_(float(args.optimizer.min_loss_scale)) {}

void NanCheck::micro_batch_loss(double loss_sum, double num_tokens, int64_t iteration, int rank) const {
  MEGATRON_CHECK(!check_loss_ || std::isfinite(loss_sum),
                 "iteration " << iteration << ": found " << nan_or_inf(loss_sum)
                              << " in local forward loss calculation on rank " << rank
                              << " (the loss of a micro-batch of " << num_tokens << " tokens)" << kAdvice);
}

void NanCheck::optimizer_step(const OptimizerStepResult& step, float loss_scale, int64_t iteration) const {
  if (!check_grads_ || !step.skipped) return;
  // Skipped with a norm: the norm itself is not finite (no scaler looked at the gradients first).
  MEGATRON_CHECK(!step.grad_norm, "iteration " << iteration << ": found " << nan_or_inf(*step.grad_norm)
                                               << " in the gradient norm" << kAdvice);
  // Skipped without: the loss scaler found non-finite scaled gradients (an overflow).
  if (dynamic_scaling_ && loss_scale > min_loss_scale_) return;  // backing off may cure it
  MEGATRON_CHECK(!dynamic_scaling_, "iteration " << iteration << ": the gradients still overflow at the minimum loss "
                                                 << "scale " << loss_scale << " (--min-loss-scale " << min_loss_scale_
                                                 << "), where the scale cannot back off and "
                                                 << "every remaining iteration would be skipped" << kAdvice
                                                 << "; or lower --min-loss-scale");
  MEGATRON_FAIL("iteration " << iteration << ": the gradients overflow at the static loss scale " << loss_scale
                             << " (--loss-scale), which cannot back off" << kAdvice
                             << "; or lower --loss-scale, or leave it out for dynamic loss scaling");
}

void NanCheck::validation_loss(double loss, int64_t iteration) const {
  MEGATRON_CHECK(!check_loss_ || std::isfinite(loss),
                 "iteration " << iteration << ": found " << nan_or_inf(loss) << " in the validation loss" << kAdvice);
}

}  // namespace megatron
