#include "megatron/pipeline_parallel/schedule.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"

namespace megatron::pipeline_parallel {

bool is_compute(ActionKind kind) { return kind == ActionKind::kForward || kind == ActionKind::kBackward; }

std::string to_string(const Action& a) {
  static constexpr const char* kNames[] = {"F", "B", "sendA", "recvA", "sendG", "recvG"};
  std::string s = concat(kNames[static_cast<int>(a.kind)], a.microbatch, ".", a.chunk);
  if (!is_compute(a.kind))
    s += concat(a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGrad ? "->" : "<-", a.peer);
  return s;
}

std::vector<std::string> validate(const ScheduleShape& s) {
  std::vector<std::string> errors;
  if (s.pipeline_size < 1) errors.push_back(concat("pipeline size ", s.pipeline_size, " must be at least 1"));
  if (s.virtual_stages < 1)
    errors.push_back(concat("virtual stages per pipeline rank ", s.virtual_stages, " must be at least 1"));
  if (s.microbatches < 1) errors.push_back(concat("number of micro-batches ", s.microbatches, " must be at least 1"));
  if (!errors.empty() || s.virtual_stages == 1) return errors;
  if (s.pipeline_size == 1)
    errors.push_back(concat(s.virtual_stages,
                            " virtual stages per pipeline rank with --pipeline-model-parallel-size 1: ",
                            "the interleaved schedule needs more than one pipeline rank (as Megatron); fix: drop ",
                            "--num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank"));
  const int64_t p = s.pipeline_size, n = s.group_size(), m = s.microbatches;
  if (p == 1) return errors;
  if (n < p || n > m)
    errors.push_back(concat("--microbatch-group-size-per-virtual-pipeline-stage ", n,
                            " (default: the pipeline size) with ", m,
                            " micro-batches per global batch and --pipeline-model-parallel-size ", p,
                            ": the interleaved schedule needs pipeline size <= group size <= micro-batches; fix: "
                            "raise --global-batch-size (micro-batches = global batch / (micro-batch size x DP)) "
                            "or set the group size between them"));
  else if (n != p && !s.overlap_p2p)
    errors.push_back(concat("--microbatch-group-size-per-virtual-pipeline-stage ", n,
                            " with --pipeline-model-parallel-size ", p, " and --no-overlap-p2p-communication",
                            ": a group larger than the pipeline deadlocks the ranks' blocking send/receive batches ",
                            "(the schedule simulation shows it; sends must complete in the background); fix: drop ",
                            "--no-overlap-p2p-communication, or leave the group size at its default, ", p));
  if (n >= p && n <= m && m % n != 0 && m % n < p)
    errors.push_back(concat(m, " micro-batches in groups of ", n,
                            " (--microbatch-group-size-per-virtual-pipeline-stage) leave a last group of ", m % n,
                            ", below the pipeline size ", p,
                            ": the interleaved schedule needs the micro-batches to divide into groups, or the last "
                            "group to hold at least P; fix: make --global-batch-size a multiple of micro-batch size "
                            "x DP x ",
                            n));
  return errors;
}

int64_t warmup_microbatches(const ScheduleShape& s, int64_t rank) {
  const int64_t total = s.microbatches * s.virtual_stages;
  if (s.forward_only) return total;
  if (s.virtual_stages == 1) return std::min(s.pipeline_size - rank - 1, s.microbatches);
  return std::min(2 * (s.pipeline_size - rank - 1) + (s.virtual_stages - 1) * s.group_size(), total);
}

std::vector<MicrobatchChunk> schedule_table(const ScheduleShape& s) {
  std::vector<MicrobatchChunk> table;
  const int64_t n = s.group_size(), m = s.microbatches;
  for (int64_t first = 0; first < m; first += n) {
    // The last group takes every micro-batch left (Megatron: first + n >= m).
    const int64_t end = first + n >= m ? m : first + n;
    for (int64_t chunk = 0; chunk < s.virtual_stages; ++chunk)
      for (int64_t mb = first; mb < end; ++mb) table.push_back({mb, chunk});
    if (end == m) break;
  }
  return table;
}

namespace {

// Compute actions in steps, each step followed by one batch of communication: warm-up forwards,
// steady (F k+W, B k), cool-down backwards. A steady step is one action in 1F1B and the pair in the
// interleaved schedule, as Megatron batches them; with overlap_p2p every action is a step.
std::vector<std::vector<Action>> compute_steps(const ScheduleShape& s, int64_t rank) {
  const std::vector<MicrobatchChunk> table = schedule_table(s);
  const int64_t total = int64_t(table.size()), warmup = warmup_microbatches(s, rank);
  auto forward = [&](int64_t k) {
    return Action{ActionKind::kForward, table[size_t(k)].microbatch, table[size_t(k)].chunk};
  };
  auto backward = [&](int64_t k) {
    return Action{ActionKind::kBackward, table[size_t(k)].microbatch, s.virtual_stages - 1 - table[size_t(k)].chunk};
  };
  std::vector<std::vector<Action>> steps;
  for (int64_t k = 0; k < warmup; ++k) steps.push_back({forward(k)});
  if (s.forward_only) return steps;
  for (int64_t k = 0; k < total - warmup; ++k) {
    if (s.virtual_stages == 1 || s.overlap_p2p) {
      steps.push_back({forward(k + warmup)});
      steps.push_back({backward(k)});
    } else {
      steps.push_back({forward(k + warmup), backward(k)});
    }
  }
  for (int64_t k = total - warmup; k < total; ++k) steps.push_back({backward(k)});
  return steps;
}

enum class Transfer { kInput, kOutput };

// What a compute action must receive first (its input) or sends when done (its output); none at
// the pipeline's ends. Forwards take activations from the previous virtual stage and pass them
// on; backwards take gradients from the next one and pass them back.
std::optional<Action> transfer_of(const ScheduleShape& s, int64_t rank, const Action& a, Transfer t) {
  const bool forward = a.kind == ActionKind::kForward, input = t == Transfer::kInput;
  const bool with_previous = forward == input;
  if (with_previous ? s.is_first_stage(rank, a.chunk) : s.is_last_stage(rank, a.chunk)) return std::nullopt;
  const ActionKind kind = forward ? (input ? ActionKind::kRecvActivation : ActionKind::kSendActivation)
                                  : (input ? ActionKind::kRecvGrad : ActionKind::kSendGrad);
  const int64_t peer = (rank + (with_previous ? s.pipeline_size - 1 : 1)) % s.pipeline_size;
  return Action{kind, a.microbatch, a.chunk, peer};
}

}  // namespace

namespace {

// The overlapped placement (header): every step one compute action, then its send and the receive
// of the next action of its kind; the first forward's receive first of all. A gradient's receive
// waits until this rank has sent the forward output it is the gradient of, so every receive posted
// depends only on work already posted, which keeps the schedule live even when every compute
// action waits for all posted receives (ReceiveWait::kEveryPosted; on a GPU, a host call that waits
// for the whole device, queued receive kernels included).
std::vector<Action> overlapped_schedule(const ScheduleShape& s, int64_t rank,
                                        const std::vector<std::vector<Action>>& steps) {
  std::vector<Action> compute;
  for (const std::vector<Action>& step : steps) compute.insert(compute.end(), step.begin(), step.end());
  std::vector<Action> actions;
  std::set<std::pair<int64_t, int64_t>> forwarded;                // (micro-batch, chunk) forwards placed
  std::map<std::pair<int64_t, int64_t>, Action> grads_waiting;  // gradient receives waiting for their forward
  auto receive_next = [&](size_t after, ActionKind kind) {
    for (size_t j = after; j < compute.size(); ++j)
      if (compute[j].kind == kind) {
        const std::optional<Action> recv = transfer_of(s, rank, compute[j], Transfer::kInput);
        if (!recv) return;
        const std::pair key{recv->microbatch, recv->chunk};
        if (kind == ActionKind::kBackward && !forwarded.count(key))
          grads_waiting.emplace(key, *recv);
        else
          actions.push_back(*recv);
        return;
      }
  };
  receive_next(0, ActionKind::kForward);
  receive_next(0, ActionKind::kBackward);
  for (size_t i = 0; i < compute.size(); ++i) {
    const Action& a = compute[i];
    actions.push_back(a);
    if (auto send = transfer_of(s, rank, a, Transfer::kOutput)) actions.push_back(*send);
    if (a.kind == ActionKind::kForward) {
      forwarded.emplace(a.microbatch, a.chunk);
      if (auto waiting = grads_waiting.find({a.microbatch, a.chunk}); waiting != grads_waiting.end()) {
        actions.push_back(waiting->second);
        grads_waiting.erase(waiting);
      }
    }
    receive_next(i + 1, a.kind);
  }
  MEGATRON_CHECK(grads_waiting.empty(), "pipeline schedule: a backward's gradient receive without its forward");
  return actions;
}

}  // namespace

std::vector<Action> build_schedule(const ScheduleShape& s, int64_t rank) {
  const std::vector<std::string> errors = validate(s);
  MEGATRON_CHECK(errors.empty(), errors.front());
  MEGATRON_CHECK(rank >= 0 && rank < s.pipeline_size,
                 "pipeline rank " << rank << " is outside a pipeline of " << s.pipeline_size << " ranks");
  const std::vector<std::vector<Action>> steps = compute_steps(s, rank);
  if (s.overlap_p2p) return overlapped_schedule(s, rank, steps);
  std::vector<Action> actions;
  // Receives of one step, sent after the step before it (or first of all, for step 0).
  auto receive_inputs = [&](const std::vector<Action>& step) {
    for (const Action& a : step)
      if (auto recv = transfer_of(s, rank, a, Transfer::kInput)) actions.push_back(*recv);
  };
  if (!steps.empty()) receive_inputs(steps.front());
  for (size_t i = 0; i < steps.size(); ++i) {
    actions.insert(actions.end(), steps[i].begin(), steps[i].end());
    for (const Action& a : steps[i])
      if (auto send = transfer_of(s, rank, a, Transfer::kOutput)) actions.push_back(*send);
    if (i + 1 < steps.size()) receive_inputs(steps[i + 1]);
  }
  return actions;
}

}  // namespace megatron::pipeline_parallel
