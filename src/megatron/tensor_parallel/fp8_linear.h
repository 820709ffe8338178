#pragma once
// The GEMMs of one linear layer in FP8 (Transformer Engine's Linear under an FP8 recipe): the
// same contracts as ops::linear_forward / linear_backward (and their GELU-fused forms, run unfused
// here), with each GEMM operand quantised per tensor first (ops/fp8.h):
//   forward   y  = x W^T (+ b)           x, W in the recipe's forward dtype (e4m3)
//   backward  dx = dy W,  dW += dy^T x    dy in the backward dtype (e5m2 under hybrid), x and W as
//             db += sum_rows(dy)          in forward (the bias and its gradient stay in bf16)
// Outputs are bf16 (dW accumulates into the fp32 main grad), accumulation is FP32. The casts go
// straight into the transposed layouts Hopper's FP8 GEMMs take (W^T, x^T and dy^T beside dy:
// ops::fp8_quantize_transpose), so no GEMM copies an operand. The forward may cast x in both
// layouts from one read and hand x^T's cast to the caller to keep for the backward (Transformer
// Engine saves its FP8 input the same way): the backward then needs neither x nor its re-cast.
// A kernel that produces x or dy may write their casts itself (cast_input / cast_grad_output,
// delayed recipe only): SwiGLU's FP8 forms (ops/activation.h) feed fc2 and fc1's backward so.
//
// Scaling state: one scale, scale_inv and amax history per operand (input, weight, output
// gradient), on the layer's device, created at the first use. Under the delayed recipe a cast
// uses the scale of earlier steps and records its tensor's amax (forward casts of x and W,
// backward casts of dy; the backward's casts of x and W again use the same scale and record
// nothing, so they reproduce the forward's FP8 values), and update_scales() runs the recipe's
// update once per optimizer step (after every micro-batch's backward, so a step uses one scale
// per operand whatever the pipeline schedule). Under current scaling (tensorwise) every cast takes
// the scale of its own tensor's amax. Under blockwise scaling every cast takes one scale per block
// of its own values (ops::fp8_quantize_blockwise): x and dy in 1x128 tiles along each GEMM's
// reduction dimension, W in 128x128 blocks; the weight-gradient GEMM's x^T and dy^T are cast from
// the bf16 tensors in tiles along the token dimension (Transformer Engine's columnwise usage),
// and W^T is W's blocks transposed. Nothing is carried between steps and no amax is reduced
// (each scale is local to its block; a TP shard's blocks are the whole tensor's where shard
// boundaries fall on multiples of 128).
// An FP8 parameter (--fp8-param-gather, Parameter::fp8) comes as its codes in the forward dtype,
// cast by the distributed optimizer from the f32 masters with this layer's weight scale (the
// scale a cast in the forward would take: the delayed recipe's of earlier steps, or the current
// one of the whole weight) and its amax recorded there (distributed/fp8_params.h): the forward
// takes the codes as they are and the backward their transpose, made at the first use in the step.
// The weight is cast once per optimizer step (Transformer Engine's FP8 weight cache for
// micro-batches after the first): W for the forward and W^T for the backward, both from one read at
// the weight's first use, are kept until update_scales(), which the training loop calls once per
// step before the optimizer changes the weights; within a step neither the weights nor their scale
// change, so the kept casts are the bytes a fresh cast would give. The cost: one byte per weight
// element per layout held through the step.
// Checkpoints hold the delayed recipe's state (recipe_state(), training/fp8_checkpoint.h), so a
// resumed run casts with the scales the uninterrupted one would have; current scaling carries
// nothing from one step to the next.
// Before the delayed update the step's amaxes are max-reduced over the amax groups (the layer's
// TP group and DP x CP: Megatron's amax reduction group), so every rank of a layer's TP x DP x CP
// group casts with one scale, and a TP shard with the whole tensor's: the single rank's FP8 values.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/ops/fp8.h"
#include "megatron/parallel/comm.h"

