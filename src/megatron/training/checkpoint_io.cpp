#include "megatron/training/checkpoint_io.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "megatron/checkpointing/retention.h"
#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/core/progress.h"
#include "megatron/core/strings.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "megatron/distributed/fp8_params.h"
#include "megatron/parallel/text_collectives.h"
#include "megatron/training/fp8_checkpoint.h"

namespace megatron {

namespace {
namespace fs = std::filesystem;
using checkpointing::CheckpointReader;
using checkpointing::ShardedTensor;

// The rank that stages, checks and publishes a save.
constexpr int kRoot = 0;

// Flags that fix the model's shape, or what the same weights compute (attention window, RoPE):
// a checkpoint only loads into a model that agrees on them. The vocabulary's padding depends on TP
// too (--make-vocab-size-divisible-by x TP), so the padded size itself is compared instead of the
// divisor.
const char* const kArchitectureFlags[] = {"--num-layers",
                                          "--hidden-size",
                                          "--ffn-hidden-size",
                                          "--num-attention-heads",
                                          "--num-query-groups",
                                          "--kv-channels",
                                          "--normalization",
                                          "--swiglu",
                                          "--position-embedding-type",
                                          "--disable-bias-linear",
                                          "--add-qkv-bias",
                                          "--window-size",
                                          "--rotary-base",
                                          "--use-rope-scaling",
                                          "--rope-scaling-factor",
                                          "--untie-embeddings-and-output-weights",
                                          "--max-position-embeddings"};

nlohmann::json args_json(const TrainingArgs& args) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [flag, value] : training_args_to_flags(args)) j[flag] = value;
  return j;
}

}  // namespace

namespace {
// Sharded weights (Megatron FSDP's optim_grads_params): each rank's flat ranges as boxes of the
// global tensors, as the distributed optimizer stores its state, so the DP ranks together save
// every element once and any layout reads them back.
std::vector<ShardedTensor> weight_shard_state(const ParameterRegistry& registry, Optimizer::StateCopies copies) {
  std::vector<ShardedTensor> out;
  for (const ParameterRegistry::WeightShard& shard : registry.weight_shards()) {
    const Parameter& p = *registry.params()[shard.param];
    if (copies == Optimizer::StateCopies::one_replica && p.is_duplicate()) continue;  // TP rank 0 saves it
    for (const Parameter::FlatBox& box : p.global_boxes(shard.begin, shard.end)) {
      const int64_t at = box.flat_begin - shard.begin;
      out.push_back({p.spec.name, p.spec.global_shape, box.global_offset,
                     shard.values.slice(at, at + shape_numel(box.shape)).view(box.shape)});
    }
  }
  return out;
}
}  // namespace

std::vector<ShardedTensor> model_state(const CheckpointedModel& model, Optimizer::StateCopies copies,
                                       const ParallelContext& ctx) {
  std::vector<ShardedTensor> out;
  if (model.parameters.weights_sharded()) {
    out = weight_shard_state(model.parameters, copies);
  } else {
    for (const auto& p : model.parameters.params())
      if (copies == Optimizer::StateCopies::this_rank || is_saved_replica(*p, ctx)) {
        // An FP8 parameter (--fp8-param-gather) is saved as the values its codes stand for, in the
        // compute dtype: the checkpoint's weights read the same for every consumer.
        const Tensor values =
            p->held_in_fp8() ? fp8_param_values(*p, p->data, model.parameters.params_dtype()) : p->data;
        for (const auto& slice : p->global_slices_of(values))
          out.push_back({p->spec.name, p->spec.global_shape, slice.global_offset, slice.local});
      }
  }
  // The routers' expert biases (Megatron's persistent buffers decoder.layers.N.mlp.router.expert_bias):
  // every rank of a stage holds the same (updated from counts summed over the stage's tokens), so
  // TP rank 0 and DP x CP rank 0 of each stage save its layers' once, as f64 like the router keeps them.
  if (copies == Optimizer::StateCopies::this_rank || (ctx.tp_rank() == 0 && ctx.dp_cp->rank() == 0))
    for (const moe::MoELayer* layer : model.moe_layers) {
      const std::vector<double>& bias = layer->router().expert_bias();
      if (bias.empty()) continue;
      Tensor t = Tensor::empty({int64_t(bias.size())}, DType::f64);
      std::copy(bias.begin(), bias.end(), t.data<double>());
      out.push_back({layer->router().expert_bias_name(), t.shape(), Shape{0}, t});
    }
  for (ShardedTensor& t : fp8_recipe_state(model.fp8_linears, copies, ctx)) out.push_back(std::move(t));
  return out;
}

