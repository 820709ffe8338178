#pragma once
// Device memory. CPU memory is 64-byte aligned. CUDA memory comes from a caching allocator
// (ops/cuda) registered here at start-up, so core stays free of CUDA headers.
#include <cstddef>

#include "megatron/core/tensor.h"

namespace megatron {

struct DeviceAllocator {
  void* (*allocate)(size_t bytes, Device device) = nullptr;
  void (*release)(void* data, size_t bytes, Device device) = nullptr;
  void (*memset_zero)(void* data, size_t bytes, Device device) = nullptr;
};

void register_cuda_allocator(const DeviceAllocator& allocator);
const DeviceAllocator& allocator_for(Device device);

// Peak and current bytes handed out per device type, for the memory report.
struct MemoryStats {
  size_t current_bytes = 0;
  size_t peak_bytes = 0;
};
MemoryStats memory_stats(DeviceType type);
void reset_peak_memory(DeviceType type);

}  // namespace megatron
