#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "megatron/core/strings.h"
#include "megatron/cuda_runtime/context.h"
#include "megatron/cuda_runtime/cuda_check.h"
#include "megatron/parallel/collective_checks.h"
#include "megatron/parallel/mpi_check.h"
#include "megatron/parallel/nccl_communicator.h"
#include "megatron/parallel/watchdog.h"

#define NCCL_CHECK(call, group, comm)                                                                           \
  do {                                                                                                          \
    const ncclResult_t megatron_nccl_status_ = (call);                                                          \
    MEGATRON_CHECK(megatron_nccl_status_ == ncclSuccess,                                                        \
                   #call << " failed on world rank " << ::megatron::mpi_world_rank() << " in group " << (group) \
                         << ": " << ncclGetErrorString(megatron_nccl_status_)                                   \
                         << ((comm) != nullptr ? std::string("; ") + ncclGetLastError(comm) : std::string()));  \
  } while (0)

namespace megatron {

namespace {

// NVLink multicast can put a host's shared GPUs out of service; it stays off (nccl_communicator.h).
void require_multicast_off() {
  const char* value = std::getenv("NCCL_NVLS_ENABLE");
  MEGATRON_CHECK(value != nullptr,
                 "NCCL_NVLS_ENABLE is not set: NVLink multicast must stay off, and NCCL takes that "
                 "only from the environment; set NCCL_NVLS_ENABLE=0 before the first communicator "
                 "(the megatron executable does)");
  MEGATRON_CHECK(std::strcmp(value, "0") == 0,
                 "NCCL_NVLS_ENABLE=" << value << ": NVLink multicast must stay off; set NCCL_NVLS_ENABLE=0");
}

ncclDataType_t reduce_type(const std::string& group, const char* op, DType d) {
  switch (d) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    default:
      MEGATRON_FAIL(group << " " << op << ": cannot reduce " << dtype_name(d)
                          << " tensors; reduce f32, f64, bf16, f16, i32 or i64");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

class Event {
 public:
  Event() { CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

bool event_done(const Event& e) {
  const cudaError_t status = cudaEventQuery(e.get());
  if (status == cudaErrorNotReady) return false;
  CUDA_CHECK(status);
  return true;
}

// Holds the operation's tensors until it is waited on (or dropped, which waits): from then on the
// caller's current stream runs after the operation, and so does every later user of their memory,
// since the caching allocator reuses a block only on the stream that allocated it, the compute
// stream (allocator.h). Holding them any longer (until the host sees the operation complete) keeps
// every transient buffer the host has queued past alive: Megatron FSDP's gathered and full
// gradient buckets of a whole backward when the host runs ahead of the GPU.
class NcclHandle final : public CommHandle {
 public:
  NcclHandle(std::shared_ptr<Event> done, std::vector<Tensor> tensors)
      : done_(std::move(done)), tensors_(std::move(tensors)) {}
  ~NcclHandle() override {
    if (!waited_) cudaStreamWaitEvent(cuda::current_stream(), done_->get(), 0);
  }
  void wait() override {
    CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(), done_->get(), 0));
    waited_ = true;
    tensors_.clear();
  }
  bool test() override { return event_done(*done_); }

 private:
  std::shared_ptr<Event> done_;
  std::vector<Tensor> tensors_;  // released by wait(), after the destructor's wait otherwise
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const std::string& name, MPI_Comm group, std::vector<int> world_ranks, Device device,
                   std::shared_ptr<Watchdog> watchdog, std::vector<int> asked);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  void set_timeout(double seconds) override {
    MEGATRON_CHECK(std::isfinite(seconds) && seconds > 0,
                   name_ << ": timeout " << seconds << " s must be positive (--distributed-timeout-minutes)");
    timeout_ = seconds;
  }
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
  void check_tensors(const char* op, std::span<const Tensor> tensors) const;
  // Records, orders after the current stream, enqueues in one NCCL group and hands the
  // completion to the watchdog; the handle holds `tensors` until it is waited on.
  CommHandlePtr issue(const std::string& op, bool p2p, std::vector<Tensor> tensors, const std::string& detail,
                      std::vector<int> peers, const std::function<void(cudaStream_t)>& enqueue);

  std::string name_;
  std::vector<int> world_ranks_;
  std::vector<int> others_;
  int rank_ = 0;
  int size_ = 1;
  Device device_;
  std::shared_ptr<Watchdog> watchdog_;
  double timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  Tensor barrier_word_;
};

NcclCommunicator::NcclCommunicator(const std::string& name, MPI_Comm group, std::vector<int> world_ranks, Device device,
                                   std::shared_ptr<Watchdog> watchdog, std::vector<int> asked)
    : name_(name),
      world_ranks_(std::move(world_ranks)),
      device_(device),
      watchdog_(std::move(watchdog)),
      timeout_(watchdog_->default_timeout()) {
  MEGATRON_CHECK(device.is_cuda(), name_ << ": NCCL communicators need a CUDA device, not " << device.str());
  int current = -1;
  CUDA_CHECK(cudaGetDevice(&current));
  MEGATRON_CHECK(current == device.index, name_ << ": NCCL on " << device.str() << " but the current device is cuda:"
                                                << current << "; select the device (init_device) first");
  if (group != MPI_COMM_NULL) {
    MPI_CHECK(MPI_Comm_rank(group, &rank_), name_);
    MPI_CHECK(MPI_Comm_size(group, &size_), name_);
  }
  MEGATRON_CHECK(size_t(size_) == world_ranks_.size(),
                 name_ << ": " << size_ << " processes but the layout lists " << world_ranks_.size());
  for (int r : world_ranks_)
    if (r != world_ranks_[size_t(rank_)]) others_.push_back(r);
  if (!asked.empty()) others_ = std::move(asked);
  require_multicast_off();

  ncclUniqueId id;
  if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id), name_, nullptr);
  const CollectiveRecord rec = watchdog_->log().begin(name_, false, "nccl_init", size_, DType::u8);
  {
    Watchdog::Scope watch(*watchdog_, rec, timeout_, others_);
    if (group != MPI_COMM_NULL) MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, group), name_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.commName = name_.c_str();
    NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), name_, nullptr);
  }
  watchdog_->log().end(rec);
  // The highest priority: when a collective and a GEMM become ready together (the overlapped TP
  // and DP schedules issue the collective first), the block scheduler gives the collective its
  // few SMs first instead of queueing it behind a GEMM that fills the device.
  int least_priority = 0, greatest_priority = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority));
  CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest_priority));
  barrier_word_ = Tensor::zeros({1}, DType::f32, device_);
}

