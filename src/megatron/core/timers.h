#pragma once
// Named wall-clock timers (Megatron's `timers('forward-backward')`). Host clock only: device
// work is timed by the CUDA backend with events and folded in by the caller.
#include <chrono>
#include <map>
#include <string>

namespace megatron {

class Timers {
 public:
  void start(const std::string& name) { running_[name] = Clock::now(); }
  // Adds the time since start(name) to name's total and returns that interval in seconds.
  double stop(const std::string& name) {
    const auto it = running_.find(name);
    if (it == running_.end()) return 0.0;
    const double s = std::chrono::duration<double>(Clock::now() - it->second).count();
    totals_[name] += s;
    running_.erase(it);
    return s;
  }
  double total(const std::string& name) const {
    const auto it = totals_.find(name);
    return it == totals_.end() ? 0.0 : it->second;
  }
  void reset() { totals_.clear(); }
  const std::map<std::string, double>& totals() const { return totals_; }

 private:
  using Clock = std::chrono::steady_clock;
  std::map<std::string, Clock::time_point> running_;
  std::map<std::string, double> totals_;
};

}  // namespace megatron
