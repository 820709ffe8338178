#include "megatron/distributed/fp8_params.h"

#include "megatron/core/error.h"
#include "megatron/ops/fp8.h"

namespace megatron {

namespace {
ops::Fp8TensorScaling& scaling_of(const Parameter& p) {
  MEGATRON_CHECK(p.fp8 && p.fp8->scaling != nullptr, p.spec.name << " is not an FP8 parameter");
  return *p.fp8->scaling;
}
}  // namespace

void cast_fp8_param_shards(const std::vector<Fp8ParamShard>& shards, const std::vector<const Parameter*>& fp8_params,
                           Communicator* group, bool record_amax) {
  if (fp8_params.empty()) return;
  const ops::Fp8Recipe& recipe = fp8_params.front()->fp8->recipe;
  for (const Parameter* p : fp8_params) {
    MEGATRON_CHECK(p->fp8->recipe.scaling == recipe.scaling && p->fp8->recipe.scaling != ops::Fp8Scaling::blockwise,
                   p->spec.name << ": FP8 parameters are cast under one per-tensor recipe (delayed or tensorwise)");
    ops::fp8_scaling_start(scaling_of(*p), recipe.amax_history_len, p->data.device());
  }
  if (recipe.scaling == ops::Fp8Scaling::delayed) {
    for (const Fp8ParamShard& s : shards) {
      ops::Fp8TensorScaling& scaling = scaling_of(*s.param);
      Tensor amax = record_amax ? scaling.amax_history.slice(0, 1) : Tensor(), codes = s.codes;
      ops::fp8_quantize(codes, amax, s.master, scaling.scale);
    }
    return;
  }
  // Current scaling: every weight's amax over its shards, then its scale, then the casts.
  std::vector<Tensor> amaxes, scales, scale_invs, histories;
  std::vector<DType> dtypes;
  for (const Parameter* p : fp8_params) {
    ops::Fp8TensorScaling& scaling = scaling_of(*p);
    scaling.amax_history.zero();
    amaxes.push_back(scaling.amax_history.slice(0, 1));
    scales.push_back(scaling.scale);
    scale_invs.push_back(scaling.scale_inv);
    histories.push_back(scaling.amax_history);
    dtypes.push_back(scaling.dtype);
  }
  for (const Fp8ParamShard& s : shards) {
    Tensor amax = scaling_of(*s.param).amax_history.slice(0, 1);
    ops::fp8_amax(amax, s.master);
  }
  if (group != nullptr && group->size() > 1) group->all_reduce_coalesced(amaxes, ReduceOp::max);
  ops::fp8_update_scales(scales, scale_invs, histories, dtypes, recipe);
  for (const Fp8ParamShard& s : shards) {
    Tensor no_amax, codes = s.codes;
    ops::fp8_quantize(codes, no_amax, s.master, scaling_of(*s.param).scale);
  }
}

Tensor fp8_param_values(const Parameter& param, const Tensor& codes, DType dtype) {
  const ops::Fp8TensorScaling& scaling = scaling_of(param);
  MEGATRON_CHECK(scaling.scale_inv.defined(), param.spec.name << ": an FP8 parameter not cast yet has no values");
  const auto scale_inv = float(scaling.scale_inv.item(0));
  const Tensor host = codes.to(Device::cpu());
  const auto* q = static_cast<const uint8_t*>(host.raw());
  const bool e4m3 = host.dtype() == DType::e4m3;
  Tensor values = Tensor::empty(host.shape(), DType::f32);
  float* v = values.data<float>();
  const int64_t n = values.numel();
#pragma omp parallel for schedule(static)  // a checkpoint's weights: billions of elements
  for (int64_t i = 0; i < n; ++i) v[i] = (e4m3 ? fp8_e4m3::to_float(q[i]) : fp8_e5m2::to_float(q[i])) * scale_inv;
  return dtype == DType::f32 ? values : values.to(dtype);
}

}  // namespace megatron
