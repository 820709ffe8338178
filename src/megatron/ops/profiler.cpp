#include "megatron/ops/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "megatron/cuda_runtime/event_timer.h"

namespace megatron::ops {

namespace {
int64_t host_nanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t mark(Device device) { return device.is_cuda() ? cuda::event_timer_record() : host_nanoseconds(); }
}  // namespace

OpProfiler& OpProfiler::instance() {
  static OpProfiler profiler;
  return profiler;
}

void OpProfiler::start() {
  records_.clear();
  cuda::event_timer_reset();
  recording_ = true;
}

std::vector<OpTiming> OpProfiler::stop() {
  recording_ = false;
  bool any_cuda = false;
  for (const Record& r : records_) any_cuda |= r.device.is_cuda();
  if (any_cuda) cuda::event_timer_synchronize();
  std::map<std::string, OpTiming> by_op;
  for (const Record& r : records_) {
    OpTiming& t = by_op[r.op];
    t.op = r.op;
    ++t.calls;
    t.milliseconds +=
        r.device.is_cuda() ? cuda::event_timer_elapsed_ms(r.start, r.end) : double(r.end - r.start) * 1e-6;
  }
  std::vector<OpTiming> out;
  for (auto& [name, t] : by_op) out.push_back(t);
  std::sort(out.begin(), out.end(),
            [](const OpTiming& a, const OpTiming& b) { return a.milliseconds > b.milliseconds; });
  records_.clear();
  return out;
}

OpProfiler::Scope::Scope(const char* op, Device device) {
  if (!instance().recording_) return;
  op_ = op;
  device_ = device;
  start_ = mark(device);
}

OpProfiler::Scope::~Scope() {
  if (op_ == nullptr) return;
  instance().records_.push_back({op_, device_, start_, mark(device_)});
}

std::string format_op_timings(const std::vector<OpTiming>& timings, double step_ms) {
  std::string out = "| op | calls | ms | % of step |\n|---|---|---|---|\n";
  double total = 0;
  char line[256];
  for (const OpTiming& t : timings) {
    total += t.milliseconds;
    std::snprintf(line, sizeof line, "| %s | %lld | %.2f | %.1f%% |\n", t.op.c_str(), static_cast<long long>(t.calls),
                  t.milliseconds, step_ms > 0 ? 100.0 * t.milliseconds / step_ms : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "| all ops | | %.2f | %.1f%% |\n| step (wall) | | %.2f | 100%% |\n", total,
                step_ms > 0 ? 100.0 * total / step_ms : 0.0, step_ms);
  return out + line;
}

}  // namespace megatron::ops
