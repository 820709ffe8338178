#pragma once
// Per-op timing of chosen steps (`megatron train --profile-ops-iteration N`): while recording,
// every op dispatched through ops/ is timed — with events on the current stream for CUDA
// tensors (so the step runs undisturbed and is read once at the end), with the host clock for
// CPU ones — and summed by op name. This is the "where does an iteration go" table. The time
// between one op's end and the next op's start (the device idle while the host catches up, for
// CUDA) is summed by the pair of ops around it: "where do the host gaps go".
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

// The idle time before `after` started whenever `before` was the last op to end.
struct OpGap {
  std::string before, after;
  int64_t calls = 0;
  double milliseconds = 0.0;
};

struct OpProfile {
  std::vector<OpTiming> ops;  // largest first
  std::vector<OpGap> gaps;    // largest first
};

class OpProfiler {
 public:
  static OpProfiler& instance();
  void start();                    // clears and starts recording
  OpProfile stop();                // waits for the device, stops, returns the totals
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

// Formatted tables of the op timings and of the `max_gaps` largest gaps, each with its share of
// `step_ms`.
std::string format_op_profile(const OpProfile& profile, double step_ms, size_t max_gaps = 10);

}  // namespace megatron::ops
