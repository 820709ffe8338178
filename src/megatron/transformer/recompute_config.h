#pragma once
// Activation recomputation, with Megatron-Core's TransformerConfig names and flags
// (--recompute-granularity, --recompute-method, --recompute-num-layers, --recompute-modules,
// --recompute-activations, and the deprecated --moe-layer-recompute). Plain data held by TransformerConfig::recompute;
// the block and the layer read it through the functions below, and validate_recompute reports every broken rule.
//
// full: a checkpointed group of layers keeps only its input (the residual stream) and the
//   forward's settings; backward runs the group's forward again to rebuild what its layers save,
//   then their backward. Which layers of a block (one pipeline chunk) form groups:
//     uniform: consecutive groups of --recompute-num-layers layers, every layer recomputed;
//     block:   the first --recompute-num-layers layers, each a group of its own; the rest keep
//              their activations.
// selective: parts of every layer drop what they save and rebuild it in backward
//   (--recompute-modules, Megatron's default core_attn):
//     core_attn: the attention op's output and log-sum-exp (q, k, v stay), recomputed by the
//                attention forward before the output projection's backward, which reads them;
//     mlp:       a dense MLP keeps only its input; backward recomputes fc1 and the activation;
//     moe:       an MoE layer (router, token exchange, experts, shared expert) keeps only its input
//                and its routing's statistics; backward runs its forward again, exchanges included;
//     moe_act:   the experts' activation output (fc2's input): dropped and recomputed in backward
//                from fc1's output, which the experts keep anyway.
// A recomputed forward (full, or moe) counts no expert-bias loads or routing statistics again
// (ForwardContext::recompute).
// Recomputation reruns the same kernels on the same inputs (dropout masks are counter-based), so
// gradients are bit-identical to a run without it.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace megatron {

struct RecomputeConfig {
  std::string recompute_granularity;   // "", "full" or "selective"
  bool recompute_activations = false;  // Megatron's shorthand for --recompute-granularity selective
  std::string recompute_method;        // "", "uniform" or "block" (full only)
  std::optional<int64_t> recompute_num_layers;
  std::vector<std::string> recompute_modules;  // selective only; empty: Megatron's default core_attn
  // Megatron's deprecated --moe-layer-recompute: selective, with moe beside the modules.
  bool moe_layer_recompute = false;

  bool full() const { return recompute_granularity == "full"; }
  bool selective() const {
    return recompute_granularity == "selective" || recompute_activations || moe_layer_recompute;
  }
  // Whether selective recomputation covers `module` (a --recompute-modules name).
  bool recomputes(const std::string& module) const;
};

// A run of consecutive layers of a block, [begin, end) counted from the block's first layer;
// `checkpointed`: run again in backward from the saved input (full granularity).
struct LayerSegment {
  int64_t begin = 0, end = 0;
  bool checkpointed = false;
  bool operator==(const LayerSegment&) const = default;
};

// The block of `num_layers` layers cut into segments, in order: with full granularity Megatron's
// uniform groups or block's first layers (the rest one plain segment); otherwise one plain segment.
std::vector<LayerSegment> recompute_segments(const RecomputeConfig& recompute, int64_t num_layers);

// Every rule the settings break, one message each (value, rule, fix). `layers_per_pipeline_rank`
// bounds --recompute-num-layers as Megatron does (num_layers // PP).
std::vector<std::string> validate_recompute(const RecomputeConfig& recompute, int64_t layers_per_pipeline_rank);

}  // namespace megatron
