#pragma once
// Device memory. CPU memory is 64-byte aligned. CUDA memory comes from a caching allocator
// (cuda_runtime/allocator.h) registered here at start-up, so core stays free of CUDA headers.
#include <cstddef>

#include "megatron/core/tensor.h"

namespace megatron {

// Peak and current bytes handed out on a device, for the memory report.
struct MemoryStats {
  size_t current_bytes = 0;
  size_t peak_bytes = 0;
  size_t reserved_bytes = 0;       // held from the system: current plus a cache (CPU: none, so current)
  size_t current_allocations = 0;  // blocks handed out now (Megatron's allocation.all.current)
};

struct DeviceAllocator {
  void* (*allocate)(size_t bytes, Device device) = nullptr;
  void (*release)(void* data, size_t bytes, Device device) = nullptr;
  void (*memset_zero)(void* data, size_t bytes, Device device) = nullptr;
  // Copies bytes between this device and the host or itself; returns when dst holds the data.
  void (*copy)(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = nullptr;
  MemoryStats (*stats)(Device device) = nullptr;
};

void register_cuda_allocator(const DeviceAllocator& allocator);
const DeviceAllocator& allocator_for(Device device);

// Bytes between any two devices (same-dtype copies; conversions happen on the host).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// The bytes handed out on `device` (a GPU's through its registered allocator).
MemoryStats memory_stats(Device device);
void reset_peak_memory(DeviceType type);

}  // namespace megatron