// Teardown cannot report errors: finish queued work, then free.
NcclCommunicator::~NcclCommunicator() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (comm_ != nullptr) ncclCommDestroy(comm_);
}

void NcclCommunicator::check_tensors(const char* op, std::span<const Tensor> tensors) const {
  check_devices(*this, op, tensors, DeviceType::cuda);
  for (const Tensor& t : tensors)
    MEGATRON_CHECK(t.device() == device_, name_ << " " << op << ": a tensor on " << t.device().str()
                                                << " but this communicator drives " << device_.str());
}

CommHandlePtr NcclCommunicator::issue(const std::string& op, bool p2p, std::vector<Tensor> tensors,
                                      const std::string& detail, std::vector<int> peers,
                                      const std::function<void(cudaStream_t)>& enqueue) {
  const DType dtype = tensors.empty() ? DType::f32 : tensors[0].dtype();
  const CollectiveRecord rec = watchdog_->log().begin(name_, p2p, op, total_numel(tensors), dtype, detail);
  auto ready = std::make_shared<Event>();
  auto done = std::make_shared<Event>();
  CUDA_CHECK(cudaEventRecord(ready->get(), cuda::current_stream()));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, ready->get(), 0));
  {
    // Enqueueing can block on peers (NCCL connects lazily on first use).
    Watchdog::Scope watch(*watchdog_, rec, timeout_, peers);
    NCCL_CHECK(ncclGroupStart(), name_, comm_);
    enqueue(stream_);
    NCCL_CHECK(ncclGroupEnd(), name_, comm_);
  }
  CUDA_CHECK(cudaEventRecord(done->get(), stream_));
  const int device = device_.index;
  watchdog_->watch(rec, timeout_, std::move(peers), [done, device] {
    CUDA_CHECK(cudaSetDevice(device));  // the watchdog thread's device
    return event_done(*done);
  });
  return std::make_unique<NcclHandle>(done, std::move(tensors));
}

