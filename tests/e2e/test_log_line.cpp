// The log line of a real CPU run: its throughput reads as the metrics file's figure, not 0.0.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "e2e/e2e_util.h"
#include "megatron/training/metrics.h"

using namespace megatron;
using megatron::testing::run_megatron;
using megatron::testing::TempDir;

TEST(LogLine, CpuRunPrintsItsThroughput) {
  const TempDir dir;
  const std::string metrics = dir / "metrics.jsonl";
  const megatron::testing::RunResult run = run_megatron(
      "train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 "
      "--train-iters 3 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 100 --log-interval 1 "
      "--device cpu --metrics-file " +
      metrics);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<std::string> printed;
  const std::regex throughput(R"(throughput per GPU \(TFLOP/s/GPU\): ([^ ]+) \|)");
  for (std::sregex_iterator it(run.output.begin(), run.output.end(), throughput), end; it != end; ++it)
    printed.push_back((*it)[1]);
  ASSERT_EQ(printed.size(), 3u) << run.output;
  std::ifstream in(metrics);
  std::string line;
  for (const std::string& value : printed) {
    ASSERT_TRUE(std::getline(in, line));
    const double tflops = nlohmann::json::parse(line).at("tflops_per_gpu").get<double>();
    // A model of ~30k parameters on a CPU: far below Megatron's 0.1 resolution, yet not zero.
    EXPECT_GT(tflops, 0.0);
    EXPECT_LT(tflops, 0.05);
    EXPECT_EQ(value, format_tflops(tflops));
    EXPECT_GT(std::stod(value), 0.0) << value;
  }
}

// --timing-log-level 2 adds Megatron's forward-compute and backward-compute after
// forward-backward, in its order; the two time each micro-batch's forward and backward inside
// forward-backward, so on one rank (min = max) their sum cannot exceed it.
TEST(LogLine, TimingLevelTwoPrintsTheComputeTimersInsideForwardBackward) {
  const megatron::testing::RunResult run = run_megatron(
      "train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 "
      "--global-batch-size 8 --train-iters 4 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 100 "
      "--log-interval 2 --device cpu --timing-log-level 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::regex timer(R"(\n    ([a-z-]+) \.+: \(([0-9.]+), ([0-9.]+)\))");
  std::vector<std::string> names;
  std::map<std::string, double> ms;  // the last interval's
  for (std::sregex_iterator it(run.output.begin(), run.output.end(), timer), end; it != end; ++it) {
    names.push_back((*it)[1]);
    ms[(*it)[1]] = std::stod((*it)[3]);
    EXPECT_EQ((*it)[2], (*it)[3]) << "one rank: min = max";
  }
  const std::vector<std::string> order = {"forward-backward", "forward-compute", "backward-compute",
                                          "batch-generator",  "all-grads-sync",  "optimizer"};
  ASSERT_EQ(names.size(), 3 * order.size()) << run.output;  // after iterations 1, 2 and 4
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 6), order);
  EXPECT_GT(ms["forward-compute"], 0.0);
  EXPECT_GT(ms["backward-compute"], 0.0);
  // Printed with two decimals: allow the rounding of three values.
  EXPECT_LE(ms["forward-compute"] + ms["backward-compute"], ms["forward-backward"] + 0.015) << run.output;
}
