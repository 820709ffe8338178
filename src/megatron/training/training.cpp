#include "megatron/training/training.h"

#include <chrono>
#include <cmath>
#include <memory>

#include "megatron/core/logging.h"
#include "megatron/core/memory.h"
#include "megatron/datasets/blended_dataset.h"
#include "megatron/datasets/data_loader.h"
#include "megatron/datasets/gpt_dataset.h"
#include "megatron/datasets/tokenizers/tokenizer.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/optimizer/lr_scheduler.h"
#include "megatron/optimizer/optimizer.h"
#include "megatron/training/checkpoint_io.h"
#include "megatron/training/device.h"
#include "megatron/training/metrics.h"

namespace megatron {

namespace {
using Clock = std::chrono::steady_clock;

struct DataSources {
  std::unique_ptr<datasets::Tokenizer> tokenizer;
  std::unique_ptr<datasets::SampleSource> train, valid;
};

// Megatron's training.py: how many samples each split must provide for this run.
int64_t num_valid_samples(const TrainingArgs& args) {
  const int64_t evaluations = args.eval_interval > 0 ? args.train_iters / args.eval_interval + 1 : 0;
  return evaluations * args.eval_iters * args.global_batch_size;
}

DataSources build_data(const TrainingArgs& args) {
  DataSources d;
  d.tokenizer = datasets::make_tokenizer(tokenizer_options(args.data));
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
  d.train = datasets::build_gpt_dataset(config, datasets::Split::train, args.train_iters * args.global_batch_size);
  MEGATRON_CHECK(d.train != nullptr, "the data flags give the training split no data (--split \""
                                         << args.data.split << "\"); give it a non-zero weight, e.g. --split 98,2,0");
  if (const int64_t n = num_valid_samples(args); n > 0) {
    d.valid = datasets::build_gpt_dataset(config, datasets::Split::valid, n);
    MEGATRON_CHECK(d.valid != nullptr, "--eval-interval "
                                           << args.eval_interval << " needs validation data but --split \""
                                           << args.data.split << "\" gives it none; "
                                           << "give it a weight (e.g. --split 98,2,0) or drop --eval-interval");
  }
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

// Validation: eval_iters global batches, continuing where the previous evaluation stopped.
double evaluate(GPTModel& model, datasets::DataLoader& valid, const TrainingArgs& args, TrainingProgress& progress) {
  LossSums total;
  for (int64_t it = 0; it < args.eval_iters; ++it) {
    for (int64_t m = 0; m < args.num_micro_batches(); ++m) {
      const datasets::Batch batch = next_batch(valid, "validation");
      const LossSums s = model.evaluate(batch.tokens, batch.labels, batch.loss_mask, batch.position_ids);
      total.loss_sum += s.loss_sum;
      total.num_tokens += s.num_tokens;
    }
    progress.consumed_valid_samples += args.global_batch_size;
  }
  return total.loss_sum / std::max(1.0, total.num_tokens);
}

bool should_save(const TrainingArgs& args, int64_t iteration) {
  return !args.save.empty() && args.save_interval > 0 && iteration % args.save_interval == 0;
}
}  // namespace

TrainingSummary pretrain(const TrainingArgs& args) {
  ParallelContext ctx = ParallelContext::single_process();
  const Device device = select_device(args.device, 0);
  DataSources data = build_data(args);

  TransformerConfig config = args.model;
  GPTModel model(config, ctx, device);
  model.parameters().initialize(uint64_t(args.seed));
  const int64_t n_params = num_parameters(config);
  LOG_INFO("> building GPT model: " << config.num_layers << " layers, hidden " << config.hidden_size << ", " << n_params
                                    << " parameters, padded vocab " << config.padded_vocab_size << ", params dtype "
                                    << dtype_name(config.params_dtype));

  AdamWOptimizer optimizer(
      model.parameters(), ctx,
      {args.optimizer.adam_beta1, args.optimizer.adam_beta2, args.optimizer.adam_eps, args.optimizer.clip_grad});
  OptimizerParamScheduler scheduler(args.optimizer, args.train_iters, args.global_batch_size);
  TrainingProgress progress;
  load_training_checkpoint(args, model, &optimizer, &scheduler, &progress);

  const auto train_loader = make_loader(*data.train, args, *data.tokenizer, args.data_parallel_size, ctx.dp->rank(),
                                        progress.consumed_train_samples);
  const auto valid_loader =
      data.valid ? make_loader(*data.valid, args, *data.tokenizer, 1, 0, progress.consumed_valid_samples) : nullptr;
  MetricsFile metrics(args.metrics_file);
  TrainingSummary summary;
  const int64_t micro = args.num_micro_batches();
  const double flops_per_iteration = num_floating_point_operations(config, args.global_batch_size);
  const int64_t tokens_per_iteration = args.global_batch_size * config.seq_length;

  double interval_loss_sum = 0, interval_tokens = 0, interval_seconds = 0;
  int64_t interval_iters = 0;
  const int64_t first_iteration = progress.iteration;
  while (progress.iteration < args.train_iters) {
    const auto t0 = Clock::now();
    model.parameters().zero_grads();
    LossSums iteration_sums;
    for (int64_t m = 0; m < micro; ++m) {
      const datasets::Batch batch = next_batch(*train_loader, "training");
      double tokens = 0;
      for (float v : batch.loss_mask.to_vector()) tokens += v;
      // Megatron's default loss: the mean over each micro-batch's tokens, averaged over micro-batches.
      const float grad_scale = tokens > 0 ? float(1.0 / (tokens * double(micro))) : 0.0f;
      const ForwardContext fwd{
          .training = true, .seed = uint64_t(args.seed), .step = uint64_t(progress.iteration * micro + m)};
      const LossSums s =
          model.forward_backward(batch.tokens, batch.labels, batch.loss_mask, grad_scale, fwd, batch.position_ids);
      iteration_sums.loss_sum += s.loss_sum;
      iteration_sums.num_tokens += s.num_tokens;
    }
    const OptimizerStepResult step = optimizer.step(scheduler.lr(), scheduler.weight_decay());
    const double loss = iteration_sums.loss_sum / std::max(1.0, iteration_sums.num_tokens);
    ++progress.iteration;
    progress.consumed_train_samples += args.global_batch_size;
    if (step.skipped) {
      ++progress.skipped_iterations;
      if (!std::isfinite(loss)) ++progress.nan_iterations;
    } else {
      scheduler.step(args.global_batch_size);
      interval_loss_sum += loss;
      ++interval_iters;
    }
    summary.train_losses.push_back(loss);
    ++summary.iterations_run;
    interval_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    interval_tokens += double(tokens_per_iteration);

    const bool first = progress.iteration == first_iteration + 1;
    if (first || progress.iteration % args.log_interval == 0 || progress.iteration == args.train_iters) {
      const int64_t iters_in_interval = std::max<int64_t>(1, interval_iters + (step.skipped ? 1 : 0));
      IterationStats st;
      st.iteration = progress.iteration;
      st.train_iters = args.train_iters;
      st.consumed_samples = progress.consumed_train_samples;
      st.elapsed_ms_per_iteration = 1e3 * interval_seconds / double(iters_in_interval);
      st.tflops_per_gpu = flops_per_iteration / (st.elapsed_ms_per_iteration * 1e-3 * 1e12);
      st.tokens_per_second = interval_tokens / interval_seconds;
      st.learning_rate = scheduler.lr();
      st.global_batch_size = args.global_batch_size;
      st.lm_loss = interval_iters > 0 ? interval_loss_sum / double(interval_iters) : loss;
      st.grad_norm = step.grad_norm;
      st.skipped_iterations = progress.skipped_iterations;
      st.nan_iterations = progress.nan_iterations;
      st.peak_memory_mib = peak_memory_mib(device);
      LOG_INFO(format_training_log_line(st));
      metrics.write_training(st);
      interval_loss_sum = interval_tokens = interval_seconds = 0;
      interval_iters = 0;
    }
    if (data.valid && progress.iteration % args.eval_interval == 0) {
      const double vloss = evaluate(model, *valid_loader, args, progress);
      summary.valid_losses.push_back(vloss);
      LOG_INFO(format_validation_line(progress.iteration, vloss));
      metrics.write_validation(progress.iteration, vloss);
    }
    if (should_save(args, progress.iteration) || (!args.save.empty() && progress.iteration == args.train_iters))
      save_training_checkpoint(args, model, &optimizer, scheduler, progress);
  }
  return summary;
}

}  // namespace megatron
