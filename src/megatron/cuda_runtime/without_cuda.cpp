// The runtime's every-build API (device.h, pinned_memory.h, event_timer.h, copy_stream.h,
// profiler_capture.h) in a build without the CUDA backend; compiled only then (CMakeLists.txt), the
// .cu files define it otherwise. No GPU is ever available, and every request for GPU work fails
// naming the reason and the fix.
#include <string>

#include "megatron/core/error.h"
#include "megatron/cuda_runtime/copy_stream.h"
#include "megatron/cuda_runtime/device.h"
#include "megatron/cuda_runtime/event_timer.h"
#include "megatron/cuda_runtime/pinned_memory.h"
#include "megatron/cuda_runtime/profiler_capture.h"

namespace megatron::cuda {

namespace {
[[noreturn]] void no_cuda_backend(const std::string& request) {
  MEGATRON_FAIL(request << " requested, but this build has no CUDA backend (nvcc was not found when it was "
                        << "configured); rebuild on a machine with the CUDA toolkit or run with --device cpu");
}
}  // namespace

bool cuda_available() { return false; }
int device_count() { return 0; }
DeviceInfo init_device(int index) { no_cuda_backend("GPU " + std::to_string(index)); }

std::shared_ptr<void> allocate_pinned_host(size_t bytes, int device) {
  no_cuda_backend(std::to_string(bytes) + " bytes of pinned host memory for GPU " + std::to_string(device));
}

int64_t event_timer_record() { no_cuda_backend("a CUDA event"); }
void event_timer_synchronize() { no_cuda_backend("a CUDA event"); }
float event_timer_elapsed_ms(int64_t, int64_t) { no_cuda_backend("a CUDA event"); }
void event_timer_reset() {}  // no events were ever pooled

void profiler_capture_start() { no_cuda_backend("the CUDA profiler (--profile)"); }
void profiler_capture_stop() { no_cuda_backend("the CUDA profiler (--profile)"); }

// The constructor throws, so no CopyStream exists and its other members are never called.
struct CopyStream::State {};
CopyStream::CopyStream(int device) { no_cuda_backend("a copy stream on GPU " + std::to_string(device)); }
CopyStream::~CopyStream() = default;
void CopyStream::wait_for_current_stream() {}
void CopyStream::copy(void*, const void*, size_t) {}
int64_t CopyStream::record() { return 0; }
void CopyStream::host_wait(int64_t) {}
void CopyStream::current_stream_waits(int64_t) {}

}  // namespace megatron::cuda
