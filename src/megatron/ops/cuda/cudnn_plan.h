#pragma once
// cuDNN's graph API (cudnn_graph.h, the "backend" API) used directly, without the C++ frontend:
// owned descriptors, a builder for operation graphs (tensors, matmuls, pointwise ops, reductions,
// reshapes), the way from a finished graph to an execution plan (engine heuristics, the first
// engine configuration that finalizes) and from a plan to a launch (a variant pack binding the
// graph's tensor uids to addresses).
//
// Every cuDNN call is checked: a failure throws megatron::Error naming the call, cuDNN's status and
// its last error message. Building a plan is the exception: cuDNN answers "not supported" for graphs
// it has no engine for, which build() returns as a reason instead of throwing, so callers can fall
// back to other kernels.
#include <cudnn_graph.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/cuda_runtime/cudnn_check.h"

namespace megatron::cuda {

// Owns one backend descriptor.
class CudnnDescriptor {
 public:
  explicit CudnnDescriptor(cudnnBackendDescriptorType_t type);
  ~CudnnDescriptor();
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return desc_; }

  // cudnnBackendSetAttribute / cudnnBackendFinalize, checked; errors name the descriptor type and
  // the attribute.
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values);
  void set(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value);
  void finalize();

 private:
  cudnnBackendDescriptorType_t type_;
  cudnnBackendDescriptor_t desc_ = nullptr;
};

// A tensor of a graph being built: its descriptor (owned by the builder) and its shape, from which
// the builder derives the shapes of pointwise outputs.
struct CudnnTensor {
  cudnnBackendDescriptor_t desc = nullptr;
  std::vector<int64_t> dims, strides;
};

// A ragged batch (cuDNN's RAGGED_OFFSET_DESC): the tensor whose (dims[0] + 1) int32 values are the
// element offsets at which each batch entry of the described tensor starts, in place of
// dims[0]'s stride. Null: a regular batch.
using CudnnRagged = const CudnnTensor*;

// A matmul's optional per-batch problem sizes (GEMM_{M,N,K}_OVERRIDE_DESC): (batch,1,1,1) int32
// tensors holding each batch entry's M, N or K, at most the dims' (variable sequence lengths).
struct CudnnMatmul {
  const CudnnTensor* m = nullptr;
  const CudnnTensor* n = nullptr;
  const CudnnTensor* k = nullptr;
};

// The optional operands and settings of a pointwise operation: second and third inputs, the
// compute precision, and GEN_INDEX's dimension.
struct CudnnPointwise {
  const CudnnTensor* b = nullptr;
  const CudnnTensor* t = nullptr;
  cudnnDataType_t math = CUDNN_DATA_FLOAT;
  int64_t axis = -1;
};

// A finalized execution plan and everything it was built from (kept alive with it).
class CudnnPlan {
 public:
  int64_t workspace_bytes() const { return workspace_bytes_; }
  // Launches the plan on `stream`: data[i] is the address of the tensor with uid uids[i] (for a
  // by-value scalar, the host address of its value); workspace holds workspace_bytes().
  void execute(cudnnHandle_t handle, cudaStream_t stream, std::span<const int64_t> uids, std::span<void* const> data,
               void* workspace) const;

 private:
  friend class CudnnGraph;
  std::vector<std::unique_ptr<CudnnDescriptor>> owned_;
  const CudnnDescriptor* plan_ = nullptr;
  int64_t workspace_bytes_ = 0;
};

// Builds one operation graph. Outputs of the *_virtual helpers are intermediates the engine keeps
// on chip (never in memory), f32 unless a dtype is given; pointwise outputs take the shape of x.
class CudnnGraph {
 public:
  // A tensor in memory, bound at execution through its uid; 16-byte aligned.
  CudnnTensor tensor(int64_t uid, cudnnDataType_t dtype, std::vector<int64_t> dims, std::vector<int64_t> strides,
                     CudnnRagged ragged = nullptr);
  // A 1x1x1x1 scalar passed by value at execution (through its host address).
  CudnnTensor scalar(int64_t uid, cudnnDataType_t dtype);
  CudnnTensor virtual_tensor(cudnnDataType_t dtype, std::vector<int64_t> dims, std::vector<int64_t> strides);

  // y = mode(x[, b[, t]]) elementwise with broadcasting (CudnnPointwise).
  void pointwise(cudnnPointwiseMode_t mode, const CudnnTensor& x, const CudnnTensor& y,
                 const CudnnPointwise& args = {});
  CudnnTensor pointwise_virtual(cudnnPointwiseMode_t mode, const CudnnTensor& x, const CudnnPointwise& args = {},
                                cudnnDataType_t dtype = CUDNN_DATA_FLOAT);
  // c = a b over the last two dimensions, batched (broadcast) over the first two; f32 accumulation.
  void matmul(const CudnnTensor& a, const CudnnTensor& b, const CudnnTensor& c, const CudnnMatmul& sizes = {});
  CudnnTensor matmul_virtual(const CudnnTensor& a, const CudnnTensor& b, std::vector<int64_t> dims,
                             std::vector<int64_t> strides, cudnnDataType_t dtype = CUDNN_DATA_FLOAT,
                             const CudnnMatmul& sizes = {});
  // y = op over the dimensions where y is smaller than x (f32).
  void reduction(cudnnReduceTensorOp_t op, const CudnnTensor& x, const CudnnTensor& y);
  CudnnTensor reduction_virtual(cudnnReduceTensorOp_t op, const CudnnTensor& x, std::vector<int64_t> dims,
                                std::vector<int64_t> strides);
  // The same elements seen with other dimensions and strides.
  CudnnTensor reshape_virtual(const CudnnTensor& x, cudnnDataType_t dtype, std::vector<int64_t> dims,
                              std::vector<int64_t> strides, CudnnRagged ragged = nullptr);

  // Finalizes the graph and builds the plan of the first engine configuration that finalizes, from
  // cuDNN's heuristics (mode A, then the fallback list). Nullptr when cuDNN has no engine for the
  // graph, with the reason in *why. The builder is spent afterwards.
  std::unique_ptr<CudnnPlan> build(cudnnHandle_t handle, std::string* why);

 private:
  CudnnDescriptor& make(cudnnBackendDescriptorType_t type);
  CudnnTensor make_tensor(int64_t uid, cudnnDataType_t dtype, std::vector<int64_t> dims, std::vector<int64_t> strides,
                          bool is_virtual, bool by_value, CudnnRagged ragged = nullptr);

  std::vector<std::unique_ptr<CudnnDescriptor>> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_uid_ = 1 << 20;  // above every caller-chosen uid
};

}  // namespace megatron::cuda
