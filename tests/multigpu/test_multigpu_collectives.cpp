// multirank-np: 2 4
// Every collective of the NCCL communicator on real GPUs, one per rank, through the communicators
// initialize_parallel builds: in place and out of place, f32 and bf16, coalesced forms mixing
// sizes and dtypes, point-to-point, the barrier, and the stream order of asynchronous handles.
// Inputs are small integers from (seed, rank, index) (multirank_util.h's value()): every sum of
// up to 4 of them, and its average over 2 or 4 ranks, is exact in f32 and bf16 whatever order
// NCCL adds in, so results compare with ==.
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "megatron/cuda_runtime/context.h"
#include "multigpu/multigpu_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Holds this thread's current stream for `ms` milliseconds from the host, as a long kernel would.
void hold_stream(int ms) {
  const cudaHostFn_t sleep = [](void* p) {
    std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(p)));
  };
  ASSERT_EQ(cudaLaunchHostFunc(cuda::current_stream(), sleep, reinterpret_cast<void*>(intptr_t(ms))), cudaSuccess);
}

class NcclCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = multigpu_unavailable(); !why.empty()) GTEST_SKIP() << why;
    st_ = make_gpu_state();
    comm_ = st_.ctx.world;
    n_ = comm_->size();
    r_ = comm_->rank();
  }
  // Rank `rank`'s input of `count` elements for `seed`, on this rank's GPU.
  static Tensor input(uint64_t seed, int rank, int64_t count, DType dtype = DType::f32) {
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) v[size_t(i)] = value(seed, rank, i);
    return Tensor::from_vector(v, {count}, dtype).to(local_gpu());
  }
  static Tensor zeros(int64_t count, DType dtype = DType::f32) { return Tensor::zeros({count}, dtype, local_gpu()); }
  // Element i of the sum over ranks.
  float sum(uint64_t seed, int64_t i) const {
    float s = 0;
    for (int q = 0; q < n_; ++q) s += value(seed, q, i);
    return s;
  }

  ParallelState st_;
  std::shared_ptr<Communicator> comm_;
  int n_ = 1, r_ = 0;
};

// The groups of a GPU job are NCCL communicators (they refuse host memory), not MPI ones.
TEST_F(NcclCollectives, GroupsOfSeveralRanksAreNccl) {
  Tensor host = Tensor::zeros({4}, DType::f32);
  for (const auto& comm : st_.ctx.communicators()) {
    if (comm->size() == 1) continue;
    EXPECT_NE(error_of([&] { comm->all_reduce(host, ReduceOp::sum); }).find("moves CUDA memory"), std::string::npos)
        << comm->name();
  }
}

TEST_F(NcclCollectives, AllReduceSumMaxAverageInF32AndBf16) {
  const int64_t count = 100003;  // odd, and several NCCL chunks long
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
      Tensor t = input(1, r_, count, dtype);
      comm_->all_reduce(t, op);
      const std::vector<float> got = t.to_vector();
      for (int64_t i = 0; i < count; ++i) {
        float expect = op == ReduceOp::avg ? float(double(sum(1, i)) / n_) : sum(1, i);
        if (op == ReduceOp::max) {
          expect = value(1, 0, i);
          for (int q = 1; q < n_; ++q) expect = std::max(expect, value(1, q, i));
        }
        ASSERT_EQ(got[size_t(i)], expect) << dtype_name(dtype) << " " << reduce_op_name(op) << " element " << i;
      }
    }
  }
}

TEST_F(NcclCollectives, AllGatherOutOfPlaceAndInPlace) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int64_t m = 1001;  // odd: bf16 chunks start off 4-byte boundaries
    Tensor out = zeros(n_ * m, dtype);
    comm_->all_gather(out, input(6, r_, m, dtype));
    Tensor in_place = zeros(n_ * m, dtype);
    Tensor mine = in_place.slice(r_ * m, (r_ + 1) * m);
    mine.copy_from(input(6, r_, m, dtype));
    comm_->all_gather(in_place, mine);
    const std::vector<float> a = out.to_vector(), b = in_place.to_vector();
    for (int q = 0; q < n_; ++q)
      for (int64_t i = 0; i < m; ++i) {
        ASSERT_EQ(a[size_t(q * m + i)], value(6, q, i)) << dtype_name(dtype) << " out of place";
        ASSERT_EQ(b[size_t(q * m + i)], value(6, q, i)) << dtype_name(dtype) << " in place";
      }
  }
}

