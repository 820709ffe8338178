#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <vector>

#include "megatron/cuda_runtime/context.h"
#include "megatron/cuda_runtime/cuda_check.h"
#include "megatron/cuda_runtime/cudnn_check.h"

namespace megatron::cuda {

namespace {
// cuBLASLt's recommended workspace on Hopper; enough for every algorithm it proposes on Ampere too.
constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;

// One context per device for the life of the process. A registry rather than an object passed to
// each op: the op signatures are shared with the CPU backend (context.h).
struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<DeviceContext>> contexts;
};
Registry& registry() {
  static Registry r;
  return r;
}

thread_local StreamHandle t_stream_override = nullptr;
}  // namespace

Stream::Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault)); }
Stream::~Stream() {
  // Destructors must not throw; a failure here would be reported by the next checked call.
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

BlasLt::BlasLt() { CUBLAS_CHECK(cublasLtCreate(&handle_)); }
BlasLt::~BlasLt() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Blas::Blas() { CUBLAS_CHECK(cublasCreate(&handle_)); }
Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

Cudnn::Cudnn() { CUDNN_CHECK(cudnnCreate(&handle_)); }
Cudnn::~Cudnn() {
  if (handle_ != nullptr) cudnnDestroy(handle_);
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) { CUDA_CHECK(cudaMalloc(&data_, bytes)); }
DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

namespace {
// Handles belong to the device current when they are created.
int make_current(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  return device;
}
}  // namespace

DeviceContext::DeviceContext(int device) : device_(make_current(device)), workspace_(kBlasWorkspaceBytes) {}

CudnnHandle DeviceContext::cudnn() {
  std::call_once(cudnn_once_, [this] { cudnn_ = std::make_unique<Cudnn>(); });
  return cudnn_->get();
}

BlasHandle DeviceContext::blas() {
  std::call_once(blas_once_, [this] {
    blas_ = std::make_unique<Blas>();
    CUBLAS_CHECK(cublasSetStream(blas_->get(), compute_stream()));
  });
  return blas_->get();
}

DeviceContext& current_context() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  thread_local int cached_device = -1;
  thread_local DeviceContext* cached = nullptr;
  if (device == cached_device) return *cached;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.contexts.size() <= size_t(device)) r.contexts.resize(size_t(device) + 1);
  if (!r.contexts[size_t(device)]) r.contexts[size_t(device)] = std::make_unique<DeviceContext>(device);
  cached_device = device;
  cached = r.contexts[size_t(device)].get();
  return *cached;
}

StreamHandle current_stream() {
  if (t_stream_override != nullptr) return t_stream_override;
  return current_context().compute_stream();
}

StreamGuard::StreamGuard(StreamHandle stream) : previous_(t_stream_override) { t_stream_override = stream; }
StreamGuard::~StreamGuard() { t_stream_override = previous_; }

void synchronize() { CUDA_CHECK(cudaStreamSynchronize(current_stream())); }

}  // namespace megatron::cuda
