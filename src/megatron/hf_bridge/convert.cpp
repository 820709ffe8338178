#include "megatron/hf_bridge/convert.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "megatron/checkpointing/atomic_file.h"
#include "megatron/checkpointing/checkpoint.h"
#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "megatron/flags/flag_table.h"
#include "megatron/hf_bridge/hf_config.h"
#include "megatron/hf_bridge/hf_weights.h"
#include "megatron/hf_bridge/tensor_mapping.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/training/checkpoint_io.h"

namespace megatron::hf_bridge {
namespace fs = std::filesystem;
using checkpointing::ShardedTensor;

namespace {

#define IMPORT_FIELD(member) MEGATRON_FLAG_FIELD(ImportOptions, member)
#define EXPORT_FIELD(member) MEGATRON_FLAG_FIELD(ExportOptions, member)

std::vector<std::string> validate_import(const ImportOptions& o) {
  std::vector<std::string> errors;
  if (o.hf_dir.empty()) errors.push_back("--hf-dir is required: the Hugging Face model directory to import");
  if (o.save.empty()) errors.push_back("--save is required: the directory the checkpoint is written to");
  if (o.tensor_model_parallel_size < 1)
    errors.push_back("--tensor-model-parallel-size " + std::to_string(o.tensor_model_parallel_size) + " must be >= 1");
  if (o.pipeline_model_parallel_size < 1)
    errors.push_back("--pipeline-model-parallel-size " + std::to_string(o.pipeline_model_parallel_size) +
                     " must be >= 1");
  return errors;
}

std::vector<std::string> validate_export(const ExportOptions& o) {
  std::vector<std::string> errors;
  if (o.load.empty()) errors.push_back("--load is required: the checkpoint directory to export (a run's --save)");
  if (o.hf_dir.empty()) errors.push_back("--hf-dir is required: the new Hugging Face model directory to write");
  return errors;
}

// The tokenizer flags of an HF model directory: tokenizer.json, else a SentencePiece
// tokenizer.model, else GPT-2's vocab.json and merges.txt.
std::vector<std::pair<std::string, std::string>> tokenizer_flags_of(const std::string& dir) {
  const auto file = [&](const char* name) { return (fs::path(dir) / name).string(); };
  if (fs::exists(file("tokenizer.json")))
    return {{"--tokenizer-type", "HuggingFaceTokenizer"}, {"--tokenizer-model", file("tokenizer.json")}};
  if (fs::exists(file("tokenizer.model")))
    return {{"--tokenizer-type", "Llama2Tokenizer"}, {"--tokenizer-model", file("tokenizer.model")}};
  if (fs::exists(file("vocab.json")) && fs::exists(file("merges.txt")))
    return {{"--tokenizer-type", "GPT2BPETokenizer"},
            {"--vocab-file", file("vocab.json")},
            {"--merge-file", file("merges.txt")}};
  MEGATRON_FAIL(dir << " holds no tokenizer (tokenizer.json, tokenizer.model, or vocab.json with merges.txt): save "
                    << "the tokenizer with the model (tokenizer.save_pretrained)");
}

nlohmann::json read_json_file(const std::string& path) {
  MEGATRON_CHECK(fs::exists(path), path << " is missing: a Hugging Face model directory holds its config.json");
  try {
    return nlohmann::json::parse(checkpointing::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL(path << " is not valid JSON (" << e.what() << ")");
  }
}

// The one floating dtype of every tensor the rules read; an error naming the first that differs.
DType weights_dtype(const HfWeights& weights, const std::vector<TensorRule>& rules) {
  std::optional<std::pair<std::string, DType>> first;
  for (const TensorRule& rule : rules)
    for (const std::string& name : rule.hf) {
      if (!weights.has(name)) continue;  // reported as missing later
      const DType dtype = weights.info(name).dtype;
      MEGATRON_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
                     "tensor " << name << " is stored as " << dtype_name(dtype)
                               << ", which we cannot train in: import weights stored as F32, BF16 or F16");
      if (!first) first = {name, dtype};
      MEGATRON_CHECK(dtype == first->second, "tensor " << name << " is stored as " << dtype_name(dtype) << " but "
                                                       << first->first << " as " << dtype_name(first->second)
                                                       << ": a model is imported in one dtype; re-save it in one");
    }
  MEGATRON_CHECK(first.has_value(), "the Hugging Face weights hold none of the model's tensors");
  return first->second;
}

std::string list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 8) out += " and " + std::to_string(names.size() - 8) + " more";
  return out;
}

