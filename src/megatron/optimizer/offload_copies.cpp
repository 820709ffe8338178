#include "megatron/optimizer/offload_copies.h"

#include "megatron/core/error.h"

namespace megatron {

OffloadCopies::OffloadCopies(Device model_device) {
  if (model_device.is_cuda()) stream_ = std::make_unique<cuda::CopyStream>(model_device.index);
}

void OffloadCopies::after_compute() {
  if (stream_) {
    stream_->wait_for_current_stream();
    return;
  }
  run_until(Mark(queued_.size()));  // nothing is left from the last step; the host's order is the compute order
  queued_.clear();
  done_ = 0;
}

void OffloadCopies::copy(Tensor dst, const Tensor& src) {
  MEGATRON_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(),
                 "offload copy of " << src.numel() << " " << dtype_name(src.dtype()) << " elements into " << dst.numel()
                                    << " " << dtype_name(dst.dtype()) << " ones: they must agree");
  if (stream_) {
    stream_->copy(dst.raw(), src.raw(), dst.nbytes());
    return;
  }
  queued_.emplace_back(std::move(dst), src);
}

OffloadCopies::Mark OffloadCopies::mark() { return stream_ ? stream_->record() : Mark(queued_.size()); }

void OffloadCopies::host_wait(Mark mark) {
  if (stream_) {
    stream_->host_wait(mark);
    return;
  }
  run_until(mark);
}

void OffloadCopies::compute_waits(Mark mark) {
  if (stream_) {
    stream_->current_stream_waits(mark);
    return;
  }
  run_until(mark);
}

void OffloadCopies::run_until(Mark mark) {
  MEGATRON_CHECK(mark >= 0 && size_t(mark) <= queued_.size(),
                 "offload copy mark " << mark << " is past the " << queued_.size() << " copies queued");
  for (; done_ < size_t(mark); ++done_) queued_[done_].first.copy_from(queued_[done_].second);
}

}  // namespace megatron
