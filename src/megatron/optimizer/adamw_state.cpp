#include "megatron/optimizer/adamw_state.h"

#include <algorithm>
#include <cstring>

#include "megatron/core/error.h"
#include "megatron/core/param_remainder.h"
#include "megatron/cuda_runtime/pinned_memory.h"
#include "megatron/ops/elementwise.h"

namespace megatron {

namespace {
// `numel` elements of host memory: pinned when the model lives on a GPU (copies at full speed),
// zero-filled.
Tensor host_tensor(int64_t numel, DType dtype, Device model_device, std::vector<std::shared_ptr<void>>& blocks) {
  if (!model_device.is_cuda()) return Tensor::zeros({numel}, dtype);
  const size_t bytes = size_t(numel) * dtype_size(dtype);
  blocks.push_back(cuda::allocate_pinned_host(std::max<size_t>(bytes, 1), model_device.index));
  std::memset(blocks.back().get(), 0, bytes);
  return Tensor::from_blob(blocks.back().get(), {numel}, dtype);
}

// The learning rate of the pieces marked decoupled_lr or not, and a piece's weight decay, this step.
float lr_of(bool decoupled_lr, const StepRates& rates) {
  return decoupled_lr ? rates.decoupled_lr.value_or(rates.lr) : rates.lr;
}
float weight_decay_of(const AdamWState::Piece& piece, const StepRates& rates) {
  return piece.weight_decay ? rates.weight_decay : 0.0f;
}
ops::AdamWParams params_of(ops::AdamWParams base, const AdamWState::Piece& piece, const StepRates& rates) {
  base.lr = lr_of(piece.decoupled_lr, rates);
  base.weight_decay = weight_decay_of(piece, rates);
  return base;
}
}  // namespace

AdamWState::AdamWState(std::vector<Piece> pieces, int64_t numel, Device device, DType params_dtype, DType state_dtype,
                       const AdamWStateOptions& options)
    : pieces_(std::move(pieces)) {
  MEGATRON_CHECK(options.offload_fraction >= 0.0 && options.offload_fraction <= 1.0,
                 "--optimizer-offload-fraction " << options.offload_fraction << " must be in [0, 1]");
  device_master_ = params_dtype != state_dtype;
  if (options.cpu_offload) {
    int64_t total = 0, taken = 0;
    for (const Piece& p : pieces_) total += p.end - p.begin;
    while (host_pieces_ < pieces_.size() && double(taken) < options.offload_fraction * double(total)) {
      taken += pieces_[host_pieces_].end - pieces_[host_pieces_].begin;
      ++host_pieces_;
    }
    host_end_ = host_pieces_ > 0 ? pieces_[host_pieces_ - 1].end : 0;
  }
  host_.first = 0;
  if (host_end_ > 0) {
    host_.master = host_tensor(host_end_, state_dtype, device, host_.pinned);
    host_.exp_avg = host_tensor(host_end_, state_dtype, device, host_.pinned);
    host_.exp_avg_sq = host_tensor(host_end_, state_dtype, device, host_.pinned);
  }
  device_.first = host_end_;
  const int64_t on_device = numel - host_end_;
  // Remainders complete bf16 parameters to f32 masters (the bits of neither f16 nor f32 do).
  const bool remainders = options.store_param_remainders && params_dtype == DType::bf16 && state_dtype == DType::f32;
  if (device_master_) device_.master = Tensor::zeros({on_device}, remainders ? DType::u16 : state_dtype, device);
  device_.exp_avg = Tensor::zeros({on_device}, state_dtype, device);
  device_.exp_avg_sq = Tensor::zeros({on_device}, state_dtype, device);
  reload_master();

  // The pipeline's chunks: segments of at most chunk_elements, packed in order.
  MEGATRON_CHECK(options.chunk_elements > 0,
                 "offload chunk of " << options.chunk_elements << " elements: must be positive");
  const int64_t chunk_elements = options.chunk_elements;
  int64_t in_chunk = chunk_elements;
  for (size_t i = 0; i < host_pieces_; ++i)
    for (int64_t b = pieces_[i].begin; b < pieces_[i].end;) {
      if (in_chunk == chunk_elements) {
        chunks_.emplace_back();
        in_chunk = 0;
      }
      const int64_t e = std::min(pieces_[i].end, b + (chunk_elements - in_chunk));
      chunks_.back().push_back({i, b, e, in_chunk});
      in_chunk += e - b;
      b = e;
    }
  if (!chunks_.empty()) {
    int64_t slot = 0;
    for (const auto& chunk : chunks_)
      slot = std::max(slot, chunk.back().slot_offset + chunk.back().end - chunk.back().begin);
    for (int s = 0; s < 2; ++s) {
      grad_slots_[s] = host_tensor(slot, state_dtype, device, slot_memory_);
      param_slots_[s] = host_tensor(slot, params_dtype, device, slot_memory_);
    }
    copies_ = std::make_unique<OffloadCopies>(device);
  }
}

Tensor AdamWState::view(const Tensor& t, const Part& part, int64_t begin, int64_t end) const {
  return t.slice(begin - part.first, end - part.first);
}

Tensor AdamWState::param_range(int64_t begin, int64_t end) const {
  for (const Piece& p : pieces_)
    if (p.begin <= begin && end <= p.end) return p.param.slice(begin - p.begin, end - p.begin);
  MEGATRON_FAIL("elements [" << begin << ", " << end << ") lie in no one piece of the optimizer's index space");
}

Tensor AdamWState::master_values(int64_t begin, int64_t end) const {
  const Part& part = part_of(begin);
  MEGATRON_CHECK(part.master.defined(), "elements [" << begin << ", " << end << ") keep no master weights apart "
                                                     << "from the parameters (they are their own master)");
  if (!remainders_at(begin)) return view(part.master, part, begin, end);
  const Tensor params = param_range(begin, end).to(Device::cpu());
  const Tensor rems = view(part.master, part, begin, end).to(Device::cpu());
  Tensor masters = Tensor::empty({end - begin}, DType::f32);
  const bf16* p = params.data<bf16>();
  const uint16_t* r = rems.data<uint16_t>();
  float* m = masters.data<float>();
  for (int64_t i = 0; i < end - begin; ++i) m[i] = join_master_value(p[i].bits, r[i]);
  return masters;
}

void AdamWState::load_master(int64_t begin, int64_t end, const std::function<void(Tensor&)>& read) {
  const Part& part = part_of(begin);
  MEGATRON_CHECK(part.master.defined(), "elements [" << begin << ", " << end << ") keep no master weights apart "
                                                     << "from the parameters (they are their own master)");
  Tensor target = remainders_at(begin) ? Tensor::empty({end - begin}, DType::f32) : view(part.master, part, begin, end);
  read(target);
  if (!remainders_at(begin)) return;
  Tensor params = Tensor::empty({end - begin}, DType::bf16), rems = Tensor::empty({end - begin}, DType::u16);
  const float* m = target.data<float>();
  bf16* p = params.data<bf16>();
  uint16_t* r = rems.data<uint16_t>();
  for (int64_t i = 0; i < end - begin; ++i) {
    const SplitMaster split = split_master(m[i]);
    p[i].bits = split.param;
    r[i] = split.remainder;
  }
  Tensor param_view = param_range(begin, end), rem_view = view(part.master, part, begin, end);
  param_view.copy_from(params);
  rem_view.copy_from(rems);
}

Tensor AdamWState::exp_avg(int64_t begin, int64_t end) const {
  const Part& part = part_of(begin);
  return view(part.exp_avg, part, begin, end);
}

Tensor AdamWState::exp_avg_sq(int64_t begin, int64_t end) const {
  const Part& part = part_of(begin);
  return view(part.exp_avg_sq, part, begin, end);
}

void AdamWState::set_params(const std::vector<Tensor>& params, const std::vector<ops::Fp8TensorScaling*>& fp8_casts) {
  MEGATRON_CHECK(params.size() == pieces_.size(),
                 "set_params(): " << params.size() << " parameter tensors for " << pieces_.size() << " pieces");
  MEGATRON_CHECK(fp8_casts.empty() || fp8_casts.size() == pieces_.size(),
                 "set_params(): " << fp8_casts.size() << " FP8 casts for " << pieces_.size() << " pieces");
  for (size_t i = 0; i < pieces_.size(); ++i) {
    Piece& p = pieces_[i];
    MEGATRON_CHECK(params[i].numel() == p.end - p.begin, "set_params(): piece " << i << " has " << p.end - p.begin
                                                                                << " elements, its new parameters "
                                                                                << params[i].numel());
    MEGATRON_CHECK(!dtype_is_fp8(params[i].dtype()) || (i >= host_pieces_ && device_master_ && !remainders_at(p.begin)),
                   "FP8 parameters (--fp8-param-gather) need f32 masters on the device: not built with "
                   "--optimizer-cpu-offload or --use-precision-aware-optimizer");
    p.param = params[i];
    p.fp8_cast = fp8_casts.empty() ? nullptr : fp8_casts[i];
    MEGATRON_CHECK(
        p.fp8_cast == nullptr || dtype_is_fp8(p.param.dtype()),
        "set_params(): piece " << i << " is cast to FP8 but its parameters are " << dtype_name(p.param.dtype()));
  }
}

void AdamWState::reload_master() {
  for (const Piece& p : pieces_) {
    const Part& part = part_of(p.begin);
    if (!part.master.defined() || dtype_is_fp8(p.param.dtype())) continue;
    Tensor m = view(part.master, part, p.begin, p.end);
    if (remainders_at(p.begin)) {
      m.zero();  // the bf16 parameters are the masters exactly
    } else {
      m.copy_from(p.param);
    }
  }
}

size_t AdamWState::device_bytes() const {
  return device_.master.nbytes() + device_.exp_avg.nbytes() + device_.exp_avg_sq.nbytes();
}

size_t AdamWState::host_bytes() const {
  return host_.master.nbytes() + host_.exp_avg.nbytes() + host_.exp_avg_sq.nbytes();
}

void AdamWState::step(const ops::AdamWParams& base, const StepRates& rates) {
  // The copies start after the gradients are complete; the device's kernels are queued before the
  // host blocks in the offloaded pipeline, so they run while it does.
  if (copies_) copies_->after_compute();
  step_on_device(base, rates, {host_pieces_, pieces_.size()});
  step_offloaded(base, rates);
}

void AdamWState::step(const ops::AdamWParams& base, const StepRates& rates, int64_t begin, int64_t end) {
  step_on_device(base, rates, device_pieces_in(begin, end));
}

void AdamWState::write_params_from_masters(int64_t begin, int64_t end) {
  const auto [first, last] = device_pieces_in(begin, end);
  for (size_t i = first; i < last; ++i) {
    Piece& p = pieces_[i];
    MEGATRON_CHECK(device_master_ && !remainders_at(p.begin) && !dtype_is_fp8(p.param.dtype()),
                   "write_params_from_masters(): elements [" << p.begin << ", " << p.end << ") keep no f32 masters "
                                                             << "apart from their " << dtype_name(p.param.dtype())
                                                             << " parameters");
    ops::cast(p.param, view(device_.master, device_, p.begin, p.end));
  }
}

std::pair<size_t, size_t> AdamWState::device_pieces_in(int64_t begin, int64_t end) const {
  MEGATRON_CHECK(begin >= host_end_, "elements [" << begin << ", " << end << ") are updated in host memory "
                                                  << "(--optimizer-cpu-offload), all together, not by range");
  size_t first = host_pieces_;
  while (first < pieces_.size() && pieces_[first].end <= begin) ++first;
  size_t last = first;
  while (last < pieces_.size() && pieces_[last].begin < end) ++last;
  MEGATRON_CHECK(first == last || (pieces_[first].begin >= begin && pieces_[last - 1].end <= end),
                 "elements [" << begin << ", " << end << ") cut a piece of the optimizer's index space");
  return {first, last};
}

void AdamWState::step_on_device(const ops::AdamWParams& base, const StepRates& rates,
                                std::pair<size_t, size_t> pieces) {
  // The pieces with a 16-bit or f32 compute copy (or none apart from the master) in one op per
  // learning rate (two under --decoupled-lr, one without); FP8 codes piece by piece, each with its
  // own scale and amax.
  std::vector<ops::AdamWPiece> together[2];  // at rates.lr, at the decoupled rate
  for (size_t i = pieces.first; i < pieces.second; ++i) {
    Piece& p = pieces_[i];
    if (!dtype_is_fp8(p.param.dtype())) {
      const bool decoupled = p.decoupled_lr && rates.decoupled_lr.has_value();
      together[size_t(decoupled)].push_back({p.begin - device_.first, p.grad, p.param, weight_decay_of(p, rates)});
      continue;
    }
    Tensor m = view(device_.exp_avg, device_, p.begin, p.end), v = view(device_.exp_avg_sq, device_, p.begin, p.end);
    Tensor master = view(device_.master, device_, p.begin, p.end);
    const ops::AdamWParams params = params_of(base, p, rates);
    if (p.fp8_cast != nullptr) {
      Tensor amax = p.fp8_cast->amax_history.slice(0, 1);
      ops::adamw_step_fp8(master, m, v, p.grad, p.param, amax, p.fp8_cast->scale, params);
    } else {
      Tensor no_copy;  // the holder casts the codes
      ops::adamw_step(master, m, v, p.grad, no_copy, params);
    }
  }
  Tensor no_master;
  for (const bool decoupled : {false, true}) {
    if (together[size_t(decoupled)].empty()) continue;
    ops::AdamWParams params = base;
    params.lr = lr_of(decoupled, rates);
    ops::adamw_step_pieces(device_master_ ? device_.master : no_master, device_.exp_avg, device_.exp_avg_sq,
                           together[size_t(decoupled)], params);
  }
}

// Chunk k's gradients go down into slot k % 2, the host updates them into the slot's parameters,
// which go up. Copies are queued in order: down(0), down(1), up(0), down(2), up(1), ... so while
// the host updates chunk k the stream runs up(k-1) and down(k+1). Each slot is refilled only after
// its last reader is done: down(k+1) is queued after update(k-1) returned, and update(k) writes
// parameter slot k % 2 after host_wait(down k), which the in-order queue puts after up(k-2).
void AdamWState::step_offloaded(const ops::AdamWParams& base, const StepRates& rates) {
  if (chunks_.empty()) return;
  const auto in_slot = [](const Tensor& slot, const Segment& s) {
    return slot.slice(s.slot_offset, s.slot_offset + s.end - s.begin);
  };
  const auto of_piece = [&](const Tensor& flat, const Segment& s) {
    const int64_t first = pieces_[s.piece].begin;
    return flat.slice(s.begin - first, s.end - first);
  };
  const auto queue_down = [&](size_t k) {
    for (const Segment& s : chunks_[k])
      copies_->copy(in_slot(grad_slots_[k % 2], s), of_piece(pieces_[s.piece].grad, s));
    return copies_->mark();
  };
  const auto queue_up = [&](size_t k) {
    for (const Segment& s : chunks_[k])
      copies_->copy(of_piece(pieces_[s.piece].param, s), in_slot(param_slots_[k % 2], s));
    return copies_->mark();
  };
  const auto update = [&](size_t k) {
    for (const Segment& s : chunks_[k]) {
      Tensor master = view(host_.master, host_, s.begin, s.end), m = view(host_.exp_avg, host_, s.begin, s.end);
      Tensor v = view(host_.exp_avg_sq, host_, s.begin, s.end);
      Tensor grad = in_slot(grad_slots_[k % 2], s), model_copy = in_slot(param_slots_[k % 2], s);
      ops::adamw_step(master, m, v, grad, model_copy, params_of(base, pieces_[s.piece], rates));
    }
  };
  OffloadCopies::Mark down[2] = {queue_down(0), 0}, last_up = 0;
  for (size_t k = 0; k < chunks_.size(); ++k) {
    if (k + 1 < chunks_.size()) down[(k + 1) % 2] = queue_down(k + 1);
    copies_->host_wait(down[k % 2]);
    update(k);
    last_up = queue_up(k);
  }
  copies_->compute_waits(last_up);
}

}  // namespace megatron