// Every rule's HF tensors present with the shape of our parameter, and no tensor left unread.
void check_tensors(const HfWeights& weights, const std::vector<TensorRule>& rules,
                   const std::map<std::string, Shape>& ours, const TransformerConfig& config, int64_t vocab_rows,
                   Family family) {
  std::vector<std::string> missing;
  std::set<std::string> used;
  for (const TensorRule& rule : rules) {
    const std::vector<Shape> shapes = hf_shapes(rule, ours.at(rule.ours), config, vocab_rows);
    for (size_t i = 0; i < rule.hf.size(); ++i) {
      used.insert(rule.hf[i]);
      if (!weights.has(rule.hf[i])) {
        missing.push_back(rule.hf[i]);
        continue;
      }
      const Shape& got = weights.info(rule.hf[i]).shape;
      MEGATRON_CHECK(got == shapes[i], "tensor " << rule.hf[i] << " in " << weights.file_of(rule.hf[i]) << " has shape "
                                                 << shape_str(got) << " but config.json makes it "
                                                 << shape_str(shapes[i]) << ": the weights and config.json disagree");
    }
  }
  MEGATRON_CHECK(missing.empty(), "the Hugging Face weights lack tensor(s) the model needs: "
                                      << list(missing) << "; the checkpoint is incomplete or of another architecture");
  std::vector<std::string> extra;
  for (const std::string& name : weights.names())
    if (!used.count(name) && !ignorable_hf_tensor(family, name)) extra.push_back(name);
  MEGATRON_CHECK(extra.empty(), "the Hugging Face weights hold tensor(s) we would not use: "
                                    << list(extra) << "; config.json describes another model than the weights");
}

// Copies the box of `global` starting at `offset` with local's shape into `local` (any number of
// dimensions, both contiguous): one run of local's last dimension at a time.
void copy_from_global(const Tensor& global, const Shape& offset, Tensor& local) {
  const size_t es = dtype_size(global.dtype());
  const auto* src = static_cast<const uint8_t*>(global.raw());
  auto* dst = static_cast<uint8_t*>(local.raw());
  const int64_t dims = local.ndim(), cols = local.dim(dims - 1), runs = local.numel() / std::max<int64_t>(cols, 1);
  std::vector<int64_t> stride(size_t(dims), 1);  // the global tensor's, in elements
  for (int64_t d = dims - 2; d >= 0; --d) stride[size_t(d)] = stride[size_t(d + 1)] * global.dim(d + 1);
  for (int64_t run = 0; run < runs; ++run) {
    int64_t rest = run, at = offset[size_t(dims - 1)];
    for (int64_t d = dims - 2; d >= 0; --d) {
      at += (offset[size_t(d)] + rest % local.dim(d)) * stride[size_t(d)];
      rest /= local.dim(d);
    }
    std::memcpy(dst + size_t(run * cols) * es, src + size_t(at) * es, size_t(cols) * es);
  }
}

// TP rank r's shards of every parameter (global tensors by name), as that rank would save them.
std::vector<std::vector<ShardedTensor>> shards_by_tp_rank(GPTModel& model, const std::map<std::string, Tensor>& globals,
                                                          int tp) {
  auto out = std::vector<std::vector<ShardedTensor>>(size_t(tp));
  for (const auto& p : model.parameters().params()) {
    const Tensor& global = globals.at(p->spec.name);
    for (int r = 0; r < tp; ++r) {
      Parameter shard;
      shard.spec = p->spec;
      shard.local_shape = tp_local_shape(p->spec, tp);
      shard.tp_rank = r;
      shard.tp_size = tp;
      if (shard.is_duplicate()) continue;
      const Tensor local = Tensor::empty(shard.local_shape, global.dtype());
      for (Parameter::Slice& slice : shard.global_slices_of(local)) {
        copy_from_global(global, slice.global_offset, slice.local);
        out[size_t(r)].push_back({p->spec.name, p->spec.global_shape, slice.global_offset, slice.local});
      }
    }
  }
  return out;
}

std::map<std::string, Shape> parameter_shapes(GPTModel& model) {
  std::map<std::string, Shape> shapes;
  for (const auto& p : model.parameters().params()) shapes[p->spec.name] = p->spec.global_shape;
  return shapes;
}

}  // namespace

