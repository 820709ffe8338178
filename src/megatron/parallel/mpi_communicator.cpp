#include "megatron/parallel/mpi_communicator.h"

#include <climits>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>

#include "megatron/core/strings.h"
#include "megatron/parallel/collective_checks.h"

namespace megatron {

namespace {

constexpr int kP2PTag = 0;

// The type that moves a dtype's bits unchanged.
MPI_Datatype move_type(DType d) {
  switch (d) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::bf16:
    case DType::f16:
    case DType::u16:
      return MPI_UINT16_T;
    case DType::u8:
    case DType::e4m3:
    case DType::e5m2:
      return MPI_UINT8_T;
  }
  MEGATRON_FAIL("no MPI type for dtype " << dtype_name(d));
}

// 16-bit floats are reduced in an fp32 copy (header comment).
bool reduces_in_f32(DType d) { return d == DType::bf16 || d == DType::f16; }

MPI_Datatype reduce_type(const std::string& group, const char* op, DType d) {
  switch (d) {
    case DType::f32:
    case DType::bf16:
    case DType::f16:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    default:
      MEGATRON_FAIL(group << " " << op << ": cannot reduce " << dtype_name(d)
                          << " tensors; reduce f32, f64, bf16, f16, i32 or i64");
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// MPI-3 counts are int.
int mpi_count(const std::string& group, const char* op, int64_t n) {
  MEGATRON_CHECK(n <= INT_MAX, group << " " << op << ": " << n << " elements exceed MPI's int count limit " << INT_MAX
                                     << "; split the tensor into coalesced pieces");
  return int(n);
}

void divide(Tensor& t, double n) {
  if (t.dtype() == DType::f64) {
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] /= n;
  } else {
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(p[i] / n);
  }
}

// One issued operation: its MPI requests and what must outlive them.
struct Work {
  CollectiveRecord record;
  std::vector<int> peers;
  std::vector<MPI_Request> requests;
  std::vector<Tensor> tensors;                     // user tensors and fp32 copies MPI reads or writes
  std::vector<std::vector<int>> counts;            // all_to_all_v counts and displacements
  std::vector<std::function<void()>> on_complete;  // rounding back, averaging, copies out
};

class MpiHandle final : public CommHandle {
 public:
  MpiHandle(std::unique_ptr<Work> work, std::shared_ptr<Watchdog> watchdog, double timeout)
      : work_(std::move(work)), watchdog_(std::move(watchdog)), timeout_(timeout) {}

  ~MpiHandle() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] error: completing %s in a dropped handle failed: %s\n", watchdog_->world_rank(),
                   format_record(work_->record, watchdog_->log().now()).c_str(), e.what());
      std::terminate();
    }
  }

  void wait() override {
    if (done_) return;
    {
      Watchdog::Scope watch(*watchdog_, work_->record, timeout_, work_->peers);
      MPI_CHECK(MPI_Waitall(int(work_->requests.size()), work_->requests.data(), MPI_STATUSES_IGNORE),
                work_->record.group);
    }
    complete();
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_CHECK(MPI_Testall(int(work_->requests.size()), work_->requests.data(), &flag, MPI_STATUSES_IGNORE),
              work_->record.group);
    if (flag) complete();
    return done_;
  }

 private:
  void complete() {
    done_ = true;
    for (auto& f : work_->on_complete) f();
    watchdog_->log().end(work_->record);
    work_.reset();
  }

  std::unique_ptr<Work> work_;
  std::shared_ptr<Watchdog> watchdog_;
  double timeout_;
  bool done_ = false;
};

}  // namespace

