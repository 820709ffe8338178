#include "megatron/distributed/parameter.h"

#include <algorithm>
#include <cmath>

#include "megatron/core/rng.h"
#include "megatron/ops/elementwise.h"

namespace megatron {

namespace {
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

struct Box {
  Shape offset, shape;
};

// Appends boxes that cover the flat range [begin, end) of the row-major dimensions shape[dim:],
// in flat order; `prefix` holds the coordinates of the dimensions before dim. Each box has
// extent 1 in the leading dimensions, then one partial dimension, then full dimensions, so it is
// contiguous in memory: at most a partial first row, whole rows, and a partial last row.
void append_boxes(const Shape& shape, size_t dim, int64_t begin, int64_t end, Shape& prefix, std::vector<Box>& out) {
  if (begin >= end) return;
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  int64_t row = begin / inner;
  const auto partial_row = [&](int64_t lo, int64_t hi) {
    prefix.push_back(row);
    append_boxes(shape, dim + 1, lo - row * inner, hi - row * inner, prefix, out);
    prefix.pop_back();
  };
  if (begin % inner != 0) {
    const int64_t stop = std::min(end, (row + 1) * inner);
    partial_row(begin, stop);
    begin = stop;
    ++row;
  }
  if (const int64_t rows = (end - begin) / inner; rows > 0) {
    Box box{prefix, Shape(dim, 1)};
    box.offset.push_back(row);
    box.offset.resize(shape.size(), 0);
    box.shape.push_back(rows);
    box.shape.insert(box.shape.end(), shape.begin() + int64_t(dim) + 1, shape.end());
    out.push_back(std::move(box));
    begin += rows * inner;
    row += rows;
  }
  if (begin < end) partial_row(begin, end);
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

std::vector<Parameter::FlatBox> Parameter::global_boxes(int64_t begin, int64_t end) const {
  const int64_t n = shape_numel(local_shape);
  MEGATRON_CHECK(0 <= begin && begin <= end && end <= n,
                 spec.name << ": flat range [" << begin << ", " << end << ") lies outside its " << n << " elements");
  MEGATRON_CHECK(!local_shape.empty(), spec.name << ": a scalar parameter has no boxes; register it with shape [1]");
  const bool split = spec.partition_dim >= 0 && tp_size > 1;
  const size_t d = size_t(std::max(spec.partition_dim, 0));
  const int64_t local_block = local_shape[d] / spec.partition_blocks;
  const int64_t global_block = spec.global_shape[d] / spec.partition_blocks;
  // Blocks split along dim 0 land in separate places of the global tensor: cut at block edges.
  const int64_t pieces = split ? spec.partition_blocks : 1;
  MEGATRON_CHECK(pieces == 1 || d == 0, spec.name << ": blocked partitions are only supported along dim 0");
  std::vector<FlatBox> out;
  for (int64_t k = 0; k < pieces; ++k) {
    const int64_t lo = std::max(begin, k * n / pieces), hi = std::min(end, (k + 1) * n / pieces);
    std::vector<Box> boxes;
    Shape prefix;
    append_boxes(local_shape, 0, lo, hi, prefix, boxes);
    int64_t flat = lo;
    for (Box& box : boxes) {
      if (split) {
        const int64_t c = box.offset[d];
        box.offset[d] = (c / local_block) * global_block + tp_rank * local_block + c % local_block;
      }
      const int64_t size = shape_numel(box.shape);
      out.push_back({flat, std::move(box.offset), std::move(box.shape)});
      flat += size;
    }
  }
  return out;
}

Parameter* ParameterRegistry::add(ParamSpec spec, int tp_rank, int tp_size) {
  MEGATRON_CHECK(find(spec.name) == nullptr, "parameter " << spec.name << " registered twice");
  MEGATRON_CHECK(!param_buffer_.defined(), "parameter " << spec.name << " registered after allocate()");
  auto p = std::make_unique<Parameter>();
  p->local_shape = local_shape_of(spec, tp_size);
  p->spec = std::move(spec);
  p->tp_rank = tp_rank;
  p->tp_size = tp_size;
  p->index = params_.size();
  params_.push_back(std::move(p));
  return params_.back().get();
}

void ParameterRegistry::allocate(DType params_dtype, Device device) {
  int64_t total = 0;
  for (const auto& p : params_) total += round_up(shape_numel(p->local_shape), kParamAlignment);
  const DType grad_dtype = params_dtype == DType::f64 ? DType::f64 : DType::f32;
  param_buffer_ = Tensor::zeros({total}, params_dtype, device);
  grad_buffer_ = Tensor::zeros({total}, grad_dtype, device);
  int64_t offset = 0;
  for (const auto& p : params_) {
    const int64_t n = shape_numel(p->local_shape);
    p->buffer_offset = offset;
    p->data = p->view_of(param_buffer_);
    p->main_grad = p->view_of(grad_buffer_);
    offset += round_up(n, kParamAlignment);
  }
}

void ParameterRegistry::set_layout(const std::vector<int64_t>& offsets, int64_t numel) {
  MEGATRON_CHECK(param_buffer_.defined(), "set_layout() needs allocated buffers; call allocate() first");
  MEGATRON_CHECK(offsets.size() == params_.size(),
                 "set_layout(): " << offsets.size() << " offsets for " << params_.size() << " parameters");
  std::vector<std::pair<int64_t, size_t>> starts;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = shape_numel(params_[i]->local_shape);
    MEGATRON_CHECK(offsets[i] >= 0 && offsets[i] % kParamAlignment == 0 && offsets[i] + n <= numel,
                   params_[i]->spec.name << ": offset " << offsets[i] << " (+" << n
                                         << " elements) must be a multiple of " << kParamAlignment
                                         << " inside a buffer of " << numel << " elements");
    starts.emplace_back(offsets[i], i);
  }
  std::sort(starts.begin(), starts.end());
  for (size_t k = 0; k + 1 < starts.size(); ++k) {
    const Parameter& a = *params_[starts[k].second];
    MEGATRON_CHECK(starts[k].first + shape_numel(a.local_shape) <= starts[k + 1].first,
                   a.spec.name << " and " << params_[starts[k + 1].second]->spec.name << " overlap in the new layout");
  }
  Tensor params = Tensor::zeros({numel}, param_buffer_.dtype(), param_buffer_.device());
  Tensor grads = Tensor::zeros({numel}, grad_buffer_.dtype(), grad_buffer_.device());
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    p.buffer_offset = offsets[i];
    Tensor data = p.view_of(params), main_grad = p.view_of(grads);
    data.copy_from(p.data);
    main_grad.copy_from(p.main_grad);
    p.data = data;
    p.main_grad = main_grad;
  }
  param_buffer_ = params;
  grad_buffer_ = grads;
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
