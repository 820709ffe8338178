// Counter-based random fills on the CPU: element i is a pure function of (seed, stream, offset + i).
#include "megatron/ops/random.h"

#include "megatron/core/rng.h"
#include "megatron/ops/cpu/dispatch_dtype.h"

namespace megatron::ops {

void cpu::fill_normal(Tensor& out, const RandomParams& params) {
  check_defined(out, "fill_normal out");
  check_cpu(out, "fill_normal out");
  const CounterRng rng{params.seed, params.stream};
  const int64_t n = out.numel();
  dispatch_floating(out.dtype(), "fill_normal", [&]<class T>(std::type_identity<T>) {
    T* o = out.data<T>();
#pragma omp parallel for if (worth_parallel(n))
    for (int64_t i = 0; i < n; ++i) o[i] = store<T>(compute_t<T>(rng.normal(params.offset + uint64_t(i))));
  });
}

}  // namespace megatron::ops
