#include "megatron/parallel/collective_checks.h"

#include <algorithm>
#include <cstdint>

namespace megatron {

namespace {

uintptr_t address(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw()); }

}  // namespace

void check_devices(const Communicator& comm, const char* op, std::span<const Tensor> tensors, DeviceType type) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MEGATRON_CHECK(t.defined(), comm.name() << " " << op << ": tensor " << i << " is undefined");
    MEGATRON_CHECK(t.device().type == type,
                   comm.name() << " " << op << ": tensor " << i << " is on " << t.device().str() << " but the "
                               << comm.name() << " communicator moves " << (type == DeviceType::cpu ? "CPU" : "CUDA")
                               << " memory; build the parallel state for the device the model runs on");
  }
}

void check_reduce_op(const Communicator& comm, const char* op, DType dtype, ReduceOp reduce) {
  MEGATRON_CHECK(reduce != ReduceOp::avg || dtype_is_floating(dtype),
                 comm.name() << " " << op << ": avg of " << dtype_name(dtype)
                             << " would truncate; use sum and divide, or a floating dtype");
}

void check_all_gather(const Communicator& comm, const Tensor& out, const Tensor& in) {
  MEGATRON_CHECK(out.dtype() == in.dtype(), comm.name() << " all_gather: out is " << dtype_name(out.dtype())
                                                        << " but in is " << dtype_name(in.dtype())
                                                        << "; gather into a tensor of the input's dtype");
  MEGATRON_CHECK(out.numel() == in.numel() * comm.size(),
                 comm.name() << " all_gather: out has " << out.numel() << " elements but " << comm.size() << " ranks x "
                             << in.numel() << " input elements = " << in.numel() * comm.size() << " are gathered");
  MEGATRON_CHECK(!overlaps(out, in) || is_chunk_of(in, out, comm.rank()),
                 comm.name() << " all_gather: in overlaps out but is not chunk " << comm.rank()
                             << " of it (this rank's slice, the only in-place layout)");
}

void check_reduce_scatter(const Communicator& comm, const Tensor& out, const Tensor& in, ReduceOp reduce) {
  MEGATRON_CHECK(out.dtype() == in.dtype(), comm.name() << " reduce_scatter: out is " << dtype_name(out.dtype())
                                                        << " but in is " << dtype_name(in.dtype()));
  MEGATRON_CHECK(in.numel() == out.numel() * comm.size(),
                 comm.name() << " reduce_scatter: in has " << in.numel() << " elements but " << comm.size()
                             << " ranks x " << out.numel() << " output elements = " << out.numel() * comm.size()
                             << " are reduced; in must be size() x out");
  MEGATRON_CHECK(!overlaps(out, in) || is_chunk_of(out, in, comm.rank()),
                 comm.name() << " reduce_scatter: out overlaps in but is not chunk " << comm.rank()
                             << " of it (this rank's slice, the only in-place layout)");
  check_reduce_op(comm, "reduce_scatter", in.dtype(), reduce);
}

void check_broadcast(const Communicator& comm, const Tensor& tensor, int root) {
  MEGATRON_CHECK(tensor.defined(), comm.name() << " broadcast: the tensor is undefined");
  MEGATRON_CHECK(root >= 0 && root < comm.size(), comm.name() << " broadcast: root " << root << " is not a rank of the "
                                                              << comm.size() << "-rank group");
}

void check_all_to_all(const Communicator& comm, const Tensor& out, const Tensor& in) {
  MEGATRON_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel(),
                 comm.name() << " all_to_all: out (" << out.numel() << " " << dtype_name(out.dtype()) << ") and in ("
                             << in.numel() << " " << dtype_name(in.dtype()) << ") must match");
  MEGATRON_CHECK(in.numel() % comm.size() == 0, comm.name()
                                                    << " all_to_all: " << in.numel() << " elements do not split into "
                                                    << comm.size() << " equal chunks; use all_to_all_v");
  MEGATRON_CHECK(!overlaps(out, in), comm.name() << " all_to_all: out and in overlap; use separate buffers");
}

int64_t check_all_to_all_v(const Communicator& comm, const Tensor& out, std::span<const int64_t> recv_rows,
                           const Tensor& in, std::span<const int64_t> send_rows) {
  const auto n = size_t(comm.size());
  MEGATRON_CHECK(recv_rows.size() == n && send_rows.size() == n,
                 comm.name() << " all_to_all_v: " << send_rows.size() << " send and " << recv_rows.size()
                             << " receive row counts for a group of " << n << " ranks; give one per rank");
  MEGATRON_CHECK(out.dtype() == in.dtype(), comm.name() << " all_to_all_v: out is " << dtype_name(out.dtype())
                                                        << " but in is " << dtype_name(in.dtype()));
  MEGATRON_CHECK(in.ndim() >= 1 && out.ndim() >= 1, comm.name() << " all_to_all_v: scalars have no rows");
  const int64_t row = in.dim(0) > 0 ? in.numel() / in.dim(0) : 0;
  const int64_t out_row = out.dim(0) > 0 ? out.numel() / out.dim(0) : 0;
  MEGATRON_CHECK(in.dim(0) == 0 || out.dim(0) == 0 || row == out_row,
                 comm.name() << " all_to_all_v: rows of in " << shape_str(in.shape()) << " and out "
                             << shape_str(out.shape()) << " differ in size");
  int64_t sent = 0, received = 0;
  for (size_t j = 0; j < n; ++j) {
    MEGATRON_CHECK(send_rows[j] >= 0 && recv_rows[j] >= 0, comm.name()
                                                               << " all_to_all_v: negative row count for rank " << j);
    sent += send_rows[j];
    received += recv_rows[j];
  }
  MEGATRON_CHECK(sent == in.dim(0), comm.name() << " all_to_all_v: send_rows add up to " << sent << " but in has "
                                                << in.dim(0) << " rows");
  MEGATRON_CHECK(received == out.dim(0), comm.name() << " all_to_all_v: recv_rows add up to " << received
                                                     << " but out has " << out.dim(0) << " rows");
  MEGATRON_CHECK(!overlaps(out, in), comm.name() << " all_to_all_v: out and in overlap; use separate buffers");
  return in.dim(0) > 0 ? row : out_row;
}

void check_p2p(const Communicator& comm, std::span<const P2POp> ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    MEGATRON_CHECK(ops[i].tensor.defined(), comm.name() << " batch_p2p: op " << i << " has no tensor");
    MEGATRON_CHECK(ops[i].peer >= 0 && ops[i].peer < comm.size(),
                   comm.name() << " batch_p2p: op " << i << " names peer " << ops[i].peer << ", not a rank of the "
                               << comm.size() << "-rank group");
  }
}

bool is_chunk_of(const Tensor& part, const Tensor& whole, int64_t index) {
  return part.dtype() == whole.dtype() && address(part) == address(whole) + size_t(index) * part.nbytes() &&
         part.numel() * (index + 1) <= whole.numel();
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  return address(a) < address(b) + b.nbytes() && address(b) < address(a) + a.nbytes();
}

int64_t total_numel(std::span<const Tensor> tensors) {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.numel();
  return n;
}

std::vector<int> p2p_world_peers(const Communicator& comm, std::span<const P2POp> ops) {
  std::vector<int> peers;
  for (const P2POp& op : ops) peers.push_back(comm.world_ranks()[size_t(op.peer)]);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

}  // namespace megatron
