#pragma once
// The dense MLP: fc1 column-parallel (fused [gate; up] with SwiGLU), activation, fc2
// row-parallel. The activation output is not kept for backward: it is recomputed from the
// saved fc1 output (selective recomputation of the cheapest tensor to rebuild), or, in FP8, fc2
// keeps the forward's cast of its x^T instead (a byte an element, and no recompute). GELU is
// fused into the GEMMs (ops/gemm.h): fc1's epilogue applies it, fc2's input-gradient GEMM applies
// its derivative; SwiGLU runs as its own kernels, which under the delayed FP8 recipe write their
// outputs as the FP8 casts the next GEMM reads (ops::swiglu_forward_fp8 / swiglu_backward_fp8).
// With --recompute-modules mlp (selective recomputation) fc1's output is not kept either: backward
// runs fc1 again on its saved input, so the MLP keeps only that input.
#include <optional>
#include <string>
#include <vector>

#include "megatron/tensor_parallel/layers.h"
#include "megatron/transformer/transformer_config.h"

namespace megatron {

class MLP {
 public:
  struct Saved {
    tensor_parallel::LinearSaved fc1, fc2;  // fc2.input is left empty: recomputed or cast kept
    Tensor fc1_out;                         // activation input (GELU: the pre-activation); empty when recomputed
    void count(ActivationMemory& m) const;
  };
  // fp8: fc1's and fc2's GEMMs in FP8 with this recipe (transformer/fp8_config.h).
  MLP(ParameterRegistry& registry, const ParallelContext& ctx, const TransformerConfig& config,
      const std::string& prefix, const std::optional<ops::Fp8Recipe>& fp8 = std::nullopt);
  Tensor forward(const Tensor& x, Saved& saved) const;
  // The same with x as its FP8 casts (Norm's FP8 forward), where input_fp8() is defined.
  Tensor forward(const tensor_parallel::Fp8Activation& x, Saved& saved) const;
  // fc1's FP8 state where it takes its input as FP8 casts: SwiGLU's FP8 path (see forward) with fc1
  // able to (ColumnParallelLinear::takes_fp8_input); else null (GELU fuses into fc1's bf16 output,
  // and a recomputed MLP keeps its bf16 input to run fc1 again).
  tensor_parallel::Fp8Linear* input_fp8() const {
    return fuses_fp8_activation() && linear_fc1_.takes_fp8_input() ? linear_fc1_.fp8() : nullptr;
  }
  Tensor backward(const Tensor& dy, const Saved& saved) const;
  // linear_fc1's and linear_fc2's FP8 state, in that order; none in bf16.
  std::vector<tensor_parallel::Fp8Linear*> fp8_linears() const;

 private:
  Tensor activation(const Tensor& fc1_out) const;
  // Whether SwiGLU's forward writes fc2's FP8 input casts directly (see forward).
  bool fuses_fp8_activation() const;
  // fc2 of SwiGLU(fc1_out) through SwiGLU's FP8 casts (fuses_fp8_activation); saves fc1_out.
  Tensor fc2_of_fp8_swiglu(const Tensor& fc1_out, Saved& saved) const;
  // fc1 and the activation of x: returns the activation, fills fc1's Saved and fc1_out.
  Tensor fc1_and_activation(const Tensor& x, tensor_parallel::LinearSaved& fc1, Tensor& fc1_out) const;
  bool swiglu_;
  bool recompute_;  // --recompute-modules mlp
  tensor_parallel::ColumnParallelLinear linear_fc1_;
  tensor_parallel::RowParallelLinear linear_fc2_;
};

}  // namespace megatron
