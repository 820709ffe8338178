#pragma once
// The tiny Hugging Face checkpoints of tests/hf/tiny/<family>/ (make_tiny_checkpoints.py) and
// their reference logits, for the bridge's tests on one rank and on several.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "megatron/checkpointing/safetensors.h"
#include "megatron/models/gpt/gpt_model.h"
#include "test_paths.h"

namespace megatron::testing {

inline const char* const kHfFamilies[] = {"llama", "mistral", "qwen2", "gpt2"};

inline std::string hf_fixture(const std::string& family) {
  return (repo_root() / "tests" / "hf" / "tiny" / family).string();
}

// The flags of `megatron train --load CKPT --finetune` with no model flags (the checkpoint's are
// taken), plus `extra`.
inline std::vector<std::string> finetune_argv(const std::string& ckpt, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {
      "--load",       ckpt, "--finetune", "--mock-data", "--micro-batch-size", "1", "--train-iters", "1",
      "--seq-length", "16", "--lr",       "1e-4"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// reference.safetensors: input_ids (P,T) i64 and logits (P,T,V) f32, computed by transformers in
// float64 and rounded once to float32.
struct HfReference {
  Tensor input_ids, logits;
};
inline HfReference hf_reference(const std::string& family) {
  const auto reader = checkpointing::SafetensorsReader::open(hf_fixture(family) + "/reference.safetensors");
  return {reader.load("input_ids"), reader.load("logits")};
}

// The largest |ours - reference| over every prompt, position and HF vocabulary column this rank's
// logits hold: the model's logits (S,B,V_local) for the prompts as a batch, columns
// [first_column, first_column + V_local) of the padded vocabulary.
inline double max_logit_error(GPTModel& model, const HfReference& ref) {
  const int64_t P = ref.input_ids.dim(0), T = ref.input_ids.dim(1), V = ref.logits.dim(2);
  Tensor tokens = Tensor::empty({P, T}, DType::i32);
  for (int64_t i = 0; i < P * T; ++i) tokens.data<int32_t>()[i] = int32_t(ref.input_ids.data<int64_t>()[i]);
  const Tensor logits = model.logits(tokens).to(Device::cpu());  // (T,P,V_local)
  const int64_t local = logits.dim(2), first = local * model.context().tp_rank();
  double worst = 0.0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t v = first; v < std::min(first + local, V); ++v) {
        const double ours = logits.item((t * P + p) * local + (v - first));
        worst = std::max(worst, std::fabs(ours - double(ref.logits.data<float>()[(p * T + t) * V + v])));
      }
  return worst;
}

// The bound on that error: float32 arithmetic through two layers of width 64 against a float64
// reference rounds to ~1e-6 of logits of size ~1-10; 1e-4 (the bound) leaves margin while
// any wrong mapping (a swapped head, a transposed weight, a missing bias) moves logits by ~0.1.
inline constexpr double kLogitTolerance = 1e-4;

}  // namespace megatron::testing
