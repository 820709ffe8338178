#pragma once
// The CUDA runtime context the kernels run in: per device, one compute stream, one cuBLASLt
// handle and its workspace, created on first use and kept for the life of the process, and a
// cuDNN handle, created on the first cuDNN call (loading cuDNN takes a while and most programs
// that use the context never call it).
//
// Current stream (a departure from STYLE's explicit-context rule, accepted because the op
// signatures are shared with the CPU backend): every op launches on current_stream(), which is
// per host thread. It is the current device's compute stream unless a StreamGuard on this
// thread says otherwise. The compute stream is a *blocking* stream, so work on the legacy
// default stream (plain cudaMemcpy, cudaMemset) is ordered with it.
//
// Kept free of CUDA headers (the handle types are forward-declared exactly as the CUDA headers
// declare them) so host code can call synchronize() and the guards; built with the CUDA backend
// only.
#include <cstddef>
#include <memory>
#include <mutex>

struct CUstream_st;      // cudaStream_t is CUstream_st*
struct cublasLtContext;  // cublasLtHandle_t is cublasLtContext*
struct cublasContext;    // cublasHandle_t is cublasContext*
struct cudnnContext;     // cudnnHandle_t is cudnnContext*

namespace megatron::cuda {

using StreamHandle = CUstream_st*;
using BlasLtHandle = cublasLtContext*;
using BlasHandle = cublasContext*;
using CudnnHandle = cudnnContext*;

// Owns a blocking CUDA stream on the device current at construction.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  StreamHandle get() const { return stream_; }

 private:
  StreamHandle stream_ = nullptr;
};

// Owns a cuBLASLt handle.
class BlasLt {
 public:
  BlasLt();
  ~BlasLt();
  BlasLt(const BlasLt&) = delete;
  BlasLt& operator=(const BlasLt&) = delete;
  BlasLtHandle get() const { return handle_; }

 private:
  BlasLtHandle handle_ = nullptr;
};

// Owns a cuBLAS handle (the grouped GEMM, which cuBLASLt lacks).
class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  BlasHandle get() const { return handle_; }

 private:
  BlasHandle handle_ = nullptr;
};

// Owns a cuDNN handle.
class Cudnn {
 public:
  Cudnn();
  ~Cudnn();
  Cudnn(const Cudnn&) = delete;
  Cudnn& operator=(const Cudnn&) = delete;
  CudnnHandle get() const { return handle_; }

 private:
  CudnnHandle handle_ = nullptr;
};

// Owns a plain cudaMalloc buffer outside the caching allocator (cuBLASLt workspace).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Everything the kernels of one device share.
class DeviceContext {
 public:
  explicit DeviceContext(int device);  // makes `device` current (it stays current)
  int device() const { return device_; }
  StreamHandle compute_stream() const { return stream_.get(); }
  BlasLtHandle blas_lt() const { return blas_lt_.get(); }
  void* blas_workspace() const { return workspace_.data(); }
  size_t blas_workspace_bytes() const { return workspace_.bytes(); }
  // Created on the first call (thread-safe); the device must be current.
  CudnnHandle cudnn();
  // Created on the first call (thread-safe), on the compute stream; the device must be current.
  BlasHandle blas();

 private:
  int device_;
  Stream stream_;
  BlasLt blas_lt_;
  DeviceBuffer workspace_;
  std::once_flag cudnn_once_;
  std::unique_ptr<Cudnn> cudnn_;
  std::once_flag blas_once_;
  std::unique_ptr<Blas> blas_;
};

// The context of the calling thread's current CUDA device (cudaGetDevice), created on first use.
DeviceContext& current_context();

// The stream ops launch on for this thread (see the header comment).
StreamHandle current_stream();

// Makes `stream` this thread's current stream until the guard goes out of scope.
class StreamGuard {
 public:
  explicit StreamGuard(StreamHandle stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  StreamHandle previous_;
};

// Waits until all work queued on this thread's current stream has finished, and reports any
// asynchronous kernel error it raised.
void synchronize();

}  // namespace megatron::cuda
