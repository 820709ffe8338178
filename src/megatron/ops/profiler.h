#pragma once
// Per-op timing of chosen steps (`megatron train --profile-ops-iteration N`): while recording,
// every op dispatched through ops/ is timed — with events on the current stream for CUDA
// tensors (so the step runs undisturbed and is read once at the end), with the host clock for
// CPU ones — and summed by op name. This is the "where does an iteration go" table.
// One recorder per process: recording is a property of the whole run, like a profiler's.
#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/tensor.h"

namespace megatron::ops {

struct OpTiming {
  std::string op;
  int64_t calls = 0;
  double milliseconds = 0.0;
};

class OpProfiler {
 public:
  static OpProfiler& instance();
  void start();                    // clears and starts recording
  std::vector<OpTiming> stop();    // waits for the device, stops, returns totals (largest first)
  bool recording() const { return recording_; }

  // Times one op call from construction to destruction (used by the dispatcher).
  class Scope {
   public:
    Scope(const char* op, Device device);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    const char* op_ = nullptr;
    Device device_;
    int64_t start_ = -1;  // event index (CUDA) or host nanoseconds (CPU)
  };

 private:
  struct Record {
    const char* op;
    Device device;
    int64_t start, end;
  };
  bool recording_ = false;
  std::vector<Record> records_;
};

// A formatted table of the timings with each op's share of `step_ms`.
std::string format_op_timings(const std::vector<OpTiming>& timings, double step_ms);

}  // namespace megatron::ops
