// A Megatron launch script's implementation choices (--use-flash-attn, --transformer-impl, the
// fusion switches, ...) run through the `megatron train` command: the log names each one once,
// and the run's losses are the plain run's, bit for bit. --deterministic-mode's environment and
// --profile's backend too; --decoupled-lr reaching the optimizer.
#include <gtest/gtest.h>

#include <cstdlib>
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
  const megatron::testing::RunResult scripted =
      run_megatron(std::string(kLlamaRun) + "--metrics-file " + (dir / "scripted.jsonl") +
                   " --use-mcore-models --transformer-impl local --use-flash-attn --no-masked-softmax-fusion "
                   "--no-gradient-accumulation-fusion --attention-softmax-in-fp32 --no-position-embedding");
  ASSERT_EQ(scripted.exit_code, 0) << scripted.output;

  for (const char* flag :
       {"--use-mcore-models:", "--transformer-impl local:", "--use-flash-attn:", "--no-masked-softmax-fusion:",
        "--no-gradient-accumulation-fusion:", "--attention-softmax-in-fp32:", "--no-position-embedding:"})
    EXPECT_EQ(count(scripted.output, std::string("> ") + flag + " Megatron's implementation choice, no effect: "), 1)
        << flag << "\n"
        << scripted.output;
  EXPECT_EQ(count(plain.output, "Megatron's implementation choice"), 0) << plain.output;

  const std::vector<double> expected = losses(dir / "plain.jsonl");
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_EQ(losses(dir / "scripted.jsonl"), expected);
}

// Megatron's flags that choose what is computed reach the run through the command: the default
// --optimizer adam and the new implementation rows change no loss; --init-method-xavier-uniform
// (the init), --rotary-seq-len-interpolation-factor (RoPE) and --apply-wd-to-qk-layernorm (the
// optimizer's decay of the q/k norms, beside --qk-layernorm) each change the losses.
TEST(MegatronScriptFlags, ModelAndOptimizerFlagsReachTheRun) {
  const TempDir dir;
  const auto run = [&](const std::string& name, const std::string& flags) {
    const megatron::testing::RunResult result = run_megatron(
        std::string(kLlamaRun) + "--qk-layernorm " + "--weight-decay 0.1 --metrics-file " + (dir / name) + flags);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return losses(dir / name);
  };
  const std::vector<double> plain = run("plain.jsonl", "");
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(run("adam.jsonl", " --optimizer adam --openai-gelu --use-dist-ckpt --num-dataset-builder-threads 4"),
            plain);
  const std::pair<const char*, const char*> changing[] = {
      {"xavier.jsonl", " --init-method-xavier-uniform"},
      {"interpolated.jsonl", " --rotary-seq-len-interpolation-factor 2"},
      {"decayed.jsonl", " --apply-wd-to-qk-layernorm"}};
  for (const auto& [name, flags] : changing) {
    const std::vector<double> changed = run(name, flags);
    EXPECT_EQ(changed.size(), 3u) << flags;
    EXPECT_NE(changed, plain) << flags;
  }
}

// --deterministic-mode through the command: the program sets NCCL_ALGO=Ring (the log says so), the
// CPU run's losses are the plain run's bit for bit (the CPU ops always sum in a fixed order), and a
// launcher's NCCL_ALGO=Tree stops the run before it starts, naming the variable and the fix.
TEST(MegatronScriptFlags, DeterministicModeSetsRingAndRefusesTree) {
  const TempDir dir;
  const char* saved = std::getenv("NCCL_ALGO");
  const std::string restore = saved ? saved : "";
  unsetenv("NCCL_ALGO");
  const megatron::testing::RunResult plain =
      run_megatron(std::string(kLlamaRun) + "--metrics-file " + (dir / "plain.jsonl"));
  const megatron::testing::RunResult deterministic = run_megatron(
      std::string(kLlamaRun) + "--metrics-file " + (dir / "deterministic.jsonl") + " --deterministic-mode");
  setenv("NCCL_ALGO", "Tree", 1);
  const megatron::testing::RunResult tree = run_megatron(std::string(kLlamaRun) + "--deterministic-mode");
  if (saved) {
    setenv("NCCL_ALGO", restore.c_str(), 1);
  } else {
    unsetenv("NCCL_ALGO");
  }
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(deterministic.exit_code, 0) << deterministic.output;
  EXPECT_EQ(count(deterministic.output,
                  "> deterministic mode: the embedding and attention backwards sum in a fixed "
                  "order, NCCL_ALGO=Ring"),
            1)
      << deterministic.output;
  const std::vector<double> expected = losses(dir / "plain.jsonl");
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_EQ(losses(dir / "deterministic.jsonl"), expected);
  EXPECT_NE(tree.exit_code, 0) << tree.output;
  EXPECT_EQ(count(tree.output, "NCCL_ALGO=Tree beside --deterministic-mode"), 1) << tree.output;
  EXPECT_EQ(count(tree.output, "building GPT model"), 0) << "the run started: " << tree.output;
}

// --profile drives the CUDA profiler for nsys: on the CPU the command refuses it before the run
// starts, naming what works on both backends.
TEST(MegatronScriptFlags, ProfileIsRefusedOnTheCpu) {
  const megatron::testing::RunResult r = run_megatron(std::string(kLlamaRun) + "--profile");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "--profile starts and stops the CUDA profiler (for nsys), and this run is on the CPU"), 1)
      << r.output;
  EXPECT_EQ(count(r.output, "building GPT model"), 0) << "the run started: " << r.output;
}

// --decoupled-lr through the command: at --lr's own value (and --min-lr's end, the default) the
// run is the plain run bit for bit; at another value the first loss, taken before any update, is
// the same and the later ones move (the embedding and output layer stepped at their own rate).
TEST(MegatronScriptFlags, DecoupledLrReachesTheEmbeddingAndOutputLayer) {
  const TempDir dir;
  const auto run = [&](const std::string& name, const std::string& flags) {
    const megatron::testing::RunResult r =
        run_megatron(std::string(kLlamaRun) + "--metrics-file " + (dir / name) + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return losses(dir / name);
  };
  const std::vector<double> plain = run("plain.jsonl", "");
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(run("same.jsonl", "--decoupled-lr 1e-3"), plain);
  const std::vector<double> decoupled = run("decoupled.jsonl", "--decoupled-lr 1e-2 --decoupled-min-lr 1e-4");
  ASSERT_EQ(decoupled.size(), 3u);
  EXPECT_EQ(decoupled[0], plain[0]);
  EXPECT_NE(decoupled[1], plain[1]);
  EXPECT_NE(decoupled[2], plain[2]);
}
