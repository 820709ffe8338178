#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "megatron/cuda_runtime/allocator.h"
#include "megatron/cuda_runtime/block_pool.h"
#include "megatron/cuda_runtime/context.h"
#include "megatron/cuda_runtime/cuda_check.h"

namespace megatron::cuda {

namespace {

constexpr size_t kMinBlock = 512;
constexpr size_t kStepsPerPowerOfTwo = 8;

struct Block {
  size_t size = 0;  // its size class
  StreamHandle stream = nullptr;
};

struct DeviceCache {
  std::unordered_map<void*, Block> in_use;                                    // small blocks handed out
  std::map<std::pair<StreamHandle, size_t>, std::vector<void*>> free_blocks;  // small, (stream, size class)
  BlockPool large;                                                            // requests of kLargeRequest bytes or more
  CudaMemoryStats stats;
};

BlockPool::StreamKey key_of(StreamHandle stream) { return reinterpret_cast<BlockPool::StreamKey>(stream); }

// One cache per device, for the whole process. Deliberately never destroyed: tensors with static
// storage duration may be released after every other static object, and the driver reclaims
// device memory at exit anyway.
struct Caches {
  std::mutex mutex;
  std::vector<DeviceCache> devices;
  DeviceCache& at(int device) {
    if (devices.size() <= size_t(device)) devices.resize(size_t(device) + 1);
    return devices[size_t(device)];
  }
};
Caches& caches() {
  static Caches* c = new Caches;
  return *c;
}

int current_device() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void require_current(Device device, const char* what) {
  const int current = current_device();
  MEGATRON_CHECK(device.index == current, what << " on " << device.str() << " but the current device is cuda:"
                                               << current << "; one process drives one GPU (init_device)");
}

// Gives every cached small block and every wholly free large segment of `cache` back to the
// driver. The caller holds the mutex.
void release_cached(DeviceCache& cache) {
  if (cache.free_blocks.empty() && cache.large.free_blocks() == 0) return;
  CUDA_CHECK(cudaDeviceSynchronize());  // stream-ordered frees: their last users must be done
  for (auto& [key, blocks] : cache.free_blocks) {
    for (void* p : blocks) {
      CUDA_CHECK(cudaFree(p));
      cache.stats.reserved_bytes -= key.second;
      ++cache.stats.device_frees;
    }
  }
  cache.free_blocks.clear();
  for (const BlockPool::Segment& segment : cache.large.take_free_segments()) {
    CUDA_CHECK(cudaFree(reinterpret_cast<void*>(segment.base)));
    cache.stats.reserved_bytes -= segment.bytes;
    ++cache.stats.device_frees;
  }
}

double mib(size_t bytes) { return double(bytes) / double(1 << 20); }

[[noreturn]] void out_of_memory(size_t bytes, size_t cls, int device, const CudaMemoryStats& s) {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) cudaGetLastError();
  MEGATRON_FAIL("CUDA out of memory: a request for "
                << bytes << " bytes (" << mib(cls) << " MiB block) on cuda:" << device << " failed. Tensors hold "
                << mib(s.current_bytes) << " MiB (peak " << mib(s.peak_bytes) << " MiB), the allocator "
                << "reserves " << mib(s.reserved_bytes) << " MiB, the device has " << mib(free_bytes) << " of "
                << mib(total_bytes)
                << " MiB free. Use a smaller --micro-batch-size (or shorter "
                   "sequences / a smaller model per GPU)");
}

// cudaMalloc with one retry after the cache is emptied; out of memory is a clear error.
void* device_malloc(DeviceCache& cache, size_t bytes, size_t request, int device) {
  void* p = nullptr;
  cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // the failure is not sticky; clear it before retrying
    release_cached(cache);
    status = cudaMalloc(&p, bytes);
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    out_of_memory(request, bytes, device, cache.stats);
  }
  CUDA_CHECK(status);
  cache.stats.reserved_bytes += bytes;
  ++cache.stats.device_allocations;
  return p;
}

