#pragma once
// When a run stops before --train-iters: Megatron's preemption and time limits
// (checkpoint_and_decide_exit). Checked after every iteration, after its evaluation:
//   --exit-signal-handler     SIGTERM (Slurm's preemption notice) lets the current step finish;
//   --exit-duration-in-mins M the run has trained M minutes (from the start of pretrain);
//   --exit-interval N         the iteration is a multiple of N.
// The loop then saves a checkpoint (when --save is given and this iteration's regular save has not
// written one), prints Megatron's "exiting program ..." line, skips the evaluations that end a
// completed run and returns; `megatron train` exits 0, so a requeued job resumes with --load.
//
// Every rank must stop at the same iteration, or the ones that go on wait forever in a collective:
// a signal reaches each rank at its own moment (or one rank only) and each rank's clock reads its
// own time, so the signal and duration flags are max-reduced over the world each iteration (as
// Megatron's all-gather of the signal flag and all-reduce of the duration test).
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "megatron/core/tensor.h"
#include "megatron/parallel/comm.h"
#include "megatron/training/arguments.h"

namespace megatron {

// While alive, SIGTERM sets a flag instead of ending the process (system calls restart); the
// previous disposition comes back at destruction. One at a time per process.
class TerminationSignalCatcher {
 public:
  TerminationSignalCatcher();
  ~TerminationSignalCatcher();
  TerminationSignalCatcher(const TerminationSignalCatcher&) = delete;
  TerminationSignalCatcher& operator=(const TerminationSignalCatcher&) = delete;
  bool received() const;
};

struct EarlyExit {
  enum class Reason { signal, duration, interval };
  Reason reason = Reason::interval;
  std::string message;  // Megatron's, e.g. "exiting program after receiving SIGTERM."
};

class ExitConditions {
 public:
  // `start`: when the run began (Megatron's _TRAIN_START_TIME, set before the model is built).
  ExitConditions(const TrainingArgs& args, std::chrono::steady_clock::time_point start);
  // The reason to stop after `iteration`, the same on every rank of `world` (a collective when
  // --exit-signal-handler or --exit-duration-in-mins is given: every rank calls it every iteration).
  std::optional<EarlyExit> check(int64_t iteration, Communicator& world, Device device) const;

 private:
  int64_t exit_interval_;
  double exit_duration_minutes_;
  std::chrono::steady_clock::time_point start_;
  std::optional<TerminationSignalCatcher> signal_;
};

}  // namespace megatron
