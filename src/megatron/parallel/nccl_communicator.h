#pragma once
// The Communicator of GPU ranks, over NCCL (implemented in nccl_communicator.cu, built with the
// CUDA backend only). Kept free of CUDA and NCCL headers.
//
// Each communicator owns a non-blocking CUDA stream. An operation records an event on the
// caller's current stream, makes its stream wait for it (the inputs are ready), enqueues the
// NCCL call(s) in one NCCL group, and records a completion event. wait() makes the caller's
// current stream wait for that event; the host never blocks. The watchdog polls the completion
// event against the deadline. The handle keeps the tensors alive until wait() (or its destruction,
// which waits) and not after: from then on every later user of their memory is queued on the
// compute stream behind that wait (the caching allocator reuses a block on the stream that
// allocated it), so a caller that frees a transient buffer after the wait frees it at once, however
// far the host runs ahead of the GPU.
//
// Bootstrap: group rank 0 creates the ncclUniqueId and broadcasts it over the group's MPI
// communicator. NVLink multicast (NVLS) stays off: NCCL reads that switch only from its
// environment (ncclConfig_t has no field for it), and library code never writes the environment,
// so creating a communicator requires NCCL_NVLS_ENABLE=0 there (the megatron executable sets it
// when unset, the tests' environment carries it) and names the fix otherwise.
//
// dtypes: reductions of f32, f64, bf16, f16, i32, i64 (NCCL reduces 16-bit floats in their own
// precision at each step; DDP reduces fp32 gradients); moves carry any dtype as bytes.
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "megatron/parallel/comm.h"

namespace megatron {

class Watchdog;

// The NCCL communicator of one group on `device` (which must be the current CUDA device).
// `group` is the group's MPI communicator used to broadcast the id (not kept); MPI_COMM_NULL for
// a group of one process without MPI. `asked` (world ranks) are asked for their status when an
// operation times out; empty: the other members (a pipeline channel asks its whole pipeline).
std::shared_ptr<Communicator> make_nccl_communicator(const std::string& name, MPI_Comm group,
                                                     std::vector<int> world_ranks, Device device,
                                                     std::shared_ptr<Watchdog> watchdog, std::vector<int> asked = {});

}  // namespace megatron
