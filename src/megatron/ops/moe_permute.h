#pragma once
// Token permutation for mixture of experts (Megatron's permute / unpermute): tokens x (T,H) are
// copied into rows (N,H) grouped by expert, the experts run on the rows, and each token's output
// is the probability-weighted sum of its rows. Row r holds token row_token[r]; token_rows (T,E)
// names the row of token t for expert e, -1 where t was not routed to e. Weights (per row, or
// (T,E) per token and expert) are in the tensors' accumulation dtype (f32; f64 for f64 tensors).
// Every output is overwritten. Both directions are gathers (no atomics), so results are
// deterministic on every backend.
#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

// rows[r] = row_weight[r] * x[row_token[r]]   (row_weight undefined: 1)
// Permute; with weights, unpermute's backward (drows[r] = p[t,e] dout[t]).
MEGATRON_OP(moe_permute, void(Tensor& rows, const Tensor& x, const Tensor& row_token, const Tensor& row_weight));
// out[t] = sum_e weight[t,e] * rows[token_rows[t,e]], over the e with a row   (weight undefined: 1)
// Unpermute; without weights, permute's backward (dx[t] = sum of its rows' gradients).
MEGATRON_OP(moe_unpermute, void(Tensor& out, const Tensor& rows, const Tensor& token_rows, const Tensor& weight));
// dweight[t,e] = <dout[t], rows[token_rows[t,e]]>, 0 where t has no row for e: the gradient of
// unpermute's weights.
MEGATRON_OP(moe_unpermute_weight_backward,
            void(Tensor& dweight, const Tensor& dout, const Tensor& rows, const Tensor& token_rows));

}  // namespace megatron::ops