namespace megatron::tensor_parallel {

class Fp8Linear {
 public:
  // name: the layer's module path (e.g. decoder.layers.0.mlp.linear_fc1), which names its state in
  // checkpoints. amax_groups: the communicators the delayed recipe's amaxes are max-reduced over
  // (null or single-rank ones are skipped).
  Fp8Linear(std::string name, const ops::Fp8Recipe& recipe, std::vector<std::shared_ptr<Communicator>> amax_groups);
  const std::string& name() const { return name_; }
  const ops::Fp8Recipe& recipe() const { return recipe_; }
  // One layout of a tensor cast to FP8: its codes and the scale_inv they stand for ((1), or the
  // blockwise recipe's block scales).
  struct Quantized {
    Tensor codes, scale_inv;
  };
  // A tensor cast in the layouts the GEMMs take: rows (N, features) and transposed (features, N),
  // either undefined where not made.
  struct Casts {
    Quantized rows, transposed;
  };

  // y (N,out) = x (N,in) W (out,in)^T (+ bias), as ops::linear_forward. With x_t given, x is cast
  // in both layouts from one read and *x_t takes x^T's cast, the weight-gradient GEMM's operand,
  // for linear_backward: the backward then neither re-casts x nor needs it.
  void linear_forward(Tensor& y, const Tensor& x, const Tensor& weight, const Tensor& bias, Quantized* x_t = nullptr);
  // The same with x already cast (cast_input; x.rows is read).
  void linear_forward(Tensor& y, const Casts& x, const Tensor& weight, const Tensor& bias);
  // y = gelu(pre), pre = x W^T (+ bias), as ops::linear_gelu_forward; x_t as in linear_forward.
  void linear_gelu_forward(Tensor& y, Tensor& pre, const Tensor& x, const Tensor& weight, const Tensor& bias,
                           Quantized* x_t = nullptr);
  // As ops::linear_backward: dx overwritten (skipped when undefined), dW accumulated or
  // overwritten as dweight_write says and db accumulated (each skipped when undefined). x is read
  // only for dW, and not at all when x_t (linear_forward's cast of x^T) is given.
  void linear_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                       const Tensor& weight, ops::GradWrite dweight_write, const Quantized* x_t = nullptr);
  // The same with dy already cast (cast_grad_output; the layouts the defined outputs need: rows for
  // dx, transposed for dW); no bias gradient, which needs dy itself.
  void linear_backward(Tensor& dx, Tensor& dweight, const Casts& dy, const Tensor& x, const Tensor& weight,
                       ops::GradWrite dweight_write, const Quantized* x_t);
  // As ops::gelu_linear_backward: dpre = (dy W) * gelu'(pre), dW and db as above.
  void gelu_linear_backward(Tensor& dpre, Tensor& dweight, Tensor& dbias, const Tensor& dy, const Tensor& x,
                            const Tensor& weight, const Tensor& pre, ops::GradWrite dweight_write,
                            const Quantized* x_t = nullptr);

  // Casts made by the kernel that produces the tensor (ops::swiglu_forward_fp8 and the like, which
  // never store it in bf16): the FusedCast writes an (N, features) tensor's codes q (N, features)
  // and q_t (features, N) at `scale` and max-accumulates its amax into `amax`, as
  // ops::fp8_quantize_transpose would from the tensor. Only the delayed recipe can fuse: its scale
  // is known before the tensor is (current and blockwise scaling take theirs from the tensor).
  using FusedCast = std::function<void(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& scale)>;
  bool fuses_casts() const { return recipe_.scaling == ops::Fp8Scaling::delayed; }
  // The layer's input x (rows, features) or output gradient dy cast by `cast` in both layouts,
  // recording the amax as the layer's own cast of the tensor would; the tensors on `device`.
  Casts cast_input(int64_t rows, int64_t features, Device device, const FusedCast& cast);
  Casts cast_grad_output(int64_t rows, int64_t features, Device device, const FusedCast& cast);