MpiCommunicator::MpiCommunicator(std::string name, MPI_Comm comm, std::vector<int> world_ranks,
                                 std::shared_ptr<Watchdog> watchdog, std::vector<int> asked)
    : name_(std::move(name)),
      comm_(comm),
      world_ranks_(std::move(world_ranks)),
      watchdog_(std::move(watchdog)),
      timeout_(watchdog_->default_timeout()) {
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), name_);
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_), name_);
  MPI_CHECK(MPI_Comm_size(comm_, &size_), name_);
  MEGATRON_CHECK(size_t(size_) == world_ranks_.size(), name_ << ": the MPI communicator has " << size_
                                                             << " ranks but the layout lists " << world_ranks_.size());
  MEGATRON_CHECK(world_ranks_[size_t(rank_)] == watchdog_->world_rank(),
                 name_ << ": group rank " << rank_ << " should be world rank " << world_ranks_[size_t(rank_)]
                       << " but this is world rank " << watchdog_->world_rank());
  for (int r : world_ranks_)
    if (r != watchdog_->world_rank()) others_.push_back(r);
  if (!asked.empty()) others_ = std::move(asked);
}

// Teardown cannot report errors.
MpiCommunicator::~MpiCommunicator() { MPI_Comm_free(&comm_); }

void MpiCommunicator::set_timeout(double seconds) {
  MEGATRON_CHECK(std::isfinite(seconds) && seconds > 0,
                 name_ << ": timeout " << seconds << " s must be positive (--distributed-timeout-minutes)");
  timeout_ = seconds;
}

CollectiveRecord MpiCommunicator::record(const std::string& op, std::span<const Tensor> tensors,
                                         const std::string& detail, bool p2p) {
  const DType dtype = tensors.empty() ? DType::f32 : tensors[0].dtype();
  return watchdog_->log().begin(name_, p2p, op, total_numel(tensors), dtype, detail);
}

namespace {

std::string op_name(const char* base, size_t tensors) { return tensors == 1 ? base : concat(base, "_coalesced"); }

std::string reduce_detail(ReduceOp op, size_t tensors) {
  std::string d = op == ReduceOp::sum ? "" : concat("op ", reduce_op_name(op));
  if (tensors != 1) d += concat(d.empty() ? "" : ", ", tensors, " tensors");
  return d;
}

CommHandlePtr launch(std::unique_ptr<Work> work, const std::shared_ptr<Watchdog>& watchdog, double timeout) {
  return std::make_unique<MpiHandle>(std::move(work), watchdog, timeout);
}

}  // namespace

CommHandlePtr MpiCommunicator::all_reduce_coalesced_async(std::span<Tensor> tensors, ReduceOp op) {
  check_devices(*this, "all_reduce", tensors, DeviceType::cpu);
  auto work = std::make_unique<Work>();
  for (const Tensor& t : tensors) {
    reduce_type(name_, "all_reduce", t.dtype());
    check_reduce_op(*this, "all_reduce", t.dtype(), op);
  }
  work->record = record(op_name("all_reduce", tensors.size()), tensors, reduce_detail(op, tensors.size()));
  work->peers = others_;
  const double n = size_;
  for (Tensor t : tensors) {
    Tensor buffer = reduces_in_f32(t.dtype()) ? t.to(DType::f32) : t;
    work->requests.emplace_back();
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer.raw(), mpi_count(name_, "all_reduce", t.numel()),
                             reduce_type(name_, "all_reduce", t.dtype()), mpi_op(op), comm_, &work->requests.back()),
              name_);
    work->on_complete.push_back([t, buffer, op, n]() mutable {
      if (op == ReduceOp::avg) divide(buffer, n);
      if (!buffer.same_storage(t)) t.copy_from(buffer);
    });
    work->tensors.push_back(buffer);
  }
  return launch(std::move(work), watchdog_, timeout_);
}

