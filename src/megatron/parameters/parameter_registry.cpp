#include "megatron/parameters/parameter_registry.h"

#include <algorithm>
#include <cmath>

#include "megatron/core/rng.h"
#include "megatron/ops/elementwise.h"

namespace megatron {

namespace {
int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// The part of `begins` (increasing part starts) holding element `offset`.
size_t part_at(const std::vector<int64_t>& begins, int64_t offset) {
  const auto it = std::upper_bound(begins.begin(), begins.end(), offset);
  return size_t(it - begins.begin()) - 1;
}

// Elements [begin, end) of the buffer split into `parts` starting at `begins`, inside one part.
// `function` and `what` name the caller and the buffer in errors.
Tensor slice_of(const std::vector<Tensor>& parts, const std::vector<int64_t>& begins, int64_t begin, int64_t end,
                const char* function, const char* what) {
  MEGATRON_CHECK(!parts.empty(), function << "(): the " << what << " buffer was dropped");
  const size_t k = part_at(begins, begin);
  const int64_t first = begins[k];
  MEGATRON_CHECK(begin <= end && end - first <= parts[k].numel(),
                 function << "(" << begin << ", " << end << ") crosses the end of " << what << " part " << k << " at "
                          << first + parts[k].numel());
  return parts[k].slice(begin - first, end - first);
}

// Checks part ends for splitting a buffer of `numel` elements: increasing, the last at its end, no
// parameter straddling two; returns the parts' begins.
std::vector<int64_t> part_begins(const std::vector<int64_t>& ends, int64_t numel,
                                 const std::vector<std::unique_ptr<Parameter>>& params, const char* what) {
  MEGATRON_CHECK(!ends.empty() && ends.back() == numel, what << ": the parts must end at the buffer's end, " << numel);
  std::vector<int64_t> begins;
  int64_t begin = 0;
  for (int64_t end : ends) {
    MEGATRON_CHECK(end > begin, what << ": part ends must increase (" << end << " after " << begin << ")");
    begins.push_back(begin);
    begin = end;
  }
  for (const auto& p : params) {
    const auto it = std::upper_bound(ends.begin(), ends.end(), p->buffer_offset);
    MEGATRON_CHECK(p->buffer_offset + shape_numel(p->local_shape) <= *it,
                   p->spec.name << " straddles " << what << " parts (elements " << p->buffer_offset << " to "
                                << p->buffer_offset + shape_numel(p->local_shape) << ", a part ends at " << *it << ")");
  }
  return begins;
}

// Xavier's bound sqrt(6 / (fan_in + fan_out)) for the matrix of the last two dims (torch's fans of
// a 2-D weight (out, in)); an expert weight (E, out, in) is E such matrices.
float xavier_uniform_bound(const ParamSpec& spec) {
  const Shape& shape = spec.global_shape;
  MEGATRON_CHECK(shape.size() >= 2, "--init-method-xavier-uniform: " << spec.name << " of shape " << shape_str(shape)
                                                                     << " is not a matrix");
  const double fan_out = double(shape[shape.size() - 2]), fan_in = double(shape.back());
  return float(std::sqrt(6.0 / (fan_in + fan_out)));
}
}  // namespace

ParameterRegistry::ParameterRegistry(int tp_rank, int tp_size, int ep_rank, int ep_size, int expert_tp_rank,
                                     int expert_tp_size)
    : tp_rank_(tp_rank),
      tp_size_(tp_size),
      ep_rank_(ep_rank),
      ep_size_(ep_size),
      expert_tp_rank_(expert_tp_size > 0 ? expert_tp_rank : tp_rank),
      expert_tp_size_(expert_tp_size > 0 ? expert_tp_size : tp_size) {
  MEGATRON_CHECK(tp_size >= 1 && 0 <= tp_rank && tp_rank < tp_size,
                 "a parameter registry for TP rank "
                     << tp_rank << " of " << tp_size
                     << " ranks: the rank must lie in [0, TP size) and the size be >= 1");
  MEGATRON_CHECK(ep_size >= 1 && 0 <= ep_rank && ep_rank < ep_size, "a parameter registry for EP rank "
                                                                        << ep_rank << " of " << ep_size
                                                                        << " ranks: the rank must lie in [0, EP size)");
  MEGATRON_CHECK(0 <= expert_tp_rank_ && expert_tp_rank_ < expert_tp_size_,
                 "a parameter registry for expert TP rank " << expert_tp_rank_ << " of " << expert_tp_size_
                                                            << " ranks: the rank must lie in [0, expert TP size)");
}

Parameter* ParameterRegistry::add(ParamSpec spec) {
  MEGATRON_CHECK(find(spec.name) == nullptr, "parameter " << spec.name << " registered twice");
  MEGATRON_CHECK(param_parts_.empty(), "parameter " << spec.name << " registered after allocate()");
  auto p = std::make_unique<Parameter>();
  // Experts split over expert TP, the rest over TP.
  p->tp_rank = spec.expert_parallel ? expert_tp_rank_ : tp_rank_;
  p->tp_size = spec.expert_parallel ? expert_tp_size_ : tp_size_;
  p->local_shape = tp_local_shape(spec, p->tp_size);
  if (spec.expert_parallel) {
    MEGATRON_CHECK(spec.partition_dim != 0,
                   spec.name << ": dim 0 of an expert-parallel parameter indexes experts; split another over TP");
    MEGATRON_CHECK(!spec.global_shape.empty() && spec.global_shape[0] % ep_size_ == 0,
                   spec.name << ": " << (spec.global_shape.empty() ? 0 : spec.global_shape[0])
                             << " experts do not divide over EP " << ep_size_);
    p->local_shape[0] = spec.global_shape[0] / ep_size_;
    p->ep_rank = ep_rank_;
    p->ep_size = ep_size_;
  }
  p->spec = std::move(spec);
  p->index = params_.size();
  params_.push_back(std::move(p));
  return params_.back().get();
}

void ParameterRegistry::allocate(DType params_dtype, Device device) {
  int64_t total = 0;
  for (const auto& p : params_) total += round_up(shape_numel(p->local_shape), kParamAlignment);
  const DType grad_dtype = params_dtype == DType::f64 ? DType::f64 : DType::f32;
  param_parts_ = {Tensor::zeros({total}, params_dtype, device)};
  param_part_begins_ = {0};
  grad_parts_ = {Tensor::zeros({total}, grad_dtype, device)};
  grad_part_begins_ = {0};
  params_dtype_ = params_dtype;
  grad_dtype_ = grad_dtype;
  device_ = device;
  int64_t offset = 0;
  for (const auto& p : params_) {
    const int64_t n = shape_numel(p->local_shape);
    p->buffer_offset = offset;
    p->data = p->view_of(param_parts_[0]);
    offset += round_up(n, kParamAlignment);
  }
  point_main_grads();
}

void ParameterRegistry::point_main_grads() {
  for (const auto& p : params_) {
    if (grad_parts_.empty()) {
      p->main_grad = Tensor();
      continue;
    }
    const size_t k = grad_part_of(*p);
    const int64_t begin = p->buffer_offset - grad_part_begins_[k];
    p->main_grad = grad_parts_[k].slice(begin, begin + shape_numel(p->local_shape)).view(p->local_shape);
  }
}

const Tensor& ParameterRegistry::grad_buffer() const {
  static const Tensor kDropped;
  MEGATRON_CHECK(grad_parts_.size() <= 1, "the main gradients are split into "
                                              << grad_parts_.size() << " parts (split_grads); read them "
                                              << "with grad_slice() or grad_buffers()");
  return grad_parts_.empty() ? kDropped : grad_parts_[0];
}

size_t ParameterRegistry::grad_part_of(const Parameter& p) const {
  MEGATRON_CHECK(!grad_parts_.empty(), p.spec.name << ": the main-gradient buffer was dropped");
  return part_at(grad_part_begins_, p.buffer_offset);
}

Tensor ParameterRegistry::grad_slice(int64_t begin, int64_t end) const {
  return slice_of(grad_parts_, grad_part_begins_, begin, end, "grad_slice", "gradient");
}

const Tensor& ParameterRegistry::param_buffer() const {
  static const Tensor kDropped;
  MEGATRON_CHECK(param_parts_.size() <= 1, "the parameters are split into " << param_parts_.size()
                                                                            << " parts (split_params); read them "
                                                                            << "with param_slice() or param_buffers()");
  return param_parts_.empty() ? kDropped : param_parts_[0];
}

Tensor ParameterRegistry::param_slice(int64_t begin, int64_t end) const {
  return slice_of(param_parts_, param_part_begins_, begin, end, "param_slice", "parameter");
}

void ParameterRegistry::split_params(const std::vector<int64_t>& ends, const std::vector<DType>& dtypes) {
  MEGATRON_CHECK(param_parts_.size() == 1, "split_params() needs the one flat parameter buffer");
  MEGATRON_CHECK(ends.size() == dtypes.size(),
                 "split_params(): " << ends.size() << " part ends but " << dtypes.size() << " dtypes");
  std::vector<int64_t> begins = part_begins(ends, param_parts_[0].numel(), params_, "parameter");
  for (const auto& p : params_) {
    const DType dtype = dtypes[part_at(begins, p->buffer_offset)];
    MEGATRON_CHECK(dtype == params_dtype_ || (dtype_is_fp8(dtype) && p->fp8),
                   p->spec.name << " would be held in " << dtype_name(dtype)
                                << ": only FP8 parameters (Parameter::fp8) "
                                << "take another dtype than the compute dtype " << dtype_name(params_dtype_));
    MEGATRON_CHECK(!p->fp8 || dtype_is_fp8(dtype),
                   p->spec.name << " is an FP8 parameter but its part is " << dtype_name(dtype));
  }
  std::vector<Tensor> parts;
  for (size_t k = 0; k < ends.size(); ++k) {
    Tensor part = Tensor::zeros({ends[k] - begins[k]}, dtypes[k], device_);
    if (dtypes[k] == params_dtype_) part.copy_from(param_parts_[0].slice(begins[k], ends[k]));
    parts.push_back(part);
  }
  param_parts_ = std::move(parts);
  param_part_begins_ = std::move(begins);
  for (const auto& p : params_) {
    const int64_t begin = p->buffer_offset - param_part_begins_[part_at(param_part_begins_, p->buffer_offset)];
    p->data = param_parts_[part_at(param_part_begins_, p->buffer_offset)]
                  .slice(begin, begin + shape_numel(p->local_shape))
                  .view(p->local_shape);
  }
}

void ParameterRegistry::release_params(size_t part) { param_parts_.at(part).release_memory(); }

void ParameterRegistry::acquire_params(size_t part) { param_parts_.at(part).reacquire_memory(); }

void ParameterRegistry::split_grads(const std::vector<int64_t>& ends) {
  MEGATRON_CHECK(grad_parts_.size() == 1, "split_grads() needs the one flat gradient buffer");
  const DType dtype = grad_parts_[0].dtype();
  std::vector<int64_t> begins = part_begins(ends, grad_parts_[0].numel(), params_, "gradient");
  // The flat buffer goes before the parts come, and they come released: memory taken at set-up
  // and given back at the first zero_grad would leave a hole the size of every gradient where the
  // optimizer state, allocated next, cannot go (the CUDA allocator would keep it reserved).
  for (const auto& p : params_) p->main_grad = Tensor();
  grad_parts_.clear();
  for (size_t k = 0; k < ends.size(); ++k)
    grad_parts_.push_back(Tensor::released({ends[k] - begins[k]}, dtype, device_));
  grad_part_begins_ = std::move(begins);
  point_main_grads();
}

void ParameterRegistry::release_grads(size_t part) { grad_parts_.at(part).release_memory(); }

void ParameterRegistry::acquire_grads(size_t part) {
  if (grads_held(part)) return;
  grad_parts_[part].reacquire_memory();
  zero_grads_lazily(part);
}

void ParameterRegistry::set_layout(const std::vector<int64_t>& offsets, int64_t numel, GradsOnMove grads_on_move) {
  MEGATRON_CHECK(param_parts_.size() == 1 && grad_parts_.size() == 1,
                 "set_layout() needs allocated, unsplit buffers; call allocate() first (and not after drop_buffers() "
                 "or split_grads())");
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
  const DType grad_dtype = grad_parts_[0].dtype();
  const bool keep_grads = grads_on_move == GradsOnMove::keep;
  if (!keep_grads) {
    for (const auto& p : params_) p->main_grad = Tensor();
    grad_parts_.clear();
  }
  Tensor params = Tensor::zeros({numel}, params_dtype_, device_);
  Tensor grads = keep_grads ? Tensor::zeros({numel}, grad_dtype, params.device()) : Tensor();
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    p.buffer_offset = offsets[i];
    Tensor data = p.view_of(params);
    data.copy_from(p.data);
    p.data = data;
    if (keep_grads) {
      Tensor main_grad = p.view_of(grads);
      main_grad.copy_from(p.main_grad);
      p.main_grad = main_grad;
    }
  }
  param_parts_ = {params};
  param_part_begins_ = {0};
  if (!keep_grads) grads = Tensor::zeros({numel}, grad_dtype, params.device());
  grad_parts_ = {grads};
  grad_part_begins_ = {0};
  point_main_grads();
}

