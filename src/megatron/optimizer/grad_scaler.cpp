#include "megatron/optimizer/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "megatron/core/error.h"

namespace megatron {
namespace {

void check_scale(double scale, const char* what) {
  MEGATRON_CHECK(std::isfinite(scale) && scale > 0.0,
                 what << " " << scale << " must be a positive finite number; pass a loss scale such as 65536");
}

}  // namespace

void to_json(nlohmann::json& j, const GradScalerState& state) {
  j = nlohmann::json{{"scale", state.scale},
                     {"growth_tracker", state.growth_tracker},
                     {"hysteresis_tracker", state.hysteresis_tracker}};
}

void from_json(const nlohmann::json& j, GradScalerState& state) {
  for (const char* key : {"scale", "growth_tracker", "hysteresis_tracker"}) {
    MEGATRON_CHECK(j.contains(key) && j.at(key).is_number(),
                   "loss scaler state " << j.dump() << " lacks the number '" << key
                                        << "'; the checkpoint's grad scaler entry is damaged or from another tool");
  }
  state.scale = j.at("scale").get<float>();
  state.growth_tracker = j.at("growth_tracker").get<int64_t>();
  state.hysteresis_tracker = j.at("hysteresis_tracker").get<int64_t>();
}

ConstantGradScaler::ConstantGradScaler(float scale) : scale_(scale) { check_scale(scale, "static loss scale"); }

DynamicGradScaler::DynamicGradScaler(const DynamicGradScalerParams& p)
    : params_(p), scale_(p.initial_scale), hysteresis_tracker_(p.hysteresis) {
  check_scale(p.initial_scale, "initial loss scale (--initial-loss-scale)");
  check_scale(p.min_scale, "minimum loss scale (--min-loss-scale)");
  MEGATRON_CHECK(p.min_scale <= p.initial_scale, "minimum loss scale "
                                                     << p.min_scale << " exceeds the initial loss scale "
                                                     << p.initial_scale << "; lower --min-loss-scale");
  MEGATRON_CHECK(p.growth_factor > 1.0f, "loss scale growth factor " << p.growth_factor << " must be > 1");
  MEGATRON_CHECK(p.backoff_factor > 0.0f && p.backoff_factor < 1.0f,
                 "loss scale backoff factor " << p.backoff_factor << " must be in (0, 1)");
  MEGATRON_CHECK(p.growth_interval > 0, "loss scale window " << p.growth_interval
                                                             << " must be a positive number of iterations "
                                                                "(--loss-scale-window)");
  MEGATRON_CHECK(p.hysteresis > 0,
                 "loss scale hysteresis " << p.hysteresis << " must be a positive number of overflows (--hysteresis)");
}

void DynamicGradScaler::update(bool found_inf) {
  if (found_inf) {
    growth_tracker_ = 0;
    --hysteresis_tracker_;
    if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * params_.backoff_factor, params_.min_scale);
    return;
  }
  ++growth_tracker_;
  // Megatron tests ==; >= agrees whenever the tracker counts up from below the interval and
  // also grows a tracker loaded from a run with a longer window, which == would never grow.
  if (growth_tracker_ >= params_.growth_interval) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = params_.hysteresis;
    scale_ *= params_.growth_factor;
  }
}

void DynamicGradScaler::load_state(const GradScalerState& state) {
  check_scale(state.scale, "loss scaler state: scale");
  MEGATRON_CHECK(state.growth_tracker >= 0, "loss scaler state: growth_tracker "
                                                << state.growth_tracker
                                                << " must be >= 0 (clean steps since the scale last changed)");
  scale_ = state.scale;
  growth_tracker_ = state.growth_tracker;
  hysteresis_tracker_ = state.hysteresis_tracker;
}

std::unique_ptr<GradScaler> make_grad_scaler(DType params_dtype, float loss_scale,
                                             const DynamicGradScalerParams& dynamic) {
  const bool half = params_dtype == DType::f16 || params_dtype == DType::bf16;
  if (!half) return nullptr;
  if (loss_scale != 0.0f) return std::make_unique<ConstantGradScaler>(loss_scale);  // checks it is positive
  if (params_dtype == DType::f16) return std::make_unique<DynamicGradScaler>(dynamic);
  return nullptr;
}

}  // namespace megatron
