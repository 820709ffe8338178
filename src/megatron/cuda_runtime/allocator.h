#pragma once
// The caching device allocator behind every CUDA tensor (registered by init_device).
//
// Small requests (below kLargeRequest) are rounded up to a size class (size_class) and served
// from blocks cached per (stream, size class). Large ones are rounded up to 512 bytes and cut by
// best fit from segments of at least 1 GiB (2 MiB multiples; one that just fits when the device
// lacks room), split and merged when freed (block_pool.h), so a buffer held all run costs its size
// and freed memory serves any later large request of its stream that fits. A freed block goes back to the cache at
// once, without synchronising: the next allocation that reuses it runs on the same stream, so the stream orders the old
// user's kernels before the new user's (stream-ordered reuse). All ops launch on the compute stream (context.h), so in
// training every block is reused; only the first steps call cudaMalloc and no step calls cudaFree. When cudaMalloc
// fails, the cache is emptied (after a device synchronisation) and the request tried once more before an out-of-memory
// error.
//
// memset_zero and copy are queued on the current stream; a copy to the host synchronises it
// so the host sees the data when copy returns.
//
// Free of CUDA headers; built with the CUDA backend only. Host code reads a GPU's current and peak
// bytes through core's memory_stats(Device), which this allocator answers once registered.
#include <cstddef>

#include "megatron/core/memory.h"

namespace megatron::cuda {

struct CudaMemoryStats {
  size_t current_bytes = 0;       // in blocks handed out to tensors (as rounded, block_size, not requests)
  size_t peak_bytes = 0;          // highest current_bytes since start or reset_peak_memory()
  size_t reserved_bytes = 0;      // obtained from cudaMalloc and held: in use plus cached
  size_t device_allocations = 0;  // cudaMalloc calls so far (flat in the steady state)
  size_t device_frees = 0;        // cudaFree calls so far (only when the cache is emptied)
};

// Statistics of the current device.
CudaMemoryStats memory_stats();
void reset_peak_memory();
// Returns every cached (unused) block of the current device to the driver. Synchronises it.
void empty_cache();

// Requests of this many bytes or more are large.
inline constexpr size_t kLargeRequest = size_t(1) << 20;

// A small request's size class: at least 512, and above 4 KiB rounded up to one of eight steps
// per power of two, so rounding wastes at most 12.5% and repeated shapes share blocks.
size_t size_class(size_t bytes);
// Bytes a request is rounded up to: its size class when small, a multiple of 512 when large (the
// block handed out may still be up to BlockPool::kMinSplit larger, when a free block's remainder
// is too small to split off).
size_t block_size(size_t bytes);

// The allocator in the form core/memory.h registers.
DeviceAllocator caching_allocator();

}  // namespace megatron::cuda
