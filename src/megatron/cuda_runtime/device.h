#pragma once
// Choosing and preparing a GPU. Kept free of CUDA headers so host code can include it, and
// declared in every build: without the CUDA backend (without_cuda.cpp) no GPU is ever available
// and asking for one is an error that says so.
#include <cstddef>
#include <string>

namespace megatron::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  size_t total_memory = 0;
  int multiprocessors = 0;
};

// True when this build has the CUDA backend and at least one GPU is visible.
bool cuda_available();
int device_count();
// Selects GPU `index`, checks it is sm_80 or newer, creates its context (context.h) and registers
// the caching allocator (allocator.h), so core's memory_stats(Device) reports it.
// Throws with a clear message when there is no GPU, it is too old, or the build has no CUDA backend.
DeviceInfo init_device(int index);

}  // namespace megatron::cuda