namespace {

void check_same_architecture(const nlohmann::json& saved, const TrainingArgs& args, const std::string& dir) {
  const nlohmann::json now = args_json(args);
  // A checkpoint saved before a flag existed was trained with its default.
  const nlohmann::json defaults = args_json(TrainingArgs{});
  for (const char* flag : kArchitectureFlags) {
    // The factor changes nothing without the scaling (whose own value is compared).
    if (std::string_view(flag) == "--rope-scaling-factor" && !args.model.use_rope_scaling) continue;
    const nlohmann::json& stored = saved.contains(flag) ? saved : defaults;
    const std::string a = stored.contains(flag) ? stored[flag].get<std::string>() : "";
    const std::string b = now.contains(flag) ? now[flag].get<std::string>() : "";
    MEGATRON_CHECK(a == b, "checkpoint " << dir << " was trained with " << flag << " " << (a.empty() ? "(unset)" : a)
                                         << " but this run has " << (b.empty() ? "(unset)" : b)
                                         << "; the model must match the checkpoint's: drop " << flag
                                         << " (a run takes the checkpoint's model flags) or give its value");
  }
  const std::string padded = std::to_string(args.model.padded_vocab_size);
  // Rows past --true-vocab-size are padding for TP (an import's): load_model_state adds or drops them.
  const std::string true_vocab = std::to_string(args.model.true_vocab_size);
  if (args.model.true_vocab_size > 0 && saved.contains("--true-vocab-size") && saved["--true-vocab-size"] == true_vocab)
    return;
  MEGATRON_CHECK(!saved.contains("padded_vocab_size") || saved["padded_vocab_size"] == padded,
                 "checkpoint " << dir << " has a padded vocabulary of " << saved["padded_vocab_size"].get<std::string>()
                               << " rows but this run pads its " << args.model.vocab_size << " tokens to " << padded
                               << " (--make-vocab-size-divisible-by " << args.model.make_vocab_size_divisible_by
                               << " x TP " << args.parallel.tensor_model_parallel_size
                               << "); use the same tokenizer, and a --make-vocab-size-divisible-by that gives "
                               << saved["padded_vocab_size"].get<std::string>() << " rows at this TP");
}

// --load takes the directory of a run's checkpoints (its --save), as in Megatron; given one
// checkpoint's directory (iter_0000100/ or release/, which hold metadata.json), say to pass the parent.
void check_not_one_checkpoint(const std::string& load_dir) {
  fs::path dir = fs::path(load_dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // a trailing slash
  const std::string name = dir.filename().string();
  const bool iteration_name = name == "release" || (name.size() > 5 && name.rfind("iter_", 0) == 0 &&
                                                    name.find_first_not_of("0123456789", 5) == std::string::npos);
  std::error_code ec;
  MEGATRON_CHECK(!iteration_name || !fs::exists(dir / "metadata.json", ec),
                 "--load " << load_dir << " is one checkpoint's directory; pass its parent, --load "
                           << (dir.has_parent_path() ? dir.parent_path().string() : std::string("."))
                           << " (the run's --save directory): the latest checkpoint in it is loaded");
}

std::string iteration_list(const std::vector<int64_t>& iterations) {
  std::string list;
  for (int64_t i : iterations) list += (list.empty() ? "" : ", ") + std::to_string(i);
  return list;
}

// How to load another checkpoint than `iteration`, for the errors about it.
std::string other_checkpoints_advice(const std::string& load_dir, int64_t iteration) {
  std::vector<int64_t> complete = checkpointing::complete_checkpoints(load_dir);
  std::erase(complete, iteration);
  if (complete.empty()) return "no other complete checkpoint exists in " + load_dir;
  return "complete checkpoints in " + load_dir + ": iterations " + iteration_list(complete) +
         "; load one with --ckpt-step N, e.g. --ckpt-step " + std::to_string(complete.back());
}

void describe_choice(const std::string& load_dir, const CheckpointChoice& choice) {
  if (choice.by == CheckpointChoice::By::newest_directory)
    LOG_WARN(load_dir << " has no " << checkpointing::kTrackerFileName << "; loading its newest checkpoint, iteration "
                      << choice.iteration << " (--ckpt-step N loads another)");
}

// The checkpoint of load_dir that a run loads, opened: every file verified.
CheckpointReader open_chosen(const std::string& load_dir, int64_t ckpt_step, bool describe) {
  const std::optional<CheckpointChoice> choice = checkpoint_to_load(load_dir, ckpt_step);
  if (!choice) check_not_one_checkpoint(load_dir);
  MEGATRON_CHECK(choice.has_value(), "no checkpoint in " << load_dir << " (neither " << checkpointing::kTrackerFileName
                                                         << " nor iter_* directories); train with --save " << load_dir
                                                         << " first");
  if (describe) describe_choice(load_dir, *choice);
  try {
    return CheckpointReader::open(load_dir, choice->iteration);
  } catch (const Error& e) {
    MEGATRON_FAIL(e.what() << "; to resume from an earlier checkpoint, pass --ckpt-step N");
  }
}

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

// common.json's record of the tokenizer: {"type": T, "vocab_size": N, "files": {name: flag}}, and a
// TikTokenizer's pattern, number of special tokens and special tokens.
constexpr const char* kTokenizerKey = "tokenizer";

// Copies the files the tokenizer reads into the staging directory; returns its record.
nlohmann::json save_tokenizer(checkpointing::CheckpointStaging& staging, const datasets::TokenizerOptions& options) {
  const std::unique_ptr<datasets::Tokenizer> tokenizer = datasets::make_tokenizer(options);
  nlohmann::json files = nlohmann::json::object();
  for (const datasets::TokenizerFile& file : tokenizer->files()) {
    staging.add_file(file.name, datasets::read_tokenizer_file(file.path, tokenizer->name() + " file"));
    files[file.name] = file.flag;
  }
  nlohmann::json record = {{"type", options.type}, {"vocab_size", options.vocab_size}, {"files", files}};
  if (options.type == "TikTokenizer")  // its own choices, unset where Megatron's defaults apply
    record.update({{"tiktoken_pattern", options.tiktoken_pattern},
                   {"tiktoken_num_special_tokens", options.tiktoken_num_special_tokens},
                   {"special_tokens", options.special_tokens}});
  return record;
}

// The tokenizer saved with a checkpoint, its files the checkpoint's own copies; nullopt for a
// checkpoint saved without one.
std::optional<datasets::TokenizerOptions> saved_tokenizer(const checkpointing::CheckpointHeader& header) {
  if (!header.common.contains(kTokenizerKey)) return std::nullopt;
  datasets::TokenizerOptions options;
  std::vector<datasets::TokenizerFile> files;
  try {
    const nlohmann::json& record = header.common.at(kTokenizerKey);
    options.type = record.at("type").get<std::string>();
    options.vocab_size = record.at("vocab_size").get<int64_t>();
    options.tiktoken_pattern = record.value("tiktoken_pattern", std::string());
    options.tiktoken_num_special_tokens = record.value("tiktoken_num_special_tokens", int64_t(0));
    options.special_tokens = record.value("special_tokens", std::vector<std::string>());
    for (const auto& [name, flag] : record.at("files").items()) {
      const auto held = header.files.find(name);
      MEGATRON_CHECK(held != header.files.end(), "checkpoint " << header.directory << " records tokenizer file " << name
                                                               << " but does not hold it");
      files.push_back({flag.get<std::string>(), held->second, name});
    }
  } catch (const nlohmann::json::exception& e) {
    MEGATRON_FAIL("checkpoint " << header.directory << ": the tokenizer record in common.json is malformed ("
                                << e.what() << ")");
  }
  return datasets::tokenizer_options_in(options, files, header.directory);
}
// The parameters whose rows are the (padded) vocabulary.
bool is_vocabulary_parameter(const ParamSpec& spec) {
  return spec.name == "embedding.word_embeddings.weight" || spec.name == "output_layer.weight";
}

// The stored rows of a vocabulary parameter when they are the model's --true-vocab-size rows padded
// for another TP (check_same_architecture allows no other difference); nullopt otherwise.
std::optional<int64_t> changed_vocabulary_rows(const CheckpointReader& reader, const Parameter& p,
                                               int64_t true_vocab_size) {
  if (true_vocab_size <= 0 || !is_vocabulary_parameter(p.spec) || !reader.has(p.spec.name)) return std::nullopt;
  const int64_t stored = reader.info(p.spec.name).global_shape[0];
  if (stored == p.spec.global_shape[0] || stored < true_vocab_size) return std::nullopt;
  return stored;
}

// A slice of a vocabulary parameter stored with `stored` rows: the rows the checkpoint holds, zeros
// past them (the padding an import at this TP writes); stored padding rows past ours are dropped.
void load_vocabulary_slice(const CheckpointReader& reader, const std::string& name, int64_t stored,
                           Parameter::Slice& slice) {
  Tensor host = Tensor::zeros(slice.local.shape(), slice.local.dtype());
  const int64_t first = slice.global_offset[0];
  const int64_t held = std::clamp<int64_t>(stored - first, 0, host.dim(0));
  if (held > 0) {
    Tensor rows = host.slice(0, held);
    reader.load(name, slice.global_offset, rows);
  }
  slice.local.copy_from(host);
}

// --dist-ckpt-strictness (checkpoint_io.h, restore_training_state).
bool keeps_lacked_weights(const std::string& strictness) {
  return strictness != "assume_ok_unexpected" && !strictness.starts_with("raise_");
}

// This rank's parameters that the checkpoint does not hold.
std::vector<std::string> lacked_weights(const CheckpointReader& reader, const ParameterRegistry& registry) {
  std::vector<std::string> lacked;
  for (const auto& p : registry.params())
    if (!reader.has(p->spec.name)) lacked.push_back(p->spec.name);
  return lacked;
}

// The first few names and how many more, for messages.
std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kShown = 8;
  std::string text;
  for (size_t i = 0; i < std::min(names.size(), kShown); ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > kShown) text += concat(" and ", names.size() - kShown, " more");
  return text;
}

// Weights of the checkpoint no rank's model holds, under the *_all values: the ranks' weight names
// are gathered on rank 0, which compares them with the checkpoint's and sends every rank the list.
void check_unused_weights(const CheckpointReader& reader, const CheckpointedModel& model,
                          const std::string& strictness) {
  if (strictness != "log_all" && strictness != "raise_all") return;
  std::string held;
  for (const auto& p : model.parameters.params()) held += p->spec.name + "\n";
  for (moe::MoELayer* layer : model.moe_layers)
    if (!layer->router().expert_bias().empty()) held += layer->router().expert_bias_name() + "\n";
  Communicator& world = *model.ctx.world;
  const std::vector<std::string> every_rank = gather_text(world, held, kRoot, model.device);
  std::string unused;
  if (world.rank() == kRoot) {
    std::set<std::string> names;
    for (const std::string& text : every_rank)
      for (std::string_view rest = text; !rest.empty();) {
        const size_t end = rest.find('\n');
        names.emplace(rest.substr(0, end));
        rest.remove_prefix(end + 1);
      }
    std::vector<std::string> listed;
    for (const std::string& name : reader.names())
      if (!is_optimizer_state_name(name) && name.find("._extra_state.") == std::string::npos && !names.count(name))
        listed.push_back(name);
    if (!listed.empty()) unused = concat(listed.size(), " weight(s) that no rank's model has: ", name_list(listed));
  }
  unused = broadcast_text(world, unused, kRoot, model.device);
  if (unused.empty()) return;
  MEGATRON_CHECK(strictness != "raise_all", "checkpoint " << reader.directory() << " holds " << unused
                                                          << " (--dist-ckpt-strictness raise_all); load it into the "
                                                          << "model it was saved from, or pass log_all to ignore them");
  LOG_WARN("checkpoint " << reader.directory() << " holds " << unused
                         << "; they are not loaded (--dist-ckpt-strictness " << strictness << ")");
}

// The model's state: every parameter's slices held here, the MoE routers' expert biases
// (Megatron's persistent buffers, so --finetune loads them too) and the FP8 layers' recipe state
// (fp8_checkpoint.h; part of Megatron's model state dict as well). One progress step per parameter:
// on `given`, else on a reporter of its own ("checkpoint '<dir>' load").
void load_model_state(const CheckpointReader& reader, const CheckpointedModel& model, const std::string& load_dir,
                      const std::string& strictness, ProgressReporter* given = nullptr) {
  const std::vector<std::string> lacked = lacked_weights(reader, model.parameters);
  if (!lacked.empty()) {
    MEGATRON_CHECK(keeps_lacked_weights(strictness),
                   "checkpoint " << load_dir << " lacks " << lacked.size() << " weight(s) this model holds: "
                                 << name_list(lacked) << "; load it into the model it was saved from, or pass "
                                 << "--dist-ckpt-strictness log_unexpected to keep their initial values");
    if (strictness.starts_with("log_"))
      LOG_WARN("checkpoint " << load_dir << " lacks " << lacked.size()
                             << " weight(s) this model holds: " << name_list(lacked)
                             << "; they keep their initial values (--dist-ckpt-strictness " << strictness << ")");
  }
  std::optional<ProgressReporter> own;
  if (!given)
    own.emplace("checkpoint '" + reader.directory() + "' load", int64_t(model.parameters.params().size()), "tensors");
  ProgressReporter& progress = given ? *given : *own;
  const ParameterRegistry& registry = model.parameters;
  std::vector<Fp8ParamShard> fp8_values;  // FP8 parameters: the values read, whole, and the codes
  for (const auto& p : registry.params()) {
    if (!reader.has(p->spec.name)) {  // kept at its initial values, as checked above
      progress.advance();
      continue;
    }
    const std::optional<int64_t> stored_rows = changed_vocabulary_rows(reader, *p, model.config.true_vocab_size);
    if (registry.weights_sharded()) {
      MEGATRON_CHECK(!stored_rows, "checkpoint " << load_dir << " holds " << stored_rows.value_or(0) << " rows of "
                                                 << p->spec.name << " and this run " << p->spec.global_shape[0]
                                                 << ": moving the vocabulary padding is not built for sharded "
                                                 << "parameters (optim_grads_params); load it at the checkpoint's TP "
                                                 << "or without --use-megatron-fsdp once");
      for (const ParameterRegistry::WeightShard& shard : registry.weight_shards()) {
        if (shard.param != p->index) continue;
        for (const Parameter::FlatBox& box : p->global_boxes(shard.begin, shard.end)) {
          const int64_t at = box.flat_begin - shard.begin;
          Tensor dest = shard.values.slice(at, at + shape_numel(box.shape)).view(box.shape);
          reader.load(p->spec.name, box.global_offset, dest);
        }
      }
      progress.advance();
      continue;
    }
    if (stored_rows)
      LOG_WARN("checkpoint " << load_dir << " holds " << *stored_rows << " rows of " << p->spec.name << " and this run "
                             << p->spec.global_shape[0] << " (--true-vocab-size " << model.config.true_vocab_size
                             << " padded for another TP): padding rows are "
                             << (*stored_rows > p->spec.global_shape[0] ? "dropped" : "added as zeros"));
    // An FP8 parameter's values are cast into its codes once its layer's scale is restored.
    Tensor values =
        p->held_in_fp8() ? Tensor::empty(p->local_shape, registry.params_dtype(), p->data.device()) : p->data;
    for (auto& slice : p->global_slices_of(values)) {
      if (stored_rows)
        load_vocabulary_slice(reader, p->spec.name, *stored_rows, slice);
      else
        reader.load(p->spec.name, slice.global_offset, slice.local);
    }
    if (p->held_in_fp8()) fp8_values.push_back({p.get(), values.view({-1}), p->data.view({-1})});
    progress.advance();
  }
  if (own) own->finish();
  // Expert biases: tensors of the model state; checkpoints from before kept them in the common
  // state, written by world rank 0 alone (complete only without PP).
  const nlohmann::json& common = reader.common();
  for (moe::MoELayer* layer : model.moe_layers) {
    moe::Router& router = layer->router();
    if (router.expert_bias().empty()) continue;
    const std::string& name = router.expert_bias_name();
    if (reader.has(name)) {
      Tensor bias = Tensor::empty(reader.info(name).global_shape, DType::f64);
      reader.load(name, Shape{0}, bias);
      router.set_expert_bias(std::vector<double>(bias.data<double>(), bias.data<double>() + bias.numel()));
      continue;
    }
    MEGATRON_CHECK(common.contains("moe_expert_bias") && common.at("moe_expert_bias").contains(name),
                   "checkpoint " << load_dir << " holds no " << name << " (saved without "
                                 << "--moe-router-enable-expert-bias); drop the flag or load a checkpoint that has it");
    router.set_expert_bias(common.at("moe_expert_bias").at(name).get<std::vector<double>>());
  }
  load_fp8_recipe_state(reader, model.fp8_linears, model.config.fp8, registry, model.device);
  // Cast at the restored scales without recording an amax: the restored history already holds it
  // (a resumed distributed optimizer casts again from its masters: DistributedOptimizer::load_state).
  std::vector<const Parameter*> fp8_params;
  for (const Fp8ParamShard& s : fp8_values) fp8_params.push_back(s.param);
  cast_fp8_param_shards(fp8_values, fp8_params, nullptr, false);
}

// --keep-last-checkpoints, once a save is published: a failure to remove costs disk space, not
// the checkpoint just written, so it warns.
void remove_old_checkpoints(const std::string& save_dir, int64_t keep) {
  try {
    for (const int64_t removed : checkpointing::remove_old_checkpoints(save_dir, keep))
      LOG_INFO("  removed the checkpoint of iteration " << removed << " (--keep-last-checkpoints " << keep << ")");
  } catch (const Error& e) {
    LOG_WARN(e.what());
  }
}
}  // namespace

