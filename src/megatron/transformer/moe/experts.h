#pragma once
// The routed experts: E MLPs without biases, fc1 (fused [gate; up] with SwiGLU) and fc2, each
// registered as one (E, out, in) parameter per layer whose dim 0 is the global expert index
// (decoder.layers.N.mlp.experts.linear_fc1.weight, (E, F or 2F, H); linear_fc2.weight, (E, H, F)),
// so a checkpoint holds every expert by its index. Under expert parallelism this rank holds the
// contiguous experts [first_expert(), first_expert() + num_local_experts()); under expert tensor
// parallelism (--expert-tensor-parallel-size, default TP) its expert TP shard of each (fc1
// column-, fc2 row-parallel), so its output rows are partial sums over the expert TP ranks, which
// the token exchange adds (moe_layer.h). Rows arrive grouped by expert
// (token_dispatcher.h): expert e runs on its rows' count of consecutive rows, known on the host
// or only as device offsets (device routing; the per-expert GEMM loop reads them back once per
// forward, the grouped GEMM need not). The activation's output (fc2's input) is kept for backward,
// as Megatron's experts keep it, or under --recompute-modules moe_act recomputed there from the
// saved fc1 output.
#include <string>
#include <vector>

#include "megatron/core/activation_memory.h"
#include "megatron/ops/grouped_gemm.h"
#include "megatron/parameters/parameter_registry.h"
#include "megatron/transformer/transformer_config.h"

namespace megatron::moe {

class Experts {
 public:
  struct Saved {
    Tensor input;    // (N,H) the dispatched rows
    Tensor fc1_out;  // (N, F or 2F)
    Tensor act;      // (N, F) fc2's input; undefined under moe_act recomputation
    ops::ExpertRows expert_rows{std::vector<int64_t>{}};
    void count(ActivationMemory& m) const {
      m.add(input);
      m.add(fc1_out);
      m.add(act);
    }
  };
  Experts(ParameterRegistry& registry, const TransformerConfig& config, const std::string& prefix);
  Tensor forward(const Tensor& rows, const ops::ExpertRows& expert_rows, Saved& saved) const;
  Tensor backward(const Tensor& dy, const Saved& saved) const;  // accumulates weight grads, returns drows
  int64_t first_expert() const { return fc1_->expert_offset(); }
  int64_t num_local_experts() const { return fc1_->local_shape[0]; }

 private:
  // out rows of expert e = in rows of e @ weight[e]^T, for every expert with rows: one grouped
  // GEMM (--moe-grouped-gemm), or one GEMM per expert (Megatron's SequentialMLP).
  void experts_linear(Tensor& out, const Tensor& in, const Parameter& weight, const ops::ExpertRows& rows) const;
  // dx rows of e = dy rows of e @ weight[e]; grad[e] += dy^T x over e's rows (= for the step's first).
  void experts_linear_backward(Tensor& dx, const Tensor& dy, const Tensor& x, Parameter& weight,
                               const ops::ExpertRows& rows) const;
  Tensor activation(const Tensor& fc1_out) const;
  bool swiglu_;
  bool grouped_gemm_;
  bool recompute_act_;  // --recompute-modules moe_act
  Parameter* fc1_;
  Parameter* fc2_;
};

}  // namespace megatron::moe
