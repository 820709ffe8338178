#pragma once
// Autoregressive sampling from a GPTModel: greedy, temperature and top-k.
// Each step re-runs the model on the last seq_length tokens (no KV cache yet).
#include <cstdint>
#include <vector>

#include "megatron/core/rng.h"
#include "megatron/models/gpt/gpt_model.h"

namespace megatron {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: whole vocabulary
  int64_t vocab_size = 0;    // real tokenizer vocabulary: padded ids are never sampled
};

// Picks the next token from one row of logits.
int32_t sample_token(const std::vector<float>& logits, const SamplingParams& params, HostRng& rng);

// Appends up to max_new_tokens tokens to prompt; stops early at stop_token (>= 0).
std::vector<int32_t> generate_tokens(GPTModel& model, std::vector<int32_t> prompt, int64_t max_new_tokens,
                                     const SamplingParams& params, int32_t stop_token, HostRng& rng);

}  // namespace megatron
