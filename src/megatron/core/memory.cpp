#include "megatron/core/memory.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace megatron {

namespace {
std::atomic<size_t> g_cpu_current{0};
std::atomic<size_t> g_cpu_peak{0};
std::atomic<size_t> g_cpu_allocations{0};

void* cpu_allocate(size_t bytes, Device) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  MEGATRON_CHECK(p != nullptr, "out of host memory allocating " << bytes << " bytes");
  g_cpu_allocations.fetch_add(1);
  const size_t now = g_cpu_current.fetch_add(bytes) + bytes;
  size_t peak = g_cpu_peak.load();
  while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}
void cpu_release(void* p, size_t bytes, Device) {
  g_cpu_current.fetch_sub(bytes);
  g_cpu_allocations.fetch_sub(1);
  std::free(p);
}
void cpu_memset_zero(void* p, size_t bytes, Device) { std::memset(p, 0, bytes); }
void cpu_copy(void* dst, Device, const void* src, Device, size_t bytes) { std::memmove(dst, src, bytes); }
MemoryStats cpu_stats(Device) {
  const size_t current = g_cpu_current.load();
  return {current, g_cpu_peak.load(), current, g_cpu_allocations.load()};
}

const DeviceAllocator kCpuAllocator{cpu_allocate, cpu_release, cpu_memset_zero, cpu_copy, cpu_stats};
DeviceAllocator g_cuda_allocator;  // set by the CUDA backend when it is built and a GPU is used
}  // namespace

void register_cuda_allocator(const DeviceAllocator& allocator) { g_cuda_allocator = allocator; }

const DeviceAllocator& allocator_for(Device device) {
  if (device.is_cpu()) return kCpuAllocator;
  MEGATRON_CHECK(g_cuda_allocator.allocate != nullptr,
                 "no CUDA allocator: this build has no CUDA backend or it was not initialised; "
                 "use --device cpu or a build with CUDA");
  return g_cuda_allocator;
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  const Device owner = dst_device.is_cuda() ? dst_device : src_device;
  allocator_for(owner).copy(dst, dst_device, src, src_device, bytes);
}

MemoryStats memory_stats(Device device) { return allocator_for(device).stats(device); }

void reset_peak_memory(DeviceType type) {
  if (type == DeviceType::cpu) g_cpu_peak.store(g_cpu_current.load());
}

}  // namespace megatron
