#pragma once
// Page-locked host memory for batches the data loader prepares ahead: copies from it to the
// GPU run at full PCIe/NVLink-C2C speed and can overlap compute. Free of CUDA headers and declared
// in every build (without the CUDA backend, asking for it is an error that says so).
#include <cstddef>
#include <memory>

namespace megatron::cuda {

// `bytes` of pinned host memory, released when the last shared_ptr goes. Makes GPU `device`
// current on the calling thread first: the loader's worker thread would otherwise allocate
// through GPU 0 (a new thread's default device), and on a multi-GPU node every rank would create
// a context there.
std::shared_ptr<void> allocate_pinned_host(size_t bytes, int device);

}  // namespace megatron::cuda