void ParameterRegistry::drop_buffers(bool params, bool grads) {
  for (const auto& p : params_) {
    if (params) p->data = Tensor();
    if (grads) p->main_grad = Tensor();
  }
  if (params) {
    param_parts_.clear();
    param_part_begins_.clear();
  }
  if (grads) {
    grad_parts_.clear();
    grad_part_begins_.clear();
  }
}

void ParameterRegistry::initialize(uint64_t seed, bool xavier_uniform) {
  MEGATRON_CHECK(param_parts_.size() == 1, "initialize() needs the flat parameter buffer; call it before sharding");
  Tensor& param_buffer = param_parts_[0];
  // Values are drawn on the host in parallel (each element is independent), then stored in
  // the parameter dtype and copied to the buffer's device in one go.
  Tensor host = device_.is_cpu() ? param_buffer : Tensor::zeros(param_buffer.shape(), params_dtype());
  for (const auto& p : params_) {
    const int64_t n = p->data.numel();
    std::vector<float> values(static_cast<size_t>(n));
    const CounterRng rng{seed, stream_id(p->spec.name)};
    const float std_dev = p->spec.init_std;
    const InitMethod init = p->spec.init;
    const Parameter& param = *p;
    const float xavier_bound = xavier_uniform && init == InitMethod::normal ? xavier_uniform_bound(p->spec) : 0.0f;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t at = uint64_t(param.global_index(i));
      values[size_t(i)] = init == InitMethod::zeros  ? 0.0f
                          : init == InitMethod::ones ? 1.0f
                          : xavier_uniform           ? xavier_bound * (2.0f * rng.uniform(at) - 1.0f)
                                                     : std_dev * rng.normal(at);
    }
    Tensor dst = p->view_of(host);
    ops::cast(dst, Tensor::from_blob(values.data(), p->local_shape, DType::f32));
  }
  if (!host.same_storage(param_buffer)) param_buffer.copy_from(host);
}

