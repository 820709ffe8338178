#pragma once
// How an op is declared: once, in its family's header (ops/<family>.h), under its contract:
//
//   MEGATRON_OP(norm_forward, void(Tensor& y, ..., const NormParams& params));
//
// declares, from that one signature,
//   cpu::norm_forward   the reference backend (ops/cpu/),
//   cuda::norm_forward  the CUDA backend (ops/cuda/; built with the CUDA backend only), and
//   norm_forward        the entry point callers use (ops::norm_forward(...)): an Op that runs the
//                       backend owning its tensors, timed while the op profiler records.
// The backends define them by qualified name, outside their namespace,
//   void cpu::norm_forward(Tensor& y, ..., const NormParams& params) { ... }
// so the compiler checks the restated parameters against the one declaration: a qualified
// definition that matches no declaration is an error. Signatures carry no default arguments (a
// function type cannot), so callers pass every argument.
#include <type_traits>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/ops/profiler.h"

namespace megatron::ops {

// The device an op runs on: that of its first defined tensor argument (a Tensor, or an element of
// a std::vector<Tensor>: the batched ops). An op's tensors share one device (each backend checks
// the others), and leading outputs may be undefined (linear_backward without dX).
template <class... Args>
Device op_device(const Args&... args) {
  const Tensor* first = nullptr;
  const auto consider = [&first](const auto& arg) {
    using Arg = std::decay_t<decltype(arg)>;
    if constexpr (std::is_same_v<Arg, Tensor>) {
      if (first == nullptr && arg.defined()) first = &arg;
    } else if constexpr (std::is_same_v<Arg, std::vector<Tensor>>) {
      for (const Tensor& t : arg)
        if (first == nullptr && t.defined()) first = &t;
    }
  };
  (consider(args), ...);
  return first != nullptr ? first->device() : Device::cpu();
}

template <class Signature>
class Op;

template <class... Args>
class Op<void(Args...)> {
 public:
  using Backend = void (*)(Args...);

  constexpr Op(const char* name, Backend cpu, Backend cuda) : name_(name), cpu_(cpu), cuda_(cuda) {}

  void operator()(Args... args) const {
    const Device device = op_device(args...);
    const Backend run = backend(device);
    const OpProfiler::Scope profile(name_, device);
    run(args...);
  }

  // The backend for tensors on `device`, for an op composed of other ops within one backend (no
  // second dispatch, no nested timing).
  Backend backend(Device device) const {
    if (device.is_cpu()) return cpu_;
    MEGATRON_CHECK(cuda_ != nullptr, name_ << " got a CUDA tensor but this build has no CUDA backend; "
                                           << "rebuild with the CUDA toolkit or run with --device cpu");
    return cuda_;
  }

  const char* name() const { return name_; }

 private:
  const char* name_;
  Backend cpu_;
  Backend cuda_;  // null in a build without the CUDA backend
};

}  // namespace megatron::ops

#ifdef MEGATRON_WITH_CUDA
#define MEGATRON_OP_CUDA_BACKEND(name) &cuda::name
#else
#define MEGATRON_OP_CUDA_BACKEND(name) nullptr
#endif

// Used inside namespace megatron::ops; the signature is a function type (see the top of this file).
#define MEGATRON_OP(name, ...)            \
  namespace cpu {                         \
  std::type_identity_t<__VA_ARGS__> name; \
  }                                       \
  namespace cuda {                        \
  std::type_identity_t<__VA_ARGS__> name; \
  }                                       \
  inline constexpr Op<__VA_ARGS__> name { #name, &cpu::name, MEGATRON_OP_CUDA_BACKEND(name) }
