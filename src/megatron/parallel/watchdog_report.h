#pragma once
// The watchdog's analysis of a stuck operation, kept free of MPI so it is tested on its own.
//
// When an operation times out, the watchdog asks the other ranks involved for their status
// (encode_status, sent as text over its side channel) and names the missing ranks (diagnose):
//   - a rank that does not answer is stopped, dead, or busy outside communication;
//   - for a collective #s on group G, a rank that has issued fewer than s operations on G never
//     arrived; a rank whose operation #s on G differs (op, count, dtype) called another collective;
//   - for a point-to-point batch, a peer with no point-to-point operation in flight on G is not
//     posting the matching send or receive;
//   - a peer that waits elsewhere (behind, inside another operation, or in a point-to-point batch
//     that also involves other ranks) is followed: the ranks its operations wait on are asked in
//     turn (ranks_to_follow), so a pipeline whose middle stage stopped is traced from any stage to
//     that stage, not to the neighbour that waits on it.
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
  std::vector<int> waits_on;                // world ranks its watched operations in flight wait on
};

// One line per group ("G group p2p issued completed") and per operation in flight
// ("F group p2p seq op count dtype age"), after a first line "R world_rank", then "W ranks..."
// when `waits_on` is not empty.
std::string encode_status(int world_rank, const CollectiveLog& log, const std::vector<int>& waits_on = {});
// Throws on text that encode_status did not write.
PeerStatus decode_status(const std::string& text);

struct Diagnosis {
  std::vector<int> missing;        // world ranks named as the cause
  std::vector<std::string> lines;  // one per peer, then the summary
};

// The ranks to ask next: those that peers waiting elsewhere, and the ranks already followed, wait
// on, and that no one has asked yet (`self` excluded). Empty once the chains end.
std::vector<int> ranks_to_follow(const CollectiveRecord& stuck, const std::vector<PeerStatus>& peers,
                                 const std::vector<PeerStatus>& followed, int self);

// `stuck` timed out on this rank; `peers` are the other ranks of its group (collectives) or its
// peers (point-to-point), with what each answered; `followed`, what the ranks reached through
// ranks_to_follow answered. A peer waiting elsewhere whose chain of waits ends at a rank that did
// not answer or has nothing in flight is held up by that rank, which is named instead of it.
Diagnosis diagnose(const CollectiveRecord& stuck, const std::vector<PeerStatus>& peers,
                   const std::vector<PeerStatus>& followed = {});

}  // namespace megatron