void ParameterRegistry::zero_grads() {
  for (Tensor& part : grad_parts_)
    if (part.memory_held()) part.zero();  // a released part is zeroed when acquired
  for (const auto& p : params_) p->grad_overwrite_pending = false;
}

void ParameterRegistry::zero_grads_lazily() {
  for (size_t k = 0; k < grad_parts_.size(); ++k)
    if (grads_held(k)) zero_grads_lazily(k);
}

void ParameterRegistry::zero_grads_lazily(size_t part) {
  // The part less its marked parameters, in as few runs as their placement allows (the gaps
  // between parameters are zeroed with their neighbours).
  const Tensor& grads = grad_parts_[part];
  const int64_t first = grad_part_begins_[part];
  std::vector<std::pair<int64_t, int64_t>> kept;
  for (const auto& p : params_) {
    if (p->buffer_offset < first || p->buffer_offset >= first + grads.numel()) continue;
    p->grad_overwrite_pending = p->spec.first_grad_overwrites;
    if (p->grad_overwrite_pending)
      kept.emplace_back(p->buffer_offset - first, p->buffer_offset - first + shape_numel(p->local_shape));
  }
  std::sort(kept.begin(), kept.end());
  int64_t begin = 0;
  for (const auto& [start, end] : kept) {
    if (start > begin) grads.slice(begin, start).zero();
    begin = std::max(begin, end);
  }
  if (grads.numel() > begin) grads.slice(begin, grads.numel()).zero();
}

void ParameterRegistry::zero_unwritten_grads(const std::vector<size_t>& params) {
  for (size_t i : params) {
    Parameter& p = *params_.at(i);
    if (p.take_grad_overwrite()) p.main_grad.zero();
  }
}

Parameter* ParameterRegistry::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p->spec.name == name) return p.get();
  return nullptr;
}

}  // namespace megatron
