#pragma once
// Autoregressive sampling from a GPTModel: greedy, temperature and top-k.
// The prompt runs once, then each step runs the model on the new token alone, attending to the
// keys and values of the earlier ones (transformer/kv_cache.h). Past seq_length tokens the model
// sees the last seq_length, as in training: each step then re-runs those (the cache cannot drop
// its first position without moving every RoPE angle).
//
// Under tensor parallelism every rank of the model's TP group calls generate_tokens with the same
// prompt, parameters and rng state. Each step gathers the last position's logits over TP (the
// output layer is vocab-parallel; GPTModel::last_position_logits), every rank samples from the
// same row with its own rng (so the rngs advance alike), and TP rank 0's token is broadcast, so
// every rank continues from the same sequence even if a rank's arithmetic ever differed.
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

// Picks the next token from one row of logits. Logits are read as double, so an f64 model's
// greedy choice is made on its exact values.
int32_t sample_token(const std::vector<double>& logits, const SamplingParams& params, HostRng& rng);

// The last position's logits of `tokens` over the whole padded vocabulary, on the host: one
// forward pass of the model (under TP, every rank of the TP group calls it).
std::vector<double> next_token_logits(GPTModel& model, const std::vector<int32_t>& tokens);

// Appends up to max_new_tokens tokens to prompt; stops early at stop_token (>= 0).
std::vector<int32_t> generate_tokens(GPTModel& model, std::vector<int32_t> prompt, int64_t max_new_tokens,
                                     const SamplingParams& params, int32_t stop_token, HostRng& rng);

}  // namespace megatron