const flags::FlagTable<ImportOptions>& import_flags() {
  static const flags::FlagTable<ImportOptions> table(
      "megatron import-hf",
      "Converts a Hugging Face model directory (LLaMA, Mistral, Qwen2, Qwen3, Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-2) "
      "into a "
      "megatron checkpoint that `megatron train --load CKPT --finetune` and `megatron generate --load CKPT` use "
      "without model flags.",
      {{"--hf-dir", IMPORT_FIELD(hf_dir), "conversion",
        "Hugging Face model directory: config.json, model.safetensors (or shards and their index), tokenizer"},
       {"--save", IMPORT_FIELD(save), "conversion", "Checkpoint directory to write (it must hold no checkpoint yet)"},
       {"--tensor-model-parallel-size", IMPORT_FIELD(tensor_model_parallel_size), "conversion",
        "The TP layout of the checkpoint (it loads at any TP that splits the model)"},
       {"--pipeline-model-parallel-size", IMPORT_FIELD(pipeline_model_parallel_size), "conversion",
        "The PP layout the checkpoint is meant for, checked against the model's layers and stored; the files are "
        "the same at every PP (tensors are saved by global name, layers by global number), so it loads at any PP "
        "that splits the layers"}},
      validate_import);
  return table;
}

const flags::FlagTable<ExportOptions>& export_flags() {
  static const flags::FlagTable<ExportOptions> table(
      "megatron export-hf",
      "Writes a megatron checkpoint as a Hugging Face model directory that transformers' AutoModelForCausalLM and "
      "AutoTokenizer load as they are.",
      {{"--load", EXPORT_FIELD(load), "conversion", "Checkpoint directory (a run's --save, or an import's)"},
       {"--ckpt-step", EXPORT_FIELD(ckpt_step), "conversion", "Iteration to export; 0: the latest"},
       {"--hf-dir", EXPORT_FIELD(hf_dir), "conversion", "Hugging Face model directory to create"},
       {"--max-shard-size", EXPORT_FIELD(max_shard_size), "conversion",
        "Largest safetensors shard (decimal units, as huggingface_hub: 5GB, 200KB)"}},
      validate_export);
  return table;
}

#undef IMPORT_FIELD
#undef EXPORT_FIELD

void import_hf(const ImportOptions& o) {
  const std::string config_path = (fs::path(o.hf_dir) / "config.json").string();
  const HfModelConfig hf = read_hf_config(read_json_file(config_path), config_path);
  const HfWeights weights = HfWeights::open(o.hf_dir);
  MEGATRON_CHECK(checkpointing::list_checkpoints(o.save).empty() &&
                     !fs::exists(fs::path(o.save) / checkpointing::kTrackerFileName),
                 "--save " << o.save << " already holds checkpoints; import into a new directory");

  std::vector<std::pair<std::string, std::string>> flags = hf.model_flags;
  for (auto& flag : tokenizer_flags_of(o.hf_dir)) flags.push_back(std::move(flag));
  const int64_t tp = o.tensor_model_parallel_size, world = tp * o.pipeline_model_parallel_size;
  // Megatron's rule for MoE layers under TP: each TP rank routes its own tokens (SP).
  const bool moe = hf.family == Family::mixtral || hf.family == Family::qwen2_moe || hf.family == Family::qwen3_moe;
  if (moe && tp > 1) flags.emplace_back("--sequence-parallel", "true");
  flags.insert(flags.end(), {{"--tensor-model-parallel-size", std::to_string(tp)},
                             {"--pipeline-model-parallel-size", std::to_string(o.pipeline_model_parallel_size)},
                             {"--micro-batch-size", "1"},
                             {"--train-iters", "1"},
                             {"--mock-data", "true"},
                             {"--lr", "1e-5"}});  // training flags a later run gives its own values
  // The vocabulary is HF's rows, stored as such (not as a divisor, which TP multiplies), padded only
  // to a multiple of the run's TP: at every TP that divides them no row is added, so the checkpoint
  // loads at each such TP.
  flags.insert(flags.end(),
               {{"--true-vocab-size", std::to_string(hf.vocab_rows)}, {"--make-vocab-size-divisible-by", "1"}});
  // The rules read the model's shape, which the flags give; the dtype comes from the weights.
  TrainingArgs shape_args = parse_training_args_from_flags(flags, world);
  const std::string prefix = hf.family == Family::gpt2 && weights.has("transformer.wte.weight") ? "transformer." : "";
  const std::vector<TensorRule> rules = tensor_rules(hf.family, shape_args.model, prefix);
  const DType dtype = weights_dtype(weights, rules);
  if (dtype != DType::f32) flags.emplace_back(dtype == DType::bf16 ? "--bf16" : "--fp16", "true");
  const TrainingArgs args = parse_training_args_from_flags(flags, world);
  if (args.model.padded_vocab_size != hf.vocab_rows)
    LOG_WARN("vocab_size " << hf.vocab_rows << " does not divide over TP " << tp << ": the vocabulary is padded to "
                           << args.model.padded_vocab_size << " rows here; an export drops the padding");

  const ParallelContext single = ParallelContext::single_process();
  GPTModel model(args.model, single);  // the whole model: its parameters are the global tensors
  const std::map<std::string, Shape> shapes = parameter_shapes(model);
  std::map<std::string, const TensorRule*> rule_of;
  for (const TensorRule& rule : rules) rule_of[rule.ours] = &rule;
  for (const auto& [name, shape] : shapes)
    MEGATRON_CHECK(rule_of.count(name), "no Hugging Face tensor maps to our parameter " << name);
  check_tensors(weights, rules, shapes, args.model, hf.vocab_rows, hf.family);

  std::map<std::string, Tensor> globals;
  for (const TensorRule& rule : rules) {
    std::vector<Tensor> sources;
    for (const std::string& name : rule.hf) sources.push_back(weights.load(name));
    globals[rule.ours] = to_ours(rule, sources, shapes.at(rule.ours), args.model, hf.vocab_rows);
  }
  save_weights_checkpoint(o.save, args, checkpointing::kReleaseIteration, shards_by_tp_rank(model, globals, int(tp)));
  LOG_INFO("imported " << family_info(hf.family).architecture << " from " << o.hf_dir << " into " << o.save
                       << " (release, TP " << tp << ", PP " << o.pipeline_model_parallel_size << ", "
                       << dtype_name(dtype) << ")");
}

