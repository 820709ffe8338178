// The NCCL communicator on one GPU (a world of one, no MPI), so it runs on a single-GPU machine:
// every operation moves the right bytes, orders with the caller's stream, checks its tensors, and a
// stuck operation is ended by the watchdog. Multi-GPU correctness is tested under mpirun on a
// machine with several GPUs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "megatron/core/memory.h"
#include "megatron/cuda_runtime/context.h"
#include "megatron/cuda_runtime/device.h"
#include "megatron/parallel/nccl_communicator.h"
#include "megatron/parallel/watchdog.h"
#include "test_util.h"
#include "unit/fsdp_pass_memory.h"

using namespace megatron;

namespace {

class NcclComm : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(cuda::device_count(), 0) << "gpu tests need a GPU (run them on the GPU machine: ctest -L gpu)";
    cuda::init_device(0);
    WatchdogOptions options;
    options.timeout_seconds = 60;
    watchdog_ = std::make_shared<Watchdog>(MPI_COMM_NULL, options);
    comm_ = make_nccl_communicator("tp", MPI_COMM_NULL, {0}, Device::cuda(0), watchdog_);
  }
  static Tensor gpu(const std::vector<float>& v, DType dtype = DType::f32) {
    return Tensor::from_vector(v, {int64_t(v.size())}, dtype).to(Device::cuda(0));
  }
  std::shared_ptr<Watchdog> watchdog_;
  std::shared_ptr<Communicator> comm_;
};

TEST_F(NcclComm, CollectivesOfOneRankMoveTheRightBytes) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Tensor x = gpu({1, -2, 3, 4}, dtype);
    comm_->all_reduce(x, ReduceOp::avg);
    EXPECT_EQ(x.to_vector(), (std::vector<float>{1, -2, 3, 4}));
    Tensor out = Tensor::zeros({4}, dtype, Device::cuda(0));
    comm_->all_gather(out, x);
    EXPECT_EQ(out.to_vector(), x.to_vector());
    comm_->all_gather(out, out);  // in place: chunk 0 of itself
    EXPECT_EQ(out.to_vector(), x.to_vector());
    Tensor shard = Tensor::zeros({4}, dtype, Device::cuda(0));
    comm_->reduce_scatter(shard, x, ReduceOp::sum);
    EXPECT_EQ(shard.to_vector(), x.to_vector());
    comm_->broadcast(shard, 0);
    EXPECT_EQ(shard.to_vector(), x.to_vector());
    Tensor swapped = Tensor::zeros({4}, dtype, Device::cuda(0));
    comm_->all_to_all(swapped, x);
    EXPECT_EQ(swapped.to_vector(), x.to_vector());
    const std::vector<int64_t> two{2};
    Tensor rows = Tensor::zeros({2, 2}, dtype, Device::cuda(0));
    comm_->all_to_all_v(rows, two, x.view({2, 2}), two);
    EXPECT_EQ(rows.to_vector(), x.to_vector());
    Tensor echo = Tensor::zeros({4}, dtype, Device::cuda(0));
    const std::vector<P2POp> ops{{P2POp::Kind::send, x, 0}, {P2POp::Kind::recv, echo, 0}};
    comm_->batch_p2p(ops);
    EXPECT_EQ(echo.to_vector(), x.to_vector());
    comm_->barrier();
  }
}