CommHandlePtr MpiCommunicator::all_gather_coalesced_async(std::span<Tensor> outs, std::span<const Tensor> ins) {
  MEGATRON_CHECK(outs.size() == ins.size(),
                 name_ << " all_gather: " << outs.size() << " outputs for " << ins.size() << " inputs");
  check_devices(*this, "all_gather", outs, DeviceType::cpu);
  check_devices(*this, "all_gather", ins, DeviceType::cpu);
  for (size_t i = 0; i < outs.size(); ++i) check_all_gather(*this, outs[i], ins[i]);
  auto work = std::make_unique<Work>();
  work->record = record(op_name("all_gather", ins.size()), ins, reduce_detail(ReduceOp::sum, ins.size()));
  work->peers = others_;
  for (size_t i = 0; i < outs.size(); ++i) {
    const Tensor& in = ins[i];
    Tensor& out = outs[i];
    const int n = mpi_count(name_, "all_gather", in.numel());
    const MPI_Datatype type = move_type(in.dtype());
    work->requests.emplace_back();
    if (is_chunk_of(in, out, rank_))
      MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out.raw(), n, type, comm_, &work->requests.back()),
                name_);
    else
      MPI_CHECK(MPI_Iallgather(in.raw(), n, type, out.raw(), n, type, comm_, &work->requests.back()), name_);
    work->tensors.push_back(in);
    work->tensors.push_back(out);
  }
  return launch(std::move(work), watchdog_, timeout_);
}

CommHandlePtr MpiCommunicator::reduce_scatter_coalesced_async(std::span<Tensor> outs, std::span<const Tensor> ins,
                                                              ReduceOp op) {
  MEGATRON_CHECK(outs.size() == ins.size(),
                 name_ << " reduce_scatter: " << outs.size() << " outputs for " << ins.size() << " inputs");
  check_devices(*this, "reduce_scatter", outs, DeviceType::cpu);
  check_devices(*this, "reduce_scatter", ins, DeviceType::cpu);
  for (size_t i = 0; i < outs.size(); ++i) {
    check_reduce_scatter(*this, outs[i], ins[i], op);
    reduce_type(name_, "reduce_scatter", ins[i].dtype());
  }
  auto work = std::make_unique<Work>();
  work->record = record(op_name("reduce_scatter", ins.size()), ins, reduce_detail(op, ins.size()));
  work->peers = others_;
  const double n = size_;
  for (size_t i = 0; i < outs.size(); ++i) {
    Tensor out = outs[i];
    const bool widen = reduces_in_f32(out.dtype());
    const Tensor in = widen ? ins[i].to(DType::f32) : ins[i];
    // MPI forbids aliased buffers; the in-place layout reduces into a separate result.
    Tensor result = widen || overlaps(out, in) ? Tensor::empty({out.numel()}, in.dtype()) : out;
    work->requests.emplace_back();
    MPI_CHECK(MPI_Ireduce_scatter_block(in.raw(), result.raw(), mpi_count(name_, "reduce_scatter", out.numel()),
                                        reduce_type(name_, "reduce_scatter", out.dtype()), mpi_op(op), comm_,
                                        &work->requests.back()),
              name_);
    work->on_complete.push_back([out, result, op, n]() mutable {
      if (op == ReduceOp::avg) divide(result, n);
      if (!result.same_storage(out)) out.copy_from(result);
    });
    work->tensors.push_back(in);
    work->tensors.push_back(result);
  }
  return launch(std::move(work), watchdog_, timeout_);
}

CommHandlePtr MpiCommunicator::broadcast_async(Tensor& tensor, int root) {
  check_broadcast(*this, tensor, root);
  check_devices(*this, "broadcast", {&tensor, 1}, DeviceType::cpu);
  auto work = std::make_unique<Work>();
  work->record = record("broadcast", {&tensor, 1}, concat("root ", root));
  work->peers = others_;
  work->requests.emplace_back();
  MPI_CHECK(MPI_Ibcast(tensor.raw(), mpi_count(name_, "broadcast", tensor.numel()), move_type(tensor.dtype()), root,
                       comm_, &work->requests.back()),
            name_);
  work->tensors.push_back(tensor);
  return launch(std::move(work), watchdog_, timeout_);
}

CommHandlePtr MpiCommunicator::all_to_all_async(Tensor& out, const Tensor& in) {
  check_all_to_all(*this, out, in);
  check_devices(*this, "all_to_all", {&in, 1}, DeviceType::cpu);
  check_devices(*this, "all_to_all", {&out, 1}, DeviceType::cpu);
  auto work = std::make_unique<Work>();
  work->record = record("all_to_all", {&in, 1});
  work->peers = others_;
  const int chunk = mpi_count(name_, "all_to_all", in.numel() / size_);
  const MPI_Datatype type = move_type(in.dtype());
  work->requests.emplace_back();
  MPI_CHECK(MPI_Ialltoall(in.raw(), chunk, type, out.raw(), chunk, type, comm_, &work->requests.back()), name_);
  work->tensors = {in, out};
  return launch(std::move(work), watchdog_, timeout_);
}