std::optional<CheckpointChoice> checkpoint_to_load(const std::string& load_dir, int64_t ckpt_step) {
  CheckpointChoice choice;
  if (ckpt_step > 0) {
    choice = {ckpt_step, CheckpointChoice::By::ckpt_step};
  } else {
    std::optional<int64_t> tracked;
    try {
      tracked = checkpointing::read_tracker(load_dir);
    } catch (const Error& e) {
      MEGATRON_FAIL(e.what() << "; " << other_checkpoints_advice(load_dir, 0));
    }
    const std::vector<int64_t> saved = checkpointing::list_checkpoints(load_dir);
    if (tracked)
      choice = {*tracked, CheckpointChoice::By::tracker};
    else if (!saved.empty())
      choice = {saved.back(), CheckpointChoice::By::newest_directory};
    else
      return std::nullopt;
  }
  const char* why = choice.by == CheckpointChoice::By::ckpt_step ? "chosen by --ckpt-step"
                    : choice.by == CheckpointChoice::By::tracker ? "named by its tracker"
                                                                 : "its newest, as it has no tracker";
  MEGATRON_CHECK(fs::is_directory(checkpointing::checkpoint_directory(load_dir, choice.iteration)),
                 load_dir << " has no checkpoint of iteration " << choice.iteration << " (" << why << "): no "
                          << checkpointing::checkpoint_directory(load_dir, choice.iteration) << "; "
                          << other_checkpoints_advice(load_dir, choice.iteration));
  MEGATRON_CHECK(checkpointing::checkpoint_is_complete(load_dir, choice.iteration),
                 "the checkpoint of iteration " << choice.iteration << " in " << load_dir << " (" << why
                                                << ") is incomplete or corrupt: its metadata.json is missing or fails "
                                                << "its checksum, or files it lists are missing or of another size; "
                                                << other_checkpoints_advice(load_dir, choice.iteration));
  return choice;
}

