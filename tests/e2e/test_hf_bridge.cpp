// Hugging Face import and export on the tiny checkpoints of every family (tests/hf/tiny/, made by
// transformers): our logits match transformers' within 1e-4 in fp32, export gives back every
// tensor bit for bit, the checkpoint is written at the requested TP layout, bad input is an error
// naming the tensor or field with nothing written, and train/generate need no model flags. Beside
// the fixtures, variants transformers' fixtures do not cover (other expert widths, both top-k
// normalisations, an ungated control) are checked against an independent float64 forward
// (hf/llama_family_oracle.h) on checkpoints made from the Qwen2 and Mistral fixtures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "e2e/e2e_util.h"
#include "hf/hf_test_util.h"
#include "hf/llama_family_oracle.h"
#include "megatron/checkpointing/checkpoint.h"
#include "megatron/hf_bridge/convert.h"
#include "megatron/hf_bridge/hf_config.h"
#include "megatron/hf_bridge/hf_weights.h"
#include "megatron/hf_bridge/tensor_mapping.h"
#include "megatron/training/checkpoint_io.h"

using namespace megatron;
using namespace megatron::testing;
namespace fs = std::filesystem;

namespace {

std::string import_family(const std::string& family, const TempDir& dir, int64_t tp = 1) {
  const std::string ckpt = dir / (family + "-ckpt");
  hf_bridge::import_hf({.hf_dir = hf_fixture(family), .save = ckpt, .tensor_model_parallel_size = tp});
  return ckpt;
}

// A checkpoint's model as one rank's whole model (its parameters are the global tensors), its
// weights loaded.
struct LoadedModel {
  explicit LoadedModel(const std::string& ckpt) : args(read_checkpoint_args(ckpt)), model(args.model, single) {
    load_model_weights(ckpt, model);
  }
  TrainingArgs args;
  ParallelContext single = ParallelContext::single_process();
  GPTModel model;
};

// Whether `save` holds no checkpoint at all, not even a staging directory.
bool nothing_written(const std::string& save) {
  if (!fs::exists(save)) return true;
  return fs::is_empty(save);
}

std::string import_error(const std::string& hf_dir, const std::string& save) {
  return error_of([&] { hf_bridge::import_hf({.hf_dir = hf_dir, .save = save}); });
}

// Exports `ckpt` into `out`: every tensor of the Hugging Face directory `hf` comes back bit for
// bit, and the config.json written reads back as the same model, of `family`.
void expect_export_gives_back(const std::string& hf, const std::string& ckpt, const std::string& out,
                              hf_bridge::Family family) {
  hf_bridge::export_hf({.load = ckpt, .hf_dir = out});
  const auto original = hf_bridge::HfWeights::open(hf), exported = hf_bridge::HfWeights::open(out);
  EXPECT_EQ(exported.names(), original.names());
  for (const std::string& name : original.names()) {
    if (!exported.has(name)) continue;
    const Tensor a = original.load(name), b = exported.load(name);
    EXPECT_TRUE(a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0) << name;
  }
  const auto read = [](const std::string& path) {
    return hf_bridge::read_hf_config(nlohmann::json::parse(checkpointing::read_file(path)), path);
  };
  const hf_bridge::HfModelConfig a = read(hf + "/config.json"), b = read(out + "/config.json");
  EXPECT_EQ(b.family, family);
  EXPECT_EQ(a.model_flags, b.model_flags);
}

}  // namespace

