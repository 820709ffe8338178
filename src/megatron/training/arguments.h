#pragma once
// Everything `megatron train` can be told, split by subsystem, with Megatron's flag names.
// One table (arguments.cpp) maps each flag and YAML key to its field, so the two never drift.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/datasets/tokenizers/tokenizer.h"
#include "megatron/optimizer/optimizer_config.h"
#include "megatron/parallel/parallel_args.h"
#include "megatron/training/batch_size_rampup.h"
#include "megatron/transformer/transformer_config.h"

namespace megatron {

struct DataArgs {
  std::vector<std::string> data_path;  // Megatron's "[w1] p1 [w2] p2 ..." list, as given
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;  // per-split blends
  std::string split = "969, 30, 1";
  bool mock_data = false;
  std::string data_cache_path;         // index cache; derived by the dataset: <prefix>/cache/...
  std::string tokenizer_type;          // NullTokenizer, ByteTokenizer, GPT2BPETokenizer, ...
  std::string tokenizer_model;         // path for tokenizers that need one
  std::string vocab_file, merge_file;  // GPT2BPETokenizer
  int64_t vocab_size = 0;              // NullTokenizer size; TikTokenizer's (unset: 131072)
  std::string tiktoken_pattern;        // TikTokenizer (datasets::TokenizerOptions)
  int64_t tiktoken_num_special_tokens = 0;
  std::vector<std::string> special_tokens;
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  int64_t num_workers = 2;                 // loader: batches prefetched = 2 * num_workers (0: none)
  std::string dataloader_type = "single";  // Megatron's samplers: single (built), cyclic, external
  double mid_level_dataset_surplus = 0.005;

  bool has_per_split_paths() const {
    return !train_data_path.empty() || !valid_data_path.empty() || !test_data_path.empty();
  }
};

// Megatron's flags that choose among its implementations (Transformer Engine or local layers,
// attention backends, kernel fusions, the process-group backend, Python's garbage collector,
// where weights are initialized, how .bin files are read, the gradients' reduction dtype), and
// --use-checkpoint-args and --auto-detect-ckpt-format, always on here. There is one
// implementation of each here, so a Megatron launch script's choices are accepted and change
// nothing; the run's log names each one given (flags_without_effect). Defaults are Megatron's.
struct MegatronImplementationChoices {
  bool use_mcore_models = false;
  std::string transformer_impl = "transformer_engine";  // transformer_engine | local
  bool use_flash_attn = false;
  std::string attention_backend = "auto";  // auto | flash | fused | unfused | local
  bool masked_softmax_fusion = true;       // each --no-*-fusion switch clears its own field
  bool bias_gelu_fusion = true;
  bool bias_swiglu_fusion = true;
  bool bias_dropout_fusion = true;
  bool apply_rope_fusion = true;
  bool no_persist_layer_norm = false;
  bool gradient_accumulation_fusion = true;
  bool attention_softmax_in_fp32 = false;
  bool cross_entropy_loss_fusion = false;
  std::string cross_entropy_fusion_impl = "native";  // native | te
  bool moe_permute_fusion = false;
  bool accumulate_allreduce_grads_in_fp32 = false;
  bool mmap_bin_files = true;                       // --no-mmap-bin-files clears it
  bool create_attention_mask_in_dataloader = true;  // --no-create-attention-mask-in-dataloader clears it
  bool auto_detect_ckpt_format = false;
  std::string ckpt_format;  // unset | torch_dist (what our checkpoints do); the other formats are refused
  std::string distributed_backend = "nccl";  // nccl | gloo
  bool manual_gc = false;
  int64_t manual_gc_interval = 0;
  int64_t empty_unused_memory_level = 0;  // 0 | 1 | 2
  bool use_cpu_initialization = false;
  bool use_checkpoint_args = false;
  bool init_model_with_meta_device = false;
  bool nccl_ub = false;  // --use-nccl-ub
  bool fsdp_double_buffer = false;
  bool fsdp_manual_registration = false;
  bool megatron_fsdp_max_pool_double_buffer = false;
  bool fsdp_db_use_persist_buf_on_alloc_fail = false;
  bool disable_gloo_process_groups = false;
  bool enable_experimental = false;
  bool disable_bf16_reduced_precision_matmul = false;
  std::string cuda_graph_impl = "none";  // none | local | transformer_engine | full_iteration
  bool save_rng = true;                  // --no-save-rng clears it
  bool load_rng = true;                  // --no-load-rng clears it
  std::string moe_router_dtype;          // unset | fp32 (the router's precision here); fp64 is refused
  std::string rope_type;                 // unset | rope (what RoPE is here); yarn is refused
  // Megatron's deprecated spellings of the position embedding, accepted where they agree with
  // --position-embedding-type (which they do not set: one flag is never rewritten from another).
  bool use_rotary_position_embeddings = false;
  bool add_position_embedding = true;  // --no-position-embedding clears it
  // Megatron's deprecated checkpoint flags, without effect there as here (--ckpt-format chooses).
  bool use_dist_ckpt = false;
  std::string dist_ckpt_format;
  bool ckpt_fully_parallel_save = false;
  // How Megatron builds and moves things, not what it computes: the same numbers either way.
  int64_t num_dataset_builder_threads = 1;
  int64_t dist_ckpt_workers = 1;
  bool ddp_pad_buckets_for_high_nccl_busbw = false;
  bool gradient_reduce_div_fusion = true;  // --no-gradient-reduce-div-fusion clears it
  bool ddp_reduce_scatter_with_fp32_accumulation = false;
  bool openai_gelu = false;  // read by no Megatron-Core layer; GELU here is its tanh form, as Megatron's fused one
  bool moe_shared_expert_overlap = false;
};

struct TrainingArgs {
  TransformerConfig model;
  ParallelArgs parallel;
  OptimizerArgs optimizer;
  DataArgs data;

