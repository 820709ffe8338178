#pragma once
// The watchdog's analysis of a stuck operation, kept free of MPI so it is tested on its own.
//
// When an operation times out, the watchdog asks the other ranks involved for their status
// (encode_status, sent as text over its side channel) and names the missing ranks (diagnose):
//   - a rank that does not answer is stopped, dead, or busy outside communication;
//   - for a collective #s on group G, a rank that has issued fewer than s operations on G never
//     arrived; a rank whose operation #s on G differs (op, count, dtype) called another collective;
//   - for a point-to-point batch, a peer with no point-to-point operation in flight on G is not
//     posting the matching send or receive.
#include <string>
#include <vector>

#include "megatron/parallel/collective_log.h"

namespace megatron {

// What one rank reported. answered = false for a rank that never replied.
struct PeerStatus {
  int world_rank = -1;
  bool answered = false;
  std::vector<GroupProgress> groups;        // issued/completed per group (last left empty)
  std::vector<CollectiveRecord> in_flight;  // start holds the age in seconds at reply time
};

// One line per group ("G group p2p issued completed") and per operation in flight
// ("F group p2p seq op count dtype age"), after a first line "R world_rank".
std::string encode_status(int world_rank, const CollectiveLog& log);
// Throws on text that encode_status did not write.
PeerStatus decode_status(const std::string& text);

struct Diagnosis {
  std::vector<int> missing;        // world ranks named as the cause
  std::vector<std::string> lines;  // one per peer, then the summary
};

// `stuck` timed out on this rank; `peers` are the other ranks of its group (collectives) or its
// peers (point-to-point), with what each answered.
Diagnosis diagnose(const CollectiveRecord& stuck, const std::vector<PeerStatus>& peers);

}  // namespace megatron
