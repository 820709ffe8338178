#pragma once
// The tiny Hugging Face checkpoints of tests/hf/tiny/<family>/ (make_tiny_checkpoints.py) and
// their reference logits, for the bridge's tests on one rank and on several.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/checkpointing/safetensors.h"
#include "megatron/hf_bridge/hf_weights.h"
#include "megatron/models/gpt/gpt_model.h"
#include "test_paths.h"
#include "test_util.h"

namespace megatron::testing {

inline const char* const kHfFamilies[] = {"llama",   "mistral",   "qwen2",     "qwen3",
                                          "mixtral", "qwen2_moe", "qwen3_moe", "gpt2"};

// The flags a run at TP > 1 adds for a family: Megatron's rule for MoE layers under TP, each rank
// routing its own tokens (sequence parallelism).
inline std::vector<std::string> tp_run_flags(const std::string& family) {
  const bool moe = family == "mixtral" || family == "qwen2_moe" || family == "qwen3_moe";
  return moe ? std::vector<std::string>{"--sequence-parallel"} : std::vector<std::string>{};
}

inline std::string hf_fixture(const std::string& family) {
  return (repo_root() / "tests" / "hf" / "tiny" / family).string();
}

// A copy of a family's fixture, in `dir`, whose weights are `edit` of the original tensors.
inline std::string edited_fixture(const TempDir& dir, const std::string& family,
                                  const std::function<void(std::vector<checkpointing::NamedTensor>&)>& edit) {
  namespace fs = std::filesystem;
  const std::string out = dir / (family + "-edited");
  fs::create_directories(out);
  for (const auto& entry : fs::directory_iterator(hf_fixture(family)))
    if (entry.path().extension() != ".safetensors" && entry.path().filename() != "model.safetensors.index.json")
      fs::copy_file(entry.path(), fs::path(out) / entry.path().filename());
  const hf_bridge::HfWeights weights = hf_bridge::HfWeights::open(hf_fixture(family));
  std::vector<checkpointing::NamedTensor> tensors;
  for (const std::string& name : weights.names()) tensors.push_back({name, weights.load(name)});
  edit(tensors);
  checkpointing::write_safetensors(out + "/model.safetensors", tensors);
  return out;
}

// The GPT-2 fixture with vocab_size 321, which TP 2 does not divide (as GPT-2's 50257): one more
// row of the tied word embedding, of values unlike the padding's zeros. Its logits of the first
// 320 columns are the fixture's reference (a row changes only its own column; prompts use ids <
// 320).
inline std::string odd_vocabulary_gpt2(const TempDir& dir) {
  const std::string odd = edited_fixture(dir, "gpt2", [](std::vector<checkpointing::NamedTensor>& t) {
    for (auto& x : t)
      if (x.name == "transformer.wte.weight") {
        Tensor grown = Tensor::empty({x.tensor.dim(0) + 1, x.tensor.dim(1)}, x.tensor.dtype());
        std::memcpy(grown.raw(), x.tensor.raw(), x.tensor.nbytes());
        for (int64_t i = 0; i < x.tensor.dim(1); ++i) grown.data<float>()[x.tensor.numel() + i] = 0.5f + float(i);
        x.tensor = grown;
      }
  });
  nlohmann::json config = nlohmann::json::parse(checkpointing::read_file(odd + "/config.json"));
  config["vocab_size"] = 321;
  checkpointing::write_file_atomic(odd + "/config.json", config.dump());
  return odd;
}

// Weights drawn here for the checkpoints made from the fixtures: a (rows, cols) tensor of values
// scale * sin(0.7 i + 1.3 seed), of no pattern a wrong mapping would keep.
inline Tensor drawn_weight(int64_t rows, int64_t cols, double scale, int seed) {
  std::vector<float> w(size_t(rows * cols));
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(scale * std::sin(0.7 * double(i) + 1.3 * seed));
  return Tensor::from_vector(w, {rows, cols});
}

// The Qwen2 fixture's tensors made Qwen3's: no q/k/v biases, and q_norm and k_norm weights of
// values around 1 (unlike the ones they start as).
inline void make_qwen3_attention(std::vector<checkpointing::NamedTensor>& t) {
  std::erase_if(t, [](const checkpointing::NamedTensor& x) { return x.name.ends_with("_proj.bias"); });
  for (int layer = 0; layer < 2; ++layer)
    for (const char* norm : {"q_norm", "k_norm"}) {
      std::vector<float> w(16);
      for (size_t i = 0; i < w.size(); ++i) w[i] = 1.0f + 0.3f * std::sin(float(7 * i + 3 * layer + norm[0]));
      t.push_back(
          {"model.layers." + std::to_string(layer) + ".self_attn." + norm + ".weight", Tensor::from_vector(w, {16})});
    }
}

// The Qwen2 fixture's config.json made Qwen3's (head_dim written out, as Qwen3Config saves it,
// attention_bias false) with `model_type` and `architecture`.
inline nlohmann::json qwen3_config(const std::string& dir, const std::string& model_type,
                                   const std::string& architecture) {
  nlohmann::json config = nlohmann::json::parse(checkpointing::read_file(dir + "/config.json"));
  config["model_type"] = model_type;
  config["architectures"] = {architecture};
  config["head_dim"] = 16;
  config["attention_bias"] = false;
  return config;
}

// The Qwen2 fixture's layer 1 MLP replaced by a Qwen-MoE sparse block (mlp.gate and
// mlp.experts.E.{gate,up,down}_proj): 4 experts of 48, their weights drawn from seeds after `seed`.
inline void sparse_layer_1(std::vector<checkpointing::NamedTensor>& t, int seed) {
  std::erase_if(t, [](const checkpointing::NamedTensor& x) { return x.name.starts_with("model.layers.1.mlp."); });
  const std::string block = "model.layers.1.mlp.";
  t.push_back({block + "gate.weight", drawn_weight(4, 64, 0.5, seed)});
  for (int e = 0; e < 4; ++e) {
    const std::string expert = block + "experts." + std::to_string(e) + ".";
    t.push_back({expert + "gate_proj.weight", drawn_weight(48, 64, 0.3, seed + 3 * e + 1)});
    t.push_back({expert + "up_proj.weight", drawn_weight(48, 64, 0.3, seed + 3 * e + 101)});
    t.push_back({expert + "down_proj.weight", drawn_weight(64, 48, 0.3, seed + 3 * e + 201)});
  }
}

// A Qwen3 checkpoint made from the Qwen2 fixture (transformers is not at hand to make one).
inline std::string qwen3_fixture(const TempDir& dir) {
  const std::string out = edited_fixture(dir, "qwen2", make_qwen3_attention);
  checkpointing::write_file_atomic(out + "/config.json", qwen3_config(out, "qwen3", "Qwen3ForCausalLM").dump());
  return out;
}

// A Qwen3-MoE checkpoint made from the Qwen2 fixture: Qwen3's attention; layer 0 keeps its dense
// MLP (mlp_only_layers [0]), layer 1's is a sparse block of 4 experts of moe_intermediate_size 48
// (not the dense 128), 2 per token, their top-2 probabilities renormalised when `norm_topk_prob`.
inline std::string qwen3_moe_fixture(const TempDir& dir, bool norm_topk_prob) {
  const std::string out = edited_fixture(dir, "qwen2", [](std::vector<checkpointing::NamedTensor>& t) {
    make_qwen3_attention(t);
    sparse_layer_1(t, 30);
  });
  nlohmann::json config = qwen3_config(out, "qwen3_moe", "Qwen3MoeForCausalLM");
  config.update({{"num_experts", 4},
                 {"num_experts_per_tok", 2},
                 {"moe_intermediate_size", 48},
                 {"decoder_sparse_step", 1},
                 {"mlp_only_layers", {0}},
                 {"norm_topk_prob", norm_topk_prob},
                 {"router_aux_loss_coef", 0.001},
                 {"output_router_logits", false}});
  checkpointing::write_file_atomic(out + "/config.json", config.dump());
  return out;
}

// A Qwen2-MoE checkpoint made from the Qwen2 fixture (its q/k/v biases kept): layer 0 keeps its
// dense MLP (mlp_only_layers [0]), layer 1's is a sparse block of 4 experts of moe_intermediate_size
// 48, 2 per token, their top-2 probabilities not renormalised (norm_topk_prob false, the default),
// beside a shared expert of 40 scaled by sigmoid(shared_expert_gate x).
inline std::string qwen2_moe_fixture(const TempDir& dir) {
  const std::string out = edited_fixture(dir, "qwen2", [](std::vector<checkpointing::NamedTensor>& t) {
    sparse_layer_1(t, 40);
    const std::string block = "model.layers.1.mlp.";
    t.push_back({block + "shared_expert.gate_proj.weight", drawn_weight(40, 64, 0.3, 51)});
    t.push_back({block + "shared_expert.up_proj.weight", drawn_weight(40, 64, 0.3, 52)});
    t.push_back({block + "shared_expert.down_proj.weight", drawn_weight(64, 40, 0.3, 53)});
    t.push_back({block + "shared_expert_gate.weight", drawn_weight(1, 64, 0.4, 54)});
  });
  nlohmann::json config = nlohmann::json::parse(checkpointing::read_file(out + "/config.json"));
  config["model_type"] = "qwen2_moe";
  config["architectures"] = {"Qwen2MoeForCausalLM"};
  config.update({{"num_experts", 4},
                 {"num_experts_per_tok", 2},
                 {"moe_intermediate_size", 48},
                 {"shared_expert_intermediate_size", 40},
                 {"decoder_sparse_step", 1},
                 {"mlp_only_layers", {0}},
                 {"norm_topk_prob", false},
                 {"qkv_bias", true},
                 {"router_aux_loss_coef", 0.001},
                 {"output_router_logits", false}});
  checkpointing::write_file_atomic(out + "/config.json", config.dump());
  return out;
}

// A Mixtral checkpoint made from the Mistral fixture (sliding window 4, untied): each layer's MLP
// replaced by a sparse MoE block of 4 experts of the MLP's shape, 2 per token, its router's and
// experts' weights drawn (the router's large enough that the top two are seldom close), and
// Mixtral's config.json.
inline std::string mixtral_fixture(const TempDir& dir) {
  const std::string out = edited_fixture(dir, "mistral", [](std::vector<checkpointing::NamedTensor>& t) {
    std::erase_if(t, [](const checkpointing::NamedTensor& x) { return x.name.find(".mlp.") != std::string::npos; });
    for (int layer = 0; layer < 2; ++layer) {
      const std::string block = "model.layers." + std::to_string(layer) + ".block_sparse_moe.";
      t.push_back({block + "gate.weight", drawn_weight(4, 64, 0.5, 10 * layer)});
      for (int e = 0; e < 4; ++e) {
        const std::string expert = block + "experts." + std::to_string(e) + ".";
        const int seed = 10 * layer + 3 * e + 1;
        t.push_back({expert + "w1.weight", drawn_weight(128, 64, 0.1, seed)});
        t.push_back({expert + "w3.weight", drawn_weight(128, 64, 0.1, seed + 100)});
        t.push_back({expert + "w2.weight", drawn_weight(64, 128, 0.1, seed + 200)});
      }
    }
  });
  nlohmann::json config = nlohmann::json::parse(checkpointing::read_file(out + "/config.json"));
  config["model_type"] = "mixtral";
  config["architectures"] = {"MixtralForCausalLM"};
  config["num_local_experts"] = 4;
  config["num_experts_per_tok"] = 2;
  config["router_aux_loss_coef"] = 0.02;
  config["output_router_logits"] = false;
  config["router_jitter_noise"] = 0.0;
  checkpointing::write_file_atomic(out + "/config.json", config.dump());
  return out;
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

// The prompts as the model's tokens, (P,T) i32.
inline Tensor prompt_tokens(const HfReference& ref) {
  Tensor tokens = Tensor::empty({ref.input_ids.dim(0), ref.input_ids.dim(1)}, DType::i32);
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = int32_t(ref.input_ids.data<int64_t>()[i]);
  return tokens;
}

// The largest |ours - reference| over every prompt, position and HF vocabulary column of
// `logits`: (T,P,V_local) for the prompts as a batch, columns [first_column, first_column +
// V_local) of the padded vocabulary (a vocab-parallel rank's).
inline double logit_error(const Tensor& logits, int64_t first_column, const HfReference& ref) {
  const Tensor host = logits.to(Device::cpu());
  const int64_t P = ref.input_ids.dim(0), T = ref.input_ids.dim(1), V = ref.logits.dim(2), local = host.dim(2);
  double worst = 0.0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t v = first_column; v < std::min(first_column + local, V); ++v) {
        const double ours = host.item((t * P + p) * local + (v - first_column));
        worst = std::max(worst, std::fabs(ours - double(ref.logits.data<float>()[(p * T + t) * V + v])));
      }
  return worst;
}

// That error for the whole model's logits on this TP rank.
inline double max_logit_error(GPTModel& model, const HfReference& ref) {
  const Tensor logits = model.logits(prompt_tokens(ref));  // (T,P,V_local)
  return logit_error(logits, logits.dim(2) * model.context().tp_rank(), ref);
}

// The bound on that error: float32 arithmetic through two layers of width 64 against a float64
// reference rounds to ~1e-6 of logits of size ~1-10; 1e-4 (the bound) leaves margin while
// any wrong mapping (a swapped head, a transposed weight, a missing bias) moves logits by ~0.1.
inline constexpr double kLogitTolerance = 1e-4;

}  // namespace megatron::testing