void check_checkpoint_directories(const TrainingArgs& args) {
  if (!args.load.empty())
    if (const std::optional<CheckpointChoice> choice = checkpoint_to_load(args.load, args.ckpt_step))
      describe_choice(args.load, *choice);
  if (args.save.empty() || (!args.load.empty() && same_directory(args.save, args.load))) return;
  const std::vector<int64_t> saved = checkpointing::list_checkpoints(args.save);
  const bool tracked = fs::exists(fs::path(args.save) / checkpointing::kTrackerFileName);
  MEGATRON_CHECK(saved.empty() && !tracked,
                 "--save " << args.save << " already holds checkpoints ("
                           << (saved.empty() ? std::string(checkpointing::kTrackerFileName)
                                             : "iterations " + iteration_list(saved))
                           << ") and this run does not resume from them ("
                           << (args.load.empty() ? std::string("no --load") : "--load " + args.load)
                           << "): its saves would replace them. To continue that run, pass --load " << args.save
                           << " (resume with --load and --save the same directory); to start a new run, give --save "
                           << "a new directory");
}

namespace {
// common.json's state: progress, schedule and optimizer step counts, the seed and the arguments.
nlohmann::json common_state(const TrainingArgs& args, const TrainingProgress& progress, int64_t scheduler_steps,
                            int64_t optimizer_step) {
  nlohmann::json common;
  common["iteration"] = progress.iteration;
  common["consumed_train_samples"] = progress.consumed_train_samples;
  common["consumed_valid_samples"] = progress.consumed_valid_samples;
  common["skipped_iterations"] = progress.skipped_iterations;
  common["nan_iterations"] = progress.nan_iterations;
  common["scheduler_num_steps"] = scheduler_steps;
  common["optimizer_step"] = optimizer_step;
  // Dropout masks and init are counter-based functions of the seed, so the seed and the
  // iteration are the whole RNG state.
  common["rng"] = {{"seed", args.seed}};
  nlohmann::json a = args_json(args);
  a["padded_vocab_size"] = std::to_string(args.model.padded_vocab_size);
  common["args"] = a;
  return common;
}
}  // namespace

