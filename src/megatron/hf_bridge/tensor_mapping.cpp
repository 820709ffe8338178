#include "megatron/hf_bridge/tensor_mapping.h"

#include <cstring>

#include "megatron/core/error.h"
#include "megatron/ops/attention.h"

namespace megatron::hf_bridge {
namespace {

std::string layer(int64_t i) { return "decoder.layers." + std::to_string(i) + "."; }

void llama_rules(std::vector<TensorRule>& rules, Family family, const TransformerConfig& c, const std::string& p) {
  rules.push_back({"embedding.word_embeddings.weight", {p + "model.embed_tokens.weight"}, Layout::vocab_rows});
  std::vector<bool> moe_layers;  // empty: a dense model
  if (c.moe.enabled()) {
    std::string why;
    moe_layers = moe_layer_pattern(c.moe.moe_layer_freq, c.num_layers, &why);
    MEGATRON_CHECK(why.empty(), "--moe-layer-freq " << c.moe.moe_layer_freq << ": " << why);
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string ours = layer(i), hf = p + "model.layers." + std::to_string(i) + ".";
    const std::string attn = hf + "self_attn.";
    rules.push_back({ours + "self_attention.linear_qkv.layer_norm_weight", {hf + "input_layernorm.weight"}});
    rules.push_back({ours + "self_attention.linear_qkv.weight",
                     {attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"},
                     Layout::qkv});
    if (c.add_qkv_bias)  // Qwen2's, Qwen2-MoE's with qkv_bias
      rules.push_back({ours + "self_attention.linear_qkv.bias",
                       {attn + "q_proj.bias", attn + "k_proj.bias", attn + "v_proj.bias"},
                       Layout::qkv});
    if (family == Family::qwen3 || family == Family::qwen3_moe) {
      rules.push_back({ours + "self_attention.q_layernorm.weight", {attn + "q_norm.weight"}});
      rules.push_back({ours + "self_attention.k_layernorm.weight", {attn + "k_norm.weight"}});
    }
    rules.push_back({ours + "self_attention.linear_proj.weight", {attn + "o_proj.weight"}});
    if (!moe_layers.empty() && moe_layers[size_t(i)]) {
      // Mixtral's block_sparse_moe (w1, w3, w2) or Qwen-MoE's mlp (gate_proj, up_proj, down_proj):
      // the router `gate` and each expert's gate, up and down projections; Qwen2-MoE's shared
      // expert and its gate beside them.
      const bool mixtral = family == Family::mixtral;
      const std::string moe = hf + (mixtral ? "block_sparse_moe." : "mlp.");
      rules.push_back({ours + "pre_mlp_layernorm.weight", {hf + "post_attention_layernorm.weight"}});
      rules.push_back({ours + "mlp.router.weight", {moe + "gate.weight"}});
      std::vector<std::string> fc1, fc2;
      for (int64_t e = 0; e < c.moe.num_moe_experts; ++e) {
        const std::string expert = moe + "experts." + std::to_string(e) + ".";
        fc1.insert(fc1.end(), {expert + (mixtral ? "w1.weight" : "gate_proj.weight"),
                               expert + (mixtral ? "w3.weight" : "up_proj.weight")});
        fc2.push_back(expert + (mixtral ? "w2.weight" : "down_proj.weight"));
      }
      rules.push_back({ours + "mlp.experts.linear_fc1.weight", fc1, Layout::experts});
      rules.push_back({ours + "mlp.experts.linear_fc2.weight", fc2, Layout::experts});
      if (c.moe.moe_shared_expert_intermediate_size > 0) {
        const std::string shared = ours + "mlp.shared_experts.";
        rules.push_back({shared + "linear_fc1.weight",
                         {moe + "shared_expert.gate_proj.weight", moe + "shared_expert.up_proj.weight"},
                         Layout::stacked});
        rules.push_back({shared + "linear_fc2.weight", {moe + "shared_expert.down_proj.weight"}});
        rules.push_back({shared + "gate_weight", {moe + "shared_expert_gate.weight"}});
      }
      continue;
    }
    rules.push_back({ours + "mlp.linear_fc1.layer_norm_weight", {hf + "post_attention_layernorm.weight"}});
    rules.push_back(
        {ours + "mlp.linear_fc1.weight", {hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"}, Layout::stacked});
    rules.push_back({ours + "mlp.linear_fc2.weight", {hf + "mlp.down_proj.weight"}});
  }
  rules.push_back({"decoder.final_layernorm.weight", {p + "model.norm.weight"}});
  if (c.untie_embeddings_and_output_weights)
    rules.push_back({"output_layer.weight", {p + "lm_head.weight"}, Layout::vocab_rows});
}

void gpt2_rules(std::vector<TensorRule>& rules, const TransformerConfig& c, const std::string& p) {
  rules.push_back({"embedding.word_embeddings.weight", {p + "wte.weight"}, Layout::vocab_rows});
  rules.push_back({"embedding.position_embeddings.weight", {p + "wpe.weight"}});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string ours = layer(i), hf = p + "h." + std::to_string(i) + ".";
    for (const char* part : {"weight", "bias"}) {
      const std::string w = part;
      rules.push_back({ours + "self_attention.linear_qkv.layer_norm_" + w, {hf + "ln_1." + w}});
      rules.push_back({ours + "self_attention.linear_qkv." + w, {hf + "attn.c_attn." + w}, Layout::packed_qkv});
      const Layout linear = w == "weight" ? Layout::conv1d : Layout::same;
      rules.push_back({ours + "self_attention.linear_proj." + w, {hf + "attn.c_proj." + w}, linear});
      rules.push_back({ours + "mlp.linear_fc1.layer_norm_" + w, {hf + "ln_2." + w}});
      rules.push_back({ours + "mlp.linear_fc1." + w, {hf + "mlp.c_fc." + w}, linear});
      rules.push_back({ours + "mlp.linear_fc2." + w, {hf + "mlp.c_proj." + w}, linear});
    }
  }
  rules.push_back({"decoder.final_layernorm.weight", {p + "ln_f.weight"}});
  rules.push_back({"decoder.final_layernorm.bias", {p + "ln_f.bias"}});
}

// A move of `rows` rows (units of dim 0; elements of a 1-D tensor) between row hf_row of HF
// tensor hf_index and row our_row of ours (HF tensors as the layout sees them: Conv1D weights
// already transposed).
struct RowMove {
  size_t hf_index;
  int64_t hf_row, our_row, rows;
};

// The layout's moves, and each HF tensor's number of rows.
struct Moves {
  std::vector<RowMove> moves;
  std::vector<int64_t> hf_rows;
};

Moves row_moves(const TensorRule& rule, const Shape& ours, const TransformerConfig& c, int64_t hf_vocab_rows) {
  const int64_t rows = ours.at(0), d = c.kv_channels, G = c.num_query_groups, r = c.num_attention_heads / G;
  Moves m;
  switch (rule.layout) {
    case Layout::same:
    case Layout::conv1d:
      m.moves.push_back({0, 0, 0, rows});
      m.hf_rows = {rows};
      break;
    case Layout::vocab_rows:
      MEGATRON_CHECK(hf_vocab_rows <= rows, "the Hugging Face vocabulary of " << hf_vocab_rows << " rows exceeds our "
                                                                              << rows << " rows of " << rule.ours);
      m.moves.push_back({0, 0, 0, hf_vocab_rows});
      m.hf_rows = {hf_vocab_rows};
      break;
    case Layout::stacked:
    case Layout::experts: {  // rows: of the experts' flattened (E x rows, cols) view (row_view)
      const auto n = int64_t(rule.hf.size());
      for (int64_t i = 0; i < n; ++i) m.moves.push_back({size_t(i), 0, i * rows / n, rows / n});
      m.hf_rows.assign(size_t(n), rows / n);
      break;
    }
    case Layout::qkv:
    case Layout::packed_qkv: {
      // Offsets of the q, k and v heads: separate tensors, or one after another in one tensor.
      const bool packed = rule.layout == Layout::packed_qkv;
      const int64_t q_rows = G * r * d, kv_rows = G * d;
      const int64_t base[3] = {0, packed ? q_rows : 0, packed ? q_rows + kv_rows : 0};
      for (int64_t g = 0; g < G; ++g)
        for (int64_t t = 0; t < r + 2; ++t) {
          const ops::QkvHead head = ops::qkv_head(0, g, t, G, r);
          m.moves.push_back(
              {packed ? 0 : size_t(head.tensor), base[head.tensor] + head.separate * d, head.fused * d, d});
        }
      m.hf_rows = packed ? std::vector<int64_t>{q_rows + 2 * kv_rows} : std::vector<int64_t>{q_rows, kv_rows, kv_rows};
      break;
    }
  }
  return m;
}

// The shape the rows of a layout count: an expert tensor (E, rows, cols) as (E x rows, cols).
Shape row_view(const TensorRule& rule, const Shape& ours) {
  if (rule.layout != Layout::experts) return ours;
  MEGATRON_CHECK(ours.size() == 3, rule.ours << " is not an (experts, rows, columns) tensor");
  return {ours[0] * ours[1], ours[2]};
}

// A layout's view of an HF tensor: a Conv1D weight transposed, anything else as it is.
bool transposed(const TensorRule& rule, size_t ndim) {
  return (rule.layout == Layout::conv1d || rule.layout == Layout::packed_qkv) && ndim == 2;
}

Tensor transpose_2d(const Tensor& t) {
  const int64_t R = t.dim(0), C = t.dim(1);
  const size_t es = dtype_size(t.dtype());
  Tensor out = Tensor::empty({C, R}, t.dtype());
  const auto* src = static_cast<const uint8_t*>(t.raw());
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) std::memcpy(dst + size_t(j * R + i) * es, src + size_t(i * C + j) * es, es);
  return out;
}

// Bytes of one row (dim 0) of a tensor of `shape` and dtype `dtype`.
size_t row_bytes(const Shape& shape, DType dtype) {
  size_t n = dtype_size(dtype);
  for (size_t i = 1; i < shape.size(); ++i) n *= size_t(shape[i]);
  return n;
}

Shape with_rows(Shape shape, int64_t rows) {
  shape.at(0) = rows;
  return shape;
}

}  // namespace

std::vector<TensorRule> tensor_rules(Family family, const TransformerConfig& config, const std::string& hf_prefix) {
  std::vector<TensorRule> rules;
  if (family == Family::gpt2)
    gpt2_rules(rules, config, hf_prefix);
  else
    llama_rules(rules, family, config, hf_prefix);
  return rules;
}

bool ignorable_hf_tensor(Family family, const std::string& name) {
  const auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (family == Family::gpt2) return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
  return ends_with(".rotary_emb.inv_freq");
}

std::vector<Shape> hf_shapes(const TensorRule& rule, const Shape& ours_shape, const TransformerConfig& config,
                             int64_t hf_vocab_rows) {
  const Shape ours = row_view(rule, ours_shape);
  const Moves m = row_moves(rule, ours, config, hf_vocab_rows);
  std::vector<Shape> shapes;
  for (int64_t rows : m.hf_rows) {
    Shape s = with_rows(ours, rows);
    if (transposed(rule, s.size())) s = {s[1], s[0]};
    shapes.push_back(s);
  }
  return shapes;
}

Tensor to_ours(const TensorRule& rule, const std::vector<Tensor>& hf, const Shape& ours,
               const TransformerConfig& config, int64_t hf_vocab_rows) {
  MEGATRON_CHECK(!hf.empty() && hf.size() == rule.hf.size(),
                 "to_ours(" << rule.ours << "): expected " << rule.hf.size() << " HF tensors, got " << hf.size());
  const DType dtype = hf.front().dtype();
  std::vector<Tensor> sources;
  for (const Tensor& t : hf) sources.push_back(transposed(rule, t.shape().size()) ? transpose_2d(t) : t);
  Tensor out = Tensor::zeros(ours, dtype);  // padding rows stay zero
  const Shape rows = row_view(rule, ours);
  const size_t bytes = row_bytes(rows, dtype);
  for (const RowMove& move : row_moves(rule, rows, config, hf_vocab_rows).moves)
    std::memcpy(static_cast<uint8_t*>(out.raw()) + size_t(move.our_row) * bytes,
                static_cast<const uint8_t*>(sources[move.hf_index].raw()) + size_t(move.hf_row) * bytes,
                size_t(move.rows) * bytes);
  return out;
}

std::vector<Tensor> to_hf(const TensorRule& rule, const Tensor& ours, const TransformerConfig& config,
                          int64_t hf_vocab_rows) {
  const Shape view = row_view(rule, ours.shape());
  const Moves m = row_moves(rule, view, config, hf_vocab_rows);
  std::vector<Tensor> out;
  for (int64_t rows : m.hf_rows) out.push_back(Tensor::empty(with_rows(view, rows), ours.dtype()));
  const size_t bytes = row_bytes(view, ours.dtype());
  for (const RowMove& move : m.moves)
    std::memcpy(static_cast<uint8_t*>(out[move.hf_index].raw()) + size_t(move.hf_row) * bytes,
                static_cast<const uint8_t*>(ours.raw()) + size_t(move.our_row) * bytes, size_t(move.rows) * bytes);
  for (Tensor& t : out)
    if (transposed(rule, t.shape().size())) t = transpose_2d(t);
  return out;
}

}  // namespace megatron::hf_bridge
