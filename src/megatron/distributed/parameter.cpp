#include "megatron/distributed/parameter.h"

#include <cmath>

#include "megatron/core/rng.h"
#include "megatron/ops/elementwise.h"

namespace megatron {

namespace {
// Elements between parameter starts in the flat buffers are rounded up to this, so every
// parameter starts 64-byte aligned in fp32 (vector loads on both backends).
constexpr int64_t kAlignElements = 16;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

Shape local_shape_of(const ParamSpec& spec, int tp_size) {
  Shape local = spec.global_shape;
  if (spec.partition_dim < 0) return local;
  MEGATRON_CHECK(spec.partition_dim < int(local.size()), spec.name << ": partition_dim out of range");
  const int64_t global = local[size_t(spec.partition_dim)];
  const int64_t divisor = spec.partition_blocks * tp_size;
  MEGATRON_CHECK(global % divisor == 0, spec.name << ": dimension " << spec.partition_dim << " of size " << global
                                                  << " is not divisible by " << spec.partition_blocks
                                                  << " block(s) x TP " << tp_size);
  local[size_t(spec.partition_dim)] = global / tp_size;
  return local;
}
}  // namespace

int64_t Parameter::global_index(int64_t local_index) const {
  if (spec.partition_dim < 0 || tp_size == 1) return local_index;
  const int d = spec.partition_dim;
  // Strides of the local and global tensors (row-major).
  int64_t inner = 1;
  for (size_t i = size_t(d) + 1; i < local_shape.size(); ++i) inner *= local_shape[i];
  const int64_t local_d = local_shape[size_t(d)];
  const int64_t global_d = spec.global_shape[size_t(d)];
  const int64_t outer_index = local_index / (inner * local_d);
  const int64_t coord = (local_index / inner) % local_d;
  const int64_t within = local_index % inner;
  const int64_t local_block = local_d / spec.partition_blocks;
  const int64_t global_block = global_d / spec.partition_blocks;
  const int64_t global_coord = (coord / local_block) * global_block + tp_rank * local_block + coord % local_block;
  return (outer_index * global_d + global_coord) * inner + within;
}

std::vector<Parameter::Slice> Parameter::global_slices_of(const Tensor& local) const {
  check_shape(local, local_shape, spec.name.c_str());
  Shape offset(spec.global_shape.size(), 0);
  if (spec.partition_dim < 0 || tp_size == 1) return {{offset, local}};
  const int d = spec.partition_dim;
  const int64_t local_block = local_shape[size_t(d)] / spec.partition_blocks;
  const int64_t global_block = spec.global_shape[size_t(d)] / spec.partition_blocks;
  if (spec.partition_blocks == 1) {
    offset[size_t(d)] = tp_rank * local_block;
    return {{offset, local}};
  }
  MEGATRON_CHECK(d == 0, spec.name << ": blocked partitions are only supported along dim 0");
  std::vector<Slice> slices;
  for (int64_t b = 0; b < spec.partition_blocks; ++b) {
    offset[0] = b * global_block + tp_rank * local_block;
    slices.push_back({offset, local.slice(b * local_block, (b + 1) * local_block)});
  }
  return slices;
}

Parameter* ParameterRegistry::add(ParamSpec spec, int tp_rank, int tp_size) {
  MEGATRON_CHECK(find(spec.name) == nullptr, "parameter " << spec.name << " registered twice");
  MEGATRON_CHECK(!param_buffer_.defined(), "parameter " << spec.name << " registered after allocate()");
  auto p = std::make_unique<Parameter>();
  p->local_shape = local_shape_of(spec, tp_size);
  p->spec = std::move(spec);
  p->tp_rank = tp_rank;
  p->tp_size = tp_size;
  params_.push_back(std::move(p));
  return params_.back().get();
}

void ParameterRegistry::allocate(DType params_dtype, Device device) {
  int64_t total = 0;
  for (const auto& p : params_) total += round_up(shape_numel(p->local_shape), kAlignElements);
  const DType grad_dtype = params_dtype == DType::f64 ? DType::f64 : DType::f32;
  param_buffer_ = Tensor::zeros({total}, params_dtype, device);
  grad_buffer_ = Tensor::zeros({total}, grad_dtype, device);
  int64_t offset = 0;
  for (const auto& p : params_) {
    const int64_t n = shape_numel(p->local_shape);
    p->buffer_offset = offset;
    p->data = p->view_of(param_buffer_);
    p->main_grad = p->view_of(grad_buffer_);
    offset += round_up(n, kAlignElements);
  }
}

void ParameterRegistry::initialize(uint64_t seed) {
  // Values are drawn on the host in parallel (each element is independent), then stored in
  // the parameter dtype and copied to the buffer's device in one go.
  Tensor host = param_buffer_.device().is_cpu() ? param_buffer_ : Tensor::zeros(param_buffer_.shape(), params_dtype());
  for (const auto& p : params_) {
    const int64_t n = p->data.numel();
    std::vector<float> values(static_cast<size_t>(n));
    const CounterRng rng{seed, stream_id(p->spec.name)};
    const float std_dev = p->spec.init_std;
    const InitMethod init = p->spec.init;
    const Parameter& param = *p;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      values[size_t(i)] = init == InitMethod::zeros  ? 0.0f
                          : init == InitMethod::ones ? 1.0f
                                                     : std_dev * rng.normal(uint64_t(param.global_index(i)));
    }
    Tensor dst = p->view_of(host);
    ops::cast(dst, Tensor::from_blob(values.data(), p->local_shape, DType::f32));
  }
  if (!host.same_storage(param_buffer_)) param_buffer_.copy_from(host);
}

void ParameterRegistry::zero_grads() {
  if (grad_buffer_.defined()) grad_buffer_.zero();
}

Parameter* ParameterRegistry::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p->spec.name == name) return p.get();
  return nullptr;
}

}  // namespace megatron