void save_weights_checkpoint(const std::string& save_dir, const TrainingArgs& args, int64_t iteration,
                             const std::vector<std::vector<ShardedTensor>>& shards_by_writer) {
  checkpointing::CheckpointStaging staging(save_dir, iteration);
  nlohmann::json common = common_state(args, TrainingProgress{}, 0, 0);
  common[kTokenizerKey] = save_tokenizer(staging, args.tokenizer);
  std::vector<nlohmann::json> reports;
  for (size_t writer = 0; writer < shards_by_writer.size(); ++writer)
    reports.push_back(
        checkpointing::write_checkpoint_shards(staging.path(), int(writer), shards_by_writer[writer], {}));
  staging.finish(reports, common);
}

nlohmann::json training_common_state(const TrainingArgs& args, const Optimizer* optimizer,
                                     const OptimizerParamScheduler& scheduler, const TrainingProgress& progress) {
  nlohmann::json common = common_state(args, progress, scheduler.num_steps(), optimizer ? optimizer->step_count() : 0);
  // Megatron keeps the scaler in the optimizer's state dict; every rank holds the same state.
  if (optimizer && !args.no_save_optim)
    if (const GradScaler* scaler = optimizer->grad_scaler()) common["grad_scaler"] = scaler->state();
  return common;
}

