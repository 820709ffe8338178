#pragma once
// Argument checks shared by every Communicator implementation, so a call that is wrong fails
// the same way on one rank (SingleRankCommunicator) as on many. Messages name the group, the
// operation, the tensor, the rule and the fix.
#include <cstdint>
#include <span>
#include <vector>

#include "megatron/parallel/comm.h"

namespace megatron {

// Every tensor is on `type` (the kind of memory this communicator moves).
void check_devices(const Communicator& comm, const char* op, std::span<const Tensor> tensors, DeviceType type);
void check_reduce_op(const Communicator& comm, const char* op, DType dtype, ReduceOp reduce);
void check_all_gather(const Communicator& comm, const Tensor& out, const Tensor& in);
void check_reduce_scatter(const Communicator& comm, const Tensor& out, const Tensor& in, ReduceOp reduce);
void check_broadcast(const Communicator& comm, const Tensor& tensor, int root);
void check_all_to_all(const Communicator& comm, const Tensor& out, const Tensor& in);
// Returns the elements per row.
int64_t check_all_to_all_v(const Communicator& comm, const Tensor& out, std::span<const int64_t> recv_rows,
                           const Tensor& in, std::span<const int64_t> send_rows);
void check_p2p(const Communicator& comm, std::span<const P2POp> ops);

// True when `part` is chunk `index` (of part.numel() elements) of `whole`: the in-place layout.
bool is_chunk_of(const Tensor& part, const Tensor& whole, int64_t index);
// True when the bytes of a and b overlap.
bool overlaps(const Tensor& a, const Tensor& b);

// Elements over all tensors (the count a coalesced call records).
int64_t total_numel(std::span<const Tensor> tensors);
// The world ranks a point-to-point batch talks to, each once: whom the watchdog asks when it is
// stuck (and follows further when they wait on others). The NCCL communicator still asks its
// whole group (not yet run on several GPUs with this).
std::vector<int> p2p_world_peers(const Communicator& comm, std::span<const P2POp> ops);

}  // namespace megatron
