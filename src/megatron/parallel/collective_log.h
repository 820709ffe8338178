#pragma once
// The per-rank record of communication: a ring of the last N operations and, per group, how many
// operations this rank has issued and completed. The watchdog prints the ring when an operation
// times out and sends the progress to other ranks when they ask, so a hang names the rank that
// never arrived and the operation it was waiting in.
//
// Sequence numbers count per group and kind: the n-th collective issued on group "dp" has seq n
// on every member (collectives are issued in the same order by all members), so comparing seq
// across ranks tells who is behind. Point-to-point operations involve only pairs, so they are
// counted apart (p2p = true) and never compared across ranks.
//
// Thread-safe: communicators record from the calling thread, the watchdog reads from its own.
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "megatron/core/dtype.h"

namespace megatron {

struct CollectiveRecord {
  uint64_t id = 0;  // process-wide issue order, from 1
  std::string group;
  bool p2p = false;
  uint64_t seq = 0;   // per (group, p2p), from 1
  std::string op;     // "all_reduce", "reduce_scatter_coalesced", "batch_p2p", ...
  int64_t count = 0;  // elements, summed over the tensors of a coalesced call
  DType dtype = DType::f32;
  std::string detail;  // free text: peers of a p2p batch, the reduction
  double start = 0;    // seconds since the log was created
  double end = -1;     // < 0 while in flight
  bool in_flight() const { return end < 0; }
};

// Issued and completed counts of one (group, kind), and the last operation issued there.
struct GroupProgress {
  std::string group;
  bool p2p = false;
  uint64_t issued = 0;
  uint64_t completed = 0;
  CollectiveRecord last;
};

class CollectiveLog {
 public:
  explicit CollectiveLog(size_t capacity);

  // Records an operation as issued now and returns it with its id and seq filled in.
  CollectiveRecord begin(const std::string& group, bool p2p, const std::string& op, int64_t count, DType dtype,
                         const std::string& detail = {});
  // Marks the operation `begin` returned as complete. It may have left the ring already; its
  // group's count still moves.
  void end(const CollectiveRecord& record);

  // The last n records still in the ring, oldest first.
  std::vector<CollectiveRecord> recent(size_t n) const;
  // Every operation issued but not yet completed that the ring still holds.
  std::vector<CollectiveRecord> in_flight() const;
  std::vector<GroupProgress> progress() const;

  double now() const;  // seconds since creation, on the clock of start/end

 private:
  GroupProgress& progress_of(const std::string& group, bool p2p);

  mutable std::mutex mutex_;
  std::vector<CollectiveRecord> ring_;  // slot id % capacity
  uint64_t next_id_ = 1;
  std::vector<GroupProgress> groups_;
  double origin_;  // steady clock at creation, seconds
};

// "dp all_reduce #5 (100 f32; op avg)": what ranks compare.
std::string record_name(const CollectiveRecord& r);
// One line per record: "#id dp all_reduce #5 (100 f32; op avg) at 1.2 s, done in 0.003 s".
std::string format_record(const CollectiveRecord& r, double now);

}  // namespace megatron
