// The CUDA runtime context and the caching allocator: size classes, reuse without cudaMalloc in
// the steady state, stream-keyed pools, memory statistics, the out-of-memory message, and copies
// and memsets ordered on the current stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "megatron/cuda_runtime/allocator.h"
#include "megatron/cuda_runtime/context.h"
#include "test_util.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaAllocator : public CudaTest {};

Tensor gpu_bytes(int64_t n) { return Tensor::empty({n}, DType::u8, gpu()); }

}  // namespace

TEST(CudaSizeClass, RoundsUpWithBoundedWaste) {
  size_t previous = 0;
  for (size_t bytes :
       {size_t(0), size_t(1), size_t(511), size_t(512), size_t(513), size_t(4095), size_t(4097), size_t(100000),
        size_t(1) << 20, (size_t(1) << 20) + 1, size_t(3) << 28, (size_t(3) << 28) + 7}) {
    const size_t cls = cuda::size_class(bytes);
    EXPECT_GE(cls, bytes);
    EXPECT_GE(cls, size_t(512));
    EXPECT_LE(double(cls), std::max(512.0, double(bytes) * 1.125 + 512.0)) << bytes;  // header: <= 12.5% waste
    EXPECT_EQ(cuda::size_class(cls), cls) << "a class is its own class";
    EXPECT_GE(cls, previous) << "classes grow with the request";
    previous = cls;
  }
}

TEST_F(CudaAllocator, SteadyStateReusesBlocksWithoutCudaMalloc) {
  const std::vector<int64_t> sizes = {1, 1000, 4096, 1 << 20, (3 << 20) + 7, 50 << 20};
  auto one_step = [&] {
    std::vector<Tensor> live;
    for (int64_t n : sizes) live.push_back(gpu_bytes(n));
    live.front().zero();
  };
  one_step();  // the first step fills the cache
  const cuda::CudaMemoryStats warm = cuda::memory_stats();
  for (int step = 0; step < 20; ++step) one_step();
  const cuda::CudaMemoryStats after = cuda::memory_stats();
  EXPECT_EQ(after.device_allocations, warm.device_allocations) << "cudaMalloc in the steady state";
  EXPECT_EQ(after.device_frees, warm.device_frees) << "cudaFree in the steady state";
  EXPECT_EQ(after.reserved_bytes, warm.reserved_bytes);
  EXPECT_EQ(after.current_bytes, warm.current_bytes);
}

TEST_F(CudaAllocator, FreedBlockIsHandedOutAgain) {
  void* first = nullptr;
  {
    Tensor t = gpu_bytes(777777);
    first = t.raw();
  }
  const size_t mallocs = cuda::memory_stats().device_allocations;
  Tensor again = gpu_bytes(777777);
  EXPECT_EQ(again.raw(), first);
  EXPECT_EQ(cuda::memory_stats().device_allocations, mallocs);
}

TEST(CudaBlockSize, LargeRequestsCostTheirSizeRoundedTo512Bytes) {
  EXPECT_EQ(cuda::block_size(1000), cuda::size_class(1000));
  EXPECT_EQ(cuda::block_size(cuda::kLargeRequest), cuda::kLargeRequest);
  EXPECT_EQ(cuda::block_size(cuda::kLargeRequest + 1), cuda::kLargeRequest + 512);
  const size_t grads = size_t(11255808000);  // llama-3b's fp32 main gradients: a size class adds 530 MiB
  EXPECT_EQ(cuda::block_size(grads), grads);
  EXPECT_GT(cuda::size_class(grads), grads + (size_t(500) << 20));
}

TEST_F(CudaAllocator, LargeBlocksAreCutFromSegmentsAndFreedMemoryServesOtherSizes) {
  cuda::empty_cache();
  const cuda::CudaMemoryStats before = cuda::memory_stats();
  void* first = nullptr;
  {
    Tensor big = gpu_bytes(int64_t(64) << 20);
    first = big.raw();
    EXPECT_EQ(cuda::memory_stats().current_bytes, before.current_bytes + (size_t(64) << 20)) << "no size class";
  }
  const size_t mallocs = cuda::memory_stats().device_allocations;
  // Three requests of another size fit in the freed 64 MiB: cut from it, one after the other.
  std::vector<Tensor> parts;
  for (int i = 0; i < 3; ++i) parts.push_back(gpu_bytes(int64_t(20) << 20));
  EXPECT_EQ(parts[0].raw(), first);
  EXPECT_EQ(static_cast<char*>(parts[1].raw()), static_cast<char*>(first) + (size_t(20) << 20));
  EXPECT_EQ(cuda::memory_stats().device_allocations, mallocs) << "served from the freed block, no cudaMalloc";
  for (Tensor& t : parts) t.zero();
  parts.clear();
  Tensor whole = gpu_bytes(int64_t(64) << 20);
  EXPECT_EQ(whole.raw(), first) << "the parts merged back into one block";
  whole.zero();
  cuda::synchronize();
}

