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

// MoE runs add the routers' losses and the extreme expert loads to the line and the file; dense
// runs show none of it.
TEST(Metrics, MoEFieldsOnlyForMoEModels) {
  IterationStats stats;
  EXPECT_EQ(format_training_log_line(stats).find("load_balancing_loss"), std::string::npos);
  stats.load_balancing_loss = 1.25;
  stats.z_loss = 0.5;
  stats.min_tokens_per_expert = 3;
  stats.max_tokens_per_expert = 40;
  const std::string line = format_training_log_line(stats);
  EXPECT_NE(
      line.find(" load_balancing_loss: 1.250000E+00 | z_loss: 5.000000E-01 | tokens per expert (min/max): 3/40 |"),
      std::string::npos)
      << line;
  const TempDir dir;
  {
    MetricsFile file(dir / "m.jsonl");
    file.write_training(stats);
  }
  std::ifstream in(dir / "m.jsonl");
  std::string text;
  std::getline(in, text);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j.at("load_balancing_loss").get<double>(), 1.25);
  EXPECT_EQ(j.at("max_tokens_per_expert").get<int64_t>(), 40);
  stats.load_balancing_name = "seq_load_balancing_loss";  // Megatron's name under seq_aux_loss
  EXPECT_NE(format_training_log_line(stats).find(" seq_load_balancing_loss: 1.250000E+00 |"), std::string::npos);
}

// --log-params-norm: Megatron's " params norm: %.3f |" after the grad norm, the unrounded value in
// the file; without the flag neither.
TEST(Metrics, ParamsNormOnlyWhenLogged) {
  IterationStats stats;
  stats.grad_norm = 1.5;
  EXPECT_EQ(format_training_log_line(stats).find("params norm"), std::string::npos);
  stats.params_norm = 123.45678;
  std::string line = format_training_log_line(stats);
  EXPECT_NE(line.find(" grad norm: 1.500 | params norm: 123.457 | number of skipped iterations:"), std::string::npos)
      << line;
  stats.num_zeros_in_grad = 4096;  // --log-num-zeros-in-grad: between the two norms, as Megatron prints it
  line = format_training_log_line(stats);
  EXPECT_NE(line.find(" grad norm: 1.500 | num zeros: 4096 | params norm: 123.457 |"), std::string::npos) << line;
  stats.num_zeros_in_grad.reset();
  const TempDir dir;
  {
    MetricsFile file(dir / "m.jsonl");
    file.write_training(stats);
    stats.params_norm.reset();
    file.write_training(stats);
  }
  std::ifstream in(dir / "m.jsonl");
  std::string with_norm, without;
  std::getline(in, with_norm);
  std::getline(in, without);
  EXPECT_EQ(nlohmann::json::parse(with_norm).at("params_norm").get<double>(), 123.45678);
  EXPECT_FALSE(nlohmann::json::parse(without).contains("params_norm"));
}
