#include "megatron/training/checkpoint_io.h"

#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "megatron/parallel/text_collectives.h"

namespace megatron {

namespace {
using checkpointing::CheckpointReader;
using checkpointing::ShardedTensor;

// The rank that stages, checks and publishes a save.
constexpr int kRoot = 0;

// Flags that fix the model's shape: a checkpoint only loads into a model that agrees on them. The
// vocabulary's padding depends on TP too (--make-vocab-size-divisible-by x TP), so the padded size
// itself is compared instead of the divisor.
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
                                          "--untie-embeddings-and-output-weights",
                                          "--max-position-embeddings"};

nlohmann::json args_json(const TrainingArgs& args) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [flag, value] : training_args_to_flags(args)) j[flag] = value;
  return j;
}

// This rank's parameter shards with their global offsets; a parameter replicated across TP is
// saved by TP rank 0 only.
std::vector<ShardedTensor> model_state(GPTModel& model) {
  std::vector<ShardedTensor> out;
  for (const auto& p : model.parameters().params())
    if (!p->is_tensor_parallel_duplicate())
      for (const auto& slice : p->global_slices())
        out.push_back({p->spec.name, p->spec.global_shape, slice.global_offset, slice.local});
  return out;
}

void check_same_architecture(const nlohmann::json& saved, const TrainingArgs& args, const std::string& dir) {
  const nlohmann::json now = args_json(args);
  for (const char* flag : kArchitectureFlags) {
    const std::string a = saved.contains(flag) ? saved[flag].get<std::string>() : "";
    const std::string b = now.contains(flag) ? now[flag].get<std::string>() : "";
    MEGATRON_CHECK(a == b, "checkpoint " << dir << " was trained with " << flag << " " << (a.empty() ? "(unset)" : a)
                                         << " but this run has " << (b.empty() ? "(unset)" : b)
                                         << "; the model shapes must match: use the checkpoint's value");
  }
  const std::string padded = std::to_string(args.model.padded_vocab_size);
  MEGATRON_CHECK(!saved.contains("padded_vocab_size") || saved["padded_vocab_size"] == padded,
                 "checkpoint " << dir << " has a padded vocabulary of " << saved["padded_vocab_size"].get<std::string>()
                               << " rows but this run pads its " << args.model.vocab_size << " tokens to " << padded
                               << " (--make-vocab-size-divisible-by " << args.model.make_vocab_size_divisible_by
                               << " x TP " << args.model.tensor_model_parallel_size
                               << "); use the same tokenizer, and a --make-vocab-size-divisible-by that gives "
                               << saved["padded_vocab_size"].get<std::string>() << " rows at this TP");
}

// The iteration a run loads from load_dir; nullopt when it holds no checkpoint.
std::optional<int64_t> iteration_to_load(const std::string& load_dir) { return checkpointing::read_tracker(load_dir); }

int64_t existing_iteration_to_load(const std::string& load_dir) {
  const auto iteration = iteration_to_load(load_dir);
  MEGATRON_CHECK(iteration.has_value(), "no checkpoint in " << load_dir << " (no latest_checkpointed_iteration.txt); "
                                                            << "train with --save " << load_dir << " first");
  return *iteration;
}

CheckpointReader open_latest(const std::string& load_dir) {
  return CheckpointReader::open(load_dir, existing_iteration_to_load(load_dir));
}

// common.json's record of the tokenizer: {"type": T, "vocab_size": N, "files": {name: flag}}.
constexpr const char* kTokenizerKey = "tokenizer";

// Copies the files the tokenizer reads into the staging directory; returns its record.
nlohmann::json save_tokenizer(checkpointing::CheckpointStaging& staging, const datasets::TokenizerOptions& options) {
  const std::unique_ptr<datasets::Tokenizer> tokenizer = datasets::make_tokenizer(options);
  nlohmann::json files = nlohmann::json::object();
  for (const datasets::TokenizerFile& file : tokenizer->files()) {
    staging.add_file(file.name, datasets::read_tokenizer_file(file.path, tokenizer->name() + " file"));
    files[file.name] = file.flag;
  }
  return {{"type", options.type}, {"vocab_size", options.vocab_size}, {"files", files}};
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
}  // namespace

