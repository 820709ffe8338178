#include "megatron/pipeline_parallel/schedule_simulation.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "megatron/core/error.h"

namespace megatron::pipeline_parallel {

double ActionCosts::compute(ActionKind kind, int64_t stage) const {
  const bool forward_pass = kind == ActionKind::kForward;
  const std::vector<double>& measured = forward_pass ? forward_by_stage : backward_by_stage;
  if (measured.empty()) return forward_pass ? forward : backward;
  MEGATRON_CHECK(stage < int64_t(measured.size()),
                 "pipeline simulation: " << measured.size() << " measured costs for virtual stage " << stage);
  return measured[size_t(stage)];
}

double SimulatedPipeline::makespan() const {
  return finish.empty() ? 0 : *std::max_element(finish.begin(), finish.end());
}

double SimulatedPipeline::bubble_fraction() const {
  const double most_busy = busy.empty() ? 0 : *std::max_element(busy.begin(), busy.end());
  return most_busy > 0 ? (makespan() - most_busy) / most_busy : 0;
}

int64_t peak_in_flight(const std::vector<Action>& actions) {
  int64_t live = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::kForward) peak = std::max(peak, ++live);
    if (a.kind == ActionKind::kBackward) --live;
  }
  return peak;
}

namespace {

bool is_send(ActionKind k) { return k == ActionKind::kSendActivation || k == ActionKind::kSendGrad; }

struct Posted {
  Action action;
  int64_t rank;
  double time;
};

// One ordered pair of ranks (sender, receiver) and one kind of tensor: what each end posted, in order.
struct Channel {
  std::vector<Posted> sends, recvs;
};

struct RankState {
  std::vector<Action> actions;
  size_t next = 0;            // first action not yet complete
  size_t batch_end = 0;       // end of the posted batch, 0 while none is posted
  std::vector<size_t> slots;  // each posted operation's index in its channel
  // Overlapped: each posted receive by (micro-batch, chunk, activation?), as (its action, its slot).
  std::map<std::tuple<int64_t, int64_t, bool>, std::pair<Action, size_t>> receives;
  std::set<std::pair<ActionKind, int64_t>> started;  // (compute kind, chunk) run at least once
  double time = 0, busy = 0;
};

class Simulation {
 public:
  Simulation(const ScheduleShape& shape, const std::vector<std::vector<Action>>& per_rank, const ActionCosts& costs,
             ReceiveWait wait)
      : shape_(shape), costs_(costs), wait_(wait) {
    for (const std::vector<Action>& actions : per_rank) {
      ranks_.emplace_back();
      ranks_.back().actions = actions;
    }
  }

