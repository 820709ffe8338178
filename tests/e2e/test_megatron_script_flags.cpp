// A Megatron launch script's implementation choices (--use-flash-attn, --transformer-impl, the
// fusion switches, ...) run through the `megatron train` command: the log names each one once,
// and the run's losses are the plain run's, bit for bit.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "e2e/e2e_util.h"

using megatron::testing::run_megatron;
using megatron::testing::TempDir;

namespace {

const char* const kLlamaRun =
    "train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 "
    "--train-iters 3 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 100 --log-interval 1 "
    "--device cpu --position-embedding-type rope --swiglu --normalization RMSNorm --disable-bias-linear ";

// The loss of each logged iteration, as the metrics file writes it.
std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.value("kind", "") == "train") out.push_back(record.at("lm_loss").get<double>());
  }
  return out;
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(MegatronScriptFlags, ImplementationChoicesAreNamedAndChangeNoLoss) {
  const TempDir dir;
  const megatron::testing::RunResult plain =
      run_megatron(std::string(kLlamaRun) + "--metrics-file " + (dir / "plain.jsonl"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const megatron::testing::RunResult scripted = run_megatron(
      std::string(kLlamaRun) + "--metrics-file " + (dir / "scripted.jsonl") +
      " --use-mcore-models --transformer-impl local --use-flash-attn --no-masked-softmax-fusion "
      "--no-gradient-accumulation-fusion --attention-softmax-in-fp32 --no-position-embedding");
  ASSERT_EQ(scripted.exit_code, 0) << scripted.output;

  for (const char* flag : {"--use-mcore-models:", "--transformer-impl local:", "--use-flash-attn:",
                           "--no-masked-softmax-fusion:", "--no-gradient-accumulation-fusion:",
                           "--attention-softmax-in-fp32:", "--no-position-embedding:"})
    EXPECT_EQ(count(scripted.output, std::string("> ") + flag + " Megatron's implementation choice, no effect: "), 1)
        << flag << "\n"
        << scripted.output;
  EXPECT_EQ(count(plain.output, "Megatron's implementation choice"), 0) << plain.output;

  const std::vector<double> expected = losses(dir / "plain.jsonl");
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_EQ(losses(dir / "scripted.jsonl"), expected);
}
