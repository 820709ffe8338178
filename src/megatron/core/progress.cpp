#include "megatron/core/progress.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <utility>

#include "megatron/core/logging.h"

namespace megatron {

ProgressReporter::ProgressReporter(std::string what, int64_t total_steps, std::string unit, Clock::duration every,
                                   std::function<Clock::time_point()> now)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      total_(std::max<int64_t>(1, total_steps)),
      every_(every),
      now_(std::move(now)),
      start_(now_()),
      last_report_(start_) {}

double ProgressReporter::seconds_since_start(Clock::time_point t) const {
  return std::chrono::duration<double>(t - start_).count();
}

void ProgressReporter::advance(int64_t steps) {
  done_ += steps;
  const Clock::time_point now = now_();
  if (now - last_report_ < every_) return;
  last_report_ = now;
  reported_ = true;
  const double elapsed = seconds_since_start(now);
  const double fraction = std::min(1.0, double(done_) / double(total_));
  // Nothing done yet gives no rate to extrapolate: say so rather than print an infinite ETA.
  std::ostringstream eta;
  if (fraction > 0)
    eta << "ETA " << std::llround(elapsed * (1.0 - fraction) / fraction) << " s";
  else
    eta << "ETA unknown";
  LOG_INFO("> " << what_ << ": " << std::min(done_, total_) << " of " << total_ << " " << unit_ << " ("
                << int(100.0 * fraction) << "%) after " << int64_t(elapsed) << " s, " << eta.str());
}

void ProgressReporter::finish() {
  if (!reported_) return;
  LOG_INFO("> " << what_ << ": done, " << total_ << " " << unit_ << " in " << std::fixed << std::setprecision(1)
                << seconds_since_start(now_()) << " s");
}

}  // namespace megatron
