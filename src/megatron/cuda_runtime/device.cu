#include <cuda_runtime.h>

#include "megatron/core/memory.h"
#include "megatron/cuda_runtime/allocator.h"
#include "megatron/cuda_runtime/context.h"
#include "megatron/cuda_runtime/cuda_check.h"
#include "megatron/cuda_runtime/device.h"

namespace megatron::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" status
    return 0;
  }
  return n;
}

bool cuda_available() { return device_count() > 0; }

DeviceInfo init_device(int index) {
  const int n = device_count();
  MEGATRON_CHECK(n > 0,
                 "this is a CUDA build but no GPU is visible (cudaGetDeviceCount found none); "
                 "check the driver and CUDA_VISIBLE_DEVICES, or run with --device cpu");
  MEGATRON_CHECK(index >= 0 && index < n, "GPU index " << index << " requested but only " << n
                                                       << " GPU(s) are visible; launch one rank per GPU");
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  MEGATRON_CHECK(prop.major >= 8, "GPU " << index << " (" << prop.name << ") is sm_" << prop.major << prop.minor
                                         << "; megatron-cpp needs sm_80 (A100) or newer, or --device cpu");
  CUDA_CHECK(cudaSetDevice(index));
  current_context();  // stream, cuBLASLt handle and workspace now, so a broken setup fails here
  register_cuda_allocator(caching_allocator());
  DeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;
  info.multiprocessors = prop.multiProcessorCount;
  return info;
}

}  // namespace megatron::cuda
