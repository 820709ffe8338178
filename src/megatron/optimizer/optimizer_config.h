#pragma once
// What the optimizer and its learning-rate schedule are told (Megatron's optimizer, learning-rate
// and mixed-precision argument groups; megatron/core/optimizer/optimizer_config.py). The flags
// that fill these fields live in training/arguments.cpp; the optimizer never reads flags.
#include <cstdint>
#include <optional>
#include <string>

#include "megatron/core/dtype.h"

namespace megatron {

enum class LrDecayStyle { constant, linear, cosine, inverse_square_root, WSD };
enum class WsdDecayStyle { exponential, linear, cosine, minus_sqrt };

struct OptimizerArgs {
  // Megatron's --optimizer: adam (AdamW, decoupled weight decay) is the one built; its other
  // choices are refused.
  std::string optimizer = "adam";
  double lr = 0.0;  // required
  double min_lr = 0.0;
  // The embedding and output layer's own maximum and minimum learning rate under the same schedule
  // (Megatron's decoupled_lr group); --decoupled-min-lr needs --decoupled-lr and defaults to min_lr.
  std::optional<double> decoupled_lr;
  std::optional<double> decoupled_min_lr;
  LrDecayStyle lr_decay_style = LrDecayStyle::linear;
  int64_t lr_decay_iters = 0;  // derived: train_iters (iteration-based training)
  int64_t lr_warmup_iters = 0;
  std::optional<double> lr_warmup_fraction;
  double lr_warmup_init = 0.0;
  WsdDecayStyle lr_wsd_decay_style = WsdDecayStyle::exponential;
  int64_t lr_wsd_decay_iters = 0;
  double weight_decay = 0.01;
  // Weight decay skips biases and norm weights; these put it back on the query and key layernorms
  // (Megatron's Qwen3-Next grouping). --no-weight-decay-cond-type apply_wd_to_qk_layernorm is
  // Megatron's deprecated spelling of the flag.
  bool apply_wd_to_qk_layernorm = false;
  std::string no_weight_decay_cond_type;
  bool decays_qk_layernorm() const {
    return apply_wd_to_qk_layernorm || no_weight_decay_cond_type == "apply_wd_to_qk_layernorm";
  }
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;  // 0 disables clipping
  // The schedule's lengths in samples, for sample-based training (--train-samples); each
  // excludes its *_iters form. 0: unset.
  int64_t lr_decay_samples = 0;  // derived: train_samples (sample-based training)
  int64_t lr_warmup_samples = 0;
  int64_t lr_wsd_decay_samples = 0;

  // Loss scaling (Megatron's mixed-precision group; optimizer/grad_scaler.h). --fp16 uses a
  // dynamic scaler unless --loss-scale gives a static one; --bf16 uses one only with --loss-scale.
  std::optional<double> loss_scale;          // static scale; unset: dynamic (fp16) or none (bf16)
  double initial_loss_scale = 4294967296.0;  // 2^32
  double min_loss_scale = 1.0;
  double loss_scale_window = 1000;  // clean iterations before the scale doubles (a float in Megatron)
  int64_t hysteresis = 2;           // overflows absorbed before the scale first halves

  // Optimizer CPU offload (optimizer/adamw_state.h), Megatron's flags and defaults. Megatron also
  // asks for --use-precision-aware-optimizer, whose code path its offload reuses; ours offloads
  // without it.
  bool optimizer_cpu_offload = false;
  double optimizer_offload_fraction = 1.0;

  // Megatron's precision-aware optimizer: with bf16 parameters the f32 master weights on the device
  // are kept as 16-bit remainders beside them (store_param_remainders, on unless
  // --no-store-param-remainders; optimizer/adamw_state.h). The state dtypes stay f32: the dtype
  // flags are taken with Megatron's choices and refused for any other value.
  bool use_precision_aware_optimizer = false;
  bool store_param_remainders = true;
  std::string main_grads_dtype = "fp32";
  std::string main_params_dtype = "fp32";
  std::string exp_avg_dtype = "fp32";
  std::string exp_avg_sq_dtype = "fp32";

  // Whether the masters of parameters in `params_dtype` are kept as remainders: bf16 only (the bits
  // of neither f16 nor f32 are the top of an f32).
  bool keeps_param_remainders(DType params_dtype) const {
    return use_precision_aware_optimizer && store_param_remainders && params_dtype == DType::bf16;
  }
};

}  // namespace megatron
