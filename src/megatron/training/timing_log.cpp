#include "megatron/training/timing_log.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "megatron/core/strings.h"

namespace megatron {

namespace {
struct TimerLevel {
  const char* name;
  int64_t level;
  bool synchronized;  // waits for the device at start and stop (the compute of one micro-batch)
};
// Megatron's names and levels, in its timers_to_log order.
constexpr TimerLevel kTimers[] = {{"forward-backward", 1, false}, {"forward-compute", 2, true},
                                  {"backward-compute", 2, true},  {"batch-generator", 2, false},
                                  {"all-grads-sync", 1, false},   {"optimizer", 1, false}};
constexpr const char* kComputeTimer = "forward-backward";

std::string padded(const std::string& name) {
  std::string text = name + " ";
  if (text.size() < 48) text.append(48 - text.size(), '.');
  return text;
}

std::string two_decimals(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}
}  // namespace

std::string format_timers(const std::vector<std::string>& names, const std::vector<std::vector<double>>& times,
                          const std::string& option) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    double lo = times[0][i], hi = times[0][i];
    for (const auto& rank : times) {
      lo = std::min(lo, rank[i]);
      hi = std::max(hi, rank[i]);
    }
    if (hi <= 0.0) continue;  // never ran: Megatron leaves it out
    if (option == "all") {
      out += "\n  " + names[i] + ":";
      for (size_t r = 0; r < times.size(); ++r) {
        char rank[48];
        std::snprintf(rank, sizeof rank, "\n     rank %2zu: ", r);
        out += rank + two_decimals(times[r][i]);
      }
    } else if (option == "max") {
      out += "\n    " + padded(names[i]) + ": " + two_decimals(hi);
    } else {
      out += "\n    " + padded(names[i]) + ": (" + two_decimals(lo) + ", " + two_decimals(hi) + ")";
    }
  }
  if (out.empty()) return "";
  const char* head = option == "all"   ? "times across ranks (ms):"
                     : option == "max" ? "max time across ranks (ms):"
                                       : "(min, max) time across ranks (ms):";
  return head + out;
}

std::string format_straggler_report(const std::vector<double>& ms, int64_t count, int64_t first, int64_t last) {
  std::vector<size_t> order(ms.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ms[a] > ms[b]; });
  std::vector<double> sorted(ms);
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  const auto describe = [&](size_t rank) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "rank %zu %.2f ms (%.2fx)", rank, ms[rank], median > 0 ? ms[rank] / median : 0.0);
    return std::string(buf);
  };
  const size_t k = std::min<size_t>(size_t(count), n);
  std::string slowest, fastest;
  for (size_t i = 0; i < k; ++i) {
    slowest += (i ? ", " : "") + describe(order[i]);
    fastest += (i ? ", " : "") + describe(order[n - 1 - i]);
  }
  return concat("straggler report, forward-backward compute per iteration over iterations ", first, "-", last,
                " (x the median ", two_decimals(median), " ms): slowest ", slowest, " | fastest ", fastest);
}

TimingLog::TimingLog(const TrainingArgs& args, Communicator& world, Device device)
    : world_(&world),
      device_(device),
      level_(args.timing_log_level),
      option_(args.timing_log_option),
      straggler_(args.log_straggler),
      straggler_count_(args.straggler_minmax_count) {
  for (const TimerLevel& t : kTimers)
    if (t.level <= level_) {
      active_.emplace_back(t.name);
      synchronized_.push_back(t.synchronized && device.is_cuda());
    }
  totals_.assign(active_.size(), 0.0);
  started_.resize(active_.size());
  running_.assign(active_.size(), false);
}

void TimingLog::start(const std::string& name) {
  if (straggler_ && name == kComputeTimer) compute_start_ = Clock::now();
  const auto it = std::find(active_.begin(), active_.end(), name);
  if (it == active_.end()) return;
  const size_t i = size_t(it - active_.begin());
  if (synchronized_[i]) wait_for_device();
  started_[i] = Clock::now();
  running_[i] = true;
}

void TimingLog::wait_for_device() const {
  if (!device_probe_.defined()) device_probe_ = Tensor::zeros({1}, DType::f32, device_);
  device_probe_.to(Device::cpu());  // a read-back returns once the stream's earlier work is done
}

void TimingLog::stop(const std::string& name) {
  const auto it = std::find(active_.begin(), active_.end(), name);
  const size_t i = size_t(it - active_.begin());
  if (it != active_.end() && running_[i] && synchronized_[i]) wait_for_device();
  const Clock::time_point now = Clock::now();
  if (straggler_ && name == kComputeTimer)
    compute_seconds_ += std::chrono::duration<double>(now - compute_start_).count();
  if (it == active_.end() || !running_[i]) return;
  totals_[i] += std::chrono::duration<double>(now - started_[i]).count();
  running_[i] = false;
}

std::vector<std::vector<double>> TimingLog::gather(const std::vector<double>& mine) const {
  const auto n = int64_t(mine.size());
  Tensor local = Tensor::empty({n}, DType::f64);
  for (int64_t i = 0; i < n; ++i) local.set_item(i, mine[size_t(i)]);
  const Tensor in = local.to(device_);
  Tensor out = Tensor::empty({n * world_->size()}, DType::f64, device_);
  world_->all_gather(out, in);
  const Tensor host = out.to(Device::cpu());
  std::vector<std::vector<double>> all(size_t(world_->size()), std::vector<double>(size_t(n)));
  for (int r = 0; r < world_->size(); ++r)
    for (int64_t i = 0; i < n; ++i) all[size_t(r)][size_t(i)] = host.item(r * n + i);
  return all;
}

void TimingLog::print(const std::string& text) const {
  if (text.empty() || world_->rank() != world_->size() - 1) return;
  const std::string line = text + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

std::vector<std::pair<std::string, double>> TimingLog::log(int64_t iteration, int64_t iterations) {
  if (active_.empty() && !straggler_) return {};
  std::vector<double> mine;
  for (double seconds : totals_) mine.push_back(1e3 * seconds / double(iterations));
  if (straggler_) mine.push_back(1e3 * compute_seconds_ / double(iterations));
  const std::vector<std::vector<double>> all = gather(mine);
  std::vector<std::vector<double>> timers(all.size());
  std::vector<double> compute;
  for (const auto& rank : all) {
    timers[&rank - all.data()].assign(rank.begin(), rank.begin() + std::ptrdiff_t(active_.size()));
    if (straggler_) compute.push_back(rank.back());
  }
  if (!active_.empty()) print(format_timers(active_, timers, option_));
  if (straggler_) print(format_straggler_report(compute, straggler_count_, iteration - iterations + 1, iteration));
  std::fill(totals_.begin(), totals_.end(), 0.0);
  compute_seconds_ = 0;
  std::vector<std::pair<std::string, double>> slowest;
  for (size_t i = 0; i < active_.size(); ++i) {
    double ms = 0;
    for (const auto& rank : timers) ms = std::max(ms, rank[i]);
    slowest.emplace_back(active_[i], ms * 1e-3);
  }
  return slowest;
}

void TimingLog::log_save() {
  const double ms = 1e3 * std::chrono::duration<double>(Clock::now() - save_start_).count();
  const std::vector<std::vector<double>> all = gather({ms});
  print(format_timers({"save-checkpoint"}, all, "minmax"));
}

}  // namespace megatron
