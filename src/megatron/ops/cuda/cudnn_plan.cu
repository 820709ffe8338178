#include <utility>

#include "megatron/ops/cuda/cudnn_plan.h"

namespace megatron::cuda {

namespace {
// The handle attributes of operation graphs and execution plans, named by value: cuDNN 9.x marks
// them deprecated (newer releases take the handle at execution only), but the 9.x releases before
// need them, and every release still accepts them.
constexpr auto kOperationGraphHandle = cudnnBackendAttributeName_t(800);  // CUDNN_ATTR_OPERATIONGRAPH_HANDLE
constexpr auto kExecutionPlanHandle = cudnnBackendAttributeName_t(400);   // CUDNN_ATTR_EXECUTION_PLAN_HANDLE

// Tensors in memory are 16-byte aligned (the attention routing checks the addresses).
constexpr int64_t kByteAlignment = 16;
}  // namespace

// ---- descriptors ----------------------------------------------------------------------------

CudnnDescriptor::CudnnDescriptor(cudnnBackendDescriptorType_t type) : type_(type) {
  const cudnnStatus_t status = cudnnBackendCreateDescriptor(type, &desc_);
  MEGATRON_CHECK(status == CUDNN_STATUS_SUCCESS, "cudnnBackendCreateDescriptor(descriptor type "
                                                     << int(type) << ") failed: " << cudnn_status_message(status));
}

CudnnDescriptor::~CudnnDescriptor() {
  if (desc_ != nullptr) cudnnBackendDestroyDescriptor(desc_);  // destructors do not throw
}

void CudnnDescriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                          const void* values) {
  const cudnnStatus_t status = cudnnBackendSetAttribute(desc_, name, type, count, values);
  MEGATRON_CHECK(status == CUDNN_STATUS_SUCCESS, "cudnnBackendSetAttribute(descriptor type "
                                                     << int(type_) << ", attribute " << int(name)
                                                     << ") failed: " << cudnn_status_message(status));
}

void CudnnDescriptor::set(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
  set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}

void CudnnDescriptor::finalize() {
  const cudnnStatus_t status = cudnnBackendFinalize(desc_);
  MEGATRON_CHECK(status == CUDNN_STATUS_SUCCESS,
                 "cudnnBackendFinalize(descriptor type " << int(type_) << ") failed: " << cudnn_status_message(status));
}

// ---- graph building -------------------------------------------------------------------------

CudnnDescriptor& CudnnGraph::make(cudnnBackendDescriptorType_t type) {
  owned_.push_back(std::make_unique<CudnnDescriptor>(type));
  return *owned_.back();
}

CudnnTensor CudnnGraph::make_tensor(int64_t uid, cudnnDataType_t dtype, std::vector<int64_t> dims,
                                    std::vector<int64_t> strides, bool is_virtual, bool by_value, CudnnRagged ragged) {
  MEGATRON_CHECK(dims.size() == strides.size(),
                 "cuDNN tensor " << uid << ": " << dims.size() << " dims but " << strides.size() << " strides");
  CudnnDescriptor& t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, int64_t(dims.size()), dims.data());
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, int64_t(strides.size()), strides.data());
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kByteAlignment);
  t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  if (ragged != nullptr) t.set(CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, ragged->desc);
  t.finalize();
  return CudnnTensor{t.get(), std::move(dims), std::move(strides)};
}

CudnnTensor CudnnGraph::tensor(int64_t uid, cudnnDataType_t dtype, std::vector<int64_t> dims,
                               std::vector<int64_t> strides, CudnnRagged ragged) {
  return make_tensor(uid, dtype, std::move(dims), std::move(strides), false, false, ragged);
}

CudnnTensor CudnnGraph::scalar(int64_t uid, cudnnDataType_t dtype) {
  return make_tensor(uid, dtype, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
}

CudnnTensor CudnnGraph::virtual_tensor(cudnnDataType_t dtype, std::vector<int64_t> dims, std::vector<int64_t> strides) {
  return make_tensor(next_virtual_uid_++, dtype, std::move(dims), std::move(strides), true, false);
}

void CudnnGraph::pointwise(cudnnPointwiseMode_t mode, const CudnnTensor& x, const CudnnTensor& y,
                           const CudnnPointwise& args) {
  CudnnDescriptor& pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &args.math);
  if (args.axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &args.axis);
  pw.finalize();
  CudnnDescriptor& op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get());
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x.desc);
  if (args.b != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, args.b->desc);
  if (args.t != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, args.t->desc);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y.desc);
  op.finalize();
  ops_.push_back(op.get());
}

CudnnTensor CudnnGraph::pointwise_virtual(cudnnPointwiseMode_t mode, const CudnnTensor& x, const CudnnPointwise& args,
                                          cudnnDataType_t dtype) {
  CudnnTensor y = virtual_tensor(dtype, x.dims, x.strides);
  pointwise(mode, x, y, args);
  return y;
}

