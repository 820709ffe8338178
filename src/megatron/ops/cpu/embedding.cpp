// Token embedding lookup on the CPU. tokens are (B,S) batch-major as the data loader gives them;
// rows are written sequence-major (S,B,C), so the transpose is folded into the lookup.
#include "megatron/ops/embedding.h"

#include "megatron/ops/cpu/dispatch_dtype.h"

namespace megatron::ops::cpu {
namespace {

// Row of weight holding token id, or -1 when another vocab-parallel rank owns it.
inline int64_t local_row(int32_t id, int64_t vocab_start, int64_t vocab_local) {
  const int64_t row = int64_t(id) - vocab_start;
  return (row >= 0 && row < vocab_local) ? row : -1;
}

template <class T>
void embedding_forward_kernel(T* out, const int32_t* tokens, const T* weight, int64_t B, int64_t S, int64_t C,
                              int64_t vocab_local, const EmbeddingParams& p) {
#pragma omp parallel for if (worth_parallel(S * B * C))
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t row = local_row(tokens[b * S + s], p.vocab_start, vocab_local);
      T* o = out + (s * B + b) * C;
      for (int64_t c = 0; c < C; ++c) {
        // out = [out +] (row owned here ? weight[row, c] : 0)
        const compute_t<T> value = row >= 0 ? load(weight[row * C + c]) : compute_t<T>(0);
        o[c] = store<T>(p.accumulate ? load(o[c]) + value : value);
      }
    }
  }
}

// Serial over tokens: two tokens with the same id add into the same weight row.
template <class T>
void embedding_backward_kernel(compute_t<T>* dweight, const T* dout, const int32_t* tokens, int64_t B, int64_t S,
                               int64_t C, int64_t vocab_local, const EmbeddingParams& p) {
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t row = local_row(tokens[b * S + s], p.vocab_start, vocab_local);
      if (row < 0) continue;
      const T* g = dout + (s * B + b) * C;
      for (int64_t c = 0; c < C; ++c) dweight[row * C + c] += load(g[c]);
    }
  }
}

void check_tokens(const Tensor& tokens) {
  check_defined(tokens, "embedding tokens");
  check_cpu(tokens, "embedding tokens");
  check_dtype(tokens, DType::i32, "embedding tokens");
  MEGATRON_CHECK(tokens.ndim() == 2, "embedding tokens must be (B,S), got " << shape_str(tokens.shape()));
}

}  // namespace

}  // namespace megatron::ops::cpu

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cpu::embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& weight, const EmbeddingParams& params) {
  check_tokens(tokens);
  check_defined(weight, "embedding weight");
  check_cpu(weight, "embedding weight");
  MEGATRON_CHECK(weight.ndim() == 2, "embedding weight must be (V_local,C), got " << shape_str(weight.shape()));
  const int64_t B = tokens.dim(0), S = tokens.dim(1), V = weight.dim(0), C = weight.dim(1);
  check_cpu(out, "embedding out");
  check_shape(out, {S, B, C}, "embedding out");
  check_dtype(out, weight.dtype(), "embedding out");
  dispatch_floating(weight.dtype(), "embedding_forward", [&]<class T>(std::type_identity<T>) {
    embedding_forward_kernel<T>(out.data<T>(), tokens.data<int32_t>(), weight.data<T>(), B, S, C, V, params);
  });
}

void cpu::embedding_backward(Tensor& dweight, const Tensor& dout, const Tensor& tokens, const EmbeddingParams& params) {
  check_tokens(tokens);
  check_defined(dweight, "embedding dweight");
  check_cpu(dweight, "embedding dweight");
  MEGATRON_CHECK(dweight.ndim() == 2, "embedding dweight must be (V_local,C), got " << shape_str(dweight.shape()));
  const int64_t B = tokens.dim(0), S = tokens.dim(1), V = dweight.dim(0), C = dweight.dim(1);
  check_cpu(dout, "embedding dout");
  check_shape(dout, {S, B, C}, "embedding dout");
  dispatch_floating(dout.dtype(), "embedding_backward", [&]<class T>(std::type_identity<T>) {
    check_dtype(dweight, dtype_of<compute_t<T>>(), "embedding dweight");
    embedding_backward_kernel<T>(dweight.data<compute_t<T>>(), dout.data<T>(), tokens.data<int32_t>(), B, S, C, V,
                                 params);
  });
}

}  // namespace megatron::ops
