#pragma once
// Megatron's TensorBoard scalars (training_log, evaluate_and_print_results; tag names in
// reference/interop-formats.md section 6.3), written by the last rank (as Megatron's writer) into
// --tensorboard-dir:
//   every --tensorboard-log-interval iterations, the iteration's own values at step = iteration and,
//   as "<tag> vs samples", at step = consumed samples: learning-rate, batch-size, lm loss,
//   loss-scale (unless --no-log-loss-scale-to-tensorboard), world-size
//   (--log-world-size-to-tensorboard), grad-norm (not for a step skipped on overflow); and at
//   step = iteration only, with --log-memory-to-tensorboard, the allocator's mem-allocated-bytes,
//   mem-reserved-bytes, mem-max-allocated-bytes (the peak the log line shows) and
//   mem-allocated-count (the blocks handed out now);
//   every --log-interval iterations: iteration-time in seconds (--log-timers-to-tensorboard),
//   throughput in TFLOP/s/GPU (--log-throughput), and always skipped-iterations and
//   nan-iterations, the interval's counts of the log line (ours: Megatron writes neither);
//   each evaluation: "lm loss validation" (or "lm loss test") and, with
//   --log-validation-ppl-to-tensorboard, "lm loss validation ppl" = exp(min(20, loss)).
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/memory.h"
#include "megatron/training/arguments.h"
#include "megatron/training/metrics.h"
#include "megatron/training/tensorboard_writer.h"

namespace megatron {

struct IterationScalars {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  double learning_rate = 0.0;
  int64_t batch_size = 0;
  double lm_loss = 0.0;
  double loss_scale = 1.0;
  std::optional<double> grad_norm;
  std::optional<double> num_zeros_in_grad;  // with --log-num-zeros-in-grad
  std::optional<double> params_norm;        // with --log-params-norm, at the TensorBoard interval
  int64_t world_size = 1;
  MemoryStats memory;  // the allocator's figures after the step
};

class TensorBoardLog {
 public:
  // Writes nothing without --tensorboard-dir or on a rank other than the last.
  TensorBoardLog(const TrainingArgs& args, bool last_rank);
  void iteration(const IterationScalars& s);
  // At a log line: the interval's mean seconds per iteration, TFLOP/s per GPU, skipped and NaN
  // iterations, as the log line shows them.
  void interval(const IterationStats& st);
  // With --log-timers-to-tensorboard, each timer's "<name>-time" (seconds per iteration, the
  // slowest rank's: TimingLog::log).
  void timers(const std::vector<std::pair<std::string, double>>& seconds, int64_t iteration);
  // split: "validation" or "test".
  void evaluation(const std::string& split, int64_t iteration, int64_t consumed_samples, double loss);

 private:
  void add(const std::string& tag, double value, int64_t iteration, int64_t consumed_samples);

  const TrainingArgs* args_;
  std::unique_ptr<TensorBoardWriter> writer_;
};

}  // namespace megatron
