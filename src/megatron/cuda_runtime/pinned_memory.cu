#include <cuda_runtime.h>

#include "megatron/cuda_runtime/cuda_check.h"
#include "megatron/cuda_runtime/pinned_memory.h"

namespace megatron::cuda {

std::shared_ptr<void> allocate_pinned_host(size_t bytes, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, bytes == 0 ? 1 : bytes));
  // Freeing cannot report an error from a deleter; a failure shows at the next checked call.
  return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
}

}  // namespace megatron::cuda
