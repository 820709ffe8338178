#pragma once
// Megatron's OptimizerParamScheduler (megatron/core/optimizer_param_scheduler.py), exactly:
// steps are counted in *samples*, the scheduler is stepped by the global batch size after
// every successful iteration, and lr(num_steps) follows warmup then the decay style.
#include <cstdint>
#include <optional>

#include "megatron/optimizer/optimizer_config.h"

namespace megatron {

class OptimizerParamScheduler {
 public:
  // The lengths, in samples, as Megatron's get_optimizer_param_scheduler derives them: with
  // lr_decay_samples set (sample-based training) the *_samples fields, otherwise the *_iters
  // fields (lr_decay_iters falling back to train_iters) times the global batch size.
  // --lr-warmup-fraction takes that fraction of the decay length, not rounded.
  OptimizerParamScheduler(const OptimizerArgs& args, int64_t train_iters, int64_t global_batch_size);
  double lr() const { return lr_at(num_steps_); }
  double lr_at(int64_t num_steps) const { return lr_at(num_steps, max_lr_, min_lr_); }
  // --decoupled-lr's: the embedding and output layer's learning rate, the same schedule between
  // --decoupled-lr and --decoupled-min-lr (--min-lr where unset), as Megatron's parameter group of
  // is_embedding_or_output_parameter; unset without the flag.
  std::optional<double> decoupled_lr() const;
  double weight_decay() const { return weight_decay_; }
  void step(int64_t increment) { num_steps_ += increment; }
  int64_t num_steps() const { return num_steps_; }
  void set_num_steps(int64_t n) { num_steps_ = n; }

 private:
  double lr_at(int64_t num_steps, double max_lr, double min_lr) const;

  double max_lr_, min_lr_, init_lr_;
  std::optional<double> decoupled_max_lr_;
  double decoupled_min_lr_;
  double warmup_steps_;  // a fraction of the decay length need not be whole (Megatron keeps the float)
  int64_t decay_steps_, wsd_decay_steps_;
  LrDecayStyle style_;
  WsdDecayStyle wsd_style_;
  double weight_decay_;
  int64_t num_steps_ = 0;
};

}  // namespace megatron
