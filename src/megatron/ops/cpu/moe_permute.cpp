// MoE token permutation on the CPU: plain gathers, accumulation in compute_t (float, or double
// for f64), one rounding per stored element.
#include "megatron/ops/checks/moe_permute.h"

#include "megatron/ops/cpu/dispatch_dtype.h"
#include "megatron/ops/moe_permute.h"

namespace megatron::ops::cpu {
namespace {

template <class T>
void permute_kernel(T* rows, const T* x, const int32_t* row_token, const compute_t<T>* weight, int64_t N, int64_t H) {
#pragma omp parallel for if (worth_parallel(N * H))
  for (int64_t r = 0; r < N; ++r) {
    const T* src = x + int64_t(row_token[r]) * H;
    const compute_t<T> w = weight ? weight[r] : compute_t<T>(1);
    for (int64_t h = 0; h < H; ++h) rows[r * H + h] = store<T>(w * load(src[h]));
  }
}

template <class T>
void unpermute_kernel(T* out, const T* rows, const int32_t* token_rows, const compute_t<T>* weight, int64_t T_,
                      int64_t E, int64_t H) {
#pragma omp parallel for if (worth_parallel(T_ * H))
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      compute_t<T> sum = 0;  // experts in index order: the same order on every backend
      for (int64_t e = 0; e < E; ++e) {
        const int32_t r = token_rows[t * E + e];
        if (r >= 0) sum += (weight ? weight[t * E + e] : compute_t<T>(1)) * load(rows[int64_t(r) * H + h]);
      }
      out[t * H + h] = store<T>(sum);
    }
  }
}

template <class T>
void weight_backward_kernel(compute_t<T>* dweight, const T* dout, const T* rows, const int32_t* token_rows, int64_t T_,
                            int64_t E, int64_t H) {
#pragma omp parallel for if (worth_parallel(T_ * H))
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      const int32_t r = token_rows[t * E + e];
      compute_t<T> dot = 0;
      if (r >= 0)
        for (int64_t h = 0; h < H; ++h) dot += load(dout[t * H + h]) * load(rows[int64_t(r) * H + h]);
      dweight[t * E + e] = dot;
    }
  }
}

template <class T>
const compute_t<T>* optional_data(const Tensor& t) {
  return t.defined() ? t.data<compute_t<T>>() : nullptr;
}

}  // namespace
}  // namespace megatron::ops::cpu

namespace megatron::ops {

void cpu::moe_permute(Tensor& rows, const Tensor& x, const Tensor& row_token, const Tensor& row_weight) {
  checks::check_moe_permute(rows, x, row_token, row_weight, check_cpu);
  dispatch_floating(x.dtype(), "moe_permute", [&]<class T>(std::type_identity<T>) {
    permute_kernel<T>(rows.data<T>(), x.data<T>(), row_token.data<int32_t>(), optional_data<T>(row_weight), rows.dim(0),
                      rows.dim(1));
  });
}

void cpu::moe_unpermute(Tensor& out, const Tensor& rows, const Tensor& token_rows, const Tensor& weight) {
  checks::check_moe_unpermute(out, rows, token_rows, weight, check_cpu);
  dispatch_floating(rows.dtype(), "moe_unpermute", [&]<class T>(std::type_identity<T>) {
    unpermute_kernel<T>(out.data<T>(), rows.data<T>(), token_rows.data<int32_t>(), optional_data<T>(weight), out.dim(0),
                        token_rows.dim(1), out.dim(1));
  });
}

void cpu::moe_unpermute_weight_backward(Tensor& dweight, const Tensor& dout, const Tensor& rows,
                                        const Tensor& token_rows) {
  checks::check_moe_unpermute_weight_backward(dweight, dout, rows, token_rows, check_cpu);
  dispatch_floating(dout.dtype(), "moe_unpermute_weight_backward", [&]<class T>(std::type_identity<T>) {
    weight_backward_kernel<T>(dweight.data<compute_t<T>>(), dout.data<T>(), rows.data<T>(), token_rows.data<int32_t>(),
                              dout.dim(0), token_rows.dim(1), dout.dim(1));
  });
}

}  // namespace megatron::ops
