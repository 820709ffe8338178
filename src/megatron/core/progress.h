#pragma once
// Progress of a long start-up phase (dataset index building, checkpoint verification,
// communicator set-up) with an ETA, logged as info lines (so from rank 0 only). Rate-limited: a
// line at most once per `every`, none for a phase that finishes within it, and, once any line was
// printed, a final line from finish(). The ETA extrapolates the rate so far over the steps left.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace megatron {

class ProgressReporter {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::duration kDefaultEvery = std::chrono::seconds(5);

  // `what` names the phase, `unit` the steps ("files", "bytes", ...). `now` is a test hook.
  ProgressReporter(std::string what, int64_t total_steps, std::string unit, Clock::duration every = kDefaultEvery,
                   std::function<Clock::time_point()> now = Clock::now);
  void advance(int64_t steps = 1);
  // The phase is over: one last line if progress was shown, so the log says it ended.
  void finish();

 private:
  double seconds_since_start(Clock::time_point t) const;

  std::string what_, unit_;
  int64_t total_ = 1;
  int64_t done_ = 0;
  Clock::duration every_;
  std::function<Clock::time_point()> now_;
  Clock::time_point start_, last_report_;
  bool reported_ = false;
};

}  // namespace megatron
