#pragma once
// An independent float64 forward of a LLaMA-family causal language model (LLaMA, Mistral, Qwen2,
// Qwen3, Mixtral, Qwen2-MoE, Qwen3-MoE)
// from its Hugging Face directory: config.json and the tensors by their Hugging Face names, naive
// loops written from transformers' modeling code, sharing nothing with the model under test. The
// logits of a family whose checkpoints cannot be made here (transformers needs the GPU machine's
// Python) come from it; on the Qwen2 fixture it reproduces transformers' own reference logits,
// which checks it.
//   per layer: h = x + o_proj(attention(rope(q_norm(q)), rope(k_norm(k)), v)) with q, k, v the
//   projections (with their biases, where present) of rmsnorm(x); q_norm/k_norm (Qwen3) normalise
//   each head over head_dim; RoPE rotates halves; GQA shares key/value head n / (heads / kv_heads);
//   a sliding_window W (Mistral, Mixtral) lets a query see itself and the W - 1 keys before it;
//   then h + down(silu(gate(rmsnorm(h))) * up(rmsnorm(h))), or for a sparse MoE block (Mixtral's
//   block_sparse_moe, Qwen3-MoE's mlp with a router `gate`) the sum over the top
//   num_experts_per_tok experts of a softmax over the router's logits, renormalised (Mixtral;
//   Qwen-MoE with norm_topk_prob), times each expert's down(silu(gate y) * up y) (Mixtral's w2,
//   w1, w3), plus Qwen2-MoE's shared expert of the same form scaled by sigmoid(shared_expert_gate
//   y). Then the final norm and lm_head (the embedding when tied).
#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hf/hf_test_util.h"
#include "megatron/checkpointing/checkpoint.h"
#include "megatron/hf_bridge/hf_weights.h"

namespace megatron::testing {

class LlamaFamilyOracle {
 public:
  explicit LlamaFamilyOracle(const std::string& hf_dir)
      : weights_(hf_bridge::HfWeights::open(hf_dir)),
        config_(nlohmann::json::parse(checkpointing::read_file(hf_dir + "/config.json"))) {
    H_ = config_.at("hidden_size").get<int64_t>();
    heads_ = config_.at("num_attention_heads").get<int64_t>();
    kv_heads_ = config_.at("num_key_value_heads").get<int64_t>();
    d_ = config_.value("head_dim", nlohmann::json()).is_number() ? config_.at("head_dim").get<int64_t>() : H_ / heads_;
    layers_ = config_.at("num_hidden_layers").get<int64_t>();
    V_ = config_.at("vocab_size").get<int64_t>();
    eps_ = config_.at("rms_norm_eps").get<double>();
    theta_ = config_.at("rope_parameters").at("rope_theta").get<double>();
    tied_ = config_.value("tie_word_embeddings", false);
    if (config_.contains("sliding_window") && config_["sliding_window"].is_number_integer())
      window_ = config_["sliding_window"].get<int64_t>();
    top_k_ = config_.value("num_experts_per_tok", int64_t(0));
    renormalise_ = config_.at("model_type") == "mixtral" || config_.value("norm_topk_prob", false);
  }
  // Skip the q/k norms even where the checkpoint has them (a control: they must matter).
  void ignore_qk_norms() { qk_norms_ = false; }
  // Renormalise the top k routing probabilities or not, whatever the config says (a control).
  void renormalise_top_k(bool renormalise) { renormalise_ = renormalise; }

