#include "megatron/parallel/collective_log.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "megatron/core/error.h"

namespace megatron {

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

CollectiveLog::CollectiveLog(size_t capacity) : origin_(steady_seconds()) {
  MEGATRON_CHECK(capacity > 0, "the collective log needs room for at least one record, got capacity 0");
  ring_.resize(capacity);
}

double CollectiveLog::now() const { return steady_seconds() - origin_; }

GroupProgress& CollectiveLog::progress_of(const std::string& group, bool p2p) {
  for (GroupProgress& g : groups_)
    if (g.group == group && g.p2p == p2p) return g;
  groups_.push_back({group, p2p, 0, 0, {}});
  return groups_.back();
}

CollectiveRecord CollectiveLog::begin(const std::string& group, bool p2p, const std::string& op, int64_t count,
                                      DType dtype, const std::string& detail) {
  const double t = now();
  std::lock_guard<std::mutex> lock(mutex_);
  GroupProgress& g = progress_of(group, p2p);
  CollectiveRecord r{next_id_++, group, p2p, ++g.issued, op, count, dtype, detail, t, -1};
  g.last = r;
  ring_[r.id % ring_.size()] = r;
  return r;
}

void CollectiveLog::end(const CollectiveRecord& r) {
  const double t = now();
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveRecord& slot = ring_[r.id % ring_.size()];
  if (slot.id == r.id) {
    MEGATRON_CHECK(slot.in_flight(), "collective " << format_record(slot, t) << " was completed twice");
    slot.end = t;
  }
  GroupProgress& g = progress_of(r.group, r.p2p);
  if (g.last.id == r.id) g.last.end = t;
  ++g.completed;
}

std::vector<CollectiveRecord> CollectiveLog::recent(size_t n) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CollectiveRecord> out;
  const uint64_t last = next_id_ - 1;
  const uint64_t held = std::min<uint64_t>(last, ring_.size());
  const uint64_t take = std::min<uint64_t>(held, n);
  for (uint64_t id = last - take + 1; id <= last; ++id) out.push_back(ring_[id % ring_.size()]);
  return out;
}

std::vector<CollectiveRecord> CollectiveLog::in_flight() const {
  std::vector<CollectiveRecord> out;
  for (const CollectiveRecord& r : recent(ring_.size()))
    if (r.in_flight()) out.push_back(r);
  return out;
}

std::vector<GroupProgress> CollectiveLog::progress() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return groups_;
}

std::string record_name(const CollectiveRecord& r) {
  std::string s = r.group + (r.p2p ? " p2p " : " ") + r.op + " #" + std::to_string(r.seq) + " (" +
                  std::to_string(r.count) + " " + dtype_name(r.dtype);
  if (!r.detail.empty()) s += "; " + r.detail;
  return s + ")";
}

std::string format_record(const CollectiveRecord& r, double now) {
  char times[96];
  if (r.in_flight())
    std::snprintf(times, sizeof times, " at %.3f s, in flight for %.3f s", r.start, now - r.start);
  else
    std::snprintf(times, sizeof times, " at %.3f s, done in %.3f s", r.start, r.end - r.start);
  return "#" + std::to_string(r.id) + " " + record_name(r) + times;
}

}  // namespace megatron
