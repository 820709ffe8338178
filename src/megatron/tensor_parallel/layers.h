#pragma once
// Megatron-Core's parallel layers. Activations are sequence-major (S,B,C). Each layer
// registers its parameters with their TP split; at TP=1 the communication is an identity.
//   ColumnParallelLinear: W (out, in) split along out (dim 0); Y_local = X W_local^T + b_local.
//   RowParallelLinear:    W (out, in) split along in (dim 1); Y = all-reduce(X_local W_local^T) + b,
//                         the bias replicated and added once, after the reduction.
//   VocabParallelEmbedding: rows of the padded vocabulary split across TP; a masked lookup of this
//                         rank's rows, summed over TP.
// With sequence parallelism (ParallelContext::sequence_parallel()) the activations entering a
// column-parallel layer and leaving a row-parallel layer or the embedding are this rank's
// sequence shard (S/TP,B,C): the column-parallel input is all-gathered along s, and the
// row-parallel / embedding output reduce-scattered along s instead of all-reduced (mappings.h).
// A column-parallel layer then saves its input shard, not the gathered input, and gathers it
// again in backward (as Megatron), so its saved activation is divided by TP too.
// Overlap of TP communication with the GEMMs:
//   - always (TP > 1, as Megatron's asynchronous dgrad communication): a column-parallel backward
//     computes dX while the SP re-gather of its input runs, then dW while dX's all-reduce (or SP
//     reduce-scatter) runs;
//   - with ParallelContext::tp_comm_overlap() (--tp-comm-overlap, needs SP): the SP all-gather before a
//     column-parallel GEMM, the reduce-scatter after a row-parallel GEMM and the all-gather of a
//     row-parallel layer's output gradient run as rings with one GEMM per sequence chunk between
//     the steps (ring_overlap.h).
// forward() fills a Saved struct with exactly what backward() needs.
#include <memory>
#include <optional>
#include <string>

#include "megatron/core/activation_memory.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter_registry.h"
#include "megatron/tensor_parallel/fp8_linear.h"

namespace megatron::tensor_parallel {

// An activation or gradient handed to an FP8 layer already cast by the kernel that produced it
// (Fp8Linear::cast_input / cast_grad_output): the (S,B,C) tensor it stands for, by shape and dtype.
struct Fp8Activation {
  Shape shape;
  DType dtype;
  Fp8Linear::Casts casts;
};

struct LinearSaved {
  Tensor input;  // (S,B,in_local), or the (S/TP,B,in) shard of a column-parallel layer under SP
  // FP8 layers whose whole input each rank's GEMM reads at once (no SP gather, no --tp-comm-overlap
  // chunks): the forward's cast of x^T, the weight-gradient GEMM's operand. Where it is defined
  // backward reads neither `input` nor a re-cast of it, so the owner may drop `input`.
  Fp8Linear::Quantized input_t;
  void count(ActivationMemory& m) const {
    m.add(input);
    m.add(input_t.codes);
  }
};

class ColumnParallelLinear {
 public:
  struct Options {
    bool bias = true;
    float init_std = 0.02f;
    int64_t partition_blocks = 1;                      // 2 for fused [gate; up]
    Parameter* shared_weight = nullptr;                // use this weight instead of registering one (tied output layer)
    std::optional<ops::Fp8Recipe> fp8 = std::nullopt;  // the GEMMs in FP8 with this recipe (fp8_linear.h)
    bool fp8_param = false;  // --fp8-param-gather: the weight held as FP8 codes (Parameter::fp8); with fp8
  };
  ColumnParallelLinear(ParameterRegistry& registry, const ParallelContext& ctx, const std::string& prefix,
                       int64_t input_size, int64_t output_size, const Options& options);
  // (S,B,in) -> (S,B,out/TP). With gelu_pre (fc1 of a GELU MLP) the GELU is fused into the GEMM:
  // returns gelu(x W^T + b) and sets *gelu_pre to x W^T + b (ops::linear_gelu_forward).
  Tensor forward(const Tensor& x, LinearSaved& saved, Tensor* gelu_pre = nullptr) const;
  // The same with x cast by its producer (a norm: ops::norm_forward_fp8), for layers where
  // takes_fp8_input(); no GELU fusion.
  Tensor forward(const Fp8Activation& x, LinearSaved& saved) const;
  // Whether forward takes an Fp8Activation: FP8 under the delayed recipe, the whole input at hand
  // (no SP gather, no --tp-comm-overlap chunks).
  bool takes_fp8_input() const { return fp8_ && fp8_->fuses_casts() && !sequence_parallel_ && !tp_comm_overlap_; }
  Tensor backward(const Tensor& dy, const LinearSaved& saved) const;  // returns dx, x's shape
  // The same with dy cast by its producer: for layers where takes_fp8_grad_output().
  Tensor backward(const Fp8Activation& dy, const LinearSaved& saved) const;
  // Whether backward takes an Fp8Activation: FP8 under the delayed recipe, no bias (its gradient
  // needs dy itself).
  bool takes_fp8_grad_output() const { return fp8_ && fp8_->fuses_casts() && bias_ == nullptr; }
  int64_t output_size_per_partition() const { return output_per_partition_; }
  // The FP8 scaling state of the GEMMs, or null when they run in bf16.
  Fp8Linear* fp8() const { return fp8_.get(); }
  Parameter* weight() const { return weight_; }  // Options::shared_weight where given

