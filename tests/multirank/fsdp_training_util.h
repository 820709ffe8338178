#pragma once
// Shared by the Megatron FSDP tests on CPU ranks (multirank/test_fsdp_*.cpp): the strategy's flags
// and the model runs, tiny_tp_run's models with several micro-batches per rank.
#include <string>
#include <vector>

#include "multirank/dp_training_util.h"

namespace megatron::testing {

inline constexpr int64_t kFsdpIterations = 10;

// --use-megatron-fsdp with `strategy`, and the distributed optimizer the sharded ones run on.
inline std::vector<std::string> fsdp_flags(const std::string& strategy) {
  std::vector<std::string> f = {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy};
  if (strategy != "no_shard") f.push_back("--use-distributed-optimizer");
  return f;
}

// tiny_tp_run with 8 sequences per global batch: several micro-batches per rank at DP 2 and 4.
inline std::vector<std::string> fsdp_run(ModelStyle style, int64_t iters) {
  std::vector<std::string> argv = tiny_tp_run(style, iters);
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "--global-batch-size") argv[i + 1] = "8";
  return argv;
}

inline std::string fsdp_run_name(ModelStyle style, int dp, const std::vector<std::string>& flags) {
  std::string name = std::string(style_name(style)) + " DP " + std::to_string(dp);
  for (const std::string& f : flags) name += " " + f;
  return name;
}

}  // namespace megatron::testing
