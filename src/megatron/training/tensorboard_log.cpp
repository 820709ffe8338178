#include "megatron/training/tensorboard_log.h"

#include <algorithm>
#include <cmath>

namespace megatron {

TensorBoardLog::TensorBoardLog(const TrainingArgs& args, bool last_rank) : args_(&args) {
  if (last_rank && !args.tensorboard_dir.empty())
    writer_ = std::make_unique<TensorBoardWriter>(args.tensorboard_dir, args.tensorboard_queue_size);
}

void TensorBoardLog::add(const std::string& tag, double value, int64_t iteration, int64_t consumed_samples) {
  writer_->add_scalar(tag, value, iteration);
  writer_->add_scalar(tag + " vs samples", value, consumed_samples);
}

void TensorBoardLog::iteration(const IterationScalars& s) {
  if (!writer_ || s.iteration % args_->tensorboard_log_interval != 0) return;
  add("learning-rate", s.learning_rate, s.iteration, s.consumed_samples);
  add("batch-size", double(s.batch_size), s.iteration, s.consumed_samples);
  add("lm loss", s.lm_loss, s.iteration, s.consumed_samples);
  if (args_->log_loss_scale_to_tensorboard) add("loss-scale", s.loss_scale, s.iteration, s.consumed_samples);
  if (args_->log_world_size_to_tensorboard) add("world-size", double(s.world_size), s.iteration, s.consumed_samples);
  if (s.grad_norm) add("grad-norm", *s.grad_norm, s.iteration, s.consumed_samples);
  if (s.num_zeros_in_grad) add("num-zeros", *s.num_zeros_in_grad, s.iteration, s.consumed_samples);
  if (s.params_norm) add("params-norm", *s.params_norm, s.iteration, s.consumed_samples);
  if (args_->log_memory_to_tensorboard) {
    writer_->add_scalar("mem-reserved-bytes", double(s.memory.reserved_bytes), s.iteration);
    writer_->add_scalar("mem-allocated-bytes", double(s.memory.current_bytes), s.iteration);
    writer_->add_scalar("mem-max-allocated-bytes", double(s.memory.peak_bytes), s.iteration);
    writer_->add_scalar("mem-allocated-count", double(s.memory.current_allocations), s.iteration);
  }
}

void TensorBoardLog::interval(const IterationStats& st) {
  if (!writer_) return;
  if (args_->log_timers_to_tensorboard)
    writer_->add_scalar("iteration-time", st.elapsed_ms_per_iteration * 1e-3, st.iteration);
  if (args_->log_throughput) writer_->add_scalar("throughput", st.tflops_per_gpu, st.iteration);
  writer_->add_scalar("skipped-iterations", double(st.skipped_iterations), st.iteration);
  writer_->add_scalar("nan-iterations", double(st.nan_iterations), st.iteration);
}

void TensorBoardLog::timers(const std::vector<std::pair<std::string, double>>& seconds, int64_t iteration) {
  if (!writer_ || !args_->log_timers_to_tensorboard) return;
  for (const auto& [name, value] : seconds) writer_->add_scalar(name + "-time", value, iteration);
}

void TensorBoardLog::evaluation(const std::string& split, int64_t iteration, int64_t consumed_samples, double loss) {
  if (!writer_) return;
  add("lm loss " + split, loss, iteration, consumed_samples);
  if (args_->log_validation_ppl_to_tensorboard && std::isfinite(loss))
    add("lm loss " + split + " ppl", std::exp(std::min(20.0, loss)), iteration, consumed_samples);
}

}  // namespace megatron
