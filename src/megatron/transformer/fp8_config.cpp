#include "megatron/transformer/fp8_config.h"

#include "megatron/core/strings.h"

namespace megatron {

bool Fp8Config::layer_in_fp8(int64_t layer_number, int64_t num_layers) const {
  if (!enabled()) return false;
  if (!first_last_layers_bf16) return true;
  return layer_number >= num_layers_at_start_in_bf16 && layer_number < num_layers - num_layers_at_end_in_bf16;
}

ops::Fp8Recipe Fp8Config::recipe() const {
  const bool delayed = fp8_recipe == "delayed";
  // hybrid gives e5m2 output gradients under every recipe: Transformer Engine's Float8BlockScaling
  // takes fp8_format E4M3 (its default) or HYBRID as the per-tensor recipes do.
  return {.forward_dtype = DType::e4m3,
          .backward_dtype = fp8_format == "hybrid" ? DType::e5m2 : DType::e4m3,
          .scaling = delayed                     ? ops::Fp8Scaling::delayed
                     : fp8_recipe == "blockwise" ? ops::Fp8Scaling::blockwise
                                                 : ops::Fp8Scaling::current,
          .amax_history_len = delayed ? fp8_amax_history_len : 1,
          .amax_compute_algo =
              delayed && fp8_amax_compute_algo == "max" ? ops::AmaxComputeAlgo::max : ops::AmaxComputeAlgo::most_recent,
          .margin = delayed ? fp8_margin : 0};
}

std::vector<std::string> validate_fp8(const Fp8Config& f, int64_t num_layers) {
  std::vector<std::string> e;
  if (!f.fp8_format.empty() && f.fp8_format != "e4m3" && f.fp8_format != "hybrid")
    e.push_back(concat("--fp8-format ", f.fp8_format, ": expected e4m3 or hybrid (Megatron's formats)"));
  if (f.fp8_recipe == "mxfp8" || f.fp8_recipe == "custom") {
    e.push_back(concat("--fp8-recipe ", f.fp8_recipe,
                       ": Megatron's recipe, not built here; use delayed (the default), tensorwise or blockwise"));
  } else if (f.fp8_recipe != "delayed" && f.fp8_recipe != "tensorwise" && f.fp8_recipe != "blockwise") {
    e.push_back(concat("--fp8-recipe ", f.fp8_recipe, ": expected delayed, tensorwise or blockwise"));
  }
  if (f.fp8_amax_compute_algo != "most_recent" && f.fp8_amax_compute_algo != "max")
    e.push_back(concat("--fp8-amax-compute-algo ", f.fp8_amax_compute_algo, ": expected most_recent or max"));
  if (f.fp8_amax_history_len < 1)
    e.push_back(concat("--fp8-amax-history-len ", f.fp8_amax_history_len,
                       " must be >= 1 step: e.g. 1024 (Megatron's recipes) or 1 (the default)"));
  if (f.fp8_margin < 0 || f.fp8_margin > 126)
    e.push_back(concat("--fp8-margin ", f.fp8_margin,
                       " must lie in [0, 126]: the scale is divided by 2^margin; e.g. 0 (the default)"));
  if (f.fp8_param_gather && f.fp8_recipe == "blockwise")
    e.push_back(
        "--fp8-param-gather with --fp8-recipe blockwise: FP8 parameters are built for the per-tensor recipes "
        "(delayed, tensorwise) here; use one of them, or drop --fp8-param-gather (the weights then stay bf16)");
  if (f.num_layers_at_start_in_bf16 < 0 || f.num_layers_at_end_in_bf16 < 0)
    e.push_back(concat("--num-layers-at-start-in-bf16 ", f.num_layers_at_start_in_bf16,
                       " and --num-layers-at-end-in-bf16 ", f.num_layers_at_end_in_bf16, " must be >= 0"));
  if (f.first_last_layers_bf16 && f.num_layers_at_start_in_bf16 + f.num_layers_at_end_in_bf16 > num_layers)
    e.push_back(concat("--num-layers-at-start-in-bf16 ", f.num_layers_at_start_in_bf16,
                       " plus --num-layers-at-end-in-bf16 ", f.num_layers_at_end_in_bf16, " exceed --num-layers ",
                       num_layers, ": lower them"));
  if (!f.enabled()) {
    if (f.first_last_layers_bf16)
      e.push_back("--first-last-layers-bf16 applies to FP8 training only: add --fp8-format, or drop it");
    if (f.fp8_param_gather)
      e.push_back("--fp8-param-gather applies to FP8 training only: add --fp8-format, or drop it");
    return e;
  }
  // Settings of the delayed recipe that current scaling (tensorwise, blockwise) has no use for:
  // refused rather than ignored (Megatron passes them to Transformer Engine's DelayedScaling only),
  // so a run never seems to follow a setting it does not.
  if (f.fp8_recipe == "tensorwise" || f.fp8_recipe == "blockwise") {
    const Fp8Config defaults;
    if (f.fp8_margin != defaults.fp8_margin || f.fp8_amax_history_len != defaults.fp8_amax_history_len ||
        f.fp8_amax_compute_algo != defaults.fp8_amax_compute_algo)
      e.push_back(concat("--fp8-margin ", f.fp8_margin, ", --fp8-amax-history-len ", f.fp8_amax_history_len,
                         " and --fp8-amax-compute-algo ", f.fp8_amax_compute_algo,
                         " apply to --fp8-recipe delayed only: ", f.fp8_recipe,
                         f.fp8_recipe == "tensorwise" ? " scales each tensor by its own amax"
                                                      : " scales each 1x128 tile or 128x128 block by its own amax",
                         "; drop them or use delayed"));
  }
  return e;
}

}  // namespace megatron