  // The end of an optimizer step's casts, before the weights change: drops the step's weight casts,
  // then runs the delayed recipe's update of every operand seen since the last one, after the amax
  // reduction (a collective over the amax groups: every rank of them calls it in the same order);
  // no update under current or blockwise scaling, whose scales are per cast. update_fp8_scales
  // does the same for many layers at once.
  void update_scales();
  // The first half of update_scales(): history[0] of every used operand max-reduced over the amax
  // groups (a collective, as update_scales). Idempotent until the next cast records an amax.
  void reduce_amaxes();

  // One operand's scaling state: (1), (1), (history length) f32 on the layer's device.
  using Operand = ops::Fp8TensorScaling;

  // What the delayed recipe carries from step to step, on the host, in the layout of Transformer
  // Engine's _extra_state: the forward tensors (input, weight) and the backward's (output
  // gradient), one column each (TE's order, without the output and input-gradient slots TE keeps
  // unscaled for a Linear). History row 0 is the slot the current step's casts record into (zero
  // right after an update), rows 1.. the earlier steps' amaxes in TE's rolled order, so the
  // position in the ring is implicit. scale_inv is 1 / scale, rebuilt on load. An operand not cast
  // yet has its starting state: scale 1, zero history.
  struct RecipeState {
    Tensor scale_fwd;         // (2) f32: input, weight
    Tensor amax_history_fwd;  // (history length, 2) f32
    Tensor scale_bwd;         // (1) f32: output gradient
    Tensor amax_history_bwd;  // (history length, 1) f32
  };
  RecipeState recipe_state() const;
  // Takes `state` (any history length) as this layer's, its tensors on `device`. A history of
  // another length than the recipe's is cut or extended as Transformer Engine's
  // adjust_amax_history_length does: rows [0, length) kept, zero rows appended.
  void load_recipe_state(const RecipeState& state, Device device);
  const Operand& input() const { return input_; }
  const Operand& weight() const { return weight_; }
  const Operand& grad_output() const { return grad_output_; }
  // The weight's state, for an FP8 parameter's holder (--fp8-param-gather: the distributed
  // optimizer casts the weight into its codes with this scale and records its amax here).
  Operand& weight_scaling() { return weight_; }

 private:
  friend void update_fp8_scales(const std::vector<Fp8Linear*>& layers);
  enum class Cast { record, again };  // a first cast in the step records its amax (delayed)
  enum class Layout { rows, transposed, both };
  // t cast to op's dtype, in the layouts asked for (t 2-D, or flattened to its last dimension).
  Casts quantize(Operand& op, const Tensor& t, Cast cast, Layout layout);
  Casts quantize_blockwise(const Operand& op, const Tensor& t, Layout layout) const;
  Casts fused_cast(Operand& op, int64_t rows, int64_t features, Device device, const FusedCast& cast);
  // The step's cast of `weight` in `layout` (rows or transposed); both made at the first use.
  const Quantized& weight_cast(const Tensor& weight, Layout layout);
  // c (M,N) = a (M,K) b (N,K)^T + beta c: the recipe's FP8 GEMM of two casts. The forward GEMM
  // (fprop) of a per-tensor recipe uses fast accumulation, as Transformer Engine's does; the
  // backward's keep fp32 promotion (TE's split accumulator for dgrad and wgrad).
  enum class Gemm { fprop, dgrad, wgrad };
  void gemm(Gemm which, Tensor& c, const Quantized& a, const Operand& a_op, const Quantized& b, const Operand& b_op,
            float beta) const;
  // (N,1) ones like t's rows: the bias as a rank-1 GEMM, in the activations' dtype.
  const Tensor& ones_column(const Tensor& t);
  std::string name_;
  ops::Fp8Recipe recipe_;
  std::vector<std::shared_ptr<Communicator>> amax_groups_;
  Operand input_, weight_, grad_output_;
  Casts weight_casts_;  // this step's, either layout undefined until first used
  Tensor ones_;
};

// Fp8Linear::update_scales() of every layer (all of one recipe), the amax reductions layer by
// layer, then the delayed recipe's updates of all their operands as one batched op
// (ops::fp8_update_scales): the model's end of a step, a launch or a few instead of one per operand.
void update_fp8_scales(const std::vector<Fp8Linear*>& layers);

}  // namespace megatron::tensor_parallel
