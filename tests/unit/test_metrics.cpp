// Megatron's training log line and the JSONL metrics file.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "megatron/training/metrics.h"
#include "test_util.h"

using namespace megatron;
using megatron::testing::TempDir;

// Megatron's one decimal where it shows the figure (any GPU run), three significant digits where
// one decimal would print a CPU run's throughput as 0.0.
TEST(Metrics, ThroughputKeepsMegatronsFormatAndShowsSmallValues) {
  EXPECT_EQ(format_tflops(412.34), "412.3");
  EXPECT_EQ(format_tflops(1.0), "1.0");
  EXPECT_EQ(format_tflops(0.5234), "0.523");
  EXPECT_EQ(format_tflops(0.001234), "0.00123");
  EXPECT_EQ(format_tflops(0.01), "0.0100");
  EXPECT_EQ(format_tflops(0.0000123), "1.23e-05");
  EXPECT_EQ(format_tflops(0.0), "0.0");
  IterationStats stats;
  stats.tflops_per_gpu = 0.001234;
  EXPECT_NE(format_training_log_line(stats).find("| throughput per GPU (TFLOP/s/GPU): 0.00123 | tokens per second:"),
            std::string::npos)
      << format_training_log_line(stats);
}

TEST(Metrics, FileHoldsTheUnroundedThroughput) {
  const TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  IterationStats stats;
  stats.iteration = 3;
  stats.tflops_per_gpu = 0.0012345678901234;
  {
    MetricsFile file(path);
    file.write_training(stats);
  }
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j.at("iteration"), 3);
  EXPECT_EQ(j.at("tflops_per_gpu").get<double>(), stats.tflops_per_gpu);  // JSON keeps every bit of a double
}