CommHandlePtr NcclCommunicator::all_reduce_coalesced_async(std::span<Tensor> tensors, ReduceOp op) {
  check_tensors("all_reduce", tensors);
  for (const Tensor& t : tensors) {
    reduce_type(name_, "all_reduce", t.dtype());
    check_reduce_op(*this, "all_reduce", t.dtype(), op);
  }
  std::vector<Tensor> keep(tensors.begin(), tensors.end());
  return issue(tensors.size() == 1 ? "all_reduce" : "all_reduce_coalesced", false, keep,
               op == ReduceOp::sum ? "" : concat("op ", reduce_op_name(op)), others_, [&](cudaStream_t s) {
                 for (Tensor& t : keep)
                   NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), reduce_type(name_, "", t.dtype()),
                                            nccl_op(op), comm_, s),
                              name_, comm_);
               });
}

CommHandlePtr NcclCommunicator::all_gather_coalesced_async(std::span<Tensor> outs, std::span<const Tensor> ins) {
  MEGATRON_CHECK(outs.size() == ins.size(),
                 name_ << " all_gather: " << outs.size() << " outputs for " << ins.size() << " inputs");
  check_tensors("all_gather", outs);
  check_tensors("all_gather", ins);
  for (size_t i = 0; i < outs.size(); ++i) check_all_gather(*this, outs[i], ins[i]);
  std::vector<Tensor> keep(ins.begin(), ins.end());
  keep.insert(keep.end(), outs.begin(), outs.end());
  const size_t n = ins.size();
  return issue(n == 1 ? "all_gather" : "all_gather_coalesced", false, keep, "", others_, [&](cudaStream_t s) {
    for (size_t i = 0; i < n; ++i)
      NCCL_CHECK(ncclAllGather(keep[i].raw(), keep[n + i].raw(), keep[i].nbytes(), ncclUint8, comm_, s), name_, comm_);
  });
}

CommHandlePtr NcclCommunicator::reduce_scatter_coalesced_async(std::span<Tensor> outs, std::span<const Tensor> ins,
                                                               ReduceOp op) {
  MEGATRON_CHECK(outs.size() == ins.size(),
                 name_ << " reduce_scatter: " << outs.size() << " outputs for " << ins.size() << " inputs");
  check_tensors("reduce_scatter", outs);
  check_tensors("reduce_scatter", ins);
  for (size_t i = 0; i < outs.size(); ++i) {
    check_reduce_scatter(*this, outs[i], ins[i], op);
    reduce_type(name_, "reduce_scatter", ins[i].dtype());
  }
  std::vector<Tensor> keep(ins.begin(), ins.end());
  keep.insert(keep.end(), outs.begin(), outs.end());
  const size_t n = ins.size();
  return issue(n == 1 ? "reduce_scatter" : "reduce_scatter_coalesced", false, keep,
               op == ReduceOp::sum ? "" : concat("op ", reduce_op_name(op)), others_, [&](cudaStream_t s) {
                 for (size_t i = 0; i < n; ++i)
                   NCCL_CHECK(ncclReduceScatter(keep[i].raw(), keep[n + i].raw(), size_t(keep[n + i].numel()),
                                                reduce_type(name_, "", keep[i].dtype()), nccl_op(op), comm_, s),
                              name_, comm_);
               });
}

CommHandlePtr NcclCommunicator::broadcast_async(Tensor& tensor, int root) {
  check_broadcast(*this, tensor, root);
  check_tensors("broadcast", {&tensor, 1});
  Tensor t = tensor;
  return issue("broadcast", false, {t}, concat("root ", root), others_, [&](cudaStream_t s) {
    NCCL_CHECK(ncclBroadcast(t.raw(), t.raw(), t.nbytes(), ncclUint8, root, comm_, s), name_, comm_);
  });
}

