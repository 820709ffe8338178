#include "megatron/optimizer/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "megatron/core/error.h"

namespace megatron {

OptimizerParamScheduler::OptimizerParamScheduler(const OptimizerArgs& args, int64_t train_iters,
                                                 int64_t global_batch_size)
    : max_lr_(args.lr),
      min_lr_(args.min_lr),
      init_lr_(args.lr_warmup_init),
      decoupled_max_lr_(args.decoupled_lr),
      decoupled_min_lr_(args.decoupled_min_lr.value_or(args.min_lr)),
      style_(args.lr_decay_style),
      wsd_style_(args.lr_wsd_decay_style),
      weight_decay_(args.weight_decay) {
  const bool by_samples = args.lr_decay_samples > 0;
  const int64_t decay_iters = args.lr_decay_iters > 0 ? args.lr_decay_iters : train_iters;
  decay_steps_ = by_samples ? args.lr_decay_samples : decay_iters * global_batch_size;
  warmup_steps_ = args.lr_warmup_fraction ? *args.lr_warmup_fraction * double(decay_steps_)
                  : by_samples            ? double(args.lr_warmup_samples)
                                          : double(args.lr_warmup_iters * global_batch_size);
  wsd_decay_steps_ = by_samples ? args.lr_wsd_decay_samples : args.lr_wsd_decay_iters * global_batch_size;
  MEGATRON_CHECK(decay_steps_ > 0, "the LR decay length is 0 samples; set --train-iters or --train-samples");
}

std::optional<double> OptimizerParamScheduler::decoupled_lr() const {
  if (!decoupled_max_lr_) return std::nullopt;
  return lr_at(num_steps_, *decoupled_max_lr_, decoupled_min_lr_);
}

double OptimizerParamScheduler::lr_at(int64_t num_steps, double max_lr, double min_lr) const {
  const double steps = double(num_steps);
  if (warmup_steps_ > 0 && steps <= warmup_steps_) return init_lr_ + (max_lr - init_lr_) * steps / warmup_steps_;
  if (style_ == LrDecayStyle::constant) return max_lr;
  if (num_steps > decay_steps_) return min_lr;
  if (style_ == LrDecayStyle::inverse_square_root) {
    // Python's x**0.5 is C's pow(x, 0.5), which may differ from sqrt in the last bit.
    const double warm = std::max(warmup_steps_, 1.0);
    return std::max(min_lr, max_lr * std::pow(warm, 0.5) / std::pow(std::max(steps, 1.0), 0.5));
  }
  const double ratio = (steps - warmup_steps_) / (double(decay_steps_) - warmup_steps_);
  double coeff = 0.0;
  switch (style_) {
    case LrDecayStyle::linear:
      coeff = 1.0 - ratio;
      break;
    case LrDecayStyle::cosine:
      coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
      break;
    case LrDecayStyle::WSD: {
      const double anneal_start = double(decay_steps_ - wsd_decay_steps_);
      if (steps <= anneal_start) {
        coeff = 1.0;
        break;
      }
      const double q = (steps - anneal_start) / double(wsd_decay_steps_);
      switch (wsd_style_) {
        case WsdDecayStyle::exponential:
          coeff = 2.0 * std::pow(0.5, q) - 1.0;
          break;
        case WsdDecayStyle::linear:
          coeff = 1.0 - q;
          break;
        case WsdDecayStyle::cosine:
          coeff = 0.5 * (std::cos(std::numbers::pi * q) + 1.0);
          break;
        case WsdDecayStyle::minus_sqrt:
          coeff = 1.0 - std::sqrt(q);
          break;
      }
      break;
    }
    default:
      MEGATRON_FAIL("unhandled LR decay style");
  }
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace megatron
