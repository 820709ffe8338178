#pragma once
// Collective communication over one process group. Models and parallel layers call this
// interface only, never NCCL or MPI. Implementations: SingleRankCommunicator (here), MPI for CPU
// ranks (mpi_communicator.h) and NCCL for GPU ranks (nccl_communicator.h); parallel_state.h
// builds them. A group of size 1 makes every collective an identity, so TP=1/DP=1 code runs the
// same path as the parallel one.
//
// Asynchronous forms return a CommHandle. wait() makes the result usable by what follows:
//   - CPU (MPI): the data is in place when wait() returns.
//   - CUDA (NCCL): the operation runs on the communicator's own stream after the work already queued on the
//     caller's current stream; wait() makes the current stream wait for it without blocking the host (stream
//     semantics, as torch.distributed's Work.wait()).
// The blocking forms are the asynchronous ones followed by wait(). Tensors passed to an operation must not be
// touched until its handle has been waited on; a handle destroyed without wait() waits first, and the operation
// holds them until then, never after: memory freed after a wait is free at once. Every wait is bounded by the
// timeout (set_timeout): a stuck operation ends the job with a report naming the rank that never arrived (watchdog.h).
//
// Coalesced forms run several tensors as one operation (one handle, one record in the
// collective log, one NCCL group): the tensors may differ in size and dtype.
//
// In place: all_reduce and broadcast always are. all_gather is in place when `in` is rank r's
// slice r of `out`; reduce_scatter when `out` is slice r of `in` (NCCL's convention).
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "megatron/core/tensor.h"

namespace megatron {

// avg divides the sum by the group size (NCCL's ncclAvg); floating dtypes only.
enum class ReduceOp { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

class CommHandle {
 public:
  virtual ~CommHandle() = default;
  virtual void wait() = 0;
  // True once the operation has completed; never blocks. On CUDA a true test() still needs
  // wait() to order the caller's stream (cheap once complete).
  virtual bool test() = 0;
};
using CommHandlePtr = std::unique_ptr<CommHandle>;

// One send or receive of a batch executed together (Megatron's batch_isend_irecv). `peer` is
// a rank of this group. Between two ranks, sends and receives match in the order issued.
struct P2POp {
  enum class Kind { send, recv };
  Kind kind = Kind::send;
  Tensor tensor;
  int peer = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "tp", "dp", ... for error messages and the watchdog
  // Global rank of every member, in group-rank order.
  virtual const std::vector<int>& world_ranks() const = 0;
  // Bounds every wait of this communicator (--distributed-timeout-minutes x 60); positive.
  virtual void set_timeout(double seconds) = 0;
  virtual double timeout() const = 0;

  // tensors[i] = op over ranks of tensors[i].
  virtual CommHandlePtr all_reduce_coalesced_async(std::span<Tensor> tensors, ReduceOp op) = 0;
  // outs[i] holds size() * ins[i].numel() elements: rank r's input lands at [r*n, (r+1)*n).
  virtual CommHandlePtr all_gather_coalesced_async(std::span<Tensor> outs, std::span<const Tensor> ins) = 0;
  // ins[i] holds size() * outs[i].numel() elements; outs[i] = op over ranks of their chunk r.
  virtual CommHandlePtr reduce_scatter_coalesced_async(std::span<Tensor> outs, std::span<const Tensor> ins,
                                                       ReduceOp op) = 0;
  virtual CommHandlePtr broadcast_async(Tensor& tensor, int root) = 0;
  // in and out hold size() equal chunks; chunk j of `in` goes to rank j, chunk j of `out` comes
  // from rank j.
  virtual CommHandlePtr all_to_all_async(Tensor& out, const Tensor& in) = 0;
  // Uneven all-to-all along dim 0: `in` is send_rows[0] rows for rank 0, then send_rows[1] for
  // rank 1, ...; `out` receives recv_rows[j] rows from rank j in rank order. Rows have the same
  // size in both; recv_rows must equal what each peer sends (MoE token dispatch).
  virtual CommHandlePtr all_to_all_v_async(Tensor& out, std::span<const int64_t> recv_rows, const Tensor& in,
                                           std::span<const int64_t> send_rows) = 0;
  virtual CommHandlePtr batch_p2p_async(std::span<const P2POp> ops) = 0;
  virtual CommHandlePtr barrier_async() = 0;

