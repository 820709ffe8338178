#pragma once
// Megatron's timers and our straggler report, printed after a log line by the last rank.
//
// Timers (--timing-log-level 0|1|2, --timing-log-option minmax|max|all): the loop times
// forward-backward (level 1), forward-compute and backward-compute (2: each micro-batch's forward
// and backward through this rank's chunks, summed), batch-generator (2), all-grads-sync (1) and
// optimizer (1), in Megatron's timers_to_log order; those up to the level run. As Megatron's
// timers, the two compute timers wait for the GPU at their start and stop (a one-element
// read-back), so they time the device's work, and level 2 slows a GPU run down. At each log line every rank's totals
// are gathered and printed in ms per iteration of the interval as Megatron's Timers.log prints
// them:
//   minmax:  "(min, max) time across ranks (ms):" then "    <name padded with dots to 48>: (1.23, 4.56)"
//   max:     "max time across ranks (ms):"        then "    <name ...>: 4.56"
//   all:     "times across ranks (ms):"           then "  <name>:" and "     rank  0: 1.23" per rank
// (Megatron divides by --log-interval even on the first line; we divide by the iterations the
// interval ran.) Every save is timed as Megatron's save-checkpoint, printed whatever the level.
// Host clock: on a GPU, forward-backward and optimizer end in a host read of the loss and of the
// grad norm, so they include their device work.
//
// Straggler report (--log-straggler, --straggler-minmax-count K): each rank's forward-backward
// compute time (the collectives that wait for a slow rank come after it, so only the slow rank's
// own time grows), gathered at each log line; the last rank names the K slowest and K fastest
// ranks in ms per iteration and as a multiple of the median.
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "megatron/parallel/comm.h"
#include "megatron/training/arguments.h"

namespace megatron {

// The printing, for tests: per-rank ms per iteration of each timer, times[rank][timer].
std::string format_timers(const std::vector<std::string>& names, const std::vector<std::vector<double>>& times,
                          const std::string& option);
// ms_per_iteration[rank] of the interval [first, last].
std::string format_straggler_report(const std::vector<double>& ms_per_iteration, int64_t count, int64_t first,
                                    int64_t last);

class TimingLog {
 public:
  TimingLog(const TrainingArgs& args, Communicator& world, Device device);
  // Timers above --timing-log-level are not started; stop() of one not started does nothing.
  void start(const std::string& name);
  void stop(const std::string& name);
  // After a log line of `iteration`, closing an interval of `iterations`: a collective over the
  // world when a timer or the straggler report is on, nothing otherwise. Returns each active
  // timer's name and its largest time over the ranks, in seconds per iteration (what Megatron's
  // --log-timers-to-tensorboard writes as "<name>-time").
  std::vector<std::pair<std::string, double>> log(int64_t iteration, int64_t iterations);
  // Around a save (every rank), then its (min, max) line: a collective.
  void start_save() { save_start_ = Clock::now(); }
  void log_save();

 private:
  using Clock = std::chrono::steady_clock;
  // Every rank's values, values[rank][i] (an all-gather).
  std::vector<std::vector<double>> gather(const std::vector<double>& mine) const;
  void print(const std::string& text) const;
  // Returns once the device has finished the work queued so far (nothing to wait for on the CPU).
  void wait_for_device() const;

  Communicator* world_;
  Device device_;
  int64_t level_;
  std::string option_;
  bool straggler_;
  int64_t straggler_count_;
  std::vector<std::string> active_;  // the timers up to the level, in print order
  std::vector<double> totals_;       // seconds, per active timer
  std::vector<Clock::time_point> started_;
  std::vector<bool> running_;
  std::vector<bool> synchronized_;  // per active timer: waits for the device (kTimers)
  mutable Tensor device_probe_;     // read back to wait for the device
  double compute_seconds_ = 0;      // forward-backward, for the straggler report
  Clock::time_point compute_start_;
  Clock::time_point save_start_;
};

}  // namespace megatron
