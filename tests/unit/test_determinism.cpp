// --deterministic-mode: the flag reaches the model config, and the launcher environment it checks
// (fake environments for NCCL_ALGO, then the process's own).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "megatron/training/arguments.h"
#include "megatron/training/determinism.h"
#include "test_util.h"

using namespace megatron;

namespace {

std::vector<std::string> problems_with(const std::map<std::string, std::string>& env) {
  return deterministic_environment_problems([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// Restores one environment variable on scope exit.
class SavedEnv {
 public:
  explicit SavedEnv(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) value_ = v;
  }
  ~SavedEnv() {
    if (value_)
      setenv(name_, value_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> value_;
};

}  // namespace

TEST(DeterministicMode, TheFlagSetsTheModelConfigsSwitch) {
  const std::vector<std::string> argv = megatron::testing::words(
      "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 --lr 1e-3 "
      "--train-iters 1 --mock-data --vocab-size 128 --tokenizer-type NullTokenizer");
  EXPECT_FALSE(parse_training_args(argv).model.deterministic_mode);
  std::vector<std::string> deterministic = argv;
  deterministic.push_back("--deterministic-mode");
  const TrainingArgs args = parse_training_args(deterministic);
  EXPECT_TRUE(args.model.deterministic_mode);
  // Written back as the flag (the run's record in common.json).
  bool listed = false;
  for (const auto& [flag, value] : training_args_to_flags(args)) listed |= flag == "--deterministic-mode";
  EXPECT_TRUE(listed);
}

TEST(DeterministicMode, NcclAlgoMustSumInAFixedOrder) {
  EXPECT_TRUE(problems_with({}).empty());
  for (const std::string ok : {"Ring", "Ring, CollnetDirect", "CollnetChain", "^NVLS"})
    EXPECT_TRUE(problems_with({{"NCCL_ALGO", ok}}).empty()) << ok;
  // Tree's order can change between runs; names are matched as Megatron's check matches them.
  for (const std::string bad : {"Tree", "Ring,Tree", "ring", "", " , "}) {
    const std::vector<std::string> p = problems_with({{"NCCL_ALGO", bad}});
    ASSERT_EQ(p.size(), 1u) << bad;
    EXPECT_NE(p[0].find("NCCL_ALGO=" + bad + " beside --deterministic-mode"), std::string::npos) << p[0];
    EXPECT_NE(p[0].find("set NCCL_ALGO=Ring"), std::string::npos) << p[0];
  }
}

// The process's own environment, as pretrain checks it: unset passes (the program then sets Ring),
// Tree raises with the rule and the fix.
TEST(DeterministicMode, TheCheckReadsTheProcessEnvironment) {
  const SavedEnv saved("NCCL_ALGO");
  unsetenv("NCCL_ALGO");
  EXPECT_EQ(megatron::testing::error_of(check_deterministic_environment), "(no error)");
  setenv("NCCL_ALGO", "Tree", 1);
  const std::string error = megatron::testing::error_of(check_deterministic_environment);
  EXPECT_NE(error.find("NCCL_ALGO=Tree beside --deterministic-mode"), std::string::npos) << error;
  EXPECT_NE(error.find("set NCCL_ALGO=Ring"), std::string::npos) << error;
}