TrainingCheckpointSave::TrainingCheckpointSave(const TrainingArgs& args, const CheckpointedModel& model,
                                               const Optimizer* optimizer, const OptimizerParamScheduler& scheduler,
                                               const TrainingProgress& progress, const ParallelContext& ctx,
                                               Snapshot snapshot, const checkpointing::SaveOptions& options)
    : save_dir_(args.save),
      iteration_(progress.iteration),
      keep_last_(args.keep_last_checkpoints),
      world_(ctx.world.get()),
      device_(model.device),
      options_(options),
      common_(training_common_state(args, optimizer, scheduler, progress)) {
  if (optimizer && !args.no_save_optim) optim_ = optimizer->sharded_state(Optimizer::StateCopies::one_replica);
  // One replica of the weights: DP rank 0 of each model-parallel slice, expert-DP rank 0 of each
  // EP rank for the experts.
  weights_ = model_state(model, Optimizer::StateCopies::one_replica, ctx);
  // The shards are views of the live buffers; training changes them while write() runs.
  if (snapshot == Snapshot::host_copy)
    for (auto* group : {&weights_, &optim_})
      for (ShardedTensor& t : *group)
        t.local = t.local.device().is_cuda() ? t.local.to(Device::cpu()) : t.local.clone();
  // 1. The root creates the staging directory and tells every rank where it is ("" if it failed).
  if (world_->rank() == kRoot)
    attempt([&] {
      staging_.emplace(save_dir_, iteration_);
      common_[kTokenizerKey] = save_tokenizer(*staging_, args.tokenizer);
    });
  staging_dir_ = broadcast_text(*world_, staging_ ? staging_->path() : "", kRoot, device_);
}

TrainingCheckpointSave::~TrainingCheckpointSave() = default;

void TrainingCheckpointSave::attempt(const std::function<void()>& step) {
  if (!failure_.empty()) return;
  try {
    step();
  } catch (const std::exception& e) {
    failure_ = "rank " + std::to_string(world_->rank()) + ": " + e.what();
  }
}

// 2. Every rank writes its own files; the report (or the error) goes to the root in publish().
void TrainingCheckpointSave::write() {
  attempt([&] {
    if (!staging_dir_.empty())
      report_ = checkpointing::write_checkpoint_shards(staging_dir_, world_->rank(), weights_, optim_, options_);
  });
  weights_.clear();  // the host copies are not needed any more
  optim_.clear();
}

