#pragma once
// LayerNorm / RMSNorm module over the last dimension (the hidden size; a head's for the query and
// key norms of --qk-layernorm), replicated across TP. Under sequence parallelism it normalises this
// rank's sequence shard, and a q/k norm normalises this rank's heads: the weight and bias gradients
// then cover that part only and are summed over TP before the optimizer
// (ParamSpec::sequence_parallel, finalize_model_grads).
#include <string>

#include "megatron/core/activation_memory.h"
#include "megatron/ops/norm.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter_registry.h"
#include "megatron/tensor_parallel/layers.h"
#include "megatron/transformer/residual_stream.h"
#include "megatron/transformer/transformer_config.h"

namespace megatron {

class Norm {
 public:
  struct Saved {
    Tensor input, mean, rstd;  // input: the tensor normalised, i.e. the stream's value (S,B,C)
    void count(ActivationMemory& m) const {
      for (const Tensor* t : {&input, &mean, &rstd}) m.add(*t);
    }
  };
  // What a norm normalises: rows of `width` elements, and whether each TP rank's gradient covers
  // only part of the rows (its sequence shard under SP, its heads for a q/k norm).
  struct Rows {
    int64_t width;
    bool partial_over_tp;
  };
  // The hidden-size norm of the residual stream: partial over TP under sequence parallelism.
  static Rows hidden(const TransformerConfig& config, const ParallelContext& ctx) {
    return {config.hidden_size, ctx.sequence_parallel()};
  }
  // weight_name / bias_name: full Megatron names (TE spec fuses the pre-norms into the next
  // linear, e.g. "...self_attention.linear_qkv.layer_norm_weight").
  Norm(ParameterRegistry& registry, const TransformerConfig& config, const std::string& weight_name,
       const std::string& bias_name, const Rows& rows);
  // y = norm(x.residual + x.delta), the addition fused into the norm when x defers one; the sum
  // (the stream's next residual) is saved.input. (S,B,C) -> (S,B,C)
  Tensor forward(const ResidualStream& x, Saved& saved) const;
  // The same with y handed to `consumer`, the next GEMM's FP8 state (a layer whose forward takes
  // an Fp8Activation), as the casts of its input: made from the stream's value and the norm's
  // statistics (ops::norm_forward_fp8), y is never stored in bf16.
  tensor_parallel::Fp8Activation forward(const ResidualStream& x, Saved& saved,
                                         tensor_parallel::Fp8Linear& consumer) const;
  // y again from what forward saved (--recompute-modules layernorm): the same op on the same stored
  // stream value, so the forward's bits.
  Tensor recompute(const Saved& saved) const;
  // Returns the gradient of the norm's input: the norm's backward plus dresidual, the gradient
  // that reached the same tensor along the residual stream (undefined: none, as for the final norm),
  // summed in the same pass.
  Tensor backward(const Tensor& dy, const Saved& saved, const Tensor& dresidual = Tensor()) const;

 private:
  void normalize(const ResidualStream& x, Tensor& y2, Saved& saved) const;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  ops::NormParams params_;
};

}  // namespace megatron