void save_training_checkpoint(const TrainingArgs& args, GPTModel& model, const Optimizer* optimizer,
                              const OptimizerParamScheduler& scheduler, const TrainingProgress& progress,
                              const ParallelContext& ctx, const checkpointing::SaveOptions& options) {
  nlohmann::json common;
  common["iteration"] = progress.iteration;
  common["consumed_train_samples"] = progress.consumed_train_samples;
  common["consumed_valid_samples"] = progress.consumed_valid_samples;
  common["skipped_iterations"] = progress.skipped_iterations;
  common["nan_iterations"] = progress.nan_iterations;
  common["scheduler_num_steps"] = scheduler.num_steps();
  common["optimizer_step"] = optimizer ? optimizer->step_count() : 0;
  // Dropout masks and init are counter-based functions of the seed, so the seed and the
  // iteration are the whole RNG state.
  common["rng"] = {{"seed", args.seed}};
  nlohmann::json a = args_json(args);
  a["padded_vocab_size"] = std::to_string(args.model.padded_vocab_size);
  common["args"] = a;
  std::vector<ShardedTensor> optim;
  if (optimizer && !args.no_save_optim) {
    optim = optimizer->sharded_state();
    // Megatron keeps the scaler in the optimizer's state dict; every rank holds the same state.
    if (const GradScaler* scaler = optimizer->grad_scaler()) common["grad_scaler"] = scaler->state();
  }
  // One replica of the weights: DP rank 0 of each model-parallel slice.
  const std::vector<ShardedTensor> weights = ctx.dp_cp->rank() == 0 ? model_state(model) : std::vector<ShardedTensor>{};

  Communicator& world = *ctx.world;
  const int rank = world.rank();
  const Device device = model.device();
  std::string failure;  // this rank's error; once set, the rank only takes part in the collectives
  const auto attempt = [&](const std::function<void()>& step) {
    if (!failure.empty()) return;
    try {
      step();
    } catch (const std::exception& e) {
      failure = "rank " + std::to_string(rank) + ": " + e.what();
    }
  };
  // 1. The root creates the staging directory and tells every rank where it is ("" if it failed).
  std::optional<checkpointing::CheckpointStaging> staging;
  if (rank == kRoot)
    attempt([&] {
      staging.emplace(args.save, progress.iteration);
      common[kTokenizerKey] = save_tokenizer(*staging, args.tokenizer);
    });
  const std::string staging_dir = broadcast_text(world, staging ? staging->path() : "", kRoot, device);
  // 2. Every rank writes its own files and reports them (or its error) to the root.
  nlohmann::json reply;
  attempt([&] {
    if (!staging_dir.empty())
      reply["report"] = checkpointing::write_checkpoint_shards(staging_dir, rank, weights, optim, options);
  });
  if (!failure.empty()) reply = {{"error", failure}};
  const std::vector<std::string> replies = gather_text(world, reply.dump(), kRoot, device);
  // 3. The root checks the reports and publishes: metadata last, rename, tracker.
  if (rank == kRoot) {
    std::vector<nlohmann::json> reports;
    for (const std::string& text : replies) {
      const nlohmann::json r = nlohmann::json::parse(text);
      if (r.contains("error") && failure.empty()) failure = r["error"].get<std::string>();
      if (r.contains("report")) reports.push_back(r["report"]);
    }
    attempt([&] { staging->finish(reports, common, options); });
  }
  // 4. The outcome, so that every rank returns only once the checkpoint is published, or fails
  // with the first failing rank's error. An unpublished staging directory is removed by the root.
  const std::string outcome = broadcast_text(world, rank == kRoot ? failure : "", kRoot, device);
  MEGATRON_CHECK(outcome.empty(), "could not save the checkpoint of iteration "
                                      << progress.iteration << " to " << args.save << " (" << outcome
                                      << "); the latest checkpoint is still the previous one");
  LOG_INFO("  successfully saved checkpoint from iteration " << progress.iteration << " to " << args.save);
}

