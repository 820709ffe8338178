// The CUDA runtime's every-build API (cuda_runtime/device.h, pinned_memory.h, event_timer.h) and
// the memory report on a machine without a GPU, in builds with and without the CUDA backend:
// training and the op profiler call it with no #ifdef, so it must answer "no GPU" and make every
// request for GPU work a clear error.
#include <gtest/gtest.h>

#include <string>

#include "megatron/core/memory.h"
#include "megatron/cuda_runtime/device.h"
#include "megatron/cuda_runtime/event_timer.h"
#include "megatron/cuda_runtime/pinned_memory.h"
#include "megatron/training/device.h"
#include "test_util.h"

namespace megatron {
namespace {

bool mentions(const std::string& error, const std::string& needle) { return error.find(needle) != std::string::npos; }

#ifdef MEGATRON_WITH_CUDA
const char* const kNoGpu = "no GPU is visible";
#else
const char* const kNoGpu = "this build has no CUDA backend";
#endif

TEST(CudaRuntime, WithoutAGpuAutoTrainsOnTheCpuAndCudaIsAClearError) {
  if (cuda::cuda_available()) GTEST_SKIP() << "a GPU is visible: tests/gpu/test_device.cpp covers this machine";
  EXPECT_EQ(cuda::device_count(), 0);
  EXPECT_EQ(select_device("auto", 0), Device::cpu());
  EXPECT_EQ(select_device("cpu", 0), Device::cpu());
  const std::string error = testing::error_of([] { select_device("cuda", 0); });
  EXPECT_TRUE(mentions(error, kNoGpu)) << error;
  EXPECT_TRUE(mentions(error, "--device cpu")) << error;
}

TEST(CudaRuntime, MemoryReportOfTheCpuAndOfAGpuNeverInitialised) {
  const MemoryStats start = memory_stats(Device::cpu());
  {
    const Tensor t = Tensor::empty({1 << 16}, DType::f32);
    EXPECT_EQ(memory_stats(Device::cpu()).current_allocations, start.current_allocations + 1);
  }
  EXPECT_EQ(memory_stats(Device::cpu()).current_allocations, start.current_allocations);
  EXPECT_GE(memory_stats(Device::cpu()).peak_bytes, std::max(start.peak_bytes, size_t(4) << 16));
  EXPECT_EQ(peak_memory_mib(Device::cpu()), double(memory_stats(Device::cpu()).peak_bytes) / (1024.0 * 1024.0));
  if (cuda::cuda_available()) GTEST_SKIP() << "a GPU is visible";
  const std::string error = testing::error_of([] { memory_stats(Device::cuda(0)); });
  EXPECT_TRUE(mentions(error, "no CUDA allocator")) << error;
}

#ifndef MEGATRON_WITH_CUDA
TEST(CudaRuntime, ABuildWithoutCudaRefusesGpuWorkNamingTheFix) {
  for (const std::string& error :
       {testing::error_of([] { cuda::init_device(0); }), testing::error_of([] { cuda::allocate_pinned_host(64, 0); }),
        testing::error_of([] { cuda::event_timer_record(); })}) {
    EXPECT_TRUE(mentions(error, "this build has no CUDA backend")) << error;
    EXPECT_TRUE(mentions(error, "rebuild on a machine with the CUDA toolkit")) << error;
  }
  cuda::event_timer_reset();  // the profiler's start(): nothing pooled, nothing to do
}
#endif

}  // namespace
}  // namespace megatron
