#pragma once
// Pipeline schedules as data: a pure function from the pipeline's shape and a rank to that rank's
// ordered list of actions (compute one micro-batch of one model chunk forward or backward, send or
// receive an activation or its gradient). The runtime only executes the list; tests read it alone.
//
// Shapes and numbering (Megatron-Core's schedules.py):
//   P  pipeline ranks, V model chunks per rank (virtual stages), M micro-batches.
//   Chunk c of rank r is virtual stage c·P + r; activations flow from virtual stage s to s+1,
//   so rank P-1's chunk c feeds rank 0's chunk c+1. Stage 0 reads tokens, stage P·V-1 computes the
//   loss; neither receives what it makes for itself.
// Compute order (one rule for every schedule):
//   warm-up forwards, then steady (forward of virtual id k+W, backward of virtual id k), then
//   cool-down backwards. Virtual id k names a (micro-batch, chunk) through Megatron's table:
//   groups of N micro-batches, and inside a group every chunk in turn (chunk 0 for the group's
//   micro-batches, then chunk 1, ...); backwards visit chunks in reverse (V-1-chunk).
//   1F1B (V=1):  W = min(P-r-1, M).
//   Interleaved: W = min(2·(P-r-1) + (V-1)·N, M·V), N = --microbatch-group-size-per-virtual-
//                pipeline-stage (default P).
//   Forward-only (evaluation): every forward in table order, no backward.
// Communication: compute runs in steps (one action; in the interleaved steady state the (F, B)
// pair), each followed by one batch holding the sends of what the step produced and the receives
// of what the next step needs (Megatron's send_forward_recv_backward / send_backward_recv_forward
// in 1F1B, send_forward_backward_recv_forward_backward interleaved). Consecutive send/receive actions form one
// batch and are posted together (one NCCL group, or MPI requests waited together): a rank blocks at
// a batch until every operation in it has met its peer's. Messages between two ranks match in the
// order they are posted, activations and gradients apart: they travel on separate channels (at P=2
// both flow between the same two ranks, in orders that differ once N > P).
// Overlapped communication (--overlap-p2p-communication, ScheduleShape::overlap_p2p): nothing
// waits at a send or a receive; a compute action waits only for its own input. Each compute action
// is its own step (the interleaved (F, B) pair too, so a forward's output leaves before the
// backward beside it runs, as Megatron posts it), followed by its send and by the receive of the
// next compute action of the same kind (forward or backward): each input is in transit while the
// action before it computes. The first forward's receive comes first of all; a gradient's receive
// never before this rank has sent the forward output it is the gradient of, so every posted receive
// waits only on work already posted (on a GPU, a set-up call in a chunk's first forward may wait
// for the whole device, queued receives included: ReceiveWait in schedule_simulation.h). Sends
// complete in the background, so groups larger than the pipeline (N > P) run.
#include <cstdint>
#include <string>
#include <vector>

namespace megatron::pipeline_parallel {

enum class ActionKind {
  kForward,         // run chunk `chunk` forward on micro-batch `microbatch`
  kBackward,        // its backward
  kSendActivation,  // send chunk's output to the next virtual stage (rank `peer`)
  kRecvActivation,  // receive chunk's input from the previous virtual stage (rank `peer`)
  kSendGrad,        // send the gradient of chunk's input to the previous virtual stage
  kRecvGrad,        // receive the gradient of chunk's output from the next virtual stage
};

struct Action {
  ActionKind kind;
  int64_t microbatch = 0;
  int64_t chunk = 0;  // this rank's model chunk
  int64_t peer = -1;  // pipeline rank at the other end of a send or receive; -1 for compute
  bool operator==(const Action&) const = default;
};

bool is_compute(ActionKind kind);
std::string to_string(const Action& action);  // "F3.1" = forward of micro-batch 3, chunk 1; "sendA3.1->2"

struct ScheduleShape {
  int64_t pipeline_size = 1;          // P
  int64_t virtual_stages = 1;         // V (1: not interleaved)
  int64_t microbatches = 1;           // M
  int64_t microbatch_group_size = 0;  // N for the interleaved schedule; 0 = P (Megatron's default)
  bool forward_only = false;          // evaluation
  bool overlap_p2p = false;           // --overlap-p2p-communication: the overlapped placement above

  int64_t group_size() const { return microbatch_group_size > 0 ? microbatch_group_size : pipeline_size; }
  int64_t virtual_stage(int64_t rank, int64_t chunk) const { return chunk * pipeline_size + rank; }
  bool is_first_stage(int64_t rank, int64_t chunk) const { return virtual_stage(rank, chunk) == 0; }
  bool is_last_stage(int64_t rank, int64_t chunk) const {
    return virtual_stage(rank, chunk) == pipeline_size * virtual_stages - 1;
  }
};

// Every rule the shape breaks, one message each (the values, the rule, the fix): sizes at least 1;
// with V > 1 Megatron's interleaving rules P > 1, P <= N <= M and M mod N either 0 or >= P, and
// without overlap_p2p N = P: with N > P the blocking batches deadlock (the simulation shows it);
// sends that complete in the background (overlap_p2p) are what larger groups need.
std::vector<std::string> validate(const ScheduleShape& shape);

// Warm-up forwards on `rank` (W above).
int64_t warmup_microbatches(const ScheduleShape& shape, int64_t rank);

// The (micro-batch, chunk) that forward virtual id k runs: Megatron's schedule table.
struct MicrobatchChunk {
  int64_t microbatch, chunk;
  bool operator==(const MicrobatchChunk&) const = default;
};
std::vector<MicrobatchChunk> schedule_table(const ScheduleShape& shape);

// `rank`'s actions in order. Throws on a shape `validate` rejects.
std::vector<Action> build_schedule(const ScheduleShape& shape, int64_t rank);

}  // namespace megatron::pipeline_parallel
