#include "megatron/parallel/watchdog_report.h"

#include <algorithm>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"

namespace megatron {

namespace {

std::string in_flight_text(const PeerStatus& p) {
  if (p.in_flight.empty()) return "nothing in flight (computing, or blocked outside communication)";
  std::string s = "in flight: ";
  for (size_t i = 0; i < p.in_flight.size(); ++i) {
    const CollectiveRecord& r = p.in_flight[i];
    s += concat(i ? "; " : "", record_name(r), " for ", r.start, " s");
  }
  return s;
}

const GroupProgress* progress_on(const PeerStatus& p, const std::string& group, bool p2p) {
  for (const GroupProgress& g : p.groups)
    if (g.group == group && g.p2p == p2p) return &g;
  return nullptr;
}

const CollectiveRecord* in_flight_on(const PeerStatus& p, const std::string& group, bool p2p, uint64_t seq) {
  for (const CollectiveRecord& r : p.in_flight)
    if (r.group == group && r.p2p == p2p && (p2p || r.seq == seq)) return &r;
  return nullptr;
}

// Whether two members' records of one seq describe the same call. An all_to_all_v's count is
// what this rank sends, which differs between members by design (MoE token exchange).
bool same_collective(const CollectiveRecord& a, const CollectiveRecord& b) {
  const bool counts_must_match = a.op != "all_to_all_v";
  return a.op == b.op && a.dtype == b.dtype && (!counts_must_match || a.count == b.count);
}

// Whether `p` answered from inside an operation other than `stuck`: behind on a collective's group
// with something in flight, or, for a point-to-point batch, anywhere in flight (its batch on the
// group may also wait on ranks this one does not talk to). Such a peer is held by what it waits on.
bool waits_elsewhere(const CollectiveRecord& stuck, const PeerStatus& p) {
  if (!p.answered || p.in_flight.empty()) return false;
  if (stuck.p2p) return true;
  const GroupProgress* g = progress_on(p, stuck.group, false);
  return (g ? g->issued : 0) < stuck.seq;
}

const PeerStatus* status_of(int rank, const std::vector<PeerStatus>& peers, const std::vector<PeerStatus>& followed) {
  for (const auto* list : {&peers, &followed})
    for (const PeerStatus& p : *list)
      if (p.world_rank == rank) return &p;
  return nullptr;
}

// Where the waits starting at `from` end: ranks that did not answer or answered with nothing in
// flight, found breadth first through ranks that answered from inside operations. Each end comes
// with the chain that leads to it ("0 waits on 1, 1 on 2"). Ranks not asked (this rank among
// them: its own wait is the stuck one) end no chain.
struct ChainEnd {
  int rank;
  std::string chain;
};

std::vector<ChainEnd> chain_ends(const PeerStatus& from, const std::vector<PeerStatus>& peers,
                                 const std::vector<PeerStatus>& followed) {
  std::vector<ChainEnd> ends;
  std::vector<std::pair<const PeerStatus*, std::string>> frontier{{&from, {}}};
  std::vector<int> seen{from.world_rank};
  while (!frontier.empty()) {
    std::vector<std::pair<const PeerStatus*, std::string>> next;
    for (const auto& [waiter, chain] : frontier) {
      for (int rank : waiter->waits_on) {
        if (std::find(seen.begin(), seen.end(), rank) != seen.end()) continue;
        seen.push_back(rank);
        const PeerStatus* s = status_of(rank, peers, followed);
        if (s == nullptr) continue;
        const std::string link = chain.empty() ? concat(waiter->world_rank, " waits on ", rank)
                                               : concat(chain, ", ", waiter->world_rank, " on ", rank);
        if (!s->answered || s->in_flight.empty())
          ends.push_back({rank, link});
        else
          next.push_back({s, link});
      }
    }
    frontier = std::move(next);
  }
  return ends;
}

}  // namespace

std::string encode_status(int world_rank, const CollectiveLog& log, const std::vector<int>& waits_on) {
  std::ostringstream os;
  const double now = log.now();
  os << "R " << world_rank << "\n";
  for (const GroupProgress& g : log.progress())
    os << "G " << g.group << " " << g.p2p << " " << g.issued << " " << g.completed << "\n";
  for (const CollectiveRecord& r : log.in_flight())
    os << "F " << r.group << " " << r.p2p << " " << r.seq << " " << r.op << " " << r.count << " " << dtype_name(r.dtype)
       << " " << now - r.start << "\n";
  if (!waits_on.empty()) {
    os << "W";
    for (int rank : waits_on) os << " " << rank;
    os << "\n";
  }
  return os.str();
}

PeerStatus decode_status(const std::string& text) {
  PeerStatus p;
  std::istringstream is(text);
  std::string tag;
  MEGATRON_CHECK(is >> tag >> p.world_rank && tag == "R", "watchdog status does not start with 'R rank': " << text);
  p.answered = true;
  while (is >> tag) {
    if (tag == "G") {
      GroupProgress g;
      MEGATRON_CHECK(is >> g.group >> g.p2p >> g.issued >> g.completed, "malformed watchdog group line in " << text);
      p.groups.push_back(g);
    } else if (tag == "F") {
      CollectiveRecord r;
      std::string dtype;
      MEGATRON_CHECK(is >> r.group >> r.p2p >> r.seq >> r.op >> r.count >> dtype >> r.start,
                     "malformed watchdog operation line in " << text);
      r.dtype = dtype_from_name(dtype);
      p.in_flight.push_back(r);
    } else if (tag == "W") {
      std::string ranks;
      std::getline(is, ranks);
      std::istringstream rs(ranks);
      for (int rank; rs >> rank;) p.waits_on.push_back(rank);
      MEGATRON_CHECK(rs.eof(), "malformed watchdog waits line in " << text);
    } else {
      MEGATRON_FAIL("unknown watchdog status line '" << tag << "' in " << text);
    }
  }
  return p;
}

std::vector<int> ranks_to_follow(const CollectiveRecord& stuck, const std::vector<PeerStatus>& peers,
                                 const std::vector<PeerStatus>& followed, int self) {
  std::vector<int> next;
  const auto add_waits_of = [&](const PeerStatus& p) {
    for (int rank : p.waits_on)
      if (rank != self && status_of(rank, peers, followed) == nullptr &&
          std::find(next.begin(), next.end(), rank) == next.end())
        next.push_back(rank);
  };
  for (const PeerStatus& p : peers)
    if (waits_elsewhere(stuck, p)) add_waits_of(p);
  for (const PeerStatus& p : followed)
    if (p.answered) add_waits_of(p);
  std::sort(next.begin(), next.end());
  return next;
}

Diagnosis diagnose(const CollectiveRecord& stuck, const std::vector<PeerStatus>& peers,
                   const std::vector<PeerStatus>& followed) {
  Diagnosis d;
  // silent: never answered. held_up: behind, but waiting inside another operation, which a silent
  // rank may be what holds (an all-to-all whose root still waits for the stopped rank). A peer that
  // waits elsewhere is traced through `followed` to where its waits end (traced); held-up peers
  // are named as the cause only when no rank is silent or traced.
  std::vector<int> silent, held_up, causes, traced, held;
  bool all_answered_p2p_busy = true;
  for (const PeerStatus& p : peers) {
    const std::string who = concat("rank ", p.world_rank);
    if (!p.answered) {
      silent.push_back(p.world_rank);
      d.lines.push_back(who + " did not answer: it is stopped, dead, or busy outside communication");
      all_answered_p2p_busy = false;
      continue;
    }
    if (stuck.p2p) {
      if (in_flight_on(p, stuck.group, true, 0) == nullptr) {
        (p.in_flight.empty() ? causes : held_up).push_back(p.world_rank);
        all_answered_p2p_busy = false;
        d.lines.push_back(concat(who, " posts no send or receive on ", stuck.group, "; ", in_flight_text(p)));
      } else {
        d.lines.push_back(concat(who, " is in a point-to-point batch on ", stuck.group, "; ", in_flight_text(p)));
      }
    } else if (const GroupProgress* g = progress_on(p, stuck.group, false); (g ? g->issued : 0) < stuck.seq) {
      (p.in_flight.empty() ? causes : held_up).push_back(p.world_rank);
      d.lines.push_back(concat(who, " never arrived: it has issued ", g ? g->issued : 0, " operation(s) on ",
                               stuck.group, ", not #", stuck.seq, " yet; ", in_flight_text(p)));
    } else if (const CollectiveRecord* same = in_flight_on(p, stuck.group, false, stuck.seq);
               same != nullptr && !same_collective(*same, stuck)) {
      causes.push_back(p.world_rank);
      d.lines.push_back(concat(who, " issued ", stuck.group, " #", stuck.seq, " as ", record_name(*same),
                               " but this rank as ", record_name(stuck), ": the ranks call different collectives"));
    } else {
      d.lines.push_back(concat(who, " arrived at ", stuck.group, " #", stuck.seq, "; ", in_flight_text(p)));
    }
    if (!waits_elsewhere(stuck, p)) continue;
    const std::vector<ChainEnd> ends = chain_ends(p, peers, followed);
    if (ends.empty()) continue;
    held.push_back(p.world_rank);
    std::erase(held_up, p.world_rank);
    for (const ChainEnd& end : ends) {
      const PeerStatus* e = status_of(end.rank, peers, followed);
      d.lines.push_back(concat(who, " is held up by rank ", end.rank,
                               e->answered ? ", which has nothing in flight" : ", which did not answer", " (",
                               end.chain, ")"));
      if (std::find(traced.begin(), traced.end(), end.rank) == traced.end()) traced.push_back(end.rank);
    }
  }
  d.missing = silent;
  for (const std::vector<int>* more : {&causes, &traced})
    for (int rank : *more)
      if (std::find(d.missing.begin(), d.missing.end(), rank) == d.missing.end()) d.missing.push_back(rank);
  if (silent.empty() && traced.empty())
    d.missing.insert(d.missing.end(), held_up.begin(), held_up.end());
  else
    held.insert(held.end(), held_up.begin(), held_up.end());
  std::sort(d.missing.begin(), d.missing.end());
  std::sort(held.begin(), held.end());
  const auto list = [](const std::vector<int>& ranks) {
    std::string text;
    for (size_t i = 0; i < ranks.size(); ++i) text += concat(i ? ", " : " ", ranks[i]);
    return text;
  };
  std::string summary = concat("timeout in ", record_name(stuck), "; ");
  if (!held.empty()) summary += concat("rank(s)", list(held), " wait in other operations, held up; ");
  if (!d.missing.empty()) {
    summary += "missing rank(s):" + list(d.missing);
  } else if (peers.empty()) {
    summary += "no other rank takes part, so this rank's own queued work holds it";
  } else if (stuck.p2p && all_answered_p2p_busy) {
    summary += "every peer is in a point-to-point batch: the sends and receives do not match";
  } else {
    summary +=
        "no rank is missing: every member arrived, so the transport failed or the operation is too slow "
        "for the timeout";
  }
  d.lines.push_back(summary);
  return d;
}

}  // namespace megatron
