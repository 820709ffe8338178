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

}  // namespace

std::string encode_status(int world_rank, const CollectiveLog& log) {
  std::ostringstream os;
  const double now = log.now();
  os << "R " << world_rank << "\n";
  for (const GroupProgress& g : log.progress())
    os << "G " << g.group << " " << g.p2p << " " << g.issued << " " << g.completed << "\n";
  for (const CollectiveRecord& r : log.in_flight())
    os << "F " << r.group << " " << r.p2p << " " << r.seq << " " << r.op << " " << r.count << " " << dtype_name(r.dtype)
       << " " << now - r.start << "\n";
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
    } else {
      MEGATRON_FAIL("unknown watchdog status line '" << tag << "' in " << text);
    }
  }
  return p;
}

Diagnosis diagnose(const CollectiveRecord& stuck, const std::vector<PeerStatus>& peers) {
  Diagnosis d;
  // silent: never answered. held_up: behind, but waiting inside an earlier operation, which a
  // silent rank may be what holds (an all-to-all whose root still waits for the stopped rank);
  // they are named as the cause only when every rank answered.
  std::vector<int> silent, held_up, causes;
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
      continue;
    }
    const GroupProgress* g = progress_on(p, stuck.group, false);
    const uint64_t issued = g ? g->issued : 0;
    if (issued < stuck.seq) {
      (p.in_flight.empty() ? causes : held_up).push_back(p.world_rank);
      d.lines.push_back(concat(who, " never arrived: it has issued ", issued, " operation(s) on ", stuck.group,
                               ", not #", stuck.seq, " yet; ", in_flight_text(p)));
      continue;
    }
    const CollectiveRecord* same = in_flight_on(p, stuck.group, false, stuck.seq);
    if (same != nullptr && !same_collective(*same, stuck)) {
      causes.push_back(p.world_rank);
      d.lines.push_back(concat(who, " issued ", stuck.group, " #", stuck.seq, " as ", record_name(*same),
                               " but this rank as ", record_name(stuck), ": the ranks call different collectives"));
      continue;
    }
    d.lines.push_back(concat(who, " arrived at ", stuck.group, " #", stuck.seq, "; ", in_flight_text(p)));
  }
  d.missing = silent;
  d.missing.insert(d.missing.end(), causes.begin(), causes.end());
  if (silent.empty()) d.missing.insert(d.missing.end(), held_up.begin(), held_up.end());
  std::sort(d.missing.begin(), d.missing.end());
  const auto list = [](const std::vector<int>& ranks) {
    std::string text;
    for (size_t i = 0; i < ranks.size(); ++i) text += concat(i ? ", " : " ", ranks[i]);
    return text;
  };
  std::string summary = concat("timeout in ", record_name(stuck), "; ");
  if (!silent.empty() && !held_up.empty())
    summary += concat("rank(s)", list(held_up), " wait in an earlier operation, held up; ");
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