  std::string model_preset;  // --model-preset NAME: starting values for model fields
  std::string window_size;   // --window-size "L,R" as given; derived into model.window_size_*
  bool bf16 = false;         // --bf16: params_dtype bf16 (derived into model.params_dtype)
  bool fp16 = false;         // --fp16: params_dtype f16 with loss scaling
  int64_t world_size = 1;    // from the launcher, not a flag
  // Megatron's --calculate-per-token-loss: each step's loss is the global batch's loss sum over its
  // loss tokens, not the mean of each micro-batch's mean.
  bool calculate_per_token_loss = false;
  int64_t micro_batch_size = 0;   // required
  int64_t global_batch_size = 0;  // derived: micro_batch_size * data_parallel_size
  int64_t train_iters = 0;        // this or train_samples is required
  int64_t train_samples = 0;      // sample-based training instead of train_iters (0: unset)
  // --rampup-batch-size START INCREMENT SAMPLES, as given (training/batch_size_rampup.h); empty: none.
  std::vector<std::string> rampup_batch_size;
  int64_t data_parallel_size = 1;  // derived: world_size / (TP * CP * PP)
  int64_t seed = 1234;
  std::string device = "auto";  // auto | cpu | cuda
  MegatronImplementationChoices implementation;

  // Data parallelism (reference/megatron-compat.md §9).
  bool use_distributed_optimizer = false;   // shard master weights and Adam state over DP
  bool overlap_grad_reduce = false;         // bucketed gradient reduction during backward
  bool overlap_param_gather = false;        // distributed optimizer: all-gather overlaps the next step
  int64_t ddp_bucket_size = 0;              // elements; 0: max(4e7, 1e6 * DP)
  double distributed_timeout_minutes = 10;  // bound on every collective wait (fractions allowed)
  // Megatron FSDP (distributed/fully_sharded.h): --use-megatron-fsdp with
  // --data-parallel-sharding-strategy no_shard | optim | optim_grads | optim_grads_params.
  bool use_megatron_fsdp = false;
  std::string data_parallel_sharding_strategy = "no_shard";

  // Megatron's --check-for-nan-in-loss-and-grad, on unless --no-check-for-nan-in-loss-and-grad:
  // a non-finite loss or gradient ends the run (training/nan_check.h).
  bool check_for_nan_in_loss_and_grad = true;

