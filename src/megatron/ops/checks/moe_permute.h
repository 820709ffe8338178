#pragma once
// Argument checks of the MoE permutation family (ops/moe_permute.h), shared by both backends.
#include "megatron/ops/checks/common.h"

namespace megatron::ops::checks {

void check_moe_permute(const Tensor& rows, const Tensor& x, const Tensor& row_token, const Tensor& row_weight,
                       TensorCheck device);
void check_moe_unpermute(const Tensor& out, const Tensor& rows, const Tensor& token_rows, const Tensor& weight,
                         TensorCheck device);
void check_moe_unpermute_weight_backward(const Tensor& dweight, const Tensor& dout, const Tensor& rows,
                                         const Tensor& token_rows, TensorCheck device);

}  // namespace megatron::ops::checks
