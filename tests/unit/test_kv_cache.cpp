// Generation's key/value cache (transformer/kv_cache.h, GPTModel::next_logits): a prompt run into
// the cache and then one token at a time gives the logits a full forward of the whole sequence
// gives, for GPT-2 style (learned positions) and LLaMA style (RoPE, grouped-query attention) with
// the Hugging Face families' features (sliding window, QKV bias, Llama-3 RoPE scaling). In f64
// the two differ only in the order of a few sums (the cached run's zero query rows add nothing):
// within 1e-12 of logits of size ~1.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "megatron/core/rng.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/parallel/comm.h"

using namespace megatron;

namespace {

TransformerConfig base_config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.vocab_size = 50;
  c.attention_dropout = c.hidden_dropout = 0.0f;
  c.params_dtype = DType::f64;
  return c;
}

TransformerConfig llama_with_hf_features() {
  TransformerConfig c = base_config();
  c.normalization = Normalization::RMSNorm;
  c.swiglu = true;
  c.position_embedding_type = PositionEmbeddingType::rope;
  c.group_query_attention = true;
  c.num_query_groups = 2;
  c.add_bias_linear = false;
  c.add_qkv_bias = true;
  c.untie_embeddings_and_output_weights = true;
  c.window_size_left = 3;
  c.window_size_right = 0;
  c.use_rope_scaling = true;
  c.rope_scaling_factor = 8.0f;
  return c;
}

double max_difference(const Tensor& a, const Tensor& b) {
  double worst = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::fabs(a.item(i) - b.item(i)));
  return worst;
}

void check_cached_equals_full(TransformerConfig c) {
  derive_model_fields(c, 1);
  const ParallelContext single = ParallelContext::single_process();
  GPTModel model(c, single);
  model.parameters().initialize(11);
  HostRng rng(3);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 12; ++i) tokens.push_back(int32_t(rng.uniform_int(uint64_t(c.vocab_size))));
  const auto prefix = [&](size_t begin, size_t end) {
    Tensor t = Tensor::empty({1, int64_t(end - begin)}, DType::i32);
    std::copy(tokens.begin() + int64_t(begin), tokens.begin() + int64_t(end), t.data<int32_t>());
    return t;
  };
  KvCache cache(c.seq_length);
  const size_t prompt = 5;
  Tensor cached = model.next_logits(prefix(0, prompt), cache);
  EXPECT_EQ(cache.length, int64_t(prompt));
  for (size_t end = prompt; end <= tokens.size(); ++end) {
    if (end > prompt) cached = model.next_logits(prefix(end - 1, end), cache);
    const Tensor full = model.last_position_logits(prefix(0, end));
    EXPECT_LE(max_difference(cached, full), 1e-12) << "after " << end << " tokens";
  }
}

}  // namespace

TEST(KvCache, Gpt2StyleCachedLogitsEqualFullForward) { check_cached_equals_full(base_config()); }

TEST(KvCache, LlamaStyleWithWindowBiasAndScalingCachedLogitsEqualFullForward) {
  check_cached_equals_full(llama_with_hf_features());
}

TEST(KvCache, RefusesPositionsPastItsCapacity) {
  TransformerConfig c = base_config();
  derive_model_fields(c, 1);
  const ParallelContext single = ParallelContext::single_process();
  GPTModel model(c, single);
  KvCache cache(4);
  Tensor five = Tensor::zeros({1, 5}, DType::i32);
  EXPECT_THROW(model.next_logits(five, cache), Error);
}
