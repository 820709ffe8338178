#pragma once
// The Communicator of CPU ranks, over MPI's non-blocking collectives (MPI_I*). Every operation
// is recorded in the watchdog's log when issued; wait() blocks in MPI_Waitall under a watchdog
// deadline.
//
// dtypes: f32, f64, i32 and i64 reduce natively. bf16 and f16 reduce in fp32: the tensor is
// converted to an fp32 copy, reduced, and rounded back once when the handle completes, so the
// result does not depend on MPI's reduction order and is rounded once (a custom MPI_Op would
// round at every step of the reduction tree). Moves (gather, broadcast, all-to-all, p2p) carry
// any dtype bit for bit. avg is a sum divided by the group size on completion.
//
// Operations on one communicator must be called from one thread (MPI's rule for collectives
// on one communicator); handles may complete in any order.
#include <memory>
#include <string>
#include <vector>

#include "megatron/parallel/comm.h"
#include "megatron/parallel/mpi_check.h"
#include "megatron/parallel/watchdog.h"

namespace megatron {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction). world_ranks[i] is group rank i's global rank.
  // `asked` (world ranks) are asked for their status when an operation times out; empty: the other
  // members (a pipeline channel asks its whole pipeline).
  MpiCommunicator(std::string name, MPI_Comm comm, std::vector<int> world_ranks, std::shared_ptr<Watchdog> watchdog,
                  std::vector<int> asked = {});
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
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
  CollectiveRecord record(const std::string& op, std::span<const Tensor> tensors, const std::string& detail = {},
                          bool p2p = false);

  std::string name_;
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;
  std::vector<int> others_;  // world ranks of the other members: who the watchdog asks
  std::shared_ptr<Watchdog> watchdog_;
  double timeout_;
};

}  // namespace megatron
