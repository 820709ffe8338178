#include "megatron/ops/checks/adamw.h"

#include <utility>

namespace megatron::ops::checks {

void check_adamw_params(const AdamWParams& params) {
  MEGATRON_CHECK(params.step >= 1, "adamw step " << params.step << " must be >= 1 (steps count from 1)");
  MEGATRON_CHECK(params.beta1 >= 0.0f && params.beta1 < 1.0f && params.beta2 >= 0.0f && params.beta2 < 1.0f,
                 "adamw betas (" << params.beta1 << ", " << params.beta2 << ") must be in [0, 1)");
}

void check_adamw_step(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grad,
                      const Tensor& model_param, const AdamWParams& params, const AdamWBackend& backend) {
  check_defined(master, "adamw master");
  backend.device(master, "adamw master");
  backend.master_dtype(master, "adamw master");
  const bool remainders = master.dtype() == DType::u16;
  const DType state_dtype = remainders ? DType::f32 : master.dtype();
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&exp_avg, "adamw exp_avg"},
                                {&exp_avg_sq, "adamw exp_avg_sq"},
                                {&grad, "adamw grad"}}) {
    backend.device(*t, name);
    check_numel(*t, master.numel(), name);
    check_dtype(*t, state_dtype, name);
  }
  MEGATRON_CHECK(!remainders || (model_param.defined() && model_param.dtype() == DType::bf16),
                 "adamw masters kept as u16 remainders need the bf16 parameters they complete");
  if (model_param.defined()) {
    backend.device(model_param, "adamw model_param");
    check_numel(model_param, master.numel(), "adamw model_param");
    MEGATRON_CHECK(!dtype_is_fp8(model_param.dtype()),
                   "adamw model_param has dtype " << dtype_name(model_param.dtype())
                                                  << "; FP8 copies of the masters are written by adamw_step_fp8");
    backend.copy_dtype(model_param, "adamw model_param");
  }
  check_adamw_params(params);
}

void check_adamw_step_pieces(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                             const std::vector<AdamWPiece>& pieces, const AdamWParams& params,
                             const AdamWBackend& backend) {
  check_defined(exp_avg, "adamw exp_avg");
  const int64_t numel = exp_avg.numel();
  check_numel(exp_avg_sq, numel, "adamw exp_avg_sq");
  if (master.defined()) check_numel(master, numel, "adamw master");
  Tensor none;
  for (const AdamWPiece& piece : pieces) {
    check_defined(piece.grad, "adamw piece grad");
    const int64_t end = piece.begin + piece.grad.numel();
    MEGATRON_CHECK(piece.begin >= 0 && end <= numel,
                   "adamw piece [" << piece.begin << ", " << end << ") lies outside the state's " << numel
                                   << " elements");
    check_defined(piece.model_param, "adamw piece model_param");
    const Tensor masters = master.defined() ? master.slice(piece.begin, end) : piece.model_param;
    check_adamw_step(masters, exp_avg.slice(piece.begin, end), exp_avg_sq.slice(piece.begin, end), piece.grad,
                     master.defined() ? piece.model_param : none, params, backend);
  }
  check_adamw_params(params);
}

void check_adamw_step_fp8(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grad,
                          const Tensor& codes, const Tensor& codes_amax, const Tensor& codes_scale,
                          const AdamWParams& params, const AdamWBackend& backend) {
  check_defined(master, "adamw_fp8 master");
  check_dtype(master, DType::f32, "adamw_fp8 master");
  check_adamw_step(master, exp_avg, exp_avg_sq, grad, Tensor(), params, backend);
  backend.device(codes, "adamw_fp8 codes");
  check_numel(codes, master.numel(), "adamw_fp8 codes");
  MEGATRON_CHECK(dtype_is_fp8(codes.dtype()),
                 "adamw_fp8 codes have dtype " << dtype_name(codes.dtype()) << "; expected e4m3 or e5m2");
  for (const auto& [t, name] :
       {std::pair<const Tensor*, const char*>{&codes_amax, "adamw_fp8 amax"}, {&codes_scale, "adamw_fp8 scale"}}) {
    backend.device(*t, name);
    check_numel(*t, 1, name);
    check_dtype(*t, DType::f32, name);
  }
}

}  // namespace megatron::ops::checks