void CudnnGraph::matmul(const CudnnTensor& a, const CudnnTensor& b, const CudnnTensor& c, const CudnnMatmul& sizes) {
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  CudnnDescriptor& mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  mm.finalize();
  CudnnDescriptor& op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a.desc);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b.desc);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c.desc);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get());
  if (sizes.m != nullptr) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, sizes.m->desc);
  if (sizes.n != nullptr) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, sizes.n->desc);
  if (sizes.k != nullptr) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, sizes.k->desc);
  op.finalize();
  ops_.push_back(op.get());
}

CudnnTensor CudnnGraph::matmul_virtual(const CudnnTensor& a, const CudnnTensor& b, std::vector<int64_t> dims,
                                       std::vector<int64_t> strides, cudnnDataType_t dtype, const CudnnMatmul& sizes) {
  CudnnTensor c = virtual_tensor(dtype, std::move(dims), std::move(strides));
  matmul(a, b, c, sizes);
  return c;
}

void CudnnGraph::reduction(cudnnReduceTensorOp_t reduce, const CudnnTensor& x, const CudnnTensor& y) {
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  CudnnDescriptor& red = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
  red.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  red.finalize();
  CudnnDescriptor& op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.desc);
  op.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.desc);
  op.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red.get());
  op.finalize();
  ops_.push_back(op.get());
}

CudnnTensor CudnnGraph::reduction_virtual(cudnnReduceTensorOp_t reduce, const CudnnTensor& x, std::vector<int64_t> dims,
                                          std::vector<int64_t> strides) {
  CudnnTensor y = virtual_tensor(CUDNN_DATA_FLOAT, std::move(dims), std::move(strides));
  reduction(reduce, x, y);
  return y;
}

CudnnTensor CudnnGraph::reshape_virtual(const CudnnTensor& x, cudnnDataType_t dtype, std::vector<int64_t> dims,
                                        std::vector<int64_t> strides, CudnnRagged ragged) {
  CudnnTensor y = make_tensor(next_virtual_uid_++, dtype, std::move(dims), std::move(strides), true, false, ragged);
  CudnnDescriptor& op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.desc);
  op.set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.desc);
  op.finalize();
  ops_.push_back(op.get());
  return y;
}

// ---- plans ----------------------------------------------------------------------------------

std::unique_ptr<CudnnPlan> CudnnGraph::build(cudnnHandle_t handle, std::string* why) {
  CudnnDescriptor& graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(kOperationGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()), ops_.data());
  // An operation graph cuDNN cannot fuse fails here (NOT_SUPPORTED), like a missing engine below.
  if (const cudnnStatus_t status = cudnnBackendFinalize(graph.get()); status != CUDNN_STATUS_SUCCESS) {
    *why = "operation graph: " + cudnn_status_message(status);
    return nullptr;
  }
  std::string tried;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    CudnnDescriptor& heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.get());
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (const cudnnStatus_t status = cudnnBackendFinalize(heur.get()); status != CUDNN_STATUS_SUCCESS) {
      tried += " heuristics mode " + std::to_string(int(mode)) + ": " + cudnn_status_message(status) + ";";
      continue;
    }
    int64_t count = 0;
    CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                         &count, nullptr));
    std::vector<cudnnBackendDescriptor_t> configs;
    for (int64_t i = 0; i < count; ++i) configs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
    int64_t returned = 0;
    if (count > 0) {
      CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                           count, &returned, configs.data()));
    }
    tried += " heuristics mode " + std::to_string(int(mode)) + ": " + std::to_string(returned) + " configurations";
    for (int64_t i = 0; i < returned; ++i) {
      CudnnDescriptor& plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(kExecutionPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[size_t(i)]);
      if (const cudnnStatus_t status = cudnnBackendFinalize(plan.get()); status != CUDNN_STATUS_SUCCESS) {
        // The first refusal with cuDNN's own words, the rest by status.
        tried += i == 0 ? " (" + cudnn_status_message(status) : std::string(", ") + cudnnGetErrorString(status);
        continue;
      }
      auto result = std::unique_ptr<CudnnPlan>(new CudnnPlan());
      int64_t elements = 0;
      CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                           &elements, &result->workspace_bytes_));
      result->plan_ = &plan;
      result->owned_ = std::move(owned_);
      return result;
    }
    if (returned > 0) tried += ")";
    tried += ";";
  }
  *why = "no engine configuration finalized:" + tried;
  return nullptr;
}

void CudnnPlan::execute(cudnnHandle_t handle, cudaStream_t stream, std::span<const int64_t> uids,
                        std::span<void* const> data, void* workspace) const {
  MEGATRON_CHECK(uids.size() == data.size(),
                 "cuDNN variant pack: " << uids.size() << " uids but " << data.size() << " addresses");
  CudnnDescriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(data.size()), data.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  CUDNN_CHECK(cudnnSetStream(handle, stream));
  CUDNN_CHECK(cudnnBackendExecute(handle, plan_->get(), pack.get()));
}

}  // namespace megatron::cuda