void export_hf(const ExportOptions& o) {
  const uint64_t max_shard_bytes = parse_shard_size(o.max_shard_size);
  MEGATRON_CHECK(!fs::exists(o.hf_dir) || fs::is_empty(o.hf_dir),
                 "--hf-dir " << o.hf_dir << " already exists and is not empty; export into a new directory");
  const TrainingArgs args = read_checkpoint_args(o.load, o.ckpt_step);
  const Family family = family_of_model(args.model);
  const ParallelContext single = ParallelContext::single_process();
  GPTModel model(args.model, single);  // the whole model: its parameters are the global tensors
  load_model_weights(o.load, model, o.ckpt_step);
  const auto tokenizer = datasets::make_tokenizer(args.tokenizer);
  const SpecialIds ids{tokenizer->bos().value_or(tokenizer->eod()), tokenizer->eod()};
  // HF's vocab_size rows, without the padding for TP (a model trained here from scratch: all rows).
  const int64_t vocab_rows = args.model.true_vocab_size > 0 ? args.model.true_vocab_size : args.model.padded_vocab_size;

  std::vector<checkpointing::NamedTensor> tensors;
  std::map<std::string, const Parameter*> params;
  for (const auto& p : model.parameters().params()) params[p->spec.name] = p.get();
  // GPT-2's names with "transformer.", as save_pretrained writes them (the hub's older files lack it).
  for (const TensorRule& rule : tensor_rules(family, args.model, family == Family::gpt2 ? "transformer." : "")) {
    const std::vector<Tensor> hf = to_hf(rule, params.at(rule.ours)->data, args.model, vocab_rows);
    for (size_t i = 0; i < hf.size(); ++i) tensors.push_back({rule.hf[i], hf[i]});
  }

  if (fs::exists(o.hf_dir)) fs::remove(o.hf_dir);  // empty: the staged directory takes its place
  checkpointing::StagedDirectory out(fs::absolute(o.hf_dir).lexically_normal().string());
  const auto write_json = [&](const char* name, const nlohmann::json& j) {
    checkpointing::write_file_atomic((fs::path(out.path()) / name).string(), j.dump(2) + "\n");
  };
  write_json("config.json", hf_config_json(family, args.model, vocab_rows, args.model.params_dtype, ids));
  write_json("generation_config.json", hf_generation_config_json(ids));
  write_hf_weights(out.path(), tensors, max_shard_bytes);
  for (const datasets::TokenizerFile& file : tokenizer->files())
    checkpointing::write_file_atomic((fs::path(out.path()) / file.name).string(), checkpointing::read_file(file.path));
  out.publish();
  LOG_INFO("exported " << family_info(family).architecture << " to " << o.hf_dir);
}

}  // namespace megatron::hf_bridge
