#include "megatron/planning/fit_advice.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "megatron/planning/memory_plan.h"
#include "megatron/training/arguments.h"

namespace megatron::planning {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

bool is_flag(const std::string& a) { return a.rfind("--", 0) == 0; }

std::string joined(const std::vector<std::vector<std::string>>& changes) {
  std::string s;
  for (const auto& c : changes)
    for (const auto& w : c) s += (s.empty() ? "" : " ") + w;
  return s;
}
}  // namespace

std::vector<std::string> with_flags(const std::vector<std::string>& train_args,
                                    const std::vector<std::vector<std::string>>& changes) {
  std::vector<std::string> out;
  for (size_t i = 0; i < train_args.size(); ++i) {
    const std::string& a = train_args[i];
    const bool replaced = std::any_of(changes.begin(), changes.end(), [&](const std::vector<std::string>& c) {
      return a == c[0] || a.rfind(c[0] + "=", 0) == 0;
    });
    if (!replaced) {
      out.push_back(a);
      continue;
    }
    while (a.find('=') == std::string::npos && i + 1 < train_args.size() && !is_flag(train_args[i + 1])) ++i;
  }
  for (const auto& c : changes) out.insert(out.end(), c.begin(), c.end());
  return out;
}

std::string fit_advice(const std::vector<std::string>& train_args, int64_t world_size, double device_gib,
                       PlanBackend backend) {
  const TrainingArgs given = parse_training_args(train_args, world_size);
  const double limit = device_gib * kGiB;
  const double peak = plan_memory(given, backend).peak();
  std::ostringstream out;
  char line[256];
  if (peak <= limit) {
    std::snprintf(line, sizeof line, "fits: peak %.2f GiB of %.2f GiB per rank\n", peak / kGiB, device_gib);
    return line;
  }
  std::snprintf(line, sizeof line, "does not fit: peak %.2f GiB > %.2f GiB per rank. Changes that fit:\n", peak / kGiB,
                device_gib);
  out << line;
  using Change = std::vector<std::vector<std::string>>;
  const Change selective{{"--recompute-granularity", "selective"}, {"--recompute-modules", "core_attn", "mlp"}};
  const Change full{{"--recompute-granularity", "full"}, {"--recompute-method", "uniform"}, {"--recompute-num-layers", "1"}};
  // Offload moves state off a GPU (on the CPU backend it is the same memory); the distributed
  // optimizer shards over DP > 1 only; the precision-aware optimizer keeps bf16 weights' masters in
  // 2 bytes.
  std::vector<Change> memory_changes;
  if (given.model.params_dtype == DType::bf16 && !given.optimizer.use_precision_aware_optimizer)
    memory_changes.push_back({{"--use-precision-aware-optimizer"}});
  if (backend == PlanBackend::cuda) memory_changes.push_back({{"--optimizer-cpu-offload"}});
  if (given.data_parallel_size > 1) memory_changes.push_back({{"--use-distributed-optimizer"}});
  std::vector<Change> layouts;
  for (const char* tp : {"2", "4", "8"}) layouts.push_back({{"--tensor-model-parallel-size", tp}, {"--sequence-parallel"}});
  for (const char* pp : {"2", "4", "8"}) layouts.push_back({{"--pipeline-model-parallel-size", pp}});
  for (int64_t mbs = given.micro_batch_size / 2; mbs >= 1; mbs /= 2)
    layouts.push_back({{"--micro-batch-size", std::to_string(mbs)},
                       {"--global-batch-size", std::to_string(given.global_batch_size)}});
  std::vector<Change> candidates{selective, full};
  candidates.insert(candidates.end(), memory_changes.begin(), memory_changes.end());
  candidates.insert(candidates.end(), layouts.begin(), layouts.end());
  // Full recomputation with each memory change, alone and with each layout change.
  for (const Change& memory : memory_changes) {
    Change c = full;
    c.insert(c.end(), memory.begin(), memory.end());
    candidates.push_back(c);
    for (const Change& layout : layouts) {
      Change with_layout = c;
      with_layout.insert(with_layout.end(), layout.begin(), layout.end());
      candidates.push_back(with_layout);
    }
  }
  for (const Change& layout : layouts) {
    Change c = full;
    c.insert(c.end(), layout.begin(), layout.end());
    candidates.push_back(c);
  }
  std::vector<std::pair<double, std::string>> fits;
  for (const Change& change : candidates) {
    try {
      const TrainingArgs changed = parse_training_args(with_flags(train_args, change), world_size);
      const double p = plan_memory(changed, backend).peak();
      const std::string text = joined(change);
      const bool listed = std::any_of(fits.begin(), fits.end(), [&](const auto& f) { return f.second == text; });
      if (p <= limit && !listed) fits.emplace_back(p, text);
    } catch (const std::exception&) {
      // Not a valid layout for this model or world (train would refuse it): not advice.
    }
  }
  std::sort(fits.begin(), fits.end());
  if (fits.empty())
    out << "  none of recomputation, the precision-aware optimizer, optimizer offload, the distributed optimizer, "
        << "TP/PP up to 8 or a smaller "
        << "micro-batch fits at " << world_size
        << " rank(s): launch more ranks (--plan-world-size) or a device with more memory\n";
  for (const auto& [p, change] : fits) {
    std::snprintf(line, sizeof line, "  %.2f GiB: ", p / kGiB);
    out << line << change << "\n";
  }
  return out.str();
}

}  // namespace megatron::planning
