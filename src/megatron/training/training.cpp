#include "megatron/training/training.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <memory>
#include <sstream>

#include "megatron/checkpointing/save_directory.h"
#include "megatron/core/logging.h"
#include "megatron/core/memory.h"
#include "megatron/core/strings.h"
#include "megatron/cuda_runtime/profiler_capture.h"
#include "megatron/datasets/blended_dataset.h"
#include "megatron/datasets/data_loader.h"
#include "megatron/datasets/gpt_dataset.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "megatron/distributed/ddp.h"
#include "megatron/distributed/distributed_optimizer.h"
#include "megatron/distributed/finalize_model_grads.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/models/gpt/model_chunks.h"
#include "megatron/ops/profiler.h"
#include "megatron/optimizer/lr_scheduler.h"
#include "megatron/optimizer/optimizer.h"
#include "megatron/parallel/cpu_threads.h"
#include "megatron/parallel/parallel_args.h"
#include "megatron/parallel/parallel_state.h"
#include "megatron/pipeline_parallel/schedule.h"
#include "megatron/pipeline_parallel/schedule_simulation.h"
#include "megatron/pipeline_parallel/stage_split.h"
#include "megatron/training/async_checkpoint.h"
#include "megatron/training/checkpoint_io.h"
#include "megatron/training/context_parallel.h"
#include "megatron/training/determinism.h"
#include "megatron/training/device.h"
#include "megatron/training/exit_conditions.h"
#include "megatron/training/local_checkpoint.h"
#include "megatron/training/metrics.h"
#include "megatron/training/nan_check.h"
#include "megatron/training/pipeline_step.h"
#include "megatron/training/tensorboard_log.h"
#include "megatron/training/timing_log.h"