TEST_F(NcclComm, CoalescedCallsMixDtypes) {
  std::vector<Tensor> ts{gpu({1, 2}), gpu({3, 4, 5}, DType::bf16), Tensor::zeros({2}, DType::i64, Device::cuda(0))};
  comm_->all_reduce_coalesced(ts, ReduceOp::max);
  EXPECT_EQ(ts[1].to_vector(), (std::vector<float>{3, 4, 5}));
  std::vector<Tensor> outs{Tensor::zeros({2}, DType::f32, Device::cuda(0)),
                           Tensor::zeros({3}, DType::bf16, Device::cuda(0))};
  const std::vector<Tensor> ins{ts[0], ts[1]};
  comm_->all_gather_coalesced_async(outs, ins)->wait();
  EXPECT_EQ(outs[0].to_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(outs[1].to_vector(), (std::vector<float>{3, 4, 5}));
}

// The operation runs after what the caller queued before it, and what the caller queues after
// wait() runs after the operation: a host callback that sleeps holds the caller's stream.
TEST_F(NcclComm, HandlesOrderWithTheCallersStream) {
  const int64_t n = 1 << 20;
  Tensor src = Tensor::zeros({n}, DType::f32, Device::cuda(0));
  Tensor out = Tensor::zeros({n}, DType::f32, Device::cuda(0));
  auto sleep_then_fill = [](void* p) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    static_cast<std::vector<float>*>(p)->assign(1, 7.0f);
  };
  const Tensor ones = Tensor::from_vector(std::vector<float>(size_t(n), 1.0f), {n}).to(Device::cuda(0));
  std::vector<float> flag;
  ASSERT_EQ(cudaLaunchHostFunc(cuda::current_stream(), sleep_then_fill, &flag), cudaSuccess);
  src.copy_from(ones);  // device to device: queued behind the callback, the host goes on
  CommHandlePtr h = comm_->all_gather_async(out, src);
  EXPECT_FALSE(h->test()) << "the gather must wait for the sleeping callback before it";
  h->wait();
  const std::vector<float> got = out.to_vector();
  EXPECT_EQ(flag, std::vector<float>{7.0f});
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[size_t(n - 1)], 1.0f);
  EXPECT_TRUE(h->test());
}

// An operation holds its tensors until it is waited on and never after: a transient buffer freed
// after the wait goes back to the allocator at once, while the GPU is still behind the host (a host
// callback that sleeps holds the operation). Holding them until the host saw the operation complete
// kept every gathered and full gradient bucket of a Megatron FSDP backward alive on GPUs (ZeRO-3's
// peak above the distributed optimizer's, PERFORMANCE.md). The block's next user, queued on the
// compute stream behind the wait, does not race the operation that still reads it.
TEST_F(NcclComm, AnOperationHoldsItsTensorsUntilWaitedOn) {
  const int64_t n = 1 << 20;  // 4 MiB of f32: a size class of its own, so the allocator counts it exactly
  const size_t bytes = size_t(n) * sizeof(float);
  const Device gpu0 = Device::cuda(0);
  const Tensor ones = Tensor::from_vector(std::vector<float>(size_t(n), 1.0f), {n}).to(gpu0);
  const Tensor twos = Tensor::from_vector(std::vector<float>(size_t(n), 2.0f), {n}).to(gpu0);
  Tensor out = Tensor::zeros({n}, DType::f32, gpu0);
  auto sleep_then_fill = [](void* p) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    static_cast<std::vector<float>*>(p)->assign(1, 7.0f);
  };
  std::vector<float> flag;
  const size_t before = memory_stats(gpu0).current_bytes;
  ASSERT_EQ(cudaLaunchHostFunc(cuda::current_stream(), sleep_then_fill, &flag), cudaSuccess);
  CommHandlePtr h;
  const void* block = nullptr;
  {
    Tensor in = Tensor::empty({n}, DType::f32, gpu0);
    in.copy_from(ones);  // queued behind the callback
    block = in.raw();
    h = comm_->all_gather_async(out, in);
  }
  EXPECT_EQ(memory_stats(gpu0).current_bytes, before + bytes) << "the operation holds its input";
  h->wait();
  EXPECT_FALSE(h->test()) << "the gather must still be queued behind the sleeping callback";
  EXPECT_EQ(memory_stats(gpu0).current_bytes, before) << "a waited operation still holds its input";
  Tensor next = Tensor::empty({n}, DType::f32, gpu0);
  EXPECT_EQ(next.raw(), block) << "the freed block is reused by the next request of its size";
  next.copy_from(twos);
  EXPECT_EQ(out.to_vector(), std::vector<float>(size_t(n), 1.0f)) << "the reuse overwrote the gather's input";
  EXPECT_EQ(flag, std::vector<float>{7.0f});
}

