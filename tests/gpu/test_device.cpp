// GPU bring-up: the device is found and validated, and tensors allocated on it through the
// registered allocator round-trip their bytes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "megatron/core/memory.h"
#include "megatron/core/tensor.h"
#include "megatron/cuda_runtime/device.h"

using namespace megatron;

TEST(CudaDevice, InitValidatesAndRegistersAllocator) {
  ASSERT_GT(cuda::device_count(), 0) << "gpu tests need a GPU";
  const cuda::DeviceInfo info = cuda::init_device(0);
  EXPECT_GE(info.sm_major, 8);
  EXPECT_GT(info.total_memory, size_t(1) << 30);
  EXPECT_THROW(cuda::init_device(cuda::device_count()), Error);
}

TEST(CudaDevice, TensorRoundTrip) {
  cuda::init_device(0);
  const int64_t n = 1 << 20;
  std::vector<float> host(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) host[size_t(i)] = float(i % 977) * 0.5f;
  Tensor t = Tensor::empty({n}, DType::f32, Device::cuda(0));
  ASSERT_EQ(cudaMemcpy(t.raw(), host.data(), size_t(n) * 4, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<float> back(static_cast<size_t>(n), -1.0f);
  ASSERT_EQ(cudaMemcpy(back.data(), t.raw(), size_t(n) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, back);
  t.zero();
  ASSERT_EQ(cudaMemcpy(back.data(), t.raw(), size_t(n) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (float v : back) ASSERT_EQ(v, 0.0f);
}

TEST(CudaDevice, HostAccessorsCopyThroughTheHost) {
  cuda::init_device(0);
  Tensor host = Tensor::from_vector({1.5f, -2.0f, 3.25f, 8.0f}, {4}, DType::bf16);
  Tensor t = host.to(Device::cuda(0));
  EXPECT_TRUE(t.device().is_cuda());
  EXPECT_EQ(t.item(2), 3.25);
  EXPECT_EQ(t.to_vector(), host.to_vector());
  Tensor f32 = t.to(DType::f32);  // conversion staged through the host, result on the GPU
  EXPECT_TRUE(f32.device().is_cuda());
  EXPECT_EQ(f32.to_vector(), host.to_vector());
  EXPECT_THROW(t.set_item(0, 1.0), Error);
}