  // Single-tensor and blocking forms of the above.
  CommHandlePtr all_reduce_async(Tensor& tensor, ReduceOp op) { return all_reduce_coalesced_async({&tensor, 1}, op); }
  CommHandlePtr all_gather_async(Tensor& out, const Tensor& in) {
    return all_gather_coalesced_async({&out, 1}, {&in, 1});
  }
  CommHandlePtr reduce_scatter_async(Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum) {
    return reduce_scatter_coalesced_async({&out, 1}, {&in, 1}, op);
  }
  void all_reduce(Tensor& tensor, ReduceOp op) { all_reduce_async(tensor, op)->wait(); }
  void all_reduce_coalesced(std::span<Tensor> tensors, ReduceOp op) { all_reduce_coalesced_async(tensors, op)->wait(); }
  void all_gather(Tensor& out, const Tensor& in) { all_gather_async(out, in)->wait(); }
  void reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum) {
    reduce_scatter_async(out, in, op)->wait();
  }
  void broadcast(Tensor& tensor, int root) { broadcast_async(tensor, root)->wait(); }
  void all_to_all(Tensor& out, const Tensor& in) { all_to_all_async(out, in)->wait(); }
  void all_to_all_v(Tensor& out, std::span<const int64_t> recv_rows, const Tensor& in,
                    std::span<const int64_t> send_rows) {
    all_to_all_v_async(out, recv_rows, in, send_rows)->wait();
  }
  void batch_p2p(std::span<const P2POp> ops) { batch_p2p_async(ops)->wait(); }
  // Returns once every rank has arrived, on the host too (a CUDA wait() alone only orders the
  // stream): rank 0 building the dataset cache before the others read it relies on this. A rank
  // that never arrives is reported by the watchdog, which tracks the operation while the host polls.
  void barrier() {
    const CommHandlePtr handle = barrier_async();
    handle->wait();
    while (!handle->test()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

// The group of one process: every collective is an identity or a copy, checked like the real ones.
class SingleRankCommunicator final : public Communicator {
 public:
  explicit SingleRankCommunicator(std::string group_name, int world_rank = 0);
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  void set_timeout(double seconds) override;
  double timeout() const override { return timeout_; }

  CommHandlePtr all_reduce_coalesced_async(std::span<Tensor> tensors, ReduceOp op) override;
  CommHandlePtr all_gather_coalesced_async(std::span<Tensor> outs, std::span<const Tensor> ins) override;
  CommHandlePtr reduce_scatter_coalesced_async(std::span<Tensor> outs, std::span<const Tensor> ins,
                                               ReduceOp op) override;
  CommHandlePtr broadcast_async(Tensor& tensor, int root) override;
  CommHandlePtr all_to_all_async(Tensor& out, const Tensor& in) override;
  CommHandlePtr all_to_all_v_async(Tensor& out, std::span<const int64_t> recv_rows, const Tensor& in,
                                   std::span<const int64_t> send_rows) override;
  CommHandlePtr batch_p2p_async(std::span<const P2POp> ops) override;
  CommHandlePtr barrier_async() override;

 private:
  std::string name_;
  std::vector<int> world_ranks_;
  double timeout_ = 600;
};

// A handle whose operation finished when it was issued.
CommHandlePtr completed_handle();

// How attention crosses the context-parallel group (--cp-comm-type): p2p, the ring that passes keys
// and values; a2a, all-to-alls that trade the sequence split for a head split; allgather, the
// ring's blocks on keys and values all-gathered once; a2a_p2p (a2a+p2p), the all-to-all inside the
// hierarchical groups' first level around the ring over the second.
enum class CpCommType { p2p, a2a, allgather, a2a_p2p };

// The pipeline's one-way channels for --overlap-p2p-communication: each joins two neighbouring
// stages and carries one kind of tensor one way (its group rank 0 sends, rank 1 receives), so on
// NCCL each has its own communicator and stream and nothing posted on one waits behind another's
// traffic (one communicator completes its operations in posting order). Activations flow from
// stage s to s+1, gradients back; with interleaving the last stage feeds the first. Every channel
// of a kind has one name ("pp_activations", "pp_grads"), and a timeout on one asks the whole
// pipeline group, so the stage further along that stopped is named. Null unless initialize_parallel
// was asked for them (ParallelOptions::pipeline_channels) at PP > 1.
struct PipelineChannels {
  std::shared_ptr<Communicator> activations_in, activations_out, grads_in, grads_out;
  bool built() const { return activations_in != nullptr; }
};

// The groups one rank belongs to, passed explicitly to layers (no process-group globals).
// Megatron's groups (reference/megatron-compat.md §7); parallel_state.h builds them.
struct ParallelContext {
  std::shared_ptr<Communicator> world;
  std::shared_ptr<Communicator> tp;                  // tensor (and sequence) parallel
  std::shared_ptr<Communicator> dp;                  // data parallel
  std::shared_ptr<Communicator> pp;                  // pipeline: activations, forward
  std::shared_ptr<Communicator> pp_grad;             // pipeline: their gradients, backward (own communicator:
                                                     // p2p matches by order alone, and the orders differ)
  std::shared_ptr<Communicator> cp;                  // context parallel
  std::shared_ptr<Communicator> cp_a2a;              // --hierarchical-context-parallel-sizes: level 0 of CP
  std::shared_ptr<Communicator> cp_p2p;              // and level 1 (null unless the sizes are given)
  std::shared_ptr<Communicator> dp_cp;               // DP x CP: gradient reduction, loss averaging
  std::shared_ptr<Communicator> mp;                  // model parallel (TP x PP): grad-norm without dist-opt
  std::shared_ptr<Communicator> ep;                  // expert parallel
  std::shared_ptr<Communicator> expert_tp;           // expert tensor parallel
  std::shared_ptr<Communicator> expert_dp;           // expert data parallel: expert gradient reduction
  std::shared_ptr<Communicator> expert_tp_ep;        // expert TP x EP: the MoE layers' token exchange
  std::shared_ptr<Communicator> expert_mp;           // expert TP x EP x PP: the experts' grad norm
  std::shared_ptr<Communicator> embedding;           // first and last pipeline stage (tied embeddings)
  std::shared_ptr<Communicator> position_embedding;  // first pipeline stage
  PipelineChannels pp_channels;                      // overlapped pipeline p2p (above)

  // Sequence parallelism and its collectives as rings beside the GEMMs, as the run gives them
  // (--sequence-parallel, --tp-comm-overlap; parallel_args.h: model_context). Layers ask
  // sequence_parallel() and tp_comm_overlap(): as in Megatron, neither takes effect at TP 1.
  bool sequence_parallel_given = false;
  bool tp_comm_overlap_given = false;
  CpCommType cp_comm_type = CpCommType::p2p;  // --cp-comm-type

  int tp_rank() const { return tp->rank(); }
  int tp_size() const { return tp->size(); }
  bool sequence_parallel() const { return sequence_parallel_given && tp_size() > 1; }
  bool tp_comm_overlap() const { return tp_comm_overlap_given && sequence_parallel(); }
  // Every distinct communicator above, each once.
  std::vector<std::shared_ptr<Communicator>> communicators() const;
  // set_timeout on every communicator; `seconds` = --distributed-timeout-minutes x 60.
  void set_timeout(double seconds) const;

  static ParallelContext single_process();
};

}  // namespace megatron