 private:
  // y (and *gelu_pre) rows = the GEMM of input rows; *input_t as LinearSaved's.
  void gemm_forward(const Tensor& input, Tensor& y, Tensor* gelu_pre, Fp8Linear::Quantized* input_t) const;
  // dy given as a tensor or as its casts (exactly one).
  Tensor backward(const Tensor* dy, const Fp8Activation* dy_cast, const LinearSaved& saved) const;
  const ParallelContext* ctx_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  int64_t output_per_partition_;
  bool sequence_parallel_;  // input is the (S/TP,B,in) sequence shard
  bool tp_comm_overlap_;    // its all-gather as a ring beside the GEMM
  // Scaling state the const forward and backward update (amaxes): held apart from the layer.
  std::unique_ptr<Fp8Linear> fp8_;
};

class RowParallelLinear {
 public:
  struct Options {
    bool bias = true;
    float init_std = 0.02f;
    std::optional<ops::Fp8Recipe> fp8 = std::nullopt;  // the GEMMs in FP8 with this recipe (fp8_linear.h)
    bool fp8_param = false;                            // as ColumnParallelLinear's
  };
  RowParallelLinear(ParameterRegistry& registry, const ParallelContext& ctx, const std::string& prefix,
                    int64_t input_size, int64_t output_size, const Options& options);
  Tensor forward(const Tensor& x, LinearSaved& saved) const;  // (S,B,in/TP) -> (S,B,out)
  // The same with x cast by its producer: for layers where takes_fp8_input().
  Tensor forward(const Fp8Activation& x, LinearSaved& saved) const;
  // Whether forward takes an Fp8Activation: FP8 under the delayed recipe, the GEMM not chunked by
  // --tp-comm-overlap.
  bool takes_fp8_input() const { return fp8_ && fp8_->fuses_casts() && !tp_comm_overlap_; }
  // Returns dx (S,B,in/TP). With gelu_pre given (fc2 of a GELU MLP, whose input was gelu(gelu_pre))
  // the GELU's backward is fused into the GEMM: returns the gradient of gelu_pre instead
  // (ops::gelu_linear_backward).
  Tensor backward(const Tensor& dy, const LinearSaved& saved, const Tensor& gelu_pre = Tensor()) const;
  Fp8Linear* fp8() const { return fp8_.get(); }  // null when the GEMMs run in bf16

 private:
  // x given as a tensor or as its casts (exactly one).
  Tensor forward(const Tensor* x, const Fp8Activation* x_cast, LinearSaved& saved) const;
  // (N,1) ones in like's dtype and device, N = like's rows: the bias add after the reduction.
  const Tensor& ones_column(const Tensor& like) const;
  const ParallelContext* ctx_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  bool sequence_parallel_;          // output is the (S/TP,B,out) sequence shard
  bool tp_comm_overlap_;            // the reduce-scatter (and dY's all-gather) as rings
  mutable Tensor ones_;             // cache of ones_column()
  std::unique_ptr<Fp8Linear> fp8_;  // as ColumnParallelLinear's
};

class VocabParallelEmbedding {
 public:
  // deterministic: the backward in a fixed order (ops::EmbeddingParams::deterministic).
  VocabParallelEmbedding(ParameterRegistry& registry, const ParallelContext& ctx, const std::string& name,
                         int64_t padded_vocab_size, int64_t hidden_size, float init_std, bool deterministic);
  // tokens (B,S) i32 -> (S,B,C) in the weight's dtype; (S/TP,B,C) under sequence parallelism.
  Tensor forward(const Tensor& tokens) const;
  void backward(const Tensor& dout, const Tensor& tokens) const;
  Parameter* weight() const { return weight_; }
  int64_t vocab_start() const { return vocab_start_; }  // global id of this rank's first row

 private:
  const ParallelContext* ctx_;
  Parameter* weight_;
  int64_t vocab_start_;
  bool sequence_parallel_;
  bool deterministic_;
};

}  // namespace megatron::tensor_parallel