CommHandlePtr NcclCommunicator::all_to_all_async(Tensor& out, const Tensor& in) {
  check_all_to_all(*this, out, in);
  check_tensors("all_to_all", {&in, 1});
  check_tensors("all_to_all", {&out, 1});
  Tensor src = in, dst = out;
  const size_t chunk = in.nbytes() / size_t(size_);
  return issue("all_to_all", false, {src, dst}, "", others_, [&](cudaStream_t s) {
    auto* from = static_cast<const char*>(src.raw());
    auto* to = static_cast<char*>(dst.raw());
    for (int j = 0; j < size_; ++j) {
      NCCL_CHECK(ncclSend(from + size_t(j) * chunk, chunk, ncclUint8, j, comm_, s), name_, comm_);
      NCCL_CHECK(ncclRecv(to + size_t(j) * chunk, chunk, ncclUint8, j, comm_, s), name_, comm_);
    }
  });
}

CommHandlePtr NcclCommunicator::all_to_all_v_async(Tensor& out, std::span<const int64_t> recv_rows, const Tensor& in,
                                                   std::span<const int64_t> send_rows) {
  const size_t row_bytes = size_t(check_all_to_all_v(*this, out, recv_rows, in, send_rows)) * in.element_size();
  check_tensors("all_to_all_v", {&in, 1});
  check_tensors("all_to_all_v", {&out, 1});
  Tensor src = in, dst = out;
  return issue("all_to_all_v", false, {src, dst}, "", others_, [&](cudaStream_t s) {
    auto* from = static_cast<const char*>(src.raw());
    auto* to = static_cast<char*>(dst.raw());
    for (int j = 0; j < size_; ++j) {
      const size_t send = size_t(send_rows[size_t(j)]) * row_bytes, recv = size_t(recv_rows[size_t(j)]) * row_bytes;
      if (send > 0) NCCL_CHECK(ncclSend(from, send, ncclUint8, j, comm_, s), name_, comm_);
      if (recv > 0) NCCL_CHECK(ncclRecv(to, recv, ncclUint8, j, comm_, s), name_, comm_);
      from += send;
      to += recv;
    }
  });
}

CommHandlePtr NcclCommunicator::batch_p2p_async(std::span<const P2POp> ops) {
  check_p2p(*this, ops);
  std::vector<Tensor> tensors;
  std::string detail;
  for (const P2POp& op : ops) {
    tensors.push_back(op.tensor);
    detail += concat(detail.empty() ? "" : " ", op.kind == P2POp::Kind::send ? "send->" : "recv<-",
                     world_ranks_[size_t(op.peer)]);
  }
  check_tensors("batch_p2p", tensors);
  // The whole group is asked on a timeout, not only this batch's peers: in a pipeline the peer may
  // itself wait on a rank further along, which is the one to name.
  return issue("batch_p2p", true, tensors, detail, others_, [&](cudaStream_t s) {
    for (const P2POp& op : ops) {
      Tensor t = op.tensor;
      if (op.kind == P2POp::Kind::send)
        NCCL_CHECK(ncclSend(t.raw(), t.nbytes(), ncclUint8, op.peer, comm_, s), name_, comm_);
      else
        NCCL_CHECK(ncclRecv(t.raw(), t.nbytes(), ncclUint8, op.peer, comm_, s), name_, comm_);
    }
  });
}

// Stream-ordered like every operation here: a one-element all-reduce.
CommHandlePtr NcclCommunicator::barrier_async() {
  return issue("barrier", false, {}, "", others_, [&](cudaStream_t s) {
    NCCL_CHECK(ncclAllReduce(barrier_word_.raw(), barrier_word_.raw(), 1, ncclFloat32, ncclSum, comm_, s), name_,
               comm_);
  });
}

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const std::string& name, MPI_Comm group,
                                                     std::vector<int> world_ranks, Device device,
                                                     std::shared_ptr<Watchdog> watchdog, std::vector<int> asked) {
  return std::make_shared<NcclCommunicator>(name, group, std::move(world_ranks), device, std::move(watchdog),
                                            std::move(asked));
}

}  // namespace megatron