  int64_t log_interval = 100;
  int64_t eval_interval = 0;  // 0: no evaluation
  int64_t eval_iters = 100;
  std::string metrics_file;  // JSONL, one object per logged iteration (ours)
  // TensorBoard (training/tensorboard_log.h), Megatron's flags and defaults.
  std::string tensorboard_dir;  // unset: no event files
  int64_t tensorboard_log_interval = 1;
  int64_t tensorboard_queue_size = 1000;
  bool log_timers_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false;
  bool log_loss_scale_to_tensorboard = true;
  bool log_world_size_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  bool log_throughput = false;
  // --log-params-norm: the L2 norm of the parameters after the step, each once over the world, on
  // the log line, in the metrics file and in TensorBoard (training/params_norm.h).
  bool log_params_norm = false;
  // --log-num-zeros-in-grad: each step's count of zero gradient elements, each parameter's once
  // (Optimizer::count_zero_grads), on the log line, in the metrics file and in TensorBoard.
  bool log_num_zeros_in_grad = false;
  int64_t profile_ops_iteration = 0;  // print the per-op time of this iteration (0: never)
  // Megatron's --profile: the CUDA profiler's capture range (nsys --capture-range=cudaProfilerApi)
  // over iterations profile_step_start + 1 .. profile_step_end, on the global ranks in
  // profile_ranks (as given; empty: every rank).
  bool profile = false;
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::vector<std::string> profile_ranks{};
  bool profiles_rank(int rank) const;
  // Megatron's timers and straggler report (training/timing_log.h).
  int64_t timing_log_level = 0;              // 0 | 1 | 2
  std::string timing_log_option = "minmax";  // minmax | max | all
  bool log_straggler = false;
  int64_t straggler_minmax_count = 1;

  std::string save;
  std::string load;
  // Derived: the tokenizer the run uses. The tokenizer flags as given, or, where they do not name
  // everything their type reads and --load holds a checkpoint with its tokenizer, completed from
  // that checkpoint's own copy (checkpoint_io.h, run_tokenizer_options).
  datasets::TokenizerOptions tokenizer;
  int64_t save_interval = 0;
  int64_t ckpt_step = 0;  // the iteration --load reads; 0: the tracker's (Megatron treats 0 as unset too)
  // Megatron's --override-ckpt-iteration: the loaded run continues as from this iteration, its data
  // position rewound to iteration * global batch size samples (checkpoint_io.h).
  std::optional<int64_t> override_ckpt_iteration;
  bool finetune = false;
  bool no_save_optim = false;
  bool no_load_optim = false;
  // Megatron's --dist-ckpt-strictness: what a load does with weights this rank's model holds that
  // the checkpoint lacks, and (the *_all values) with weights the checkpoint holds that no rank's
  // model does (checkpoint_io.h).
  std::string dist_ckpt_strictness = "assume_ok_unexpected";
  // Megatron's non-persistent checkpoints, of type local only (training/local_checkpoint.h): each
  // rank keeps its own newest state in <dir>/rank_RRRRR, resumed only under the same layout.
  int64_t non_persistent_save_interval = 0;  // 0: none
  std::string non_persistent_ckpt_type;      // "local" ("global", "in_memory": Megatron's, not built)
  std::string non_persistent_local_ckpt_dir;
  bool async_save = false;            // write checkpoints from a background thread (training/async_checkpoint.h)
  int64_t keep_last_checkpoints = 0;  // ours: after each save, delete all but the newest K in --save (0: keep all)

  // Preemption and time limits (training/exit_conditions.h): stop early, saving first.
  int64_t exit_interval = 0;         // stop at the first iteration that is a multiple of it (0: never)
  double exit_duration_in_mins = 0;  // stop once the run has lasted this long (0: never; fractions allowed)
  bool exit_signal_handler = false;  // SIGTERM: finish the step, save, exit 0

