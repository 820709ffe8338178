#include "megatron/training/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "megatron/core/error.h"
#include "megatron/core/logging.h"

namespace megatron {

std::string format_tflops(double tflops) {
  char text[32];
  std::snprintf(text, sizeof text, tflops >= 1.0 || tflops == 0.0 ? "%.1f" : "%#.3g", tflops);
  return text;
}

std::string format_training_log_line(const IterationStats& s) {
  char head[768], norm[64] = "", zeros[64] = "", params[64] = "", tail[256];
  std::snprintf(head, sizeof head,
                " [%s] iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per iteration (ms): %.1f | "
                "throughput per GPU (TFLOP/s/GPU): %s | tokens per second: %.0f | learning rate: %.6E | "
                "global batch size: %5lld | lm loss: %.6E | loss scale: %.1f |",
                timestamp_now().c_str(), static_cast<long long>(s.iteration), static_cast<long long>(s.train_iters),
                static_cast<long long>(s.consumed_samples), s.elapsed_ms_per_iteration,
                format_tflops(s.tflops_per_gpu).c_str(), s.tokens_per_second, s.learning_rate,
                static_cast<long long>(s.global_batch_size), s.lm_loss, s.loss_scale);
  if (s.grad_norm) std::snprintf(norm, sizeof norm, " grad norm: %.3f |", *s.grad_norm);
  // A whole count, printed as Megatron's int64 count prints.
  if (s.num_zeros_in_grad) std::snprintf(zeros, sizeof zeros, " num zeros: %.0f |", *s.num_zeros_in_grad);
  if (s.params_norm) std::snprintf(params, sizeof params, " params norm: %.3f |", *s.params_norm);
  std::snprintf(tail, sizeof tail,
                " number of skipped iterations: %3lld | number of nan iterations: %3lld | peak memory (MiB): %.0f |",
                static_cast<long long>(s.skipped_iterations), static_cast<long long>(s.nan_iterations),
                s.peak_memory_mib);
  std::string line = std::string(head) + norm + zeros + params + tail;
  if (s.load_balancing_loss) {
    char moe[256];
    std::snprintf(moe, sizeof moe, " %s: %.6E | z_loss: %.6E | tokens per expert (min/max): %lld/%lld |",
                  s.load_balancing_name.c_str(), *s.load_balancing_loss, s.z_loss.value_or(0.0),
                  static_cast<long long>(s.min_tokens_per_expert), static_cast<long long>(s.max_tokens_per_expert));
    line += moe;
  }
  return line;
}

std::string format_validation_line(const std::string& prefix, double loss) {
  char buf[256];
  std::string line = " validation loss at " + prefix + " | ";
  std::snprintf(buf, sizeof buf, "lm loss value: %.6E | ", loss);
  line += buf;
  // Megatron's exp(min(20, loss)) turns a NaN loss into a perplexity of e^20; a loss that is not
  // finite has none.
  if (std::isfinite(loss)) {
    std::snprintf(buf, sizeof buf, "lm loss PPL: %.6E | ", std::exp(std::min(20.0, loss)));
    line += buf;
  }
  const std::string dashes(line.size() + 1, '-');  // Megatron's len(string) + 1
  return dashes + "\n" + line + "\n" + dashes;
}

MetricsFile::MetricsFile(const std::string& path) {
  if (path.empty()) return;
  out_.open(path, std::ios::app);
  MEGATRON_CHECK(out_.good(), "cannot open --metrics-file " << path << " for appending; check the directory exists");
}

void MetricsFile::write_training(const IterationStats& s) {
  if (!out_.is_open()) return;
  nlohmann::json j = {{"kind", "train"},
                      {"iteration", s.iteration},
                      {"consumed_samples", s.consumed_samples},
                      {"elapsed_ms_per_iteration", s.elapsed_ms_per_iteration},
                      {"tflops_per_gpu", s.tflops_per_gpu},
                      {"tokens_per_second", s.tokens_per_second},
                      {"learning_rate", s.learning_rate},
                      {"global_batch_size", s.global_batch_size},
                      {"lm_loss", s.lm_loss},
                      {"loss_scale", s.loss_scale},
                      {"grad_norm", s.grad_norm ? nlohmann::json(*s.grad_norm) : nlohmann::json()},
                      {"skipped_iterations", s.skipped_iterations},
                      {"nan_iterations", s.nan_iterations},
                      {"peak_memory_mib", s.peak_memory_mib},
                      {"reserved_memory_mib", s.reserved_memory_mib},
                      {"optimizer_state_mib", s.optimizer_state_mib},
                      {"activation_memory_mib", s.activation_memory_mib}};
  if (s.num_zeros_in_grad) j["num_zeros_in_grad"] = *s.num_zeros_in_grad;
  if (s.params_norm) j["params_norm"] = *s.params_norm;
  if (s.load_balancing_loss) {
    j[s.load_balancing_name] = *s.load_balancing_loss;
    j["z_loss"] = s.z_loss.value_or(0.0);
    j["min_tokens_per_expert"] = s.min_tokens_per_expert;
    j["max_tokens_per_expert"] = s.max_tokens_per_expert;
  }
  out_ << j.dump() << '\n';
  out_.flush();
}

void MetricsFile::write_evaluation(const std::string& kind, int64_t iteration, double loss, int64_t samples,
                                   bool end_of_training) {
  if (!out_.is_open()) return;
  nlohmann::json j = {{"kind", kind}, {"iteration", iteration}, {"lm_loss", loss}, {"samples", samples}};
  if (end_of_training) j["end_of_training"] = true;
  out_ << j.dump() << '\n';
  out_.flush();
}

}  // namespace megatron