  SimulatedPipeline run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int64_t r = 0; r < int64_t(ranks_.size()); ++r) progress = advance(r) || progress;
    }
    report_deadlock();
    SimulatedPipeline out;
    for (const RankState& s : ranks_) {
      out.finish.push_back(s.time);
      out.busy.push_back(s.busy);
      out.peak_in_flight.push_back(peak_in_flight(s.actions));
    }
    return out;
  }

 private:
  Channel& channel(int64_t rank, const Action& a) {
    const bool activation = a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvActivation;
    return is_send(a.kind) ? channels_[{rank, a.peer, activation}] : channels_[{a.peer, rank, activation}];
  }

  // A send of (micro-batch, chunk) from virtual stage v must meet the receive at v+1 (activation)
  // or v-1 (gradient) of the same micro-batch.
  void check_pair(const Posted& send, const Posted& recv) const {
    const bool activation = send.action.kind == ActionKind::kSendActivation;
    const int64_t from = shape_.virtual_stage(send.rank, send.action.chunk);
    const int64_t to = shape_.virtual_stage(recv.rank, recv.action.chunk);
    const bool same = recv.action.kind == (activation ? ActionKind::kRecvActivation : ActionKind::kRecvGrad) &&
                      recv.action.microbatch == send.action.microbatch && to == from + (activation ? 1 : -1);
    MEGATRON_CHECK(same, "pipeline schedule: rank " << send.rank << "'s " << to_string(send.action) << " meets rank "
                                                    << recv.rank << "'s " << to_string(recv.action));
  }

  // Posts one send or receive at the rank's time; returns its index in its channel.
  size_t post(int64_t r, const RankState& s, const Action& op) {
    Channel& c = channel(r, op);
    std::vector<Posted>& mine = is_send(op.kind) ? c.sends : c.recvs;
    const std::vector<Posted>& peers = is_send(op.kind) ? c.recvs : c.sends;
    mine.push_back({op, r, s.time});
    if (peers.size() >= mine.size())
      is_send(op.kind) ? check_pair(mine.back(), peers[mine.size() - 1])
                       : check_pair(peers[mine.size() - 1], mine.back());
    return mine.size() - 1;
  }

  // Overlapped: when compute action `a` may start (its input, or every receive posted, has
  // arrived: both ends posted, plus the transfer); false while a send it waits for is not posted.
  bool inputs_arrived(int64_t r, RankState& s, const Action& a, double& arrival) {
    arrival = s.time;
    const auto arrived = [&](const std::pair<Action, size_t>& receive) {
      const Channel& c = channel(r, receive.first);
      if (c.sends.size() <= receive.second) return false;
      arrival = std::max(arrival, std::max(c.recvs[receive.second].time, c.sends[receive.second].time) + costs_.p2p);
      return true;
    };
    const bool first_use = !s.started.count({a.kind, a.chunk});
    if (wait_ == ReceiveWait::kEveryPostedAtFirstUse && first_use)
      return std::all_of(s.receives.begin(), s.receives.end(), [&](const auto& entry) { return arrived(entry.second); });
    auto it = s.receives.find({a.microbatch, a.chunk, a.kind == ActionKind::kForward});
    return it == s.receives.end() || arrived(it->second);
  }

  // Runs rank r as far as it can go; true if anything changed.
  bool advance(int64_t r) {
    RankState& s = ranks_[size_t(r)];
    bool progress = false;
    while (s.next < s.actions.size()) {
      const Action& a = s.actions[s.next];
      if (shape_.overlap_p2p && !is_compute(a.kind)) {
        const size_t slot = post(r, s, a);
        if (!is_send(a.kind)) s.receives[{a.microbatch, a.chunk, a.kind == ActionKind::kRecvActivation}] = {a, slot};
        ++s.next;
        progress = true;
        continue;
      }
      if (is_compute(a.kind)) {
        if (shape_.overlap_p2p) {
          double arrival = 0;
          if (!inputs_arrived(r, s, a, arrival)) return progress;
          s.time = arrival;
          s.started.emplace(a.kind, a.chunk);
        }
        const double cost = costs_.compute(a.kind, shape_.virtual_stage(r, a.chunk));
        s.time += cost;
        s.busy += cost;
        ++s.next;
        progress = true;
        continue;
      }
      if (s.batch_end == 0) {
        post_batch(r, s);
        progress = true;
      }
      double met = s.time;
      for (size_t i = s.next; i < s.batch_end; ++i) {
        const Action& op = s.actions[i];
        Channel& c = channel(r, op);
        const std::vector<Posted>& peers = is_send(op.kind) ? c.recvs : c.sends;
        const size_t slot = s.slots[i - s.next];
        if (peers.size() <= slot) return progress;
        met = std::max(met, peers[slot].time);
      }
      s.time = met + costs_.p2p;
      s.next = s.batch_end;
      s.batch_end = 0;
      progress = true;
    }
    return progress;
  }

  void post_batch(int64_t r, RankState& s) {
    s.batch_end = s.next;
    while (s.batch_end < s.actions.size() && !is_compute(s.actions[s.batch_end].kind)) ++s.batch_end;
    s.slots.clear();
    for (size_t i = s.next; i < s.batch_end; ++i) s.slots.push_back(post(r, s, s.actions[i]));
  }

  void report_deadlock() const {
    std::ostringstream stuck;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const RankState& s = ranks_[r];
      if (s.next == s.actions.size()) continue;
      stuck << " rank " << r << " waits at";
      for (size_t i = s.next; i < std::max(s.batch_end, s.next + 1); ++i) stuck << " " << to_string(s.actions[i]);
      stuck << ";";
    }
    MEGATRON_CHECK(stuck.str().empty(), "pipeline schedule deadlocks:" << stuck.str());
  }

  ScheduleShape shape_;
  ActionCosts costs_;
  ReceiveWait wait_;
  std::vector<RankState> ranks_;
  std::map<std::tuple<int64_t, int64_t, bool>, Channel> channels_;  // (sender, receiver, activation?)
};

}  // namespace

SimulatedPipeline simulate(const ScheduleShape& shape, const std::vector<std::vector<Action>>& per_rank,
                           const ActionCosts& costs, ReceiveWait wait) {
  MEGATRON_CHECK(int64_t(per_rank.size()) == shape.pipeline_size,
                 "pipeline simulation: " << per_rank.size() << " action lists for " << shape.pipeline_size << " ranks");
  return Simulation(shape, per_rank, costs, wait).run();
}

SimulatedPipeline simulate(const ScheduleShape& shape, const ActionCosts& costs, ReceiveWait wait) {
  std::vector<std::vector<Action>> per_rank;
  for (int64_t r = 0; r < shape.pipeline_size; ++r) per_rank.push_back(build_schedule(shape, r));
  return simulate(shape, per_rank, costs, wait);
}

}  // namespace megatron::pipeline_parallel