TEST_F(NcclCollectives, ReduceScatterOutOfPlaceAndInPlace) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int64_t m = 1001;
    Tensor out = zeros(m, dtype);
    comm_->reduce_scatter(out, input(7, r_, n_ * m, dtype));
    Tensor whole = input(7, r_, n_ * m, dtype);
    Tensor mine = whole.slice(r_ * m, (r_ + 1) * m);
    comm_->reduce_scatter(mine, whole);
    const std::vector<float> a = out.to_vector(), b = mine.to_vector();
    for (int64_t i = 0; i < m; ++i) {
      ASSERT_EQ(a[size_t(i)], sum(7, r_ * m + i)) << dtype_name(dtype) << " out of place";
      ASSERT_EQ(b[size_t(i)], sum(7, r_ * m + i)) << dtype_name(dtype) << " in place";
    }
  }
}

// One operation each over tensors of different sizes and dtypes (DDP's buckets, the distributed
// optimizer's shards).
TEST_F(NcclCollectives, CoalescedFormsMixSizesAndDtypes) {
  std::vector<Tensor> ts{input(3, r_, 5), input(4, r_, 3001, DType::bf16), input(5, r_, 1)};
  comm_->all_reduce_coalesced(ts, ReduceOp::sum);
  const std::vector<float> t0 = ts[0].to_vector(), t1 = ts[1].to_vector();
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(t0[size_t(i)], sum(3, i));
  for (int64_t i = 0; i < 3001; ++i) ASSERT_EQ(t1[size_t(i)], sum(4, i));
  EXPECT_EQ(ts[2].item(0), sum(5, 0));

  const int64_t a = 4, b = 1003;
  std::vector<Tensor> full{input(8, r_, n_ * a), input(9, r_, n_ * b, DType::bf16)};
  std::vector<Tensor> shards{zeros(a), zeros(b, DType::bf16)};
  comm_->reduce_scatter_coalesced_async(shards, full, ReduceOp::sum)->wait();
  const std::vector<float> s0 = shards[0].to_vector(), s1 = shards[1].to_vector();
  for (int64_t i = 0; i < a; ++i) EXPECT_EQ(s0[size_t(i)], sum(8, r_ * a + i));
  for (int64_t i = 0; i < b; ++i) ASSERT_EQ(s1[size_t(i)], sum(9, r_ * b + i));

  std::vector<Tensor> gathered{zeros(n_ * a), zeros(n_ * b, DType::bf16)};
  comm_->all_gather_coalesced_async(gathered, shards)->wait();
  const std::vector<float> g0 = gathered[0].to_vector(), g1 = gathered[1].to_vector();
  for (int64_t i = 0; i < n_ * a; ++i) EXPECT_EQ(g0[size_t(i)], sum(8, i));
  for (int64_t i = 0; i < n_ * b; ++i) ASSERT_EQ(g1[size_t(i)], sum(9, i));
}

TEST_F(NcclCollectives, BroadcastFromEveryRoot) {
  for (DType dtype : {DType::f32, DType::bf16})
    for (int root = 0; root < n_; ++root) {
      Tensor t = input(10, r_, 999, dtype);
      comm_->broadcast(t, root);
      const std::vector<float> got = t.to_vector();
      for (int64_t i = 0; i < 999; ++i)
        ASSERT_EQ(got[size_t(i)], value(10, root, i)) << dtype_name(dtype) << " root " << root;
    }
}

TEST_F(NcclCollectives, AllToAll) {
  const int64_t m = 333;
  Tensor out = zeros(n_ * m);
  comm_->all_to_all(out, input(11, r_, n_ * m));
  // Chunk q of out is chunk r of rank q's input.
  const std::vector<float> got = out.to_vector();
  for (int q = 0; q < n_; ++q)
    for (int64_t i = 0; i < m; ++i) ASSERT_EQ(got[size_t(q * m + i)], value(11, q, r_ * m + i));
}

TEST_F(NcclCollectives, AllToAllVMovesUnevenRows) {
  // Rank s sends s + 2j rows of 3 elements to rank j (none from rank 0 to itself); a send's rows
  // are consecutive input rows.
  const int64_t row = 3;
  auto rows = [](int s, int j) { return int64_t(s + 2 * j); };
  std::vector<int64_t> send(static_cast<size_t>(n_)), recv(static_cast<size_t>(n_));
  int64_t total_send = 0, total_recv = 0;
  for (int j = 0; j < n_; ++j) {
    send[size_t(j)] = rows(r_, j);
    recv[size_t(j)] = rows(j, r_);
    total_send += send[size_t(j)];
    total_recv += recv[size_t(j)];
  }
  Tensor in = input(12, r_, total_send * row, DType::bf16).view({total_send, row});
  Tensor out = Tensor::zeros({total_recv, row}, DType::bf16, local_gpu());
  comm_->all_to_all_v(out, recv, in, send);
  const std::vector<float> got = out.to_vector();
  int64_t at = 0;
  for (int s = 0; s < n_; ++s) {
    int64_t offset = 0;  // where rank s's block for this rank starts in its input
    for (int j = 0; j < r_; ++j) offset += rows(s, j);
    for (int64_t k = 0; k < rows(s, r_) * row; ++k)
      ASSERT_EQ(got[size_t(at + k)], value(12, s, offset * row + k)) << "from rank " << s;
    at += rows(s, r_) * row;
  }
}