bool load_training_checkpoint(const TrainingArgs& args, GPTModel& model, Optimizer* optimizer,
                              OptimizerParamScheduler* scheduler, TrainingProgress* progress) {
  if (args.load.empty()) return false;
  if (!iteration_to_load(args.load).has_value()) {
    LOG_WARN("--load " << args.load << " holds no checkpoint yet; starting from scratch");
    return false;
  }
  const CheckpointReader reader = open_latest(args.load);
  const nlohmann::json& common = reader.common();
  check_same_architecture(common.at("args"), args, args.load);
  for (const auto& p : model.parameters().params())
    for (auto& slice : p->global_slices()) reader.load(p->spec.name, slice.global_offset, slice.local);

  const bool restore_state = !args.finetune && !args.no_load_optim;
  if (optimizer) {
    const bool has_optim = reader.has(optimizer_state_name(model.parameters().params().front()->spec.name, "exp_avg"));
    if (restore_state && has_optim) {
      optimizer->load_state(reader);
      optimizer->set_step_count(common.at("optimizer_step").get<int64_t>());
      if (GradScaler* scaler = optimizer->grad_scaler()) {
        if (common.contains("grad_scaler"))
          scaler->load_state(common.at("grad_scaler").get<GradScalerState>());
        else
          LOG_WARN("checkpoint " << args.load << " holds no loss scaler state (saved without loss scaling); the "
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
  }
  LOG_INFO(" loaded checkpoint from " << args.load << " at iteration " << common.at("iteration").get<int64_t>()
                                      << (args.finetune ? " (finetune: weights only)" : ""));
  return true;
}

// The checkpoint's own layout is left out (loading reads global slices, so any layout can), and
// the model is rebuilt at the requested TP without sequence parallelism (nor its overlap); its padded vocabulary is
// kept: it depends on the TP it was trained with.
TrainingArgs read_checkpoint_args(const std::string& load_dir, int64_t tensor_model_parallel_size) {
  // The tensors are read (and verified) by load_model_weights.
  const checkpointing::CheckpointHeader header =
      checkpointing::read_checkpoint_header(load_dir, existing_iteration_to_load(load_dir));
  const nlohmann::json& saved = header.common.at("args");
  // The stored tokenizer flags name the files where training read them; the copies are here.
  std::map<std::string, std::string> tokenizer;
  if (const auto options = saved_tokenizer(header))
    for (const auto& [flag, value] : tokenizer_flags(*options)) tokenizer[flag] = value;
  std::vector<std::pair<std::string, std::string>> flags;
  for (const auto& [flag, value] : saved.items()) {
    const bool layout = flag == "--tensor-model-parallel-size" || flag == "--pipeline-model-parallel-size" ||
                        flag == "--sequence-parallel" || flag == "--tp-comm-overlap";
    const auto copy = tokenizer.find(flag);
    if (flag.rfind("--", 0) == 0 && !layout)
      flags.emplace_back(flag, copy != tokenizer.end() ? copy->second : value.get<std::string>());
  }
  const int64_t tp = tensor_model_parallel_size;
  flags.emplace_back("--tensor-model-parallel-size", std::to_string(tp));
  TrainingArgs args;
  try {
    // The world is the TP group (DP = 1), so the training rules of the layout apply unchanged.
    args = parse_training_args_from_flags(flags, tp);
  } catch (const Error& e) {
    MEGATRON_FAIL("the model of checkpoint " << load_dir << " cannot be built at --tensor-model-parallel-size " << tp
                                             << ": " << e.what());
  }
  if (saved.contains("padded_vocab_size")) {
    const int64_t padded = std::stoll(saved["padded_vocab_size"].get<std::string>());
    MEGATRON_CHECK(padded % tp == 0, "the padded vocabulary of checkpoint "
                                         << load_dir << " (" << padded
                                         << " rows) is not divisible by --tensor-model-parallel-size " << tp
                                         << ": each TP rank holds padded_vocab_size / TP rows of the embedding and "
                                            "output layer; use a TP that divides "
                                         << padded << " (the TP it was trained with does)");
    args.model.padded_vocab_size = padded;
  }
  return args;
}

datasets::TokenizerOptions run_tokenizer_options(const datasets::TokenizerOptions& given, const std::string& load_dir) {
  if (load_dir.empty() || datasets::tokenizer_options_complete(given)) return given;
  const std::optional<int64_t> iteration = iteration_to_load(load_dir);
  if (!iteration) return given;
  const std::optional<datasets::TokenizerOptions> saved =
      saved_tokenizer(checkpointing::read_checkpoint_header(load_dir, *iteration));
  return saved ? datasets::complete_tokenizer_options(given, *saved) : given;
}

void load_model_weights(const std::string& load_dir, GPTModel& model) {
  const CheckpointReader reader = open_latest(load_dir);
  for (const auto& p : model.parameters().params())
    for (auto& slice : p->global_slices()) reader.load(p->spec.name, slice.global_offset, slice.local);
}

}  // namespace megatron