void TrainingCheckpointSave::publish() {
  const nlohmann::json reply =
      failure_.empty() ? nlohmann::json{{"report", report_}} : nlohmann::json{{"error", failure_}};
  const std::vector<std::string> replies = gather_text(*world_, reply.dump(), kRoot, device_);
  // 3. The root checks the reports and publishes: metadata last, rename, tracker.
  if (world_->rank() == kRoot) {
    std::vector<nlohmann::json> reports;
    for (const std::string& text : replies) {
      const nlohmann::json r = nlohmann::json::parse(text);
      if (r.contains("error") && failure_.empty()) failure_ = r["error"].get<std::string>();
      if (r.contains("report")) reports.push_back(r["report"]);
    }
    attempt([&] { staging_->finish(reports, common_, options_); });
    if (failure_.empty() && keep_last_ > 0) remove_old_checkpoints(save_dir_, keep_last_);
  }
  // 4. The outcome, so that every rank returns only once the checkpoint is published, or fails
  // with the first failing rank's error. An unpublished staging directory is removed by the root.
  const std::string outcome = broadcast_text(*world_, world_->rank() == kRoot ? failure_ : "", kRoot, device_);
  MEGATRON_CHECK(outcome.empty(), "could not save the checkpoint of iteration "
                                      << iteration_ << " to " << save_dir_ << " (" << outcome
                                      << "); the latest checkpoint is still the previous one");
  LOG_INFO("  successfully saved checkpoint from iteration " << iteration_ << " to " << save_dir_);
}

void save_training_checkpoint(const TrainingArgs& args, const CheckpointedModel& model, const Optimizer* optimizer,
                              const OptimizerParamScheduler& scheduler, const TrainingProgress& progress,
                              const ParallelContext& ctx, const checkpointing::SaveOptions& options) {
  TrainingCheckpointSave save(args, model, optimizer, scheduler, progress, ctx, TrainingCheckpointSave::Snapshot::none,
                              options);
  save.write();
  save.publish();
}

void restore_training_state(const CheckpointReader& reader, const TrainingArgs& args, const CheckpointedModel& model,
                            Optimizer* optimizer, OptimizerParamScheduler* scheduler, TrainingProgress* progress) {
  const nlohmann::json& common = reader.common();
  check_same_architecture(common.at("args"), args, reader.directory());
  // Any optimizer tensor: a partial (per-rank) checkpoint of a distributed-optimizer shard may hold
  // none of the first parameter's state.
  const std::vector<std::string> names = reader.names();
  const bool restore_optimizer = optimizer && !args.finetune && !args.no_load_optim &&
                                 std::any_of(names.begin(), names.end(), is_optimizer_state_name);
  if (restore_optimizer)
    for (const auto& p : model.parameters.params())
      if (const std::optional<int64_t> stored_rows = changed_vocabulary_rows(reader, *p, args.model.true_vocab_size))
        MEGATRON_FAIL("checkpoint " << reader.directory() << " holds " << *stored_rows << " vocabulary rows of "
                                    << p->spec.name << " and this run pads to " << p->spec.global_shape[0] << " at TP "
                                    << args.parallel.tensor_model_parallel_size
                                    << ": its optimizer state does not fit; resume at the checkpoint's TP, or start "
                                    << "from its weights with --finetune or --no-load-optim");
  const std::vector<std::string> lacked = lacked_weights(reader, model.parameters);
  MEGATRON_CHECK(!restore_optimizer || lacked.empty() || !keeps_lacked_weights(args.dist_ckpt_strictness),
                 "checkpoint " << reader.directory() << " lacks " << lacked.size() << " weight(s) this model holds ("
                               << name_list(lacked) << "), kept at their initial values under --dist-ckpt-strictness "
                               << args.dist_ckpt_strictness << ", and fresh optimizer state for some parameters "
                               << "beside restored state for the others is not built: add --no-load-optim (fresh "
                               << "optimizer state for all) or --finetune");
  check_unused_weights(reader, model, args.dist_ckpt_strictness);
  load_model_state(reader, model, reader.directory(), args.dist_ckpt_strictness);

  if (optimizer) {
    if (restore_optimizer) {
      optimizer->load_state(reader);
      optimizer->set_step_count(common.at("optimizer_step").get<int64_t>());
      if (GradScaler* scaler = optimizer->grad_scaler()) {
        if (common.contains("grad_scaler"))
          scaler->load_state(common.at("grad_scaler").get<GradScalerState>());
        else
          LOG_WARN("checkpoint " << reader.directory()
                                 << " holds no loss scaler state (saved without loss scaling); the "
                                 << "loss scale starts at " << scaler->scale());
      }
    } else {
      optimizer->reload_master_from_model();
    }
  }
  if (!args.finetune) {
    progress->iteration = common.at("iteration").get<int64_t>();
    progress->consumed_train_samples = common.at("consumed_train_samples").get<int64_t>();
    progress->consumed_valid_samples = common.at("consumed_valid_samples").get<int64_t>();
    progress->skipped_iterations = common.at("skipped_iterations").get<int64_t>();
    progress->nan_iterations = common.at("nan_iterations").get<int64_t>();
    if (scheduler) scheduler->set_num_steps(common.at("scheduler_num_steps").get<int64_t>());
    if (const std::optional<int64_t> iteration = args.override_ckpt_iteration) {
      // Megatron's: the samples of `iteration` steps at this run's global batch size (the data
      // loader replays from there), whatever the checkpoint's batch size was.
      const std::string saved_batch = common.at("args").value("--global-batch-size", std::string());
      if (!saved_batch.empty() && saved_batch != std::to_string(args.global_batch_size))
        LOG_WARN("--override-ckpt-iteration " << *iteration << " counts " << args.global_batch_size
                                              << " samples an iteration, but checkpoint " << reader.directory()
                                              << " was saved at --global-batch-size " << saved_batch
                                              << ": if the iteration is in that run's units, the data resumes at "
                                              << "another sample");
      progress->iteration = *iteration;
      progress->consumed_train_samples = *iteration * args.global_batch_size;
      LOG_INFO("  --override-ckpt-iteration: starting at iteration " << *iteration << " (consumed_train_samples "
                                                                     << progress->consumed_train_samples << ")");
    }
  }
}

