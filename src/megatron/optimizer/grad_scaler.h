#pragma once
// Loss scaling for fp16 training, as Megatron's megatron/core/optimizer/grad_scaler.py.
//
// The loss is multiplied by scale() before backward, so small fp16 gradients do not flush to
// zero; the optimizer finds non-finite main grads (an fp16 overflow), calls update(found_inf),
// skips the step when found_inf, and otherwise unscales the grads by inv_scale().
//
//   ConstantGradScaler (--loss-scale S): scale S forever; update() changes nothing.
//   DynamicGradScaler (fp16 without --loss-scale), per update:
//     found_inf: growth_tracker = 0; hysteresis_tracker -= 1;
//                if hysteresis_tracker <= 0: scale = max(scale * backoff_factor, min_scale)
//     otherwise: growth_tracker += 1; when it reaches growth_interval: growth_tracker = 0,
//                hysteresis_tracker = hysteresis, scale *= growth_factor
//   A clean step does not refill the hysteresis tracker; only a growth does. So after the first
//   `hysteresis` overflows every further overflow backs off until the scale next grows. The scale
//   is a float (a float32 tensor in Megatron) with no upper bound: fp16 gradients overflow long
//   before the scale leaves float's range.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>

#include "megatron/core/dtype.h"

namespace megatron {

// What a checkpoint keeps: the fields of Megatron's DynamicGradScaler.state_dict(), stored in
// JSON as {"scale": .., "growth_tracker": .., "hysteresis_tracker": ..}.
struct GradScalerState {
  float scale = 1.0f;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
  bool operator==(const GradScalerState&) const = default;
};
void to_json(nlohmann::json& j, const GradScalerState& state);
void from_json(const nlohmann::json& j, GradScalerState& state);  // checks the fields exist; load_state checks values

class GradScaler {
 public:
  virtual ~GradScaler() = default;
  virtual float scale() const = 0;
  // 1 / scale computed in double and rounded to float, as Megatron's inv_scale.
  float inv_scale() const { return float(1.0 / double(scale())); }
  virtual void update(bool found_inf) = 0;
  virtual GradScalerState state() const = 0;
  virtual void load_state(const GradScalerState& state) = 0;
};

class ConstantGradScaler final : public GradScaler {
 public:
  explicit ConstantGradScaler(float scale);
  float scale() const override { return scale_; }
  void update(bool) override {}
  GradScalerState state() const override { return {scale_, 0, 0}; }
  // Megatron's constant scaler keeps nothing in checkpoints: the flag's scale wins on resume.
  void load_state(const GradScalerState&) override {}

 private:
  float scale_;
};

// Megatron's defaults: --initial-loss-scale 2^32, --min-loss-scale 1, --loss-scale-window 1000,
// --hysteresis 2; growth and backoff are fixed at 2 and 0.5 in Megatron's optimizer setup.
struct DynamicGradScalerParams {
  float initial_scale = 4294967296.0f;
  float min_scale = 1.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 1000;
  int64_t hysteresis = 2;
};

class DynamicGradScaler final : public GradScaler {
 public:
  explicit DynamicGradScaler(const DynamicGradScalerParams& params);  // checks the params
  float scale() const override { return scale_; }
  void update(bool found_inf) override;
  GradScalerState state() const override { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  void load_state(const GradScalerState& state) override;

 private:
  DynamicGradScalerParams params_;
  float scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_;
};

// Megatron's choice: a 16-bit model with a static loss scale (loss_scale != 0; 0 stands for
// --loss-scale unset) gets a constant scaler, an f16 model without one a dynamic scaler, anything
// else none (nullptr: loss scale 1, no overflow check, no skipped steps).
std::unique_ptr<GradScaler> make_grad_scaler(DType params_dtype, float loss_scale,
                                             const DynamicGradScalerParams& dynamic);

}  // namespace megatron