// Both directions of the ring (different sizes and dtypes, so a mismatched pairing shows) and a
// rank to itself, in one batch.
TEST_F(NcclCollectives, BatchedSendRecvAroundTheRingAndToSelf) {
  const int next = (r_ + 1) % n_, prev = (r_ + n_ - 1) % n_;
  Tensor from_prev = zeros(800, DType::bf16), from_next = zeros(5), from_self = zeros(3);
  const std::vector<P2POp> ops{
      {P2POp::Kind::recv, from_prev, prev},        {P2POp::Kind::send, input(13, r_, 800, DType::bf16), next},
      {P2POp::Kind::send, input(14, r_, 5), prev}, {P2POp::Kind::recv, from_next, next},
      {P2POp::Kind::send, input(15, r_, 3), r_},   {P2POp::Kind::recv, from_self, r_}};
  comm_->batch_p2p(ops);
  const std::vector<float> p = from_prev.to_vector(), q = from_next.to_vector(), s = from_self.to_vector();
  for (int64_t i = 0; i < 800; ++i) ASSERT_EQ(p[size_t(i)], value(13, prev, i));
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(q[size_t(i)], value(14, next, i));
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(s[size_t(i)], value(15, r_, i));
}

// Rank 0 arrives 300 ms after the others; nobody's stream may pass the barrier before it does.
TEST_F(NcclCollectives, BarrierHoldsEveryRankUntilTheLastArrives) {
  comm_->barrier();  // NCCL connects on first use: not part of the timing
  cuda::synchronize();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = Clock::now();
  if (r_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  comm_->barrier();
  cuda::synchronize();
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(waited, 0.25) << "rank " << r_ << " passed the barrier before rank 0 reached it";
}

// The operation runs after the work the caller queued before issuing it, and what the caller
// queues after wait() runs after the operation, while the ranks are ready at different times:
// rank r's stream is held 300 + 200 r ms before its input is written. Were the all-reduce not
// ordered after that write, it would reduce zeros; were the copy after wait() not ordered after the
// all-reduce, it would read this rank's own input on every rank but the last (the sum needs the
// last rank's input), and the all-reduce would then overwrite the zeros written after it.
TEST_F(NcclCollectives, AsyncHandleOrdersWithTheCallersStream) {
  const int64_t count = 1 << 20;
  const Tensor ready = input(21, r_, count);
  Tensor t = zeros(count), seen = zeros(count);
  cuda::synchronize();
  hold_stream(300 + 200 * r_);
  t.copy_from(ready);  // device to device, queued behind the hold
  CommHandlePtr h = comm_->all_reduce_async(t, ReduceOp::sum);
  EXPECT_FALSE(h->test()) << "the all-reduce must wait for the work queued before it";
  h->wait();
  seen.copy_from(t);  // reads the result
  t.zero();           // overwrites it
  cuda::synchronize();
  EXPECT_TRUE(h->test());
  const std::vector<float> got = seen.to_vector(), after = t.to_vector();
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(got[size_t(i)], sum(21, i)) << "element " << i << " read after wait()";
    ASSERT_EQ(after[size_t(i)], 0.0f) << "element " << i << " written after wait()";
  }
}

// Several operations in flight on one communicator, waited on in another order than issued.
TEST_F(NcclCollectives, AsyncHandlesWaitedOutOfOrder) {
  Tensor a = input(16, r_, 50);
  Tensor gathered = zeros(n_ * 7);
  Tensor shard = zeros(4, DType::bf16);
  CommHandlePtr h1 = comm_->all_reduce_async(a, ReduceOp::sum);
  CommHandlePtr h2 = comm_->all_gather_async(gathered, input(17, r_, 7));
  CommHandlePtr h3 = comm_->reduce_scatter_async(shard, input(18, r_, n_ * 4, DType::bf16));
  CommHandlePtr h4 = comm_->barrier_async();
  h3->wait();
  h2->wait();
  h4->wait();
  h1->wait();
  const std::vector<float> x = a.to_vector(), g = gathered.to_vector(), s = shard.to_vector();
  for (int64_t i = 0; i < 50; ++i) ASSERT_EQ(x[size_t(i)], sum(16, i));
  for (int64_t i = 0; i < n_ * 7; ++i) ASSERT_EQ(g[size_t(i)], value(17, int(i / 7), i % 7));
  for (int64_t i = 0; i < 4; ++i) ASSERT_EQ(s[size_t(i)], sum(18, r_ * 4 + i));
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
