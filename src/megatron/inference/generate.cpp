#include "megatron/inference/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace megatron {

int32_t sample_token(const std::vector<double>& logits, const SamplingParams& params, HostRng& rng) {
  const int64_t V =
      params.vocab_size > 0 ? std::min<int64_t>(params.vocab_size, int64_t(logits.size())) : int64_t(logits.size());
  MEGATRON_CHECK(V > 0, "no logits to sample from");
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  if (params.temperature <= 0.0f)
    return *std::max_element(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] < logits[b]; });
  const int64_t k = params.top_k > 0 ? std::min(params.top_k, V) : V;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  // Softmax over the k best at this temperature, then inverse-CDF sampling.
  const double top = logits[size_t(order[0])];
  std::vector<double> p(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i)
    total += p[size_t(i)] = std::exp((logits[size_t(order[size_t(i)])] - top) / params.temperature);
  double u = rng.uniform() * total;
  for (int64_t i = 0; i < k; ++i) {
    u -= p[size_t(i)];
    if (u < 0) return order[size_t(i)];
  }
  return order[size_t(k - 1)];
}

std::vector<double> next_token_logits(GPTModel& model, const std::vector<int32_t>& tokens) {
  MEGATRON_CHECK(!tokens.empty(), "generation needs at least one prompt token");
  // The model sees at most seq_length tokens: the last ones.
  const int64_t S = std::min<int64_t>(int64_t(tokens.size()), model.config().seq_length);
  Tensor input = Tensor::empty({1, S}, DType::i32);
  std::copy(tokens.end() - S, tokens.end(), input.data<int32_t>());
  const Tensor row = model.last_position_logits(input).to(Device::cpu()).to(DType::f64);  // (1,V)
  const double* d = row.data<double>();
  return std::vector<double>(d, d + row.numel());
}

namespace {
// The logits after `tokens`, from the cache where it holds all but the newest: the prompt fills it,
// then each step adds one token; a sequence longer than seq_length runs its last seq_length
// tokens from an empty cache.
std::vector<double> cached_next_token_logits(GPTModel& model, const std::vector<int32_t>& tokens, KvCache& cache) {
  MEGATRON_CHECK(!tokens.empty(), "generation needs at least one prompt token");
  const int64_t window = model.config().seq_length;
  if (int64_t(tokens.size()) > window) {
    cache = KvCache(window);
    return next_token_logits(model, tokens);
  }
  const int64_t fresh = int64_t(tokens.size()) - cache.length;
  Tensor input = Tensor::empty({1, fresh}, DType::i32);
  std::copy(tokens.end() - fresh, tokens.end(), input.data<int32_t>());
  const Tensor row = model.next_logits(input, cache).to(Device::cpu()).to(DType::f64);  // (1,V)
  const double* d = row.data<double>();
  return std::vector<double>(d, d + row.numel());
}
}  // namespace

std::vector<int32_t> generate_tokens(GPTModel& model, std::vector<int32_t> tokens, int64_t max_new_tokens,
                                     const SamplingParams& params, int32_t stop_token, HostRng& rng) {
  Communicator& tp = *model.context().tp;
  KvCache cache(model.config().seq_length);
  for (int64_t n = 0; n < max_new_tokens; ++n) {
    int32_t next = sample_token(cached_next_token_logits(model, tokens, cache), params, rng);
    if (tp.size() > 1) {
      Tensor chosen = Tensor::empty({1}, DType::i32);
      chosen.data<int32_t>()[0] = next;
      chosen = chosen.to(model.device());
      tp.broadcast(chosen, 0);
      next = int32_t(chosen.item(0));
    }
    tokens.push_back(next);
    if (next == stop_token) break;
  }
  return tokens;
}

}  // namespace megatron
