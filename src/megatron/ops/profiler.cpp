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

namespace {
double elapsed_ms(Device device, int64_t from, int64_t to) {
  return device.is_cuda() ? double(cuda::event_timer_elapsed_ms(from, to)) : double(to - from) * 1e-6;
}

template <typename Key, typename T>
std::vector<T> largest_first(std::map<Key, T>&& by_key) {
  std::vector<T> out;
  for (auto& [key, t] : by_key) out.push_back(std::move(t));
  std::sort(out.begin(), out.end(), [](const T& a, const T& b) { return a.milliseconds > b.milliseconds; });
  return out;
}
}  // namespace

OpProfile OpProfiler::stop() {
  recording_ = false;
  bool any_cuda = false;
  for (const Record& r : records_) any_cuda |= r.device.is_cuda();
  if (any_cuda) cuda::event_timer_synchronize();
  std::map<std::string, OpTiming> by_op;
  for (const Record& r : records_) {
    OpTiming& t = by_op[r.op];
    t.op = r.op;
    ++t.calls;
    t.milliseconds += elapsed_ms(r.device, r.start, r.end);
  }
  // Gaps on one clock: the device's events where any op ran there (host-side ops in a CUDA run
  // are on another clock and are left out), in the order the ops started; an op that starts
  // before the last one ended (one op dispatched inside another) leaves no gap.
  std::vector<const Record*> timeline;
  for (const Record& r : records_)
    if (r.device.is_cuda() == any_cuda) timeline.push_back(&r);
  std::sort(timeline.begin(), timeline.end(), [](const Record* a, const Record* b) { return a->start < b->start; });
  std::map<std::pair<std::string, std::string>, OpGap> by_pair;
  const Record* last_ended = nullptr;
  for (const Record* r : timeline) {
    if (last_ended != nullptr && r->start > last_ended->end) {
      OpGap& g = by_pair[{last_ended->op, r->op}];
      g.before = last_ended->op;
      g.after = r->op;
      ++g.calls;
      g.milliseconds += std::max(0.0, elapsed_ms(r->device, last_ended->end, r->start));
    }
    if (last_ended == nullptr || r->end > last_ended->end) last_ended = r;
  }
  records_.clear();
  return {largest_first(std::move(by_op)), largest_first(std::move(by_pair))};
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

std::string format_op_profile(const OpProfile& profile, double step_ms, size_t max_gaps) {
  const auto share = [&](double ms) { return step_ms > 0 ? 100.0 * ms / step_ms : 0.0; };
  std::string out = "| op | calls | ms | % of step |\n|---|---|---|---|\n";
  double total = 0;
  char line[512];
  for (const OpTiming& t : profile.ops) {
    total += t.milliseconds;
    std::snprintf(line, sizeof line, "| %s | %lld | %.2f | %.1f%% |\n", t.op.c_str(), static_cast<long long>(t.calls),
                  t.milliseconds, share(t.milliseconds));
    out += line;
  }
  std::snprintf(line, sizeof line, "| all ops | | %.2f | %.1f%% |\n| step (wall) | | %.2f | 100%% |\n", total,
                share(total), step_ms);
  out += line;
  double gaps = 0;
  for (const OpGap& g : profile.gaps) gaps += g.milliseconds;
  std::snprintf(line, sizeof line,
                "\nidle between ops: %.2f ms (%.1f%% of the step), largest by the ops around it:\n"
                "| before | after | gaps | ms | %% of step |\n|---|---|---|---|---|\n",
                gaps, share(gaps));
  out += line;
  for (size_t i = 0; i < std::min(max_gaps, profile.gaps.size()); ++i) {
    const OpGap& g = profile.gaps[i];
    std::snprintf(line, sizeof line, "| %s | %s | %lld | %.2f | %.1f%% |\n", g.before.c_str(), g.after.c_str(),
                  static_cast<long long>(g.calls), g.milliseconds, share(g.milliseconds));
    out += line;
  }
  return out;
}

}  // namespace megatron::ops
