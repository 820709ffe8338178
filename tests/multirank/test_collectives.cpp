// multirank-np: 2 4
// Every collective of the MPI communicator on verifiable inputs: in place and out of place,
// f32 and bf16 (and the other dtypes where they matter), coalesced and asynchronous forms; and
// the text collectives built on them.
#include <algorithm>
#include <string>
#include <vector>

#include "megatron/core/memory.h"
#include "megatron/parallel/collective_log.h"
#include "megatron/parallel/text_collectives.h"
#include "megatron/parallel/watchdog.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

class Collectives : public ::testing::Test {
 protected:
  void SetUp() override {
    st_ = make_state({});
    comm_ = st_.ctx.world;
    n_ = comm_->size();
    r_ = comm_->rank();
  }
  // Rank `rank`'s input of `count` elements for seed `seed`.
  static Tensor input(uint64_t seed, int rank, int64_t count, DType dtype = DType::f32) {
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) v[size_t(i)] = value(seed, rank, i);
    return Tensor::from_vector(v, {count}, dtype);
  }
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

TEST_F(Collectives, AllReduceEveryOpAndDtype) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i32, DType::i64}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      Tensor t = input(1, r_, 37, dtype);
      comm_->all_reduce(t, op);
      for (int64_t i = 0; i < 37; ++i) {
        float expect = value(1, 0, i);
        for (int q = 1; q < n_; ++q) {
          const float v = value(1, q, i);
          expect = op == ReduceOp::sum ? expect + v : op == ReduceOp::max ? std::max(expect, v) : std::min(expect, v);
        }
        ASSERT_EQ(t.item(i), expect) << dtype_name(dtype) << " " << reduce_op_name(op) << " element " << i;
      }
    }
  }
}

TEST_F(Collectives, AllReduceAverageDividesTheSumOnce) {
  Tensor t = input(2, r_, 10);
  comm_->all_reduce(t, ReduceOp::avg);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(t.item(i), double(float(double(sum(2, i)) / n_)));
  Tensor ints = input(2, r_, 4, DType::i32);
  EXPECT_NE(error_of([&] { comm_->all_reduce(ints, ReduceOp::avg); }).find("avg of i32"), std::string::npos);
}

// bf16 is reduced in fp32 and rounded once. Rank 0 holds 1 and the others 2^-8, half of bf16's
// step at 1: summed pairwise in bf16, each 1 + 2^-8 would round back to 1; summed in fp32, 4 ranks
// give 1 + 3 * 2^-8, which rounds to 1 + 2^-6.
TEST_F(Collectives, Bf16ReducesInFp32) {
  std::vector<float> v(4, r_ == 0 ? 1.0f : 0.00390625f);
  Tensor t = Tensor::from_vector(v, {4}, DType::bf16);
  comm_->all_reduce(t, ReduceOp::sum);
  const float exact = 1.0f + 0.00390625f * float(n_ - 1);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(t.item(i), double(round_to_bf16(exact)));
}

TEST_F(Collectives, CoalescedAllReduceMixesSizesAndDtypes) {
  std::vector<Tensor> ts{input(3, r_, 5), input(4, r_, 1000, DType::f64), input(5, r_, 1, DType::bf16)};
  comm_->all_reduce_coalesced(ts, ReduceOp::sum);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(ts[0].item(i), sum(3, i));
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(ts[1].item(i), sum(4, i));
  EXPECT_EQ(ts[2].item(0), sum(5, 0));
}

TEST_F(Collectives, AllGatherOutOfPlaceAndInPlace) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int64_t m = 6;
    Tensor out = Tensor::zeros({n_ * m}, dtype);
    comm_->all_gather(out, input(6, r_, m, dtype));
    Tensor in_place = Tensor::zeros({n_ * m}, dtype);
    Tensor mine = in_place.slice(r_ * m, (r_ + 1) * m);
    mine.copy_from(input(6, r_, m, dtype));
    comm_->all_gather(in_place, mine);
    for (int q = 0; q < n_; ++q)
      for (int64_t i = 0; i < m; ++i) {
        ASSERT_EQ(out.item(q * m + i), value(6, q, i)) << dtype_name(dtype);
        ASSERT_EQ(in_place.item(q * m + i), value(6, q, i)) << dtype_name(dtype);
      }
  }
}

TEST_F(Collectives, ReduceScatterOutOfPlaceAndInPlace) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int64_t m = 5;
    Tensor out = Tensor::zeros({m}, dtype);
    comm_->reduce_scatter(out, input(7, r_, n_ * m, dtype));
    Tensor whole = input(7, r_, n_ * m, dtype);
    Tensor mine = whole.slice(r_ * m, (r_ + 1) * m);
    comm_->reduce_scatter(mine, whole);
    for (int64_t i = 0; i < m; ++i) {
      ASSERT_EQ(out.item(i), sum(7, r_ * m + i)) << dtype_name(dtype);
      ASSERT_EQ(mine.item(i), sum(7, r_ * m + i)) << dtype_name(dtype);
    }
  }
}

