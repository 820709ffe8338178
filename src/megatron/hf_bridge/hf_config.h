#pragma once
// config.json of a Hugging Face causal LM <-> our model flags (reference/interop-formats.md
// section 2). Import reads every field: those that shape the model become our flags (Megatron's
// names), those that do not change the computation (ids, dtype, bookkeeping) are accepted, and any
// other field, or a value we cannot build (another activation, attention bias on o_proj, a RoPE
// scaling other than Llama-3's with Megatron's constants), is an error naming the field, so
// nothing is silently ignored. Both the v4 form (rope_theta, rope_scaling) and the v5 form
// (rope_parameters) are read; export writes the v4 form, which both read.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/dtype.h"
#include "megatron/hf_bridge/hf_family.h"
#include "megatron/transformer/transformer_config.h"

namespace megatron::hf_bridge {

struct HfModelConfig {
  Family family = Family::llama;
  // Our model flags (name, value text; "true" for switches), as parse_training_args_from_flags takes.
  std::vector<std::pair<std::string, std::string>> model_flags;
  int64_t vocab_rows = 0;  // HF vocab_size: rows of the embedding and lm_head
};

// `config` is the parsed config.json; `where` names it in errors.
HfModelConfig read_hf_config(const nlohmann::json& config, const std::string& where);

struct SpecialIds {
  int64_t bos = 0, eos = 0;
};

// config.json for a model of `config` as `family`, with `vocab_rows` embedding rows stored in
// `dtype`.
nlohmann::json hf_config_json(Family family, const TransformerConfig& config, int64_t vocab_rows, DType dtype,
                              const SpecialIds& ids);
// generation_config.json: the special ids, greedy by default as transformers writes it.
nlohmann::json hf_generation_config_json(const SpecialIds& ids);

}  // namespace megatron::hf_bridge
