#pragma once
// Argument checks of the elementwise family (ops/elementwise.h), shared by ops/cpu/elementwise.cpp
// and ops/cuda/elementwise.cu; `device` is the backend's device rule.
#include "megatron/ops/checks/common.h"

namespace megatron::ops::checks {

// in is defined, both on the backend's device, out has in's element count (dtypes may differ).
void check_same_numel(const Tensor& out, const Tensor& in, const char* out_name, const char* in_name,
                      TensorCheck device);
void check_add(const Tensor& out, const Tensor& a, const Tensor& b, TensorCheck device);
void check_transpose01(const Tensor& out, const Tensor& in, TensorCheck device);

}  // namespace megatron::ops::checks