namespace megatron {

namespace {
using Clock = std::chrono::steady_clock;

struct DataSources {
  std::unique_ptr<datasets::Tokenizer> tokenizer;
  std::unique_ptr<datasets::SampleSource> train, valid, test;
};

// Megatron's get_train_valid_test_num_samples: eval_iters global batches per evaluation, the
// validation split evaluated every eval_interval iterations and once more after training, the
// test split once after training. Evaluation (test included) is off without --eval-interval.
int64_t num_valid_samples(const TrainingArgs& args) {
  const int64_t evaluations = args.eval_interval > 0 ? args.total_iterations() / args.eval_interval + 1 : 0;
  return evaluations * args.eval_iters * args.global_batch_size;
}
int64_t num_test_samples(const TrainingArgs& args) {
  return args.eval_interval > 0 ? args.eval_iters * args.global_batch_size : 0;
}

DataSources build_data(const TrainingArgs& args) {
  DataSources d;
  d.tokenizer = datasets::make_tokenizer(args.tokenizer);
  datasets::GPTDataConfig config;
  config.data_path = args.data.data_path;
  config.train_data_path = args.data.train_data_path;
  config.valid_data_path = args.data.valid_data_path;
  config.test_data_path = args.data.test_data_path;
  config.mock_data = args.data.mock_data;
  config.split = args.data.split;
  config.data_cache_path = args.data.data_cache_path;
  config.mid_level_dataset_surplus = args.data.mid_level_dataset_surplus;
  config.seq_length = args.model.seq_length;
  config.seed = args.seed;
  config.tokenizer = {{"class", d.tokenizer->name()}, {"vocab_size", d.tokenizer->vocab_size()}};
  config.vocab_size = d.tokenizer->vocab_size();
  config.eod = d.tokenizer->eod();
  const int64_t train_samples = args.train_samples > 0 ? args.train_samples : args.train_iters * args.global_batch_size;
  d.train = datasets::build_gpt_dataset(config, datasets::Split::train, train_samples);
  MEGATRON_CHECK(d.train != nullptr, "the data flags give the training split no data (--split \""
                                         << args.data.split << "\"); give it a non-zero weight, e.g. --split 98,2,0");
  if (const int64_t n = num_valid_samples(args); n > 0) {
    d.valid = datasets::build_gpt_dataset(config, datasets::Split::valid, n);
    MEGATRON_CHECK(d.valid != nullptr, "--eval-interval "
                                           << args.eval_interval << " needs validation data but --split \""
                                           << args.data.split << "\" gives it none; "
                                           << "give it a weight (e.g. --split 98,2,0) or drop --eval-interval");
  }
  // Null when --split gives the test split no weight or no --test-data-path is given.
  if (const int64_t n = num_test_samples(args); n > 0)
    d.test = datasets::build_gpt_dataset(config, datasets::Split::test, n);
  return d;
}

std::unique_ptr<datasets::DataLoader> make_loader(const datasets::SampleSource& source, const TrainingArgs& args,
                                                  const datasets::Tokenizer& tok, int64_t dp_size, int64_t dp_rank,
                                                  int64_t consumed) {
  datasets::DataLoaderOptions o;
  o.micro_batch_size = args.micro_batch_size;
  o.data_parallel_size = dp_size;
  o.data_parallel_rank = dp_rank;
  o.consumed_samples = consumed;
  o.prefetch = 2 * args.data.num_workers;
  o.batch = {.eod = tok.eod(),
             .eod_mask_loss = args.data.eod_mask_loss,
             .reset_position_ids = args.data.reset_position_ids,
             .reset_attention_mask = args.data.reset_attention_mask};
  return std::make_unique<datasets::DataLoader>(source, o);
}

datasets::Batch next_batch(datasets::DataLoader& loader, const char* split) {
  std::optional<datasets::Batch> batch = loader.next();
  MEGATRON_CHECK(batch.has_value(), "the " << split << " data ran out at " << loader.consumed_samples()
                                           << " samples; the dataset was built for fewer samples than this run uses");
  return std::move(*batch);
}

// Sums of every rank of the data-parallel group: the global batch's loss (Megatron averages the
// reported loss over DP x CP).
// The MoE routers' statistics over a log interval: per-layer means of the losses and the extreme
// expert loads of its micro-batches. The micro-batches' statistics are read from the device at
// report(), once per log interval.
struct IntervalMoEStats {
  std::vector<moe::MoEStats> micro_batches;
  void add(const moe::MoEStats& s) {
    if (s.layers > 0) micro_batches.push_back(s);
  }
  void report(IterationStats& st) const {
    if (micro_batches.empty()) return;
    double load_balancing_loss = 0.0, z_loss = 0.0;
    int64_t min_tokens = std::numeric_limits<int64_t>::max(), max_tokens = 0;
    for (const moe::MoEStats& s : micro_batches) {
      const moe::MoEStats::Values v = s.values();
      load_balancing_loss += v.load_balancing_loss / double(s.layers);
      z_loss += v.z_loss / double(s.layers);
      min_tokens = std::min(min_tokens, v.min_tokens_per_expert);
      max_tokens = std::max(max_tokens, v.max_tokens_per_expert);
    }
    const auto n = double(micro_batches.size());
    st.load_balancing_loss = load_balancing_loss / n;
    if (micro_batches.back().per_sequence) st.load_balancing_name = "seq_load_balancing_loss";
    st.z_loss = z_loss / n;
    st.min_tokens_per_expert = min_tokens;
    st.max_tokens_per_expert = max_tokens;
  }
};

// Both sums reduced over `group` (elementwise: sum, or max where every rank holds the same value
// or none).
LossSums reduce_over(Communicator& group, const LossSums& local, Device device, ReduceOp op = ReduceOp::sum) {
  if (group.size() == 1) return local;
  Tensor host = Tensor::empty({2}, DType::f64);
  host.data<double>()[0] = local.loss_sum;
  host.data<double>()[1] = local.num_tokens;
  Tensor sums = host.to(device);
  group.all_reduce(sums, op);
  return {sums.item(0), sums.item(1)};
}

MicroBatch micro_batch_of(const datasets::Batch& b) {
  return {b.tokens, b.labels, b.loss_mask, b.position_ids, b.segment_ids};
}

// Every pipeline stage's memory, logged once from rank 0: a stage keeps the activations of up to
// min(PP - stage, micro-batches) micro-batches (1F1B's warm-up plus one; interleaved, the
// schedule's count of (micro-batch, chunk) forwards), so the first stage holds the most.
// `activation_mib`: one micro-batch through one chunk.
void log_pipeline_memory(const ParallelContext& ctx, double activation_mib, double peak_mib,
                         const pipeline_parallel::ScheduleShape& shape, Device device) {
  const int64_t p = ctx.pp->size();
  Tensor mine = Tensor::empty({2}, DType::f64);
  mine.data<double>()[0] = activation_mib;
  mine.data<double>()[1] = peak_mib;
  Tensor all = Tensor::empty({p, 2}, DType::f64, device);
  ctx.pp->all_gather(all, mine.to(device));
  const Tensor host = all.to(Device::cpu());
  std::ostringstream line;
  line << "> memory per pipeline stage (activations of one micro-batch through one chunk x those in flight, peak):";
  for (int64_t r = 0; r < p; ++r) {
    const int64_t in_flight = pipeline_parallel::peak_in_flight(pipeline_parallel::build_schedule(shape, r));
    line << (r ? "; " : " ") << "stage " << r << ": " << std::setprecision(3) << host.data<double>()[2 * r] << " MiB x "
         << in_flight << ", peak " << host.data<double>()[2 * r + 1] << " MiB";
  }
  LOG_INFO(line.str());
}

struct Evaluation {
  double loss = 0.0;
  int64_t samples = 0;  // global samples read
};

// Megatron's evaluate: eval_iters global batches from where the loader stands (validation goes
// on where the previous evaluation stopped); each data-parallel rank evaluates its slice and
// the sums are combined.
// `loader` is null on a stage that reads no data (stage_reads_data).
Evaluation evaluate(ModelChunks& model, datasets::DataLoader* loader, const char* split, const TrainingArgs& args,
                    const ParallelContext& ctx) {
  LossSums total;
  for (int64_t it = 0; it < args.eval_iters; ++it) {
    std::vector<MicroBatchRun> runs;
    for (int64_t m = 0; m < args.num_micro_batches(); ++m)
      runs.push_back(
          {.batch = loader ? context_parallel_part(micro_batch_of(next_batch(*loader, split)), *ctx.cp) : MicroBatch(),
           .fwd = {.training = false}});
    const LossSums s = pipeline_forward_backward(model, ctx, runs, pipeline_step_shape(args, /*forward_only=*/true));
    total.loss_sum += s.loss_sum;
    total.num_tokens += s.num_tokens;
  }
  total = reduce_over(*ctx.dp_cp, total, model.device());
  return {total.loss_sum / std::max(1.0, total.num_tokens), args.eval_iters * args.global_batch_size};
}

// Megatron prints the training and validation lines from the last rank (print_rank_last), which
// holds the loss under pipeline parallelism; the logger prints info from rank 0 only.
void print_from_last_rank(bool last_rank, const std::string& line) {
  if (!last_rank) return;
  const std::string text = line + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// Where an evaluation's result goes: Megatron's lines from the last rank, the metrics file and
// TensorBoard. `end_of_training`: the evaluations after the last iteration.
struct EvaluationReport {
  bool last_rank;
  MetricsFile& metrics;
  TensorBoardLog& tensorboard;

  void operator()(const char* split, const Evaluation& e, const TrainingProgress& progress, bool end_of_training) {
    const std::string where = end_of_training ? concat(" on ", split, " set") : std::string();
    print_from_last_rank(last_rank, format_validation_line(concat("iteration ", progress.iteration, where), e.loss));
    metrics.write_evaluation(split, progress.iteration, e.loss, e.samples, end_of_training);
    tensorboard.evaluation(split, progress.iteration, progress.consumed_train_samples, e.loss);
  }
};

// Megatron's training_log interval: the loss is averaged over the interval's advanced iterations,
// the time over all of them, and skipped and nan iterations are counted per interval.
struct LogInterval {
  double loss_sum = 0, tokens = 0, flops = 0, seconds = 0;
  int64_t advanced = 0, skipped = 0, nan = 0;

  void add(double loss, bool skipped_step, double step_seconds, double step_tokens, double step_flops) {
    if (skipped_step) {
      ++skipped;
      if (!std::isfinite(loss)) ++nan;
    } else {
      loss_sum += loss;
      ++advanced;
    }
    seconds += step_seconds;
    tokens += step_tokens;
    flops += step_flops;
  }
  int64_t iterations() const { return std::max<int64_t>(1, advanced + skipped); }
  // Fills the interval's fields of `st` (`last_loss`: the loss when every step was skipped) and
  // starts the next interval.
  void close(IterationStats& st, double last_loss, int64_t world_size) {
    st.elapsed_ms_per_iteration = 1e3 * seconds / double(iterations());
    st.tflops_per_gpu = flops / (seconds * 1e12) / double(world_size);
    st.tokens_per_second = tokens / seconds;
    st.lm_loss = advanced > 0 ? loss_sum / double(advanced) : last_loss;
    st.skipped_iterations = skipped;
    st.nan_iterations = nan;
    *this = LogInterval();
  }
};

bool should_save(const TrainingArgs& args, int64_t iteration) {
  return !args.save.empty() && args.save_interval > 0 && iteration % args.save_interval == 0;
}

// Overlapped pipeline sends and receives hung on NCCL (docs/PERFORMANCE.md, "Multi-GPU equivalence
// runs": rank 0's host stopped inside a CUDA call of its first forward while its first receive
// waited). The schedule's placement now keeps every posted receive behind work already posted (the
// simulation's first-use waits reproduce the hang and pass with it), but until a GPU run confirms
// it, refused on GPUs before any group or channel is built.
void check_device_supports(const TrainingArgs& args, Device device) {
  MEGATRON_CHECK(!(device.is_cuda() && args.pipeline_overlaps_p2p()),
                 "the interleaved schedule overlaps its sends and receives by default (Megatron's "
                 "--no-overlap-p2p-communication not given), which hangs on GPUs in this build (a known defect: "
                 "docs/PERFORMANCE.md, Multi-GPU equivalence runs); add --no-overlap-p2p-communication (blocking "
                 "sends and receives, groups of micro-batches at the default size)");
  MEGATRON_CHECK(!(args.profile && !device.is_cuda()),
                 "--profile starts and stops the CUDA profiler (for nsys), and this run is on the CPU: drop it, or "
                 "use --profile-ops-iteration N for the time of each op family (both backends)");
}

void check_context(const TrainingArgs& args, const ParallelContext& ctx) {
  MEGATRON_CHECK(ctx.world->size() == args.world_size, "the arguments were derived for a world of "
                                                           << args.world_size << " ranks but this run has "
                                                           << ctx.world->size()
                                                           << "; parse them with the launched world size");
  MEGATRON_CHECK(ctx.dp->size() == args.data_parallel_size &&
                     ctx.tp_size() == args.parallel.tensor_model_parallel_size &&
                     ctx.pp->size() == args.parallel.pipeline_model_parallel_size,
                 "the parallel groups (DP " << ctx.dp->size() << ", TP " << ctx.tp_size() << ", PP " << ctx.pp->size()
                                            << ") disagree with the arguments (DP " << args.data_parallel_size
                                            << ", TP " << args.parallel.tensor_model_parallel_size << ", PP "
                                            << args.parallel.pipeline_model_parallel_size
                                            << "); build the groups from the same sizes");
  const int64_t ep = ctx.ep ? ctx.ep->size() : 1;
  MEGATRON_CHECK(ep == args.parallel.expert_model_parallel_size, "the parallel groups have EP "
                                                                     << ep << " but the arguments ask for EP "
                                                                     << args.parallel.expert_model_parallel_size
                                                                     << "; build the groups from the same sizes");
  MEGATRON_CHECK(!args.pipeline_overlaps_p2p() || ctx.pp_channels.built(),
                 "the interleaved schedule overlaps its sends and receives (--no-overlap-p2p-communication not "
                 "given) but the parallel groups have no pipeline channels; build them with "
                 "ParallelOptions::pipeline_channels");
}

// Megatron's choice of scaler (optimizer/grad_scaler.h): dynamic for fp16, static with --loss-scale.
std::unique_ptr<GradScaler> grad_scaler_for(const TrainingArgs& args) {
  const OptimizerArgs& o = args.optimizer;
  return make_grad_scaler(args.model.params_dtype, float(o.loss_scale.value_or(0.0)),
                          {.initial_scale = float(o.initial_loss_scale),
                           .min_scale = float(o.min_loss_scale),
                           .growth_interval = int64_t(o.loss_scale_window),
                           .hysteresis = o.hysteresis});
}

DdpConfig ddp_config(const TrainingArgs& args, const ModelChunks& model) {
  const DataParallelSharding sharding = args.use_megatron_fsdp
                                            ? parse_data_parallel_sharding(args.data_parallel_sharding_strategy)
                                            : DataParallelSharding::no_shard;
  return {.overlap_grad_reduce = args.overlap_grad_reduce,
          .use_distributed_optimizer = args.use_distributed_optimizer,
          .overlap_param_gather = args.overlap_param_gather,
          .bucket_size = args.ddp_bucket_size,
          .param_chunks = model.param_chunks(),
          .shard_grads =
              sharding == DataParallelSharding::optim_grads || sharding == DataParallelSharding::optim_grads_params,
          .shard_params = sharding == DataParallelSharding::optim_grads_params,
          .release_weights_after_backward = args.releases_weights_after_backward()};
}

// The dataset index is built (and cached) by rank 0 first, then read by the others, as Megatron
// does, so the ranks neither race to write the cache nor each build it.
DataSources build_data_in_turn(const TrainingArgs& args, Communicator& world) {
  DataSources data;
  if (world.rank() == 0) data = build_data(args);
  world.barrier();
  if (world.rank() != 0) data = build_data(args);
  return data;
}
// Every directory this run writes can be written, before any work: --save and --load, --save by
// every rank (each writes its own files there), the local checkpoint directory.
void check_run_directories(const TrainingArgs& args, int rank) {
  check_checkpoint_directories(args);
  if (!args.save.empty()) checkpointing::prepare_save_directory(args.save, concat(".write_probe_rank_", rank));
  check_local_checkpoint_directory(args, rank);
}

// The optimizer's state on this rank, MiB.
double state_mib(const Optimizer& optimizer) { return double(optimizer.state_bytes()) / (1024.0 * 1024.0); }

// The model's shape, as it is built.
void log_model(const TransformerConfig& config) {
  const int64_t n_params = num_parameters(config);
  LOG_INFO("> building GPT model: " << config.num_layers << " layers, hidden " << config.hidden_size << ", " << n_params
                                    << " parameters, padded vocab " << config.padded_vocab_size << ", params dtype "
                                    << dtype_name(config.params_dtype));
}

// The parallel layout and the optimizer's memory per rank, once the optimizer is built.
void log_layout(const TrainingArgs& args, const ParallelContext& ctx, const DistributedDataParallel& ddp,
                const pipeline_parallel::PipelineSplit& split, const Optimizer& optimizer, Device device) {
  const int64_t dp_size = ctx.dp->size();
  if (ctx.tp_size() > 1)
    LOG_INFO("> tensor parallel: " << ctx.tp_size() << " ranks"
                                   << (ctx.sequence_parallel() ? ", sequence parallel" : "")
                                   << (ctx.tp_comm_overlap() ? ", communication overlapped with GEMMs" : "")
                                   << (device.is_cuda() && std::getenv("CUDA_DEVICE_MAX_CONNECTIONS") != nullptr
                                           ? concat(", CUDA_DEVICE_MAX_CONNECTIONS=",
                                                    std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"))
                                           : std::string()));
  if (ctx.pp->size() > 1) {
    std::string layers;
    for (int64_t n : split.layers_per_stage) layers += concat(layers.empty() ? "" : ", ", n);
    LOG_INFO("> pipeline parallel: " << ctx.pp->size() << " stages ("
                                     << (split.virtual_stages > 1
                                             ? concat("interleaved, ", split.virtual_stages, " chunks each")
                                             : std::string("1F1B"))
                                     << ") holding " << layers << " layers");
  }
  if (dp_size > 1)
    LOG_INFO("> data parallel: " << dp_size << " ranks, " << ddp.layout().buckets.size() << " gradient bucket(s)"
                                 << (args.use_distributed_optimizer ? ", distributed optimizer" : "")
                                 << (args.use_megatron_fsdp
                                         ? concat(", Megatron FSDP sharding ", args.data_parallel_sharding_strategy)
                                         : std::string()));
  const HeldBytes held = ddp.held_bytes();
  LOG_INFO("> weights and main gradients: "
           << std::fixed << std::setprecision(1) << double(held.weights) / (1024.0 * 1024.0) << " MiB and "
           << double(held.grads) / (1024.0 * 1024.0) << " MiB held per rank"
           << (ddp.config().shard_grads ? " between uses (this rank's shards)"
                                        : " (the gradients from the backward to the step)")
           << (ddp.config().release_weights_after_backward
                   ? "; each bucket's weights released from its last backward to the optimizer's update"
                   : ""));
  int64_t fp8_weights = 0, fp8_elements = 0;
  for (const auto& p : ddp.registry().params())
    if (p->held_in_fp8()) {
      ++fp8_weights;
      fp8_elements += p->data.numel();
    }
  if (fp8_weights > 0)
    LOG_INFO("> FP8 parameters (--fp8-param-gather): " << fp8_weights << " weights, " << fp8_elements
                                                       << " elements, held as FP8 codes cast from the masters after "
                                                       << "each step and gathered in FP8");
  LOG_INFO("> optimizer state: " << std::fixed << std::setprecision(1) << state_mib(optimizer) << " MiB per rank ("
                                 << (args.use_distributed_optimizer ? "this rank's shard of the " : "")
                                 << "master weights"
                                 << (args.optimizer.keeps_param_remainders(args.model.params_dtype)
                                         ? " as remainders beside the bf16 weights"
                                         : "")
                                 << " and Adam moments)");
  if (optimizer.host_state_bytes() > 0)
    LOG_INFO("> optimizer CPU offload: " << std::fixed << std::setprecision(1)
                                         << double(optimizer.host_state_bytes()) / (1024.0 * 1024.0)
                                         << " MiB of it in host memory, updated on the CPU cores");
}

std::unique_ptr<Optimizer> make_optimizer(const TrainingArgs& args, ModelChunks& model, DistributedDataParallel& ddp,
                                          const ParallelContext& ctx) {
  const AdamWHyper hyper{args.optimizer.adam_beta1, args.optimizer.adam_beta2, args.optimizer.adam_eps,
                         args.optimizer.clip_grad, args.optimizer.decays_qk_layernorm()};
  const AdamWStateOptions state_options{
      .cpu_offload = args.optimizer.optimizer_cpu_offload,
      .offload_fraction = args.optimizer.optimizer_offload_fraction,
      .store_param_remainders = args.optimizer.keeps_param_remainders(args.model.params_dtype)};
  std::unique_ptr<Optimizer> optimizer;
  if (args.use_distributed_optimizer)
    optimizer = std::make_unique<DistributedOptimizer>(ddp, ctx, hyper, grad_scaler_for(args), state_options);
  else
    optimizer = std::make_unique<AdamWOptimizer>(model.parameters(), ctx, hyper, grad_scaler_for(args), state_options);
  optimizer->set_log_num_zeros_in_grad(args.log_num_zeros_in_grad);
  return optimizer;
}

// What one training iteration leaves for its logging.
struct IterationResult {
  double loss = 0;
  OptimizerStepResult step;
  int64_t batch_size = 0, micro_batches = 0;
  double seconds = 0;
};

// What pretrain sets up before the loop: the data, the model with its DDP and optimizer, the
// schedule and the progress loaded from a checkpoint.
struct TrainingSetUp {
  const TrainingArgs& args;
  const ParallelContext& ctx;
  Device device;
  const DataSources& data;
  ModelChunks& model;
  DistributedDataParallel& ddp;
  Optimizer* optimizer;
  OptimizerParamScheduler& scheduler;
  TrainingProgress& progress;
};

// The training loop over what pretrain set up: each iteration (train_step), its log (record), the
// evaluation, save and exit decision after it (evaluate_save_and_decide_exit), and the evaluations
// after the last iteration (evaluate_after_training). Owns the loaders, which start where the
// loaded checkpoint left off, and where the run is reported.
struct TrainingLoop : TrainingSetUp {
  explicit TrainingLoop(const TrainingSetUp& set_up);
  IterationResult train_step();
  void record(const IterationResult& it);
  // --log-params-norm's value when `logged` (collective: every rank calls it alike).
  std::optional<double> params_norm(bool logged);
  std::optional<EarlyExit> evaluate_save_and_decide_exit(const ExitConditions& exit_conditions);
  void evaluate_after_training();
  // A checkpoint of the state now (asynchronous with --async-save), timed.
  void save();

  const bool last_rank;
  const int64_t dp_size, dp_rank;
  const double optimizer_state_mib;
  const bool reads_data;  // null loaders where not
  const std::unique_ptr<datasets::DataLoader> train_loader, valid_loader, test_loader;
  MetricsFile metrics;
  TensorBoardLog tensorboard;
  EvaluationReport report_evaluation;
  TimingLog timers;
  TrainingSummary summary;
  LogInterval interval;
  IntervalMoEStats interval_moe;
  const int64_t first_iteration;
  AsyncCheckpointSaver async_saver;
  const NanCheck nan_check;
  const int64_t train_iters;
};

TrainingLoop::TrainingLoop(const TrainingSetUp& set_up)
    : TrainingSetUp(set_up),
      last_rank(ctx.world->rank() == ctx.world->size() - 1),
      dp_size(ctx.dp->size()),
      dp_rank(ctx.dp->rank()),
      optimizer_state_mib(state_mib(*optimizer)),
      // Stages between the first and the last read no data (unless document masking needs it).
      reads_data(stage_reads_data(model, args.data.reset_attention_mask)),
      train_loader(reads_data ? make_loader(*data.train, args, *data.tokenizer, dp_size, dp_rank,
                                            progress.consumed_train_samples)
                              : nullptr),
      valid_loader(data.valid && reads_data ? make_loader(*data.valid, args, *data.tokenizer, dp_size, dp_rank,
                                                          progress.consumed_valid_samples)
                                            : nullptr),
      test_loader(data.test && reads_data ? make_loader(*data.test, args, *data.tokenizer, dp_size, dp_rank, 0)
                                          : nullptr),
      metrics(last_rank ? MetricsFile(args.metrics_file) : MetricsFile()),
      tensorboard(args, last_rank),
      report_evaluation{last_rank, metrics, tensorboard},
      timers(args, *ctx.world, device),
      first_iteration(progress.iteration),
      async_saver(*ctx.world, device),
      nan_check(args),
      train_iters(args.total_iterations()) {}

void TrainingLoop::save() {
  ddp.finish_param_gather();
  timers.start_save();
  if (args.async_save)
    async_saver.start([&] {
      return std::make_unique<TrainingCheckpointSave>(args, model, optimizer, scheduler, progress, ctx,
                                                      TrainingCheckpointSave::Snapshot::host_copy);
    });
  else
    save_training_checkpoint(args, model, optimizer, scheduler, progress, ctx);
  timers.log_save();
}

IterationResult TrainingLoop::train_step() {
  // Megatron's --profile: the capture range opens after profile_step_start iterations and closes
  // after profile_step_end (the step below completes one).
  const bool captures = args.profile && args.profiles_rank(ctx.world->rank());
  if (captures && progress.iteration == args.profile_step_start) {
    cuda::profiler_capture_start();
    LOG_INFO("> --profile: the CUDA profiler started after iteration " << progress.iteration);
  }
  const bool profile = progress.iteration + 1 == args.profile_ops_iteration;
  if (profile) ops::OpProfiler::instance().start();
  const auto t0 = Clock::now();
  // With --rampup-batch-size the batch grows with the consumed samples.
  const int64_t batch_size = args.global_batch_size_at(progress.consumed_train_samples);
  const int64_t micro = batch_size / (args.micro_batch_size * dp_size);
  const int64_t micro_batches_before = progress.consumed_train_samples / (args.micro_batch_size * dp_size);
  ddp.zero_grad();
  std::vector<MicroBatchRun> runs;
  std::vector<double> loss_tokens;  // each micro-batch's, over its whole sequences
  timers.start("forward-backward");
  for (int64_t m = 0; m < micro; ++m) {
    timers.start("batch-generator");
    const MicroBatch batch = train_loader ? micro_batch_of(next_batch(*train_loader, "training")) : MicroBatch();
    timers.stop("batch-generator");
    double tokens = 0;
    if (batch.loss_mask.defined())
      for (float v : batch.loss_mask.to_vector()) tokens += v;
    loss_tokens.push_back(tokens);
    // The micro-batch's index in the global batch, so dropout masks do not depend on the DP size.
    const ForwardContext fwd{.training = true,
                             .seed = uint64_t(args.seed),
                             .step = uint64_t((micro_batches_before + m) * dp_size + dp_rank)};
    runs.push_back({.batch = context_parallel_part(batch, *ctx.cp), .fwd = fwd});
  }
  // The loss gradient's scale, times the loss scale (1 without loss scaling). Megatron's default
  // loss: the mean over each micro-batch's tokens, averaged over micro-batches. Under context
  // parallelism `tokens` counts the whole sequences and the gradients are averaged over DP x CP, so
  // each CP rank's share is scaled by CP (Megatron's loss * cp_size). --calculate-per-token-loss:
  // the global batch's loss sum over its number of loss tokens (Megatron divides the DP-summed
  // gradients by it; here every micro-batch, and the MoE aux loss, is scaled by DP x CP over it,
  // which the DP x CP average undoes).
  const double scale_of_loss = optimizer->loss_scale(), cp_size = double(ctx.cp->size());
  if (args.calculate_per_token_loss) {
    double local = 0.0;
    for (double t : loss_tokens) local += t;
    // Every stage that reads data counts the same tokens, the others none; the MoE layers of every
    // stage need the count for their aux loss.
    const double global =
        reduce_over(*ctx.pp, reduce_over(*ctx.dp, {.num_tokens = local}, device), device, ReduceOp::max).num_tokens;
    const double scale = global > 0 ? scale_of_loss * double(dp_size) * cp_size / global : 0.0;
    for (MicroBatchRun& run : runs) run.loss_grad_scale = run.fwd.aux_loss_grad_scale = float(scale);
  } else {
    for (size_t m = 0; m < runs.size(); ++m) {
      const double tokens = loss_tokens[m];
      runs[m].loss_grad_scale = tokens > 0 ? float(scale_of_loss * cp_size / (tokens * double(micro))) : 0.0f;
      runs[m].fwd.aux_loss_grad_scale = float(scale_of_loss / double(micro));
    }
  }
  // With --overlap-param-gather the forward waits for each bucket of the previous step's
  // parameter all-gather just before it reads it (DDP listens to the model's notifications).
  const PipelineHooks hooks{.before_forward = [&](int64_t) { timers.start("forward-compute"); },
                            .after_backward = [&](int64_t) { timers.stop("backward-compute"); },
                            .on_loss =
                                [&](int64_t, const LossSums& s) {
                                  nan_check.micro_batch_loss(s.loss_sum, s.num_tokens, progress.iteration + 1,
                                                             ctx.world->rank());
                                },
                            .before_backward =
                                [&](int64_t m) {
                                  ddp.set_last_micro_batch(m + 1 == micro);
                                  timers.start("backward-compute");
                                },
                            .after_forward =
                                [&](int64_t, const GPTModel& chunk) {
                                  timers.stop("forward-compute");
                                  interval_moe.add(chunk.moe_stats());
                                }};
  LossSums iteration_sums =
      pipeline_forward_backward(model, ctx, runs, pipeline_step_shape(args, /*forward_only=*/false), hooks);
  timers.stop("forward-backward");
  timers.start("all-grads-sync");
  // The DP reduction, then (as Megatron) the SP norms' sum over TP and the tied embedding's over
  // the embedding group.
  finalize_model_grads(ddp);
  timers.stop("all-grads-sync");
  model.update_expert_bias();                        // Megatron's aux-loss-free balancing, once per step
  model.update_fp8_scales();                         // the delayed FP8 recipe's amax histories and scales
  const float loss_scale = optimizer->loss_scale();  // the step may change it
  timers.start("optimizer");
  const std::optional<double> decoupled_lr = scheduler.decoupled_lr();
  const OptimizerStepResult step =
      optimizer->step({float(scheduler.lr()), float(scheduler.weight_decay()),
                       decoupled_lr ? std::optional<float>(float(*decoupled_lr)) : std::nullopt});
  timers.stop("optimizer");
  nan_check.optimizer_step(step, loss_scale, progress.iteration + 1);
  if (profile) {
    const ops::OpProfile timings = ops::OpProfiler::instance().stop();
    const double step_ms = 1e3 * std::chrono::duration<double>(Clock::now() - t0).count();
    LOG_INFO("per-op time of iteration " << progress.iteration + 1 << ":\n"
                                         << ops::format_op_profile(timings, step_ms));
  }
  iteration_sums = reduce_over(*ctx.dp_cp, iteration_sums, device);
  const double loss = iteration_sums.loss_sum / std::max(1.0, iteration_sums.num_tokens);
  ++progress.iteration;
  progress.consumed_train_samples += batch_size;
  // Megatron advances the iteration and the consumed samples on a skipped step, but neither the
  // scheduler nor the optimizer's step count (the LR of the next step is the skipped one's).
  if (step.skipped) {
    ++progress.skipped_iterations;
    if (!std::isfinite(loss)) ++progress.nan_iterations;
  } else {
    scheduler.step(batch_size);
  }
  if (captures && progress.iteration == args.profile_step_end) {
    cuda::profiler_capture_stop();
    LOG_INFO("> --profile: the CUDA profiler stopped after iteration " << progress.iteration);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return {loss, step, batch_size, micro, seconds};
}

// --log-params-norm: the parameters' norm after the step (Megatron's calc_params_l2_norm), on the
// iterations that print or write it. The model's weights as this rank holds them: the compute copy
// (bf16 in a bf16 run, where Megatron reads the f32 masters; the per-element roundings, independent,
// are expected, not measured, to move the norm far less than the log's printed precision), each
// parameter once over the world; an overlapped parameter all-gather is finished first.
std::optional<double> TrainingLoop::params_norm(bool logged) {
  if (!args.log_params_norm || !logged) return std::nullopt;
  ddp.finish_param_gather();
  return norm_of_each_parameter_once(model.parameters(), ctx,
                                     [](const Parameter& p) -> const Tensor& { return p.data; });
}

void TrainingLoop::record(const IterationResult& it) {
  const HeldBytes held = ddp.held_bytes();
  summary.weight_bytes = held.weights;
  summary.peak_weight_bytes = held.weights_peak;
  summary.grad_bytes = held.grads;
  summary.peak_grad_bytes = held.grads_peak;
  summary.optimizer_state_bytes = int64_t(optimizer->state_bytes());
  summary.train_losses.push_back(it.loss);
  summary.grad_norms.push_back(it.step.grad_norm.value_or(std::numeric_limits<double>::quiet_NaN()));
  summary.loss_scales.push_back(optimizer->loss_scale());
  summary.skipped.push_back(it.step.skipped);
  ++summary.iterations_run;
  interval.add(it.loss, it.step.skipped, it.seconds, double(it.batch_size * args.model.seq_length),
               num_floating_point_operations(args.model, it.batch_size));

  const bool first = progress.iteration == first_iteration + 1;
  const bool log_line = first || progress.iteration % args.log_interval == 0 || progress.iteration == train_iters;
  const bool tensorboard_now = !args.tensorboard_dir.empty() && progress.iteration % args.tensorboard_log_interval == 0;
  const std::optional<double> norm = params_norm(log_line || tensorboard_now);
  if (norm) summary.params_norms.push_back(*norm);
  if (it.step.num_zeros_in_grad) summary.num_zeros_in_grad.push_back(*it.step.num_zeros_in_grad);
  tensorboard.iteration({.iteration = progress.iteration,
                         .consumed_samples = progress.consumed_train_samples,
                         .learning_rate = scheduler.lr(),
                         .batch_size = it.batch_size,
                         .lm_loss = it.loss,
                         .loss_scale = optimizer->loss_scale(),
                         .grad_norm = it.step.grad_norm,
                         .num_zeros_in_grad = it.step.num_zeros_in_grad,
                         .params_norm = norm,
                         .world_size = ctx.world->size(),
                         .memory = memory_stats(device)});
  const double activation_mib = double(model.activation_bytes()) / (1024.0 * 1024.0);  // all chunks
  if (first)
    LOG_INFO("> activation memory per micro-batch (saved for backward, per rank): " << activation_mib << " MiB");
  if (first && ctx.pp->size() > 1)
    log_pipeline_memory(ctx, activation_mib / double(model.size()), peak_memory_mib(device),
                        {.pipeline_size = ctx.pp->size(),
                         .virtual_stages = model.size(),
                         .microbatches = it.micro_batches,
                         .microbatch_group_size = pipeline_step_shape(args, false).microbatch_group_size,
                         .overlap_p2p = args.pipeline_overlaps_p2p()},
                        device);
  if (log_line) {
    const int64_t iters_in_interval = interval.iterations();
    IterationStats st;
    st.iteration = progress.iteration;
    st.train_iters = train_iters;
    st.consumed_samples = progress.consumed_train_samples;
    st.learning_rate = scheduler.lr();
    st.global_batch_size = it.batch_size;
    st.loss_scale = optimizer->loss_scale();  // after this step's update, as Megatron logs it
    st.grad_norm = it.step.grad_norm;
    st.num_zeros_in_grad = it.step.num_zeros_in_grad;
    st.params_norm = norm;
    st.peak_memory_mib = peak_memory_mib(device);
    st.reserved_memory_mib = double(memory_stats(device).reserved_bytes) / (1024.0 * 1024.0);
    interval.close(st, it.loss, ctx.world->size());
    st.optimizer_state_mib = optimizer_state_mib;
    st.activation_memory_mib = activation_mib;
    interval_moe.report(st);
    interval_moe = {};
    print_from_last_rank(last_rank, format_training_log_line(st));
    metrics.write_training(st);
    tensorboard.interval(st);
    tensorboard.timers(timers.log(st.iteration, iters_in_interval), st.iteration);
  }
}

std::optional<EarlyExit> TrainingLoop::evaluate_save_and_decide_exit(const ExitConditions& exit_conditions) {
  if (data.valid && progress.iteration % args.eval_interval == 0) {
    ddp.finish_param_gather();
    const Evaluation valid = evaluate(model, valid_loader.get(), "validation", args, ctx);
    nan_check.validation_loss(valid.loss, progress.iteration);
    progress.consumed_valid_samples += valid.samples;
    summary.valid_losses.push_back(valid.loss);
    report_evaluation("validation", valid, progress, false);
  }
  const bool save_now =
      should_save(args, progress.iteration) || (!args.save.empty() && progress.iteration == train_iters);
  // Megatron's checkpoint_and_decide_exit: after the evaluation, one save for the regular
  // interval and an early exit alike.
  const std::optional<EarlyExit> exit = exit_conditions.check(progress.iteration, *ctx.world, device);
  async_saver.maybe_finalize(/*blocking=*/false);
  if (save_now || (exit && !args.save.empty())) {
    save();
  } else if (args.non_persistent_save_interval > 0 && progress.iteration % args.non_persistent_save_interval == 0) {
    ddp.finish_param_gather();
    save_local_checkpoint(args, model, optimizer, scheduler, progress, ctx);
  }
  if (exit) {
    async_saver.maybe_finalize(/*blocking=*/true);
    LOG_INFO("[" << exit->message << "] datetime: " << timestamp_now());
    summary.early_exit = exit;
  }
  return exit;
}

void TrainingLoop::evaluate_after_training() {
  async_saver.maybe_finalize(/*blocking=*/true);
  ddp.finish_param_gather();
  // Megatron's pretrain after the loop (and after the last save): the validation split once more
  // (its sample count planned for this "+1" evaluation), then the test split from its start.
  if (data.valid) {
    const Evaluation valid = evaluate(model, valid_loader.get(), "validation", args, ctx);
    nan_check.validation_loss(valid.loss, progress.iteration);
    summary.end_valid_loss = valid.loss;
    report_evaluation("validation", valid, progress, true);
  }
  if (data.test) {
    const Evaluation test = evaluate(model, test_loader.get(), "test", args, ctx);
    nan_check.validation_loss(test.loss, progress.iteration);
    summary.test_loss = test.loss;
    summary.test_samples = test.samples;
    report_evaluation("test", test, progress, true);
  }
}
}  // namespace

TrainingSummary pretrain(const TrainingArgs& args, const std::shared_ptr<MpiRuntime>& mpi) {
  const ScopedLogRank log_rank(mpi ? mpi->process().rank : 0);
  configure_cpu_threads(mpi.get());
  if (args.model.deterministic_mode) check_deterministic_environment();
  const Device device = select_device(args.device, mpi ? mpi->process().local_rank : 0, args.model.fp8.enabled(),
                                      args.model.fp8.enabled() && args.model.fp8.fp8_recipe == "blockwise");
  check_device_supports(args, device);
  const ParallelState state =
      initialize_parallel(args.parallel.sizes(), {.device = device,
                                                  .timeout_seconds = 60.0 * args.distributed_timeout_minutes,
                                                  .tied_embeddings = !args.model.untie_embeddings_and_output_weights,
                                                  .pipeline_channels = args.pipeline_overlaps_p2p(),
                                                  .mpi = mpi});
  return pretrain(args, state.ctx, device);
}

TrainingSummary pretrain(const TrainingArgs& args, const ParallelContext& groups, Device device) {
  const ExitConditions exit_conditions(args, Clock::now());
  check_device_supports(args, device);
  check_context(args, groups);
  const ScopedLogRank log_rank(groups.world->rank());
  check_run_directories(args, groups.world->rank());
  const ParallelContext ctx = model_context(groups, args.parallel);
  const DataSources data = build_data_in_turn(args, *ctx.world);

  const pipeline_parallel::PipelineSplit split =
      pipeline_parallel::pipeline_split(args.parallel, args.model.num_layers);
  ModelChunks model(args.model, ctx, device, split);
  model.parameters().initialize(uint64_t(args.seed), args.model.init_method_xavier_uniform);
  for (const std::string& line : flags_without_effect(args)) LOG_INFO("> " << line);
  if (args.model.deterministic_mode)
    LOG_INFO("> deterministic mode: the embedding and attention backwards sum in a fixed order"
             << (std::getenv("NCCL_ALGO") != nullptr ? concat(", NCCL_ALGO=", std::getenv("NCCL_ALGO")) : ""));
  log_model(args.model);
  DistributedDataParallel ddp(model.parameters(), ctx, ddp_config(args, model));
  const std::unique_ptr<Optimizer> optimizer = make_optimizer(args, model, ddp, ctx);
  log_layout(args, ctx, ddp, split, *optimizer, device);
  OptimizerParamScheduler scheduler(args.optimizer, args.train_iters, args.global_batch_size);
  TrainingProgress progress;
  if (!load_local_checkpoint(args, model, optimizer.get(), &scheduler, &progress, ctx))
    load_training_checkpoint(args, model, optimizer.get(), &scheduler, &progress);

  TrainingLoop loop({args, ctx, device, data, model, ddp, optimizer.get(), scheduler, progress});
  while (progress.iteration < loop.train_iters) {
    loop.record(loop.train_step());
    // As Megatron's sys.exit: no evaluation after training.
    if (loop.evaluate_save_and_decide_exit(exit_conditions)) return loop.summary;
  }
  loop.evaluate_after_training();
  return loop.summary;
}

}  // namespace megatron
