#pragma once
// What the training loop reports: Megatron's log line (reference §5.1) on stdout and the same
// numbers as one JSON object per line in --metrics-file.
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace megatron {

struct IterationStats {
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  double elapsed_ms_per_iteration = 0.0;
  double tflops_per_gpu = 0.0;
  double tokens_per_second = 0.0;
  double learning_rate = 0.0;
  int64_t global_batch_size = 0;
  double lm_loss = 0.0;
  double loss_scale = 1.0;
  std::optional<double> grad_norm;  // absent for a step skipped on overflow: not printed (Megatron)
  std::optional<double> num_zeros_in_grad;  // with --log-num-zeros-in-grad (absent on a skipped step)
  std::optional<double> params_norm;        // with --log-params-norm
  int64_t skipped_iterations = 0;   // in the interval since the previous log line
  int64_t nan_iterations = 0;       // skipped iterations with a non-finite loss, in the interval
  double peak_memory_mib = 0.0;
  double reserved_memory_mib = 0.0;    // what the allocator holds from the device (in use plus cached); JSON only
  double optimizer_state_mib = 0.0;    // this rank's optimizer buffers (Optimizer::state_bytes); JSON only
  double activation_memory_mib = 0.0;  // one micro-batch's activations kept for backward on this rank; JSON only
  // MoE models only: the routers' losses (unweighted, as Megatron logs them), averaged over the MoE
  // layers and the interval's micro-batches, and the fewest and most tokens any expert received in
  // one micro-batch of the interval, on the logging rank.
  std::optional<double> load_balancing_loss, z_loss;
  std::string load_balancing_name = "load_balancing_loss";  // seq_load_balancing_loss with seq_aux_loss
  int64_t min_tokens_per_expert = 0, max_tokens_per_expert = 0;
};

// The throughput as the log line prints it: Megatron's one decimal from 1 TFLOP/s/GPU up, three
// significant digits below, where a small model on a CPU runs and "%.1f" would print 0.0. The
// metrics file holds the unrounded value.
std::string format_tflops(double tflops);
std::string format_training_log_line(const IterationStats& stats);
// Megatron's evaluate_and_print_results: " validation loss at <prefix> | lm loss value: ... |
// lm loss PPL: ... | " between dashed lines. The prefix is "iteration N" for the periodic
// evaluations, "iteration N on validation set" / "iteration N on test set" after training.
std::string format_validation_line(const std::string& prefix, double loss);

class MetricsFile {
 public:
  MetricsFile() = default;
  explicit MetricsFile(const std::string& path);  // appends; empty path: disabled
  void write_training(const IterationStats& stats);
  // kind "validation" or "test"; `samples`: how many the evaluation read; `end_of_training`
  // marks the evaluations after the last iteration.
  void write_evaluation(const std::string& kind, int64_t iteration, double loss, int64_t samples, bool end_of_training);

 private:
  std::ofstream out_;
};

}  // namespace megatron
