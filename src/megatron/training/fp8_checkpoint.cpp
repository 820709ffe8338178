#include "megatron/training/fp8_checkpoint.h"

#include <algorithm>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "megatron/core/error.h"
#include "megatron/core/logging.h"

namespace megatron {

namespace {
using checkpointing::CheckpointReader;
using checkpointing::ShardedTensor;
using tensor_parallel::Fp8Linear;

constexpr std::string_view kExtraState = "._extra_state.";
constexpr std::string_view kScaleFwd = "scale_fwd";

std::string entry(const std::string& layer, std::string_view field) {
  return layer + std::string(kExtraState) + std::string(field);
}

bool delayed(const Fp8Linear& layer) { return layer.recipe().scaling == ops::Fp8Scaling::delayed; }

// The whole saved tensor, as f32 on the host.
Tensor read_whole(const CheckpointReader& reader, const std::string& name) {
  MEGATRON_CHECK(reader.has(name), "checkpoint " << reader.directory() << " holds part of an FP8 layer's recipe state "
                                                 << "but not " << name << "; it is damaged: resume from another "
                                                 << "checkpoint (--ckpt-step N)");
  Tensor t = Tensor::empty(reader.info(name).global_shape, DType::f32);
  reader.load(name, Shape(size_t(t.ndim()), 0), t);
  return t;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Why a run leaves saved FP8 state of layers it holds unused, for the log.
std::string why_unused(const Fp8Config& fp8) {
  if (!fp8.enabled()) return "it trains without FP8, no --fp8-format";
  if (fp8.fp8_recipe != "delayed") return "--fp8-recipe " + fp8.fp8_recipe + ", which keeps no state between steps";
  return "they are bf16 layers here, --first-last-layers-bf16";
}
}  // namespace

std::vector<ShardedTensor> fp8_recipe_state(const std::vector<Fp8Linear*>& layers, Optimizer::StateCopies copies,
                                            const ParallelContext& ctx) {
  const bool one_replica = copies == Optimizer::StateCopies::one_replica;
  const bool writes = !one_replica || (ctx.tp_rank() == 0 && ctx.dp_cp->rank() == 0);
  std::vector<ShardedTensor> out;
  for (Fp8Linear* layer : layers) {
    if (!delayed(*layer)) continue;
    if (one_replica) layer->reduce_amaxes();  // every rank of the groups: the saved row 0 is theirs too
    if (!writes) continue;
    const Fp8Linear::RecipeState s = layer->recipe_state();
    const std::pair<std::string_view, const Tensor*> fields[] = {{kScaleFwd, &s.scale_fwd},
                                                                 {"amax_history_fwd", &s.amax_history_fwd},
                                                                 {"scale_bwd", &s.scale_bwd},
                                                                 {"amax_history_bwd", &s.amax_history_bwd}};
    for (const auto& [field, t] : fields)
      out.push_back({entry(layer->name(), field), t->shape(), Shape(size_t(t->ndim()), 0), *t});
  }
  return out;
}

void load_fp8_recipe_state(const CheckpointReader& reader, const std::vector<Fp8Linear*>& layers, const Fp8Config& fp8,
                           const ParameterRegistry& registry, Device device) {
  const std::string& dir = reader.directory();
  std::vector<std::string> fresh;
  std::set<std::string> loaded;
  int64_t saved_length = 0, run_length = 0;  // of a history whose length differs, if any
  for (Fp8Linear* layer : layers) {
    if (!delayed(*layer)) continue;
    const std::string& name = layer->name();
    if (!reader.has(entry(name, kScaleFwd))) {
      fresh.push_back(name);
      continue;
    }
    const Fp8Linear::RecipeState state{
        read_whole(reader, entry(name, kScaleFwd)), read_whole(reader, entry(name, "amax_history_fwd")),
        read_whole(reader, entry(name, "scale_bwd")), read_whole(reader, entry(name, "amax_history_bwd"))};
    layer->load_recipe_state(state, device);
    loaded.insert(name);
    if (state.amax_history_fwd.dim(0) != layer->recipe().amax_history_len) {
      saved_length = state.amax_history_fwd.dim(0);
      run_length = layer->recipe().amax_history_len;
    }
  }
  if (!fresh.empty() && loaded.empty())
    LOG_INFO("checkpoint " << dir << " holds no FP8 recipe state (saved without --fp8-recipe delayed): the delayed "
                           << "scaling of " << fresh.size() << " FP8 linear layers starts afresh, scale 1 and an "
                           << "empty amax history, as in a new run");
  else if (!fresh.empty())
    LOG_WARN("checkpoint " << dir << " holds no FP8 recipe state for " << joined(fresh)
                           << " (bf16 layers of the run that saved it): their delayed scaling starts afresh, scale 1 "
                           << "and an empty amax history");
  if (saved_length != 0)
    LOG_WARN("checkpoint " << dir << " holds FP8 amax histories of " << saved_length << " steps and this run has "
                           << "--fp8-amax-history-len " << run_length
                           << ": as Transformer Engine, each history keeps its first "
                           << std::min(saved_length, run_length) << " rows"
                           << (run_length > saved_length ? " and gains zero rows" : "")
                           << "; pass --fp8-amax-history-len " << saved_length
                           << " to resume with the saved histories whole");

  // Saved state of layers this rank holds (their weights are its parameters) but runs otherwise.
  std::vector<std::string> unused;
  const std::string suffix = entry("", kScaleFwd);
  for (const std::string& name : reader.names()) {
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string layer = name.substr(0, name.size() - suffix.size());
    if (!loaded.contains(layer) && registry.find(layer + ".weight") != nullptr) unused.push_back(layer);
  }
  if (!unused.empty())
    LOG_INFO("checkpoint " << dir << " holds the delayed FP8 recipe state of " << unused.size()
                           << " linear layers this run does not scale with delayed FP8 (" << why_unused(fp8)
                           << "): it is not loaded, as Megatron leaves it unused");
}

}  // namespace megatron