  // Logits (T,V) of one prompt.
  std::vector<std::vector<double>> logits(const std::vector<int64_t>& ids) const {
    const int64_t T = int64_t(ids.size());
    const Matrix embed = load("model.embed_tokens.weight");
    Matrix x(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) x[size_t(t)] = embed[size_t(ids[size_t(t)])];
    for (int64_t l = 0; l < layers_; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const Matrix h = rmsnorm_rows(x, load(p + "input_layernorm.weight")[0]);
      Matrix q = linear(h, p + "self_attn.q_proj"), k = linear(h, p + "self_attn.k_proj");
      const Matrix v = linear(h, p + "self_attn.v_proj");
      const bool normed = qk_norms_ && weights_.has(p + "self_attn.q_norm.weight");
      if (normed) {
        normalize_heads(q, load(p + "self_attn.q_norm.weight")[0]);
        normalize_heads(k, load(p + "self_attn.k_norm.weight")[0]);
      }
      rotate(q);
      rotate(k);
      const Matrix attended = attention(q, k, v);
      const Matrix o = linear(attended, p + "self_attn.o_proj");
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < H_; ++c) x[size_t(t)][size_t(c)] += o[size_t(t)][size_t(c)];
      const Matrix h2 = rmsnorm_rows(x, load(p + "post_attention_layernorm.weight")[0]);
      const Matrix down = weights_.has(p + "block_sparse_moe.gate.weight")
                              ? sparse_moe(h2, p + "block_sparse_moe.", {"w1", "w3", "w2"})
                          : weights_.has(p + "mlp.gate.weight")
                              ? sparse_moe(h2, p + "mlp.", {"gate_proj", "up_proj", "down_proj"})
                              : swiglu(h2, p + "mlp.gate_proj", p + "mlp.up_proj", p + "mlp.down_proj");
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < H_; ++c) x[size_t(t)][size_t(c)] += down[size_t(t)][size_t(c)];
    }
    const Matrix final = rmsnorm_rows(x, load("model.norm.weight")[0]);
    const Matrix head = tied_ ? embed : load("lm_head.weight");
    return matmul_transposed(final, head);
  }

 private:
  using Matrix = std::vector<std::vector<double>>;

  // A tensor as rows of doubles (a 1-D tensor is one row).
  Matrix load(const std::string& name) const {
    const Tensor t = weights_.load(name);
    const int64_t cols = t.dim(-1), rows = t.numel() / cols;
    Matrix m(static_cast<size_t>(rows), std::vector<double>(static_cast<size_t>(cols)));
    for (int64_t i = 0; i < t.numel(); ++i) m[size_t(i / cols)][size_t(i % cols)] = t.item(i);
    return m;
  }
  static Matrix matmul_transposed(const Matrix& a, const Matrix& w) {  // a w^T
    Matrix y(a.size(), std::vector<double>(w.size(), 0.0));
    for (size_t t = 0; t < a.size(); ++t)
      for (size_t o = 0; o < w.size(); ++o)
        for (size_t i = 0; i < a[t].size(); ++i) y[t][o] += a[t][i] * w[o][i];
    return y;
  }
  Matrix linear(const Matrix& a, const std::string& module) const {
    Matrix y = matmul_transposed(a, load(module + ".weight"));
    if (weights_.has(module + ".bias")) {
      const std::vector<double> b = load(module + ".bias")[0];
      for (auto& row : y)
        for (size_t o = 0; o < row.size(); ++o) row[o] += b[o];
    }
    return y;
  }
  Matrix swiglu(const Matrix& y, const std::string& gate_proj, const std::string& up_proj,
                const std::string& down_proj) const {
    const Matrix gate = linear(y, gate_proj), up = linear(y, up_proj);
    Matrix act = gate;
    for (size_t t = 0; t < act.size(); ++t)
      for (size_t j = 0; j < act[t].size(); ++j) act[t][j] = gate[t][j] / (1.0 + std::exp(-gate[t][j])) * up[t][j];
    return linear(act, down_proj);
  }
  // `expert_proj`: the names of an expert's gate, up and down projections.
  Matrix sparse_moe(const Matrix& y, const std::string& block, const std::array<const char*, 3>& expert_proj) const {
    const Matrix logits = linear(y, block + "gate");
    Matrix out(y.size(), std::vector<double>(y[0].size(), 0.0));
    for (size_t t = 0; t < y.size(); ++t) {
      std::vector<double> p = logits[t];
      const double top = *std::max_element(p.begin(), p.end());
      double sum = 0.0;
      for (double& v : p) sum += v = std::exp(v - top);
      std::vector<size_t> order(p.size());
      for (size_t e = 0; e < p.size(); ++e) order[e] = e;
      std::partial_sort(order.begin(), order.begin() + top_k_, order.end(),
                        [&](size_t a, size_t b) { return p[a] > p[b]; });
      double chosen = 0.0;
      for (int64_t k = 0; k < top_k_; ++k) chosen += p[order[size_t(k)]] / sum;
      if (!renormalise_) chosen = 1.0;
      for (int64_t k = 0; k < top_k_; ++k) {
        const size_t e = order[size_t(k)];
        const std::string expert = block + "experts." + std::to_string(e) + ".";
        const Matrix one = swiglu({y[t]}, expert + expert_proj[0], expert + expert_proj[1], expert + expert_proj[2]);
        for (size_t c = 0; c < out[t].size(); ++c) out[t][c] += p[e] / sum / chosen * one[0][c];
      }
    }
    if (weights_.has(block + "shared_expert_gate.weight")) {
      const Matrix shared = swiglu(y, block + "shared_expert.gate_proj", block + "shared_expert.up_proj",
                                   block + "shared_expert.down_proj");
      const Matrix gate = linear(y, block + "shared_expert_gate");
      for (size_t t = 0; t < y.size(); ++t)
        for (size_t c = 0; c < out[t].size(); ++c) out[t][c] += shared[t][c] / (1.0 + std::exp(-gate[t][0]));
    }
    return out;
  }
  void rmsnorm(double* x, int64_t n, const std::vector<double>& w) const {
    double mean_square = 0.0;
    for (int64_t i = 0; i < n; ++i) mean_square += x[i] * x[i];
    const double scale = 1.0 / std::sqrt(mean_square / double(n) + eps_);
    for (int64_t i = 0; i < n; ++i) x[i] = w[size_t(i)] * (x[i] * scale);
  }
  Matrix rmsnorm_rows(const Matrix& x, const std::vector<double>& w) const {
    Matrix y = x;
    for (auto& row : y) rmsnorm(row.data(), int64_t(row.size()), w);
    return y;
  }
  void normalize_heads(Matrix& x, const std::vector<double>& w) const {
    for (auto& row : x)
      for (size_t head = 0; head < row.size() / size_t(d_); ++head) rmsnorm(row.data() + head * size_t(d_), d_, w);
  }
  // Rotate-half RoPE at positions 0..T-1: pair (i, i + d/2) turned by t / theta^(2i/d).
  void rotate(Matrix& x) const {
    for (size_t t = 0; t < x.size(); ++t)
      for (size_t head = 0; head < x[t].size() / size_t(d_); ++head) {
        double* v = x[t].data() + head * size_t(d_);
        for (int64_t i = 0; i < d_ / 2; ++i) {
          const double angle = double(t) / std::pow(theta_, double(2 * i) / double(d_));
          const double a = v[i], b = v[i + d_ / 2];
          v[i] = a * std::cos(angle) - b * std::sin(angle);
          v[i + d_ / 2] = b * std::cos(angle) + a * std::sin(angle);
        }
      }
  }
  // Causal softmax attention, scores scaled by 1/sqrt(head_dim).
  Matrix attention(const Matrix& q, const Matrix& k, const Matrix& v) const {
    const size_t T = q.size();
    Matrix out(T, std::vector<double>(size_t(heads_ * d_), 0.0));
    for (int64_t n = 0; n < heads_; ++n) {
      const int64_t g = n / (heads_ / kv_heads_);
      for (size_t t = 0; t < T; ++t) {
        std::vector<double> score(t + 1);
        double top = -INFINITY, sum = 0.0;
        const size_t first = window_ > 0 && t + 1 > size_t(window_) ? t + 1 - size_t(window_) : 0;
        for (size_t s = 0; s < first; ++s) score[s] = -INFINITY;
        for (size_t s = first; s <= t; ++s) {
          double dot = 0.0;
          for (int64_t i = 0; i < d_; ++i) dot += q[t][size_t(n * d_ + i)] * k[s][size_t(g * d_ + i)];
          score[s] = dot / std::sqrt(double(d_));
          top = std::max(top, score[s]);
        }
        for (size_t s = first; s <= t; ++s) sum += score[s] = std::exp(score[s] - top);
        for (size_t s = first; s <= t; ++s)
          for (int64_t i = 0; i < d_; ++i) out[t][size_t(n * d_ + i)] += score[s] / sum * v[s][size_t(g * d_ + i)];
      }
    }
    return out;
  }

  hf_bridge::HfWeights weights_;
  nlohmann::json config_;
  int64_t H_, heads_, kv_heads_, d_, layers_, V_;
  double eps_, theta_;
  bool tied_;
  int64_t window_ = 0;        // sliding_window; 0: none
  int64_t top_k_ = 0;         // num_experts_per_tok (Mixtral, Qwen3-MoE)
  bool renormalise_ = false;  // the top k's probabilities divided by their sum
  bool qk_norms_ = true;
};

// The oracle's logits of the prompts `input_ids` (P,T), rounded once to f32 as the fixtures' are.
inline HfReference oracle_reference(const LlamaFamilyOracle& oracle, const Tensor& input_ids) {
  const int64_t P = input_ids.dim(0), T = input_ids.dim(1);
  std::vector<float> flat;
  for (int64_t p = 0; p < P; ++p) {
    std::vector<int64_t> ids(input_ids.data<int64_t>() + p * T, input_ids.data<int64_t>() + (p + 1) * T);
    for (const auto& row : oracle.logits(ids))
      for (double x : row) flat.push_back(float(x));
  }
  const int64_t V = int64_t(flat.size()) / (P * T);
  return {input_ids, Tensor::from_vector(flat, {P, T, V})};
}

}  // namespace megatron::testing