// The pattern of a training step: activations freed during the backward serve the larger
// gradient bucket it takes, and the reverse in the next forward, without new device memory (the
// blocks lie side by side in one preferred segment and merge when freed).
TEST_F(CudaAllocator, ManyFreedBlocksServeOneLargerRequestAndTheReverse) {
  cuda::empty_cache();
  std::vector<Tensor> activations;
  for (int i = 0; i < 8; ++i) activations.push_back(gpu_bytes(int64_t(100) << 20));
  const cuda::CudaMemoryStats forward = cuda::memory_stats();
  activations.clear();
  Tensor bucket = gpu_bytes(int64_t(700) << 20);
  EXPECT_EQ(cuda::memory_stats().device_allocations, forward.device_allocations) << "cut from the freed activations";
  bucket = Tensor();
  for (int i = 0; i < 8; ++i) activations.push_back(gpu_bytes(int64_t(100) << 20));
  const cuda::CudaMemoryStats again = cuda::memory_stats();
  EXPECT_EQ(again.device_allocations, forward.device_allocations);
  EXPECT_EQ(again.reserved_bytes, forward.reserved_bytes);
  for (Tensor& t : activations) t.zero();
  cuda::synchronize();
}

TEST_F(CudaAllocator, TracksCurrentAndPeak) {
  cuda::reset_peak_memory();
  const cuda::CudaMemoryStats before = cuda::memory_stats();
  EXPECT_EQ(before.peak_bytes, before.current_bytes);
  const size_t a_bytes = (1 << 20) + 3, b_bytes = 3 << 20;
  Tensor a = gpu_bytes(int64_t(a_bytes));
  {
    Tensor b = gpu_bytes(int64_t(b_bytes));
    const cuda::CudaMemoryStats both = cuda::memory_stats();
    EXPECT_EQ(both.current_bytes, before.current_bytes + cuda::block_size(a_bytes) + cuda::block_size(b_bytes));
    EXPECT_EQ(both.peak_bytes, both.current_bytes);
    EXPECT_GE(both.reserved_bytes, both.current_bytes);
  }
  const cuda::CudaMemoryStats one = cuda::memory_stats();
  EXPECT_EQ(one.current_bytes, before.current_bytes + cuda::block_size(a_bytes));
  EXPECT_EQ(one.peak_bytes, before.current_bytes + cuda::block_size(a_bytes) + cuda::block_size(b_bytes));
  cuda::reset_peak_memory();
  EXPECT_EQ(cuda::memory_stats().peak_bytes, one.current_bytes);
}

TEST_F(CudaAllocator, OutOfMemoryNamesTheRequestTheUsageAndTheFix) {
  const int64_t huge = int64_t(1) << 48;  // 256 TiB: no GPU has it
  const std::string message = megatron::testing::error_of([&] { gpu_bytes(huge); });
  EXPECT_NE(message.find("out of memory"), std::string::npos) << message;
  EXPECT_NE(message.find("281474976710656 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("peak"), std::string::npos) << message;
  EXPECT_NE(message.find("reserves"), std::string::npos) << message;
  EXPECT_NE(message.find("--micro-batch-size"), std::string::npos) << message;
  // The failure leaves no sticky error and the allocator keeps working.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  Tensor small = gpu_bytes(1024);
  small.zero();
  cuda::synchronize();
}

TEST_F(CudaAllocator, EmptyCacheReturnsUnusedBlocks) {
  { Tensor t = gpu_bytes(int64_t(64) << 20); }
  const cuda::CudaMemoryStats cached = cuda::memory_stats();
  EXPECT_GT(cached.reserved_bytes, cached.current_bytes);
  cuda::empty_cache();
  const cuda::CudaMemoryStats emptied = cuda::memory_stats();
  EXPECT_EQ(emptied.reserved_bytes, emptied.current_bytes);
  EXPECT_GT(emptied.device_frees, cached.device_frees);
}

TEST_F(CudaAllocator, CopyAndZeroRunInOrderOnTheCurrentStream) {
  const Tensor host = randn({1 << 20}, DType::f32, 11);
  Tensor dev = host.to(gpu());
  Tensor twin = dev.clone();  // device-to-device copy, queued behind the upload
  EXPECT_EQ(std::memcmp(twin.to(Device::cpu()).raw(), host.raw(), host.nbytes()), 0);
  dev.zero();
  const Tensor back = dev.to(Device::cpu());  // returns with the data in place
  for (int64_t i = 0; i < back.numel(); ++i) ASSERT_EQ(back.data<float>()[i], 0.0f) << i;
}

TEST_F(CudaAllocator, PoolsAreKeptPerStream) {
  cuda::Stream side;
  void* on_side = nullptr;
  {
    cuda::StreamGuard guard(side.get());
    EXPECT_EQ(cuda::current_stream(), side.get());
    Tensor t = gpu_bytes(555555);
    on_side = t.raw();
    t.zero();
    cuda::synchronize();
  }
  EXPECT_EQ(cuda::current_stream(), cuda::current_context().compute_stream());
  // A block freed by the side stream is not given to the compute stream: reuse would race.
  Tensor t = gpu_bytes(555555);
  EXPECT_NE(t.raw(), on_side);
  cuda::synchronize();
}

TEST_F(CudaAllocator, ContextOwnsHandles) {
  const cuda::DeviceContext& ctx = cuda::current_context();
  EXPECT_EQ(ctx.device(), 0);
  EXPECT_NE(ctx.compute_stream(), nullptr);
  EXPECT_NE(ctx.blas_lt(), nullptr);
  EXPECT_NE(ctx.blas_workspace(), nullptr);
  EXPECT_GE(ctx.blas_workspace_bytes(), size_t(4) << 20);
}