bool load_training_checkpoint(const TrainingArgs& args, const CheckpointedModel& model, Optimizer* optimizer,
                              OptimizerParamScheduler* scheduler, TrainingProgress* progress) {
  if (args.load.empty()) return false;
  if (!checkpoint_to_load(args.load, args.ckpt_step).has_value()) {
    check_not_one_checkpoint(args.load);
    LOG_WARN("--load " << args.load << " holds no checkpoint yet; starting from scratch");
    return false;
  }
  const CheckpointReader reader = open_chosen(args.load, args.ckpt_step, /*describe=*/false);
  restore_training_state(reader, args, model, optimizer, scheduler, progress);
  LOG_INFO(" loaded checkpoint from " << args.load << " at iteration " << reader.common().at("iteration").get<int64_t>()
                                      << (args.finetune ? " (finetune: weights only)" : ""));
  return true;
}

// As stored, but for the tokenizer flags, which name the files where training read them: the
// checkpoint's own copies are read instead.
TrainingArgs read_checkpoint_args(const std::string& load_dir, int64_t ckpt_step) {
  const std::optional<CheckpointChoice> choice = checkpoint_to_load(load_dir, ckpt_step);
  if (!choice) check_not_one_checkpoint(load_dir);
  MEGATRON_CHECK(choice.has_value(), "no checkpoint in " << load_dir << " (neither " << checkpointing::kTrackerFileName
                                                         << " nor iter_* directories); train with --save " << load_dir
                                                         << " first");
  describe_choice(load_dir, *choice);
  // The tensors are read (and verified) by load_model_weights.
  const checkpointing::CheckpointHeader header = checkpointing::read_checkpoint_header(load_dir, choice->iteration);
  const nlohmann::json& saved = header.common.at("args");
  std::map<std::string, std::string> tokenizer;
  if (const auto options = saved_tokenizer(header))
    for (const auto& [flag, value] : tokenizer_flags(*options)) tokenizer[flag] = value;
  std::vector<std::pair<std::string, std::string>> flags;
  for (const auto& [key, value] : saved.items()) {
    if (key.rfind("--", 0) != 0) continue;  // not padded_vocab_size
    const auto copy = tokenizer.find(key);
    flags.emplace_back(key, copy != tokenizer.end() ? copy->second : value.get<std::string>());
  }
  // World size is no flag: take a world the stored layout runs on, one replica of the dense
  // layers (TP x CP x PP ranks) per EP rank.
  int64_t world = 1;
  for (const char* axis : {"--tensor-model-parallel-size", "--context-parallel-size", "--pipeline-model-parallel-size",
                           "--expert-model-parallel-size"})
    if (saved.contains(axis)) world *= std::stoll(saved[axis].get<std::string>());
  return parse_training_args_from_flags(flags, world);
}

std::vector<std::pair<std::string, std::string>> saved_flags(const std::string& load_dir, int64_t ckpt_step) {
  const std::optional<CheckpointChoice> choice = checkpoint_to_load(load_dir, ckpt_step);
  if (!choice) return {};
  const nlohmann::json saved = checkpointing::read_checkpoint_header(load_dir, choice->iteration).common.at("args");
  std::vector<std::pair<std::string, std::string>> flags;
  for (const auto& [key, value] : saved.items())
    if (key.rfind("--", 0) == 0) flags.emplace_back(key, value.get<std::string>());  // not padded_vocab_size
  return flags;
}

datasets::TokenizerOptions run_tokenizer_options(const datasets::TokenizerOptions& given, const std::string& load_dir,
                                                 int64_t ckpt_step) {
  if (load_dir.empty() || datasets::tokenizer_options_complete(given)) return given;
  const std::optional<CheckpointChoice> choice = checkpoint_to_load(load_dir, ckpt_step);
  if (!choice) return given;
  const std::optional<datasets::TokenizerOptions> saved =
      saved_tokenizer(checkpointing::read_checkpoint_header(load_dir, choice->iteration));
  return saved ? datasets::complete_tokenizer_options(given, *saved) : given;
}

void load_model_weights(const std::string& load_dir, const CheckpointedModel& model, int64_t ckpt_step,
                        ProgressReporter* progress) {
  const CheckpointReader reader = open_chosen(load_dir, ckpt_step, /*describe=*/false);
  load_model_state(reader, model, load_dir, TrainingArgs{}.dist_ckpt_strictness, progress);
}

}  // namespace megatron