// The float64 oracle the tests below rely on (on checkpoints made from the Qwen2 and Mistral
// fixtures: other expert widths, dense layers beside sparse ones, both top-k normalisations)
// reproduces transformers' own logits of the transformers-made fixtures (to their f32 rounding):
// its attention, RoPE, GQA, biases, sliding window, norms, q/k norms, MLP and sparse MoE blocks
// (Mixtral's, Qwen2-MoE's with its gated shared expert, Qwen3-MoE's) are transformers'.
TEST(HfBridge, TheLlamaFamilyOracleReproducesTransformers) {
  for (const char* family : {"qwen2", "mistral", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"}) {
    const HfReference ref = hf_reference(family);
    const HfReference mine = oracle_reference(LlamaFamilyOracle(hf_fixture(family)), ref.input_ids);
    ASSERT_EQ(mine.logits.shape(), ref.logits.shape());
    double worst = 0.0;
    for (int64_t i = 0; i < ref.logits.numel(); ++i)
      worst = std::max(worst, std::fabs(mine.logits.item(i) - ref.logits.item(i)));
    std::printf("%s: max |oracle - transformers| = %.3g\n", family, worst);
    EXPECT_LE(worst, 1e-5) << family;
  }
}

// Mixtral (a sparse MoE block in every layer, made from the Mistral fixture): the imported MoE
// model's logits are the oracle's; export gives back every tensor bit for bit and a config.json
// that reads back as the same model.
TEST(HfBridge, MixtralImportsItsExpertsAndExportsBitForBit) {
  TempDir dir;
  const std::string hf = mixtral_fixture(dir), ckpt = dir / "mixtral-ckpt", out = dir / "exported";
  hf_bridge::import_hf({.hf_dir = hf, .save = ckpt});
  LoadedModel m(ckpt);
  EXPECT_EQ(m.args.model.moe.num_moe_experts, 4);
  EXPECT_EQ(m.args.model.moe.moe_router_topk, 2);
  EXPECT_EQ(m.args.model.window_size_left, 3);
  const HfReference ref = oracle_reference(LlamaFamilyOracle(hf), hf_reference("mistral").input_ids);
  const double error = max_logit_error(m.model, ref);
  std::printf("mixtral: max |logit - oracle| = %.3g (bound %.0e)\n", error, kLogitTolerance);
  EXPECT_LE(error, kLogitTolerance);

  expect_export_gives_back(hf, ckpt, out, hf_bridge::Family::mixtral);
}

// Qwen3-MoE (made from the Qwen2 fixture: layer 0 dense, layer 1 a sparse block of experts
// narrower than the dense MLP), with norm_topk_prob true (Megatron's default router) and false
// (--moe-router-pre-softmax): the imported model's logits are the oracle's, and the oracle's with
// the other normalisation differ by far more than the bound; export gives back every tensor bit
// for bit and a config.json that reads back as the same model.
TEST(HfBridge, Qwen3MoeImportsItsDenseAndSparseLayersAndExportsBitForBit) {
  for (const bool norm_topk_prob : {true, false}) {
    SCOPED_TRACE(norm_topk_prob ? "norm_topk_prob true" : "norm_topk_prob false");
    TempDir dir;
    const std::string hf = qwen3_moe_fixture(dir, norm_topk_prob), ckpt = dir / "ckpt", out = dir / "exported";
    hf_bridge::import_hf({.hf_dir = hf, .save = ckpt});
    LoadedModel m(ckpt);
    const MoEConfig& moe = m.args.model.moe;
    EXPECT_TRUE(m.args.model.qk_layernorm);
    EXPECT_EQ(moe.num_moe_experts, 4);
    EXPECT_EQ(moe.moe_router_topk, 2);
    EXPECT_EQ(moe.moe_ffn_hidden_size, 48);
    EXPECT_EQ(m.args.model.ffn_hidden_size, 128);
    EXPECT_EQ(moe.moe_layer_freq, "[0,1]");
    EXPECT_EQ(moe.moe_router_pre_softmax, !norm_topk_prob);
    LlamaFamilyOracle oracle(hf);
    const Tensor prompts = hf_reference("qwen2").input_ids;
    const double error = max_logit_error(m.model, oracle_reference(oracle, prompts));
    std::printf("qwen3_moe (norm_topk_prob %d): max |logit - oracle| = %.3g (bound %.0e)\n", int(norm_topk_prob), error,
                kLogitTolerance);
    EXPECT_LE(error, kLogitTolerance);
    oracle.renormalise_top_k(!norm_topk_prob);
    EXPECT_GT(max_logit_error(m.model, oracle_reference(oracle, prompts)), 100 * kLogitTolerance);

    expect_export_gives_back(hf, ckpt, out, hf_bridge::Family::qwen3_moe);
    const nlohmann::json written = nlohmann::json::parse(checkpointing::read_file(out + "/config.json"));
    EXPECT_EQ(written["architectures"], nlohmann::json({"Qwen3MoeForCausalLM"}));
    EXPECT_EQ(written["mlp_only_layers"], nlohmann::json({0}));
    EXPECT_EQ(written["decoder_sparse_step"], 1);
    EXPECT_EQ(written["moe_intermediate_size"], 48);
    EXPECT_EQ(written["intermediate_size"], 128);
    EXPECT_EQ(written["norm_topk_prob"], norm_topk_prob);
  }
}

// Qwen2-MoE (made from the Qwen2 fixture: QKV biases, layer 0 dense, layer 1 a sparse block beside
// a gated shared expert): the imported model's logits are the oracle's, which differ from those
// of the same model without the shared expert's gate by far more than the bound; export gives
// back every tensor bit for bit and a config.json that reads back as the same model.
TEST(HfBridge, Qwen2MoeImportsItsGatedSharedExpertAndExportsBitForBit) {
  TempDir dir;
  const std::string hf = qwen2_moe_fixture(dir), ckpt = dir / "ckpt", out = dir / "exported";
  hf_bridge::import_hf({.hf_dir = hf, .save = ckpt});
  LoadedModel m(ckpt);
  const MoEConfig& moe = m.args.model.moe;
  EXPECT_TRUE(m.args.model.add_qkv_bias);
  EXPECT_EQ(moe.moe_shared_expert_intermediate_size, 40);
  EXPECT_TRUE(moe.moe_shared_expert_gate);
  EXPECT_TRUE(moe.moe_router_pre_softmax);
  EXPECT_EQ(moe.moe_layer_freq, "[0,1]");
  const Tensor prompts = hf_reference("qwen2").input_ids;
  const double error = max_logit_error(m.model, oracle_reference(LlamaFamilyOracle(hf), prompts));
  std::printf("qwen2_moe: max |logit - oracle| = %.3g (bound %.0e)\n", error, kLogitTolerance);
  EXPECT_LE(error, kLogitTolerance);
  // The control: a gate of zeros scales the shared expert by 1/2 everywhere.
  TempDir control_dir;  // edited_fixture of qwen2 writes where `hf` lies within `dir`
  const std::string ungated = edited_fixture(control_dir, "qwen2", [&](std::vector<checkpointing::NamedTensor>& t) {
    const hf_bridge::HfWeights gated = hf_bridge::HfWeights::open(hf);
    t.clear();
    for (const std::string& name : gated.names())
      t.push_back(
          {name, name.ends_with("shared_expert_gate.weight") ? Tensor::zeros({1, 64}, DType::f32) : gated.load(name)});
  });
  checkpointing::write_file_atomic(ungated + "/config.json", checkpointing::read_file(hf + "/config.json"));
  EXPECT_GT(max_logit_error(m.model, oracle_reference(LlamaFamilyOracle(ungated), prompts)), 100 * kLogitTolerance);

  expect_export_gives_back(hf, ckpt, out, hf_bridge::Family::qwen2_moe);
  const nlohmann::json written = nlohmann::json::parse(checkpointing::read_file(out + "/config.json"));
  EXPECT_EQ(written["architectures"], nlohmann::json({"Qwen2MoeForCausalLM"}));
  EXPECT_EQ(written["shared_expert_intermediate_size"], 40);
  EXPECT_EQ(written["qkv_bias"], true);
  EXPECT_EQ(written["norm_topk_prob"], false);
  EXPECT_EQ(written.count("head_dim"), 0u);
}

// Qwen3 (q_norm and k_norm: --qk-layernorm): the imported model's logits are the oracle's, which
// differ from those of the same model without the norms by far more than the bound; the flag is
// set; export gives back every tensor bit for bit, and its config.json reads back as the same model.
TEST(HfBridge, Qwen3ImportsWithItsQkNormsAndExportsBitForBit) {
  TempDir dir;
  const std::string hf = qwen3_fixture(dir), ckpt = dir / "qwen3-ckpt", out = dir / "exported";
  hf_bridge::import_hf({.hf_dir = hf, .save = ckpt});
  LoadedModel m(ckpt);
  EXPECT_TRUE(m.args.model.qk_layernorm);
  EXPECT_EQ(m.args.model.kv_channels, 16);
  LlamaFamilyOracle oracle(hf);
  const Tensor prompts = hf_reference("qwen2").input_ids;
  const double error = max_logit_error(m.model, oracle_reference(oracle, prompts));
  std::printf("qwen3: max |logit - oracle| = %.3g (bound %.0e)\n", error, kLogitTolerance);
  EXPECT_LE(error, kLogitTolerance);
  oracle.ignore_qk_norms();
  EXPECT_GT(max_logit_error(m.model, oracle_reference(oracle, prompts)), 100 * kLogitTolerance);

  expect_export_gives_back(hf, ckpt, out, hf_bridge::Family::qwen3);
  const nlohmann::json written = nlohmann::json::parse(checkpointing::read_file(out + "/config.json"));
  EXPECT_EQ(written["architectures"], nlohmann::json({"Qwen3ForCausalLM"}));
  EXPECT_EQ(written["head_dim"], 16);
  EXPECT_EQ(written["attention_bias"], false);
}

TEST(HfBridge, ImportedLogitsMatchTransformers) {
  for (const char* family : kHfFamilies) {
    TempDir dir;
    LoadedModel m(import_family(family, dir));
    const double error = max_logit_error(m.model, hf_reference(family));
    std::printf("%s: max |logit - transformers| = %.3g (bound %.0e)\n", family, error, kLogitTolerance);
    EXPECT_LE(error, kLogitTolerance) << family;
  }
}

TEST(HfBridge, ExportGivesBackEveryTensorBitForBit) {
  for (const char* family : kHfFamilies) {
    TempDir dir;
    const std::string ckpt = import_family(family, dir), out = dir / "exported";
    // A small shard size, so the export is sharded with its index whatever the original was.
    hf_bridge::export_hf({.load = ckpt, .hf_dir = out, .max_shard_size = "100KB"});
    const auto original = hf_bridge::HfWeights::open(hf_fixture(family));
    const auto exported = hf_bridge::HfWeights::open(out);
    EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json")) << family;
    std::vector<std::string> kept;
    for (const std::string& name : original.names())
      if (!hf_bridge::ignorable_hf_tensor(hf_bridge::family_of_model_type(family).value(), name)) kept.push_back(name);
    EXPECT_EQ(exported.names(), kept) << family;
    for (const std::string& name : kept) {
      if (!exported.has(name)) continue;
      const Tensor a = original.load(name), b = exported.load(name);
      EXPECT_TRUE(a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0)
          << family << " " << name;
    }
    // The exported config describes the same model.
    const auto read = [](const std::string& path) {
      return hf_bridge::read_hf_config(nlohmann::json::parse(checkpointing::read_file(path)), path);
    };
    const hf_bridge::HfModelConfig a = read(hf_fixture(family) + "/config.json"), b = read(out + "/config.json");
    EXPECT_EQ(a.family, b.family) << family;
    EXPECT_EQ(a.vocab_rows, b.vocab_rows) << family;
    EXPECT_EQ(a.model_flags, b.model_flags) << family;
    for (const char* file : {"tokenizer.json", "generation_config.json"})
      EXPECT_TRUE(fs::exists(out + "/" + file)) << family << " " << file;
  }
}

TEST(HfBridge, ImportWritesTheRequestedTensorParallelLayout) {
  TempDir dir;
  const std::string ckpt = import_family("llama", dir, 2);
  const std::string release = checkpointing::checkpoint_directory(ckpt, checkpointing::kReleaseIteration);
  EXPECT_TRUE(fs::exists(release + "/model_rank_00000.safetensors"));
  EXPECT_TRUE(fs::exists(release + "/model_rank_00001.safetensors"));
  EXPECT_EQ(read_checkpoint_args(ckpt).parallel.tensor_model_parallel_size, 2);
  const auto shard = checkpointing::SafetensorsReader::open(release + "/model_rank_00001.safetensors");
  EXPECT_FALSE(shard.has("decoder.final_layernorm.weight"));  // replicated: TP rank 0 saves it
  // A run at TP 1 loads it as `megatron train --load CKPT --finetune` would (the reverse, TP 1 to
  // TP 2, is tests/multirank/test_hf_tp_logits.cpp).
  const TrainingArgs args = parse_training_args(finetune_argv(ckpt));
  EXPECT_EQ(args.model.padded_vocab_size, 320);  // config.json's vocab_size
  const ParallelContext single = ParallelContext::single_process();
  GPTModel model(args.model, single);
  EXPECT_TRUE(load_training_checkpoint(args, model, nullptr, nullptr, nullptr));
  EXPECT_LE(max_logit_error(model, hf_reference("llama")), kLogitTolerance);
}

// --pipeline-model-parallel-size is checked against the layers and stored; the files are those of
// PP 1 (layers by global number), which tests/multirank/test_hf_pp_logits.cpp runs at PP 2.
TEST(HfBridge, ImportChecksAndStoresThePipelineLayout) {
  TempDir dir;
  const std::string pp1 = import_family("llama", dir);
  const std::string pp2 = dir / "pp2";
  hf_bridge::import_hf({.hf_dir = hf_fixture("llama"), .save = pp2, .pipeline_model_parallel_size = 2});
  EXPECT_EQ(read_checkpoint_args(pp2).parallel.pipeline_model_parallel_size, 2);
  const auto release = [](const std::string& ckpt) {
    return checkpointing::checkpoint_directory(ckpt, checkpointing::kReleaseIteration) +
           "/model_rank_00000.safetensors";
  };
  EXPECT_EQ(checkpointing::read_file(release(pp2)), checkpointing::read_file(release(pp1)));

  const std::string pp3 = dir / "pp3";
  const std::string error = error_of(
      [&] { hf_bridge::import_hf({.hf_dir = hf_fixture("llama"), .save = pp3, .pipeline_model_parallel_size = 3}); });
  EXPECT_NE(error.find("--num-layers 2 does not divide over --pipeline-model-parallel-size 3"), std::string::npos)
      << error;
  EXPECT_TRUE(nothing_written(pp3));
  const RunResult zero = run_megatron("import-hf --hf-dir " + hf_fixture("llama") + " --save " + pp3 +
                                      " --pipeline-model-parallel-size 0");
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_NE(zero.output.find("--pipeline-model-parallel-size 0 must be >= 1"), std::string::npos) << zero.output;
}

TEST(HfBridge, BadInputIsAnErrorNamingItAndWritesNothing) {
  TempDir dir;
  const std::string save = dir / "ckpt";
  const auto drop = [](const std::string& name) {
    return [name](std::vector<checkpointing::NamedTensor>& t) {
      std::erase_if(t, [&](const checkpointing::NamedTensor& x) { return x.name == name; });
    };
  };
  const std::string missing = "model.layers.1.mlp.up_proj.weight";
  EXPECT_NE(import_error(edited_fixture(dir, "llama", drop(missing)), save)
                .find("lack tensor(s) the model needs: " + missing),
            std::string::npos);
  EXPECT_TRUE(nothing_written(save));

  TempDir extra_dir;
  const std::string extra = edited_fixture(extra_dir, "qwen2", [](std::vector<checkpointing::NamedTensor>& t) {
    t.push_back({"model.layers.0.self_attn.o_proj.bias", Tensor::zeros({64}, DType::f32)});
  });
  EXPECT_NE(import_error(extra, save).find("tensor(s) we would not use: model.layers.0.self_attn.o_proj.bias"),
            std::string::npos);

  TempDir shape_dir;
  const std::string misshaped = edited_fixture(shape_dir, "mistral", [](std::vector<checkpointing::NamedTensor>& t) {
    for (auto& x : t)
      if (x.name == "model.layers.0.self_attn.k_proj.weight") x.tensor = Tensor::zeros({64, 64}, DType::f32);
  });
  EXPECT_NE(import_error(misshaped, save).find("tensor model.layers.0.self_attn.k_proj.weight"), std::string::npos);

  TempDir dtype_dir;
  const std::string ints = edited_fixture(dtype_dir, "gpt2", [](std::vector<checkpointing::NamedTensor>& t) {
    for (auto& x : t)
      if (x.name.find("ln_f.bias") != std::string::npos) x.tensor = Tensor::zeros(x.tensor.shape(), DType::i32);
  });
  EXPECT_NE(import_error(ints, save).find("ln_f.bias is stored as i32"), std::string::npos);

  TempDir config_dir;
  const std::string unknown = edited_fixture(config_dir, "llama", [](auto&) {});
  nlohmann::json config = nlohmann::json::parse(checkpointing::read_file(unknown + "/config.json"));
  config["qk_layernorm"] = true;
  checkpointing::write_file_atomic(unknown + "/config.json", config.dump());
  EXPECT_NE(import_error(unknown, save).find("qk_layernorm"), std::string::npos);
  config["model_type"] = "deepseek_v3";
  checkpointing::write_file_atomic(unknown + "/config.json", config.dump());
  EXPECT_NE(import_error(unknown, save).find("model_type \"deepseek_v3\""), std::string::npos);
  EXPECT_TRUE(nothing_written(save));
}

TEST(HfBridge, GenerateAndFinetuneNeedNoModelFlags) {
  TempDir dir;
  const std::string ckpt = import_family("qwen2", dir);
  const RunResult generated = run_megatron("generate --load " + ckpt + " --prompt 'The quick' --max-new-tokens 4");
  EXPECT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_NE(generated.output.find("The quick"), std::string::npos) << generated.output;

  const std::string out = dir / "finetuned";
  const RunResult trained =
      run_megatron("train --load " + ckpt + " --finetune --save " + out +
                   " --mock-data --micro-batch-size 2 --train-iters 3 --seq-length 16 --lr 1e-4 --log-interval 1"
                   " --save-interval 3");
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(trained.output.find("iteration        3/"), std::string::npos) << trained.output;
  // The fine-tuned checkpoint keeps the imported model and exports as its family again.
  hf_bridge::export_hf({.load = out, .hf_dir = dir / "hf"});
  const nlohmann::json config = nlohmann::json::parse(checkpointing::read_file(dir / "hf/config.json"));
  EXPECT_EQ(config["model_type"], "qwen2");
}

// --no-eod-termination: a model whose next token is always the end of document (the final norm
// outputs its bias alone, ones, which the tied embedding row of <|endoftext|>, id 0, matches
// best by far) stops after one token by default, and with the flag generates every token asked for.
TEST(HfBridge, NoEodTerminationGeneratesEveryTokenAskedFor) {
  TempDir dir;
  const std::string hf = edited_fixture(dir, "gpt2", [](std::vector<checkpointing::NamedTensor>& t) {
    for (auto& x : t) {
      float* v = x.tensor.data<float>();
      if (x.name == "transformer.ln_f.weight") std::fill(v, v + x.tensor.numel(), 0.0f);
      if (x.name == "transformer.ln_f.bias") std::fill(v, v + x.tensor.numel(), 1.0f);
      if (x.name == "transformer.wte.weight") std::fill(v, v + x.tensor.dim(1), 10.0f);  // row 0
    }
  });
  const std::string ckpt = dir / "ckpt";
  hf_bridge::import_hf({.hf_dir = hf, .save = ckpt});
  const std::string run = "generate --load " + ckpt + " --prompt 'The quick' --max-new-tokens 6 --temperature 0";
  const RunResult stops = run_megatron(run);
  EXPECT_NE(stops.output.find("generated 1 tokens"), std::string::npos) << stops.output;
  const RunResult all = run_megatron(run + " --no-eod-termination");
  EXPECT_NE(all.output.find("generated 6 tokens"), std::string::npos) << all.output;
}

// A vocab_size TP does not divide (GPT-2's 50257 at TP 2) is padded in the checkpoint, and the
// export drops that padding: exactly vocab_size rows, bit for bit, and config.json says so.
TEST(HfBridge, ExportDropsThePaddingOfAVocabularyTpDoesNotDivide) {
  TempDir dir;
  const std::string odd = odd_vocabulary_gpt2(dir);
  const std::string ckpt = dir / "ckpt", out = dir / "exported";
  hf_bridge::import_hf({.hf_dir = odd, .save = ckpt, .tensor_model_parallel_size = 2});
  EXPECT_EQ(read_checkpoint_args(ckpt).model.padded_vocab_size, 322);
  hf_bridge::export_hf({.load = ckpt, .hf_dir = out});
  const Tensor a = hf_bridge::HfWeights::open(odd).load("transformer.wte.weight");
  const Tensor b = hf_bridge::HfWeights::open(out).load("transformer.wte.weight");
  EXPECT_EQ(shape_str(b.shape()), shape_str(a.shape()));
  EXPECT_TRUE(a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
  EXPECT_EQ(nlohmann::json::parse(checkpointing::read_file(out + "/config.json"))["vocab_size"], 321);
}

// A run that loads a checkpoint with another value of a flag that changes what the model computes
// (not its tensor shapes) is an error naming the flag and both values, before any weight is read.
TEST(HfBridge, LoadRefusesAnotherAttentionOrRopeSetting) {
  TempDir dir;
  const std::string mistral = import_family("mistral", dir), llama = import_family("llama", dir);
  const struct {
    std::string ckpt;
    std::vector<std::string> given;
  } cases[] = {{mistral, {"--window-size", "7,0"}},
               {mistral, {"--rotary-base", "5000"}},
               {mistral, {"--use-rope-scaling"}},
               {mistral, {"--add-qkv-bias"}},
               {llama, {"--rope-scaling-factor", "4"}}};
  for (const auto& c : cases) {
    const TrainingArgs args = parse_training_args(finetune_argv(c.ckpt, c.given));
    std::string stored;
    for (const auto& [flag, value] : saved_flags(c.ckpt, 0))
      if (flag == c.given[0]) stored = value;
    const ParallelContext single = ParallelContext::single_process();
    GPTModel model(args.model, single);
    const std::string error = error_of([&] { load_training_checkpoint(args, model, nullptr, nullptr, nullptr); });
    const std::string given = c.given.size() > 1 ? c.given[1] : "true";
    EXPECT_NE(error.find("was trained with " + c.given[0] + " " + (stored.empty() ? "(unset)" : stored) +
                         " but this run has " + given),
              std::string::npos)
        << c.given[0] << ": " << error;
  }
}
