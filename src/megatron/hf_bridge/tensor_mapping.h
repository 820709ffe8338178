#pragma once
// Which Hugging Face tensors make each of our parameters, and how, for the families we bridge
// (reference/interop-formats.md sections 3 and 4). Each layout is written once, as row moves
// between the HF tensors and ours; import applies them one way and export the other, so an
// import followed by an export gives back every HF tensor bit for bit (any dtype: only bytes move).
//
//   same         one HF tensor with our shape (Linear weights [out, in], norms, biases)
//   conv1d       one GPT-2 Conv1D weight [in, out]: ours is its transpose
//   vocab_rows   embeddings and lm_head: HF's vocab_size rows, then our padding rows (zeros)
//   stacked      HF tensors stacked along rows: SwiGLU's fused [gate; up]
//   qkv          q_proj, k_proj, v_proj (weights or biases) into Megatron's per-query-group
//                layout: for each group its r = heads/groups query heads, one key and one value
//                head (ops::qkv_head, the one definition of that layout)
//   packed_qkv   GPT-2's c_attn, [Q; K; V] in one tensor (a Conv1D weight or a bias), into the
//                same per-group layout
// HF's RoPE rotates halves (rotate_half), as Megatron does without --rotary-interleaved, so q
// and k rows need no permutation.
#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/hf_bridge/hf_family.h"
#include "megatron/transformer/transformer_config.h"

namespace megatron::hf_bridge {

// experts: our (E, rows, cols) expert tensor is the HF tensors (rows / n each: for fc1 [w1, w3] of
// each expert in turn, for fc2 each expert's w2) one after another, as `stacked` over E x rows.
enum class Layout { same, conv1d, vocab_rows, stacked, qkv, packed_qkv, experts };

struct TensorRule {
  std::string ours;             // our global parameter name
  std::vector<std::string> hf;  // the HF tensors it is made of, in the layout's order
  Layout layout = Layout::same;
};

// The rule of every parameter of a model of `family` with `config`. `hf_prefix` is prepended
// to every HF name ("model." is already part of the Llama names; GPT-2 files hold "transformer."
// or nothing).
std::vector<TensorRule> tensor_rules(Family family, const TransformerConfig& config, const std::string& hf_prefix);

// HF tensor names that may lie in a checkpoint without being a parameter (buffers transformers
// saved in some versions): skipped on import.
bool ignorable_hf_tensor(Family family, const std::string& name);

// The shapes of the rule's HF tensors for our parameter of shape `ours` (global), with
// `hf_vocab_rows` the HF vocab_size (vocab_rows layout).
std::vector<Shape> hf_shapes(const TensorRule& rule, const Shape& ours, const TransformerConfig& config,
                             int64_t hf_vocab_rows);

// Import: our global tensor of shape `ours` (padding rows zero) from the rule's HF tensors (their
// shapes hf_shapes(...), one dtype).
Tensor to_ours(const TensorRule& rule, const std::vector<Tensor>& hf, const Shape& ours,
               const TransformerConfig& config, int64_t hf_vocab_rows);

// Export: the rule's HF tensors from our global tensor.
std::vector<Tensor> to_hf(const TensorRule& rule, const Tensor& ours, const TransformerConfig& config,
                          int64_t hf_vocab_rows);

}  // namespace megatron::hf_bridge