TEST_F(Collectives, CoalescedGatherAndScatterIntoFlatBuffers) {
  // The distributed optimizer's pattern: shards of two buckets, one call each way.
  const int64_t a = 4, b = 3;
  std::vector<Tensor> full{input(8, r_, n_ * a), input(9, r_, n_ * b)};
  std::vector<Tensor> shards{Tensor::zeros({a}, DType::f32), Tensor::zeros({b}, DType::f32)};
  comm_->reduce_scatter_coalesced_async(shards, full, ReduceOp::sum)->wait();
  for (int64_t i = 0; i < a; ++i) EXPECT_EQ(shards[0].item(i), sum(8, r_ * a + i));
  for (int64_t i = 0; i < b; ++i) EXPECT_EQ(shards[1].item(i), sum(9, r_ * b + i));
  std::vector<Tensor> gathered{Tensor::zeros({n_ * a}, DType::f32), Tensor::zeros({n_ * b}, DType::f32)};
  comm_->all_gather_coalesced_async(gathered, shards)->wait();
  for (int64_t i = 0; i < n_ * a; ++i) EXPECT_EQ(gathered[0].item(i), sum(8, i));
  for (int64_t i = 0; i < n_ * b; ++i) EXPECT_EQ(gathered[1].item(i), sum(9, i));
}

TEST_F(Collectives, BroadcastFromEveryRoot) {
  for (int root = 0; root < n_; ++root) {
    Tensor t = input(10, r_, 9, DType::bf16);
    comm_->broadcast(t, root);
    for (int64_t i = 0; i < 9; ++i) ASSERT_EQ(t.item(i), value(10, root, i)) << "root " << root;
  }
}

TEST_F(Collectives, AllToAll) {
  const int64_t m = 3;
  Tensor out = Tensor::zeros({n_ * m}, DType::f32);
  comm_->all_to_all(out, input(11, r_, n_ * m));
  // Chunk q of out is chunk r of rank q's input.
  for (int q = 0; q < n_; ++q)
    for (int64_t i = 0; i < m; ++i) ASSERT_EQ(out.item(q * m + i), value(11, q, r_ * m + i));
}

TEST_F(Collectives, AllToAllVMovesUnevenRows) {
  // Rank s sends s + j + 1 rows of 2 elements to rank j; row k of a send holds input rows in order.
  const int64_t row = 2;
  auto rows = [](int s, int j) { return int64_t(s + j + 1); };
  std::vector<int64_t> send(static_cast<size_t>(n_)), recv(static_cast<size_t>(n_));
  int64_t total_send = 0, total_recv = 0;
  for (int j = 0; j < n_; ++j) {
    send[size_t(j)] = rows(r_, j);
    recv[size_t(j)] = rows(j, r_);
    total_send += send[size_t(j)];
    total_recv += recv[size_t(j)];
  }
  Tensor in = input(12, r_, total_send * row).view({total_send, row});
  Tensor out = Tensor::zeros({total_recv, row}, DType::f32);
  comm_->all_to_all_v(out, recv, in, send);
  int64_t at = 0;
  for (int s = 0; s < n_; ++s) {
    int64_t offset = 0;  // where rank s's block for this rank starts in its input
    for (int j = 0; j < r_; ++j) offset += rows(s, j);
    for (int64_t k = 0; k < rows(s, r_) * row; ++k) ASSERT_EQ(out.item(at + k), value(12, s, offset * row + k));
    at += rows(s, r_) * row;
  }
}

// Text of rank r: r copies of a letter (rank 0's is empty), so the lengths differ and one is 0.
TEST_F(Collectives, TextTravelsToAndFromEveryRoot) {
  const auto text_of = [](int rank) { return std::string(size_t(rank), char('a' + rank)); };
  for (int root = 0; root < n_; ++root) {
    EXPECT_EQ(broadcast_text(*comm_, text_of(r_) + (r_ == root ? "!" : ""), root, Device::cpu()), text_of(root) + "!");
    EXPECT_EQ(broadcast_text(*comm_, "", root, Device::cpu()), "");
    const std::vector<std::string> all = gather_text(*comm_, text_of(r_), root, Device::cpu());
    ASSERT_EQ(all.size(), r_ == root ? size_t(n_) : 0u);
    for (int q = 0; q < int(all.size()); ++q) EXPECT_EQ(all[size_t(q)], text_of(q)) << "root " << root;
  }
}