// A large block: from the stream's free blocks, or from a new segment of the preferred size
// (BlockPool::segment_bytes), or, when the device has no room for that, of the least that fits
// (emptying the cache first if need be).
void* allocate_large(DeviceCache& cache, size_t bytes, StreamHandle stream, int device) {
  const size_t block = block_size(bytes);
  std::optional<BlockPool::Address> at = cache.large.allocate(block, key_of(stream));
  if (!at) {
    size_t segment = BlockPool::segment_bytes(block);
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, segment);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it before the fitting request
      segment = BlockPool::fitting_segment_bytes(block);
      p = device_malloc(cache, segment, bytes, device);
    } else {
      CUDA_CHECK(status);
      cache.stats.reserved_bytes += segment;
      ++cache.stats.device_allocations;
    }
    cache.large.add_segment(reinterpret_cast<BlockPool::Address>(p), segment, key_of(stream));
    at = cache.large.allocate(block, key_of(stream));
  }
  return reinterpret_cast<void*>(*at);
}

void* cache_allocate(size_t bytes, Device device) {
  require_current(device, "allocation");
  const StreamHandle stream = current_stream();
  Caches& c = caches();
  std::lock_guard<std::mutex> lock(c.mutex);
  DeviceCache& cache = c.at(device.index);
  void* p = nullptr;
  size_t held = 0;
  if (bytes >= kLargeRequest) {
    p = allocate_large(cache, bytes, stream, device.index);
    held = cache.large.block_bytes(reinterpret_cast<BlockPool::Address>(p));
  } else {
    held = size_class(bytes);
    auto it = cache.free_blocks.find({stream, held});
    if (it != cache.free_blocks.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    } else {
      p = device_malloc(cache, held, bytes, device.index);
    }
    cache.in_use.emplace(p, Block{held, stream});
  }
  cache.stats.current_bytes += held;
  cache.stats.peak_bytes = std::max(cache.stats.peak_bytes, cache.stats.current_bytes);
  return p;
}

// Called from Storage's destructor: throwing here terminates, which is what a free of memory
// this allocator never handed out deserves.
void cache_release(void* p, size_t, Device device) {
  Caches& c = caches();
  std::lock_guard<std::mutex> lock(c.mutex);
  DeviceCache& cache = c.at(device.index);
  const auto address = reinterpret_cast<BlockPool::Address>(p);
  if (cache.large.holds(address)) {
    cache.stats.current_bytes -= cache.large.release(address);
    return;
  }
  auto it = cache.in_use.find(p);
  MEGATRON_CHECK(it != cache.in_use.end(),
                 "release of " << p << " on " << device.str() << ", which the CUDA caching allocator did not hand out");
  const Block block = it->second;
  cache.in_use.erase(it);
  cache.free_blocks[{block.stream, block.size}].push_back(p);
  cache.stats.current_bytes -= block.size;
}

void cache_memset_zero(void* p, size_t bytes, Device device) {
  require_current(device, "memset");
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, current_stream()));
}

// Host memory here is pageable (core's CPU allocator): an asynchronous copy from it returns once
// the source is staged, so the caller may reuse it; a copy to it must wait for the stream.
void cache_copy(void* dst, Device dst_device, const void* src, Device, size_t bytes) {
  const StreamHandle stream = current_stream();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));  // unified addressing knows the direction
  if (dst_device.is_cpu()) CUDA_CHECK(cudaStreamSynchronize(stream));
}

MemoryStats cache_stats(Device device) {
  Caches& c = caches();
  std::lock_guard<std::mutex> lock(c.mutex);
  const DeviceCache& cache = c.at(device.index);
  const CudaMemoryStats& s = cache.stats;
  return {s.current_bytes, s.peak_bytes, s.reserved_bytes, cache.in_use.size() + cache.large.used_blocks()};
}

}  // namespace

size_t block_size(size_t bytes) {
  if (bytes < kLargeRequest) return size_class(bytes);
  return (bytes + kMinBlock - 1) / kMinBlock * kMinBlock;
}

size_t size_class(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  const size_t step = std::max(kMinBlock, std::bit_floor(bytes) / kStepsPerPowerOfTwo);
  return (bytes + step - 1) / step * step;
}

CudaMemoryStats memory_stats() {
  const int device = current_device();
  Caches& c = caches();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.at(device).stats;
}

void reset_peak_memory() {
  const int device = current_device();
  Caches& c = caches();
  std::lock_guard<std::mutex> lock(c.mutex);
  CudaMemoryStats& s = c.at(device).stats;
  s.peak_bytes = s.current_bytes;
}

void empty_cache() {
  const int device = current_device();
  Caches& c = caches();
  std::lock_guard<std::mutex> lock(c.mutex);
  release_cached(c.at(device));
}

DeviceAllocator caching_allocator() {
  return {cache_allocate, cache_release, cache_memset_zero, cache_copy, cache_stats};
}

}  // namespace megatron::cuda