  // The ramp --rampup-batch-size gives; nullopt without one (or when malformed: validate() says so).
  std::optional<BatchSizeRampup> batch_size_rampup() const;
  // Iterations the run trains for: train_iters, or train_samples / global_batch_size, or the
  // ramp's count (Megatron's update_train_iters).
  int64_t total_iterations() const;
  // The global batch size of the iteration that starts at `consumed_samples`.
  int64_t global_batch_size_at(int64_t consumed_samples) const;
  // Number of micro-batches per step on this DP rank.
  int64_t num_micro_batches() const { return global_batch_size / (micro_batch_size * data_parallel_size); }
  // Whether DDP releases each bucket's weights from its last backward to the optimizer's update
  // (DdpConfig::release_weights_after_backward): wherever the optimizer rewrites 16-bit weights from
  // f32 masters it keeps apart on the device; not with the precision-aware optimizer's remainders
  // (the weights are part of the masters), optimizer CPU offload, FP8 parameters or Megatron FSDP.
  bool releases_weights_after_backward() const {
    return (model.params_dtype == DType::bf16 || model.params_dtype == DType::f16) &&
           !optimizer.keeps_param_remainders(model.params_dtype) && !optimizer.optimizer_cpu_offload &&
           !model.fp8.fp8_param_gather && !use_megatron_fsdp;
  }
  // Whether the pipeline's sends and receives overlap compute: --overlap-p2p-communication (on
  // unless --no-overlap-p2p-communication) with the interleaved schedule only, as Megatron keeps it.
  bool pipeline_overlaps_p2p() const;
};

// Parses argv (after the subcommand) and any --config YAML file. Flags override YAML; YAML
// overrides presets; presets override defaults. Then derives fields and validates: every
// problem is reported in one Error (unknown flags, bad values, contradictions).
TrainingArgs parse_training_args(const std::vector<std::string>& argv, int64_t world_size = 1);

// The same as parse_training_args, from training_args_to_flags output (e.g. stored in a
// checkpoint): bool flags carry "true"/"false", list values are separated by spaces, "" is unset.
TrainingArgs parse_training_args_from_flags(const std::vector<std::pair<std::string, std::string>>& flags,
                                            int64_t world_size = 1);

// Fills what Megatron derives (done once, after all values are in): the tokenizer (completed from
// the --load checkpoint's where the flags lack any), model.vocab_size from it, model.params_dtype
// from --bf16/--fp16, derive_model_fields() (the vocabulary padded for TP), data_parallel_size =
// world_size / (TP*CP*PP), global_batch_size = mbs * DP, lr_decay_iters = train_iters and
// lr_decay_samples = train_samples when unset. What the user gave is never rewritten.
void derive_training_args(TrainingArgs& args);

// Megatron's --window-size text ("L,R" or "(L,R)") as (L, R); nullopt when it is not two integers.
std::optional<std::pair<int64_t, int64_t>> parse_window_size(const std::string& text);

// Every rule the arguments break (model rules included), one message each. Empty when valid.
std::vector<std::string> validate(const TrainingArgs& args);

// Vocabulary size (unpadded) of the tokenizer the data arguments name: --vocab-size for
// NullTokenizer, 257 for ByteTokenizer. Throws for other tokenizers or missing sizes.
int64_t tokenizer_vocab_size(const DataArgs& data);
// The tokenizer flags as given, as the tokenizer factory takes them.
datasets::TokenizerOptions tokenizer_options(const DataArgs& data);
// The flags (name, value text) that give `options`: the inverse of tokenizer_options.
std::vector<std::pair<std::string, std::string>> tokenizer_flags(const datasets::TokenizerOptions& options);

// Help text generated from the flag table.
std::string training_args_help();

// One line for each of Megatron's implementation choices given a value other than its default:
// the flag as given and why it changes nothing here (its help text).
std::vector<std::string> flags_without_effect(const TrainingArgs& args);

// The arguments as JSON-ready key/value text (for checkpoints and logs): flag name -> value,
// one pair per table row except --config (its contents are already merged in).
std::vector<std::pair<std::string, std::string>> training_args_to_flags(const TrainingArgs& args);

}  // namespace megatron
