#include "megatron/training/exit_conditions.h"

#include <csignal>
#include <cstring>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"

namespace megatron {

namespace {
// A POSIX signal handler receives no context, so the flag it sets has to live at namespace
// scope; TerminationSignalCatcher is its only user and owns its lifetime.
volatile std::sig_atomic_t termination_received = 0;
struct sigaction previous_action;
bool catcher_alive = false;

extern "C" void on_termination(int) { termination_received = 1; }
}  // namespace

TerminationSignalCatcher::TerminationSignalCatcher() {
  MEGATRON_CHECK(!catcher_alive,
                 "a SIGTERM catcher is already installed in this process; only one run at a time "
                 "can use --exit-signal-handler");
  termination_received = 0;
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_termination;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in flight go on; the loop polls the flag
  MEGATRON_CHECK(sigaction(SIGTERM, &action, &previous_action) == 0,
                 "cannot install the SIGTERM handler of --exit-signal-handler: " << std::strerror(errno));
  catcher_alive = true;
}

TerminationSignalCatcher::~TerminationSignalCatcher() {
  sigaction(SIGTERM, &previous_action, nullptr);
  catcher_alive = false;
}

bool TerminationSignalCatcher::received() const { return termination_received != 0; }

ExitConditions::ExitConditions(const TrainingArgs& args, std::chrono::steady_clock::time_point start)
    : exit_interval_(args.exit_interval), exit_duration_minutes_(args.exit_duration_in_mins), start_(start) {
  if (args.exit_signal_handler) signal_.emplace();
}

std::optional<EarlyExit> ExitConditions::check(int64_t iteration, Communicator& world, Device device) const {
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() / 60.0;
  if (signal_ || exit_duration_minutes_ > 0) {
    // Max over the world: one rank's signal, or one rank's clock past the limit, stops them all.
    Tensor flags = Tensor::zeros({2}, DType::f32);
    flags.set_item(0, signal_ && signal_->received() ? 1.0 : 0.0);
    flags.set_item(1, exit_duration_minutes_ > 0 && minutes > exit_duration_minutes_ ? 1.0 : 0.0);
    Tensor reduced = flags.to(device);
    world.all_reduce(reduced, ReduceOp::max);
    if (reduced.item(0) > 0) return EarlyExit{EarlyExit::Reason::signal, "exiting program after receiving SIGTERM."};
    if (reduced.item(1) > 0)
      return EarlyExit{EarlyExit::Reason::duration, concat("exiting program after ", minutes, " minutes")};
  }
  if (exit_interval_ > 0 && iteration % exit_interval_ == 0)
    return EarlyExit{EarlyExit::Reason::interval, concat("exiting program at iteration ", iteration)};
  return std::nullopt;
}

}  // namespace megatron