// The same, as Megatron FSDP meets it (unit/fsdp_pass_memory.h; CPU form test_fsdp_pass_memory):
// a forward and backward of 16 one-bucket layers with the compute stream held by a sleeping host
// callback throughout, so the host runs ahead of the GPU as in training, holds the few buckets FSDP
// has in use, not one per layer the host has passed.
TEST_F(NcclComm, FsdpHoldsAFewBucketsWhileTheHostRunsAhead) {
  std::atomic<bool> stall_over{false};
  auto sleep_then_set = [](void* p) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    static_cast<std::atomic<bool>*>(p)->store(true);
  };
  const megatron::testing::FsdpPassMemory m = megatron::testing::fsdp_pass_memory(
      Device::cuda(0), comm_, 16, 1 << 18,
      [&] { ASSERT_EQ(cudaLaunchHostFunc(cuda::current_stream(), sleep_then_set, &stall_over), cudaSuccess); });
  EXPECT_FALSE(stall_over.load()) << "the pass outlasted the stall: the host did not run ahead";
  // Exact: 1 MiB buckets are a size class of their own.
  EXPECT_EQ(m.peak_above_start, megatron::testing::kFsdpBucketsAtPeak * m.bucket_bytes);
  cuda::synchronize();
}

TEST_F(NcclComm, RejectsHostTensorsAndForeignDtypes) {
  Tensor host = Tensor::zeros({4}, DType::f32);
  EXPECT_NE(megatron::testing::error_of([&] {
              comm_->all_reduce(host, ReduceOp::sum);
            }).find("is on cpu but the tp communicator moves CUDA memory"),
            std::string::npos);
  Tensor bytes = Tensor::zeros({4}, DType::u8, Device::cuda(0));
  EXPECT_NE(megatron::testing::error_of([&] { comm_->all_reduce(bytes, ReduceOp::sum); }).find("cannot reduce u8"),
            std::string::npos);
}

// The library never writes the environment: without NCCL_NVLS_ENABLE=0 there (set by the megatron
// executable, or by ctest here), no communicator starts, and the error names the fix.
TEST_F(NcclComm, RefusesNvlinkMulticast) {
  const auto error = [&] {
    return megatron::testing::error_of(
        [&] { make_nccl_communicator("dp", MPI_COMM_NULL, {0}, Device::cuda(0), watchdog_); });
  };
  setenv("NCCL_NVLS_ENABLE", "1", 1);
  const std::string enabled = error();
  unsetenv("NCCL_NVLS_ENABLE");
  const std::string unset = error();
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  EXPECT_NE(enabled.find("NVLink multicast must stay off; set NCCL_NVLS_ENABLE=0"), std::string::npos) << enabled;
  EXPECT_NE(unset.find("NCCL_NVLS_ENABLE is not set"), std::string::npos) << unset;
  EXPECT_NE(unset.find("set NCCL_NVLS_ENABLE=0"), std::string::npos) << unset;
}

// A GPU operation that cannot start (its stream waits for a host callback that sleeps) is ended
// by the watchdog with the record of the rank. (#1 on the group is the communicator's creation.)
TEST(NcclCommDeathTest, StuckOperationEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        cuda::init_device(0);
        WatchdogOptions options;
        options.timeout_seconds = 60;  // creating the communicator takes about 0.5 s
        auto watchdog = std::make_shared<Watchdog>(MPI_COMM_NULL, options);
        auto comm = make_nccl_communicator("dp", MPI_COMM_NULL, {0}, Device::cuda(0), watchdog);
        comm->set_timeout(0.5);
        cudaLaunchHostFunc(
            cuda::current_stream(), [](void*) { std::this_thread::sleep_for(std::chrono::seconds(20)); }, nullptr);
        Tensor x = Tensor::zeros({8}, DType::f32, Device::cuda(0));
        comm->all_reduce(x, ReduceOp::sum);
        std::this_thread::sleep_for(std::chrono::seconds(20));
      },
      ::testing::ExitedWithCode(1), "error: dp all_reduce #2 \\(8 f32\\) did not complete within 0.5 s");
}

}  // namespace