TEST_F(Collectives, BatchedSendRecvAroundTheRingAndToSelf) {
  const int next = (r_ + 1) % n_, prev = (r_ + n_ - 1) % n_;
  Tensor from_prev = Tensor::zeros({8}, DType::bf16);
  Tensor from_self = Tensor::zeros({3}, DType::f32);
  std::vector<P2POp> ops{{P2POp::Kind::recv, from_prev, prev},
                         {P2POp::Kind::send, input(13, r_, 8, DType::bf16), next},
                         {P2POp::Kind::send, input(14, r_, 3), r_},
                         {P2POp::Kind::recv, from_self, r_}};
  comm_->batch_p2p(ops);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(from_prev.item(i), value(13, prev, i));
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(from_self.item(i), value(14, r_, i));
}

TEST_F(Collectives, AsyncHandlesCompleteOutOfOrder) {
  Tensor a = input(15, r_, 50);
  Tensor gathered = Tensor::zeros({n_ * 7}, DType::f32);
  Tensor shard = Tensor::zeros({4}, DType::bf16);
  CommHandlePtr h1 = comm_->all_reduce_async(a, ReduceOp::sum);
  CommHandlePtr h2 = comm_->all_gather_async(gathered, input(16, r_, 7));
  CommHandlePtr h3 = comm_->reduce_scatter_async(shard, input(17, r_, n_ * 4, DType::bf16));
  CommHandlePtr h4 = comm_->barrier_async();
  while (!h3->test()) {
  }
  h2->wait();
  h4->wait();
  h1->wait();
  EXPECT_TRUE(h1->test());
  for (int64_t i = 0; i < 50; ++i) ASSERT_EQ(a.item(i), sum(15, i));
  for (int64_t i = 0; i < n_ * 7; ++i) ASSERT_EQ(gathered.item(i), value(16, int(i / 7), i % 7));
  for (int64_t i = 0; i < 4; ++i) ASSERT_EQ(shard.item(i), sum(17, r_ * 4 + i));
}

TEST_F(Collectives, DroppedHandleStillCompletes) {
  Tensor t = input(18, r_, 5);
  comm_->all_reduce_async(t, ReduceOp::sum).reset();
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(t.item(i), sum(18, i));
}

// comm.h's contract, which Megatron FSDP's peak relies on: the caller may drop a tensor before the
// wait, the operation holds it until then and no longer (the CPU allocator's bytes in use show it).
// The NCCL form, where the wait does not block the host: tests/gpu/test_nccl_comm.cpp.
TEST_F(Collectives, AnOperationHoldsItsTensorsUntilWaitedOn) {
  const int64_t n = 1 << 16;
  Tensor gathered = Tensor::zeros({n_ * n}, DType::f32);
  const size_t before = memory_stats(Device::cpu()).current_bytes;
  CommHandlePtr h = comm_->all_gather_async(gathered, input(19, r_, n));  // the input's one reference
  EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, before + size_t(n) * sizeof(float));
  h->wait();
  EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, before) << "a waited operation still holds its input";
  for (int64_t i = 0; i < n_ * n; i += 997) ASSERT_EQ(gathered.item(i), value(19, int(i / n), i % n));
}

TEST_F(Collectives, WrongSizesFailOnEveryRankBeforeCommunicating) {
  Tensor out = Tensor::zeros({n_ * 3 + 1}, DType::f32);
  EXPECT_NE(error_of([&] { comm_->all_gather(out, input(19, r_, 3)); }).find("all_gather: out has"), std::string::npos);
  Tensor shard = Tensor::zeros({2}, DType::f32);
  EXPECT_NE(error_of([&] { comm_->reduce_scatter(shard, input(19, r_, 5)); }).find("reduce_scatter: in has 5"),
            std::string::npos);
  Tensor t = input(19, r_, 2);
  EXPECT_NE(error_of([&] { comm_->broadcast(t, n_); }).find("root"), std::string::npos);
  comm_->barrier();  // still in step
}

TEST_F(Collectives, EveryRankLogsTheSameSequence) {
  if (!st_.watchdog) GTEST_SKIP() << "single process: no collective log";
  Tensor t = input(20, r_, 3);
  comm_->all_reduce(t, ReduceOp::sum);
  comm_->barrier();
  const std::vector<CollectiveRecord> last = st_.watchdog->log().recent(2);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0].op, "all_reduce");
  EXPECT_EQ(last[1].op, "barrier");
  EXPECT_EQ(last[1].seq, last[0].seq + 1);
  EXPECT_FALSE(last[1].in_flight());
  // Every rank reached the same sequence number on "world".
  Tensor seq = Tensor::from_vector({float(last[1].seq)}, {1});
  Tensor lo = seq.clone(), hi = seq.clone();
  comm_->all_reduce(lo, ReduceOp::min);
  comm_->all_reduce(hi, ReduceOp::max);
  EXPECT_EQ(lo.item(0), hi.item(0));
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