CommHandlePtr MpiCommunicator::all_to_all_v_async(Tensor& out, std::span<const int64_t> recv_rows, const Tensor& in,
                                                  std::span<const int64_t> send_rows) {
  const int64_t row = check_all_to_all_v(*this, out, recv_rows, in, send_rows);
  check_devices(*this, "all_to_all_v", {&in, 1}, DeviceType::cpu);
  check_devices(*this, "all_to_all_v", {&out, 1}, DeviceType::cpu);
  auto work = std::make_unique<Work>();
  work->record = record("all_to_all_v", {&in, 1});
  work->peers = others_;
  // counts[0..3]: send counts, send displacements, receive counts, receive displacements (elements).
  work->counts.assign(4, std::vector<int>(size_t(size_)));
  int64_t send_at = 0, recv_at = 0;
  for (size_t j = 0; j < size_t(size_); ++j) {
    work->counts[0][j] = mpi_count(name_, "all_to_all_v", send_rows[j] * row);
    work->counts[1][j] = mpi_count(name_, "all_to_all_v", send_at);
    work->counts[2][j] = mpi_count(name_, "all_to_all_v", recv_rows[j] * row);
    work->counts[3][j] = mpi_count(name_, "all_to_all_v", recv_at);
    send_at += send_rows[j] * row;
    recv_at += recv_rows[j] * row;
  }
  const MPI_Datatype type = move_type(in.dtype());
  work->requests.emplace_back();
  MPI_CHECK(MPI_Ialltoallv(in.raw(), work->counts[0].data(), work->counts[1].data(), type, out.raw(),
                           work->counts[2].data(), work->counts[3].data(), type, comm_, &work->requests.back()),
            name_);
  work->tensors = {in, out};
  return launch(std::move(work), watchdog_, timeout_);
}

CommHandlePtr MpiCommunicator::batch_p2p_async(std::span<const P2POp> ops) {
  check_p2p(*this, ops);
  std::vector<Tensor> tensors;
  std::string detail;
  for (const P2POp& op : ops) {
    tensors.push_back(op.tensor);
    detail += concat(detail.empty() ? "" : " ", op.kind == P2POp::Kind::send ? "send->" : "recv<-",
                     world_ranks_[size_t(op.peer)]);
  }
  check_devices(*this, "batch_p2p", tensors, DeviceType::cpu);
  auto work = std::make_unique<Work>();
  work->record = record("batch_p2p", tensors, detail, true);
  // A peer that itself waits on a rank further along is followed there by the watchdog.
  work->peers = p2p_world_peers(*this, ops);
  for (const P2POp& op : ops) {
    Tensor t = op.tensor;
    const int n = mpi_count(name_, "batch_p2p", t.numel());
    work->requests.emplace_back();
    if (op.kind == P2POp::Kind::send)
      MPI_CHECK(MPI_Isend(t.raw(), n, move_type(t.dtype()), op.peer, kP2PTag, comm_, &work->requests.back()), name_);
    else
      MPI_CHECK(MPI_Irecv(t.raw(), n, move_type(t.dtype()), op.peer, kP2PTag, comm_, &work->requests.back()), name_);
  }
  work->tensors = std::move(tensors);
  return launch(std::move(work), watchdog_, timeout_);
}

CommHandlePtr MpiCommunicator::barrier_async() {
  auto work = std::make_unique<Work>();
  work->record = record("barrier", {});
  work->peers = others_;
  work->requests.emplace_back();
  MPI_CHECK(MPI_Ibarrier(comm_, &work->requests.back()), name_);
  return launch(std::move(work), watchdog_, timeout_);
}

}  // namespace megatron
