#include "megatron/transformer/recompute_config.h"

#include <algorithm>

#include "megatron/core/strings.h"

namespace megatron {

namespace {
// What --recompute-modules may name here, and Megatron's other names (refused, not built).
const std::vector<std::string> kBuiltModules = {"core_attn", "mlp", "moe", "moe_act", "layernorm"};
const std::vector<std::string> kMegatronOnlyModules = {"mla_up_proj", "shared_experts"};

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

void check_full(const RecomputeConfig& r, int64_t layers_per_pipeline_rank, std::vector<std::string>& e) {
  if (r.recompute_method.empty())
    e.push_back(
        "--recompute-granularity full needs --recompute-method uniform (every layer, in groups of "
        "--recompute-num-layers) or block (the first --recompute-num-layers layers of each pipeline stage)");
  if (!r.recompute_num_layers) {
    e.push_back(
        concat("--recompute-granularity full needs --recompute-num-layers between 1 and the layers per "
               "pipeline rank (",
               layers_per_pipeline_rank, ")"));
  } else if (*r.recompute_num_layers < 1 || *r.recompute_num_layers > layers_per_pipeline_rank) {
    e.push_back(concat("--recompute-num-layers ", *r.recompute_num_layers,
                       " must lie between 1 and the layers per pipeline rank (", layers_per_pipeline_rank,
                       ", Megatron's bound num_layers // PP); give a value in that range"));
  }
}
}  // namespace

bool RecomputeConfig::recomputes(const std::string& module) const {
  if (!selective()) return false;
  if (module == "moe" && moe_layer_recompute) return true;
  return recompute_modules.empty() ? module == "core_attn" : contains(recompute_modules, module);
}

std::vector<LayerSegment> recompute_segments(const RecomputeConfig& r, int64_t num_layers) {
  std::vector<LayerSegment> segments;
  const int64_t n = r.recompute_num_layers.value_or(0);
  int64_t next = 0;
  if (r.full() && n > 0) {
    if (r.recompute_method == "uniform") {
      for (; next < num_layers; next += n) segments.push_back({next, std::min(next + n, num_layers), true});
    } else if (r.recompute_method == "block") {
      for (; next < std::min(n, num_layers); ++next) segments.push_back({next, next + 1, true});
    }
  }
  if (next < num_layers) segments.push_back({next, num_layers, false});
  return segments;
}

std::vector<std::string> validate_recompute(const RecomputeConfig& r, int64_t layers_per_pipeline_rank) {
  std::vector<std::string> e;
  if (r.recompute_activations && r.recompute_granularity == "full")
    e.push_back(
        "--recompute-activations means --recompute-granularity selective, but --recompute-granularity is "
        "full: give one of them");
  if (r.moe_layer_recompute && r.recompute_granularity == "full")
    e.push_back(
        "--moe-layer-recompute is Megatron's deprecated spelling of --recompute-granularity selective "
        "--recompute-modules moe, but --recompute-granularity is full: give one of them");
  if (r.full()) check_full(r, layers_per_pipeline_rank, e);
  if (!r.full() && !r.recompute_method.empty())
    e.push_back(concat("--recompute-method ", r.recompute_method,
                       " applies to --recompute-granularity full only: add it, or drop --recompute-method"));
  if (!r.full() && r.recompute_num_layers)
    e.push_back(concat("--recompute-num-layers ", *r.recompute_num_layers,
                       " applies to --recompute-granularity full only: add it, or drop --recompute-num-layers"));
  if (!r.selective() && !r.recompute_modules.empty())
    e.push_back(concat("--recompute-modules ", join(r.recompute_modules, " "),
                       " applies to --recompute-granularity selective only: add it, or drop --recompute-modules"));
  for (const std::string& m : r.recompute_modules) {
    if (contains(kBuiltModules, m)) continue;
    e.push_back(concat("--recompute-modules ", m, ": ",
                       contains(kMegatronOnlyModules, m) ? "Megatron's module, not built here yet" : "unknown module",
                       "; modules built: ", join(kBuiltModules, ", ")));
  }
  return e;
}

}  // namespace megatron
