// Token embedding lookup on CUDA. tokens are (B,S) as the loader gives them; rows are written
// sequence-major (S,B,C), so the transpose is folded into the lookup (as on the CPU).
//   forward:  one block per output row (grid-stride), 16-byte packs along C when rows are aligned.
//   backward: dweight rows receive float atomicAdds. Atomics make the order of additions into a
//             row that several tokens share vary from run to run, so dweight may differ in the
//             last bits between runs (a deliberate trade: the embedding gradient is a small part
//             of the step, and a deterministic version needs a sort of the token ids).
#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/embedding.h"

namespace megatron::ops::cuda {
namespace {

// Row of weight holding token id, or -1 when another vocab-parallel rank owns it.
__device__ __forceinline__ int64_t local_row(int32_t id, int64_t vocab_start, int64_t vocab_local) {
  const int64_t row = int64_t(id) - vocab_start;
  return (row >= 0 && row < vocab_local) ? row : -1;
}

// out row r = (s, b) <- weight[tokens[b, s] - vocab_start] (zero when masked), or += it.
template <bool kVector, bool kAccumulate, class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* weight, int64_t B, int64_t S,
                                         int64_t C, int64_t vocab_start, int64_t vocab_local) {
  for (int64_t r = blockIdx.x; r < S * B; r += gridDim.x) {
    const int64_t s = r / B, b = r % B;
    const int64_t row = local_row(tokens[b * S + s], vocab_start, vocab_local);
    T* o = out + r * C;
    const T* w = weight + (row < 0 ? 0 : row) * C;
    int64_t done = 0;
    if constexpr (kVector) {
      constexpr int kVec = kPack<T>;
      for (int64_t c = int64_t(threadIdx.x) * kVec; c + kVec <= C; c += int64_t(blockDim.x) * kVec) {
        float v[kVec];
        if (row >= 0) {
          load_floats<kVec>(w + c, v);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) v[j] = 0.0f;
        }
        if constexpr (kAccumulate) {
          float old[kVec];
          load_floats<kVec>(o + c, old);
#pragma unroll
          for (int j = 0; j < kVec; ++j) v[j] = __fadd_rn(old[j], v[j]);
        }
        store_floats<kVec>(o + c, v);
      }
      done = C / kVec * kVec;
    }
    for (int64_t c = done + threadIdx.x; c < C; c += blockDim.x) {
      float v = row >= 0 ? to_float(w[c]) : 0.0f;
      if constexpr (kAccumulate) v = __fadd_rn(to_float(o[c]), v);
      o[c] = from_float<T>(v);
    }
  }
}

// dweight[tokens[b, s] - vocab_start] += dout row (s, b) for owned ids.
template <class T>
__global__ void embedding_backward_kernel(float* dweight, const T* dout, const int32_t* tokens, int64_t B, int64_t S,
                                          int64_t C, int64_t vocab_start, int64_t vocab_local) {
  for (int64_t r = blockIdx.x; r < S * B; r += gridDim.x) {
    const int64_t s = r / B, b = r % B;
    const int64_t row = local_row(tokens[b * S + s], vocab_start, vocab_local);
    if (row < 0) continue;  // the same for the whole block: no thread waits on a barrier here
    const T* g = dout + r * C;
    float* d = dweight + row * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(d + c, to_float(g[c]));
  }
}

// Threads per row: enough for C in one or two passes, a multiple of the warp.
int threads_for_row(int64_t C, int per_thread) {
  return int(std::clamp<int64_t>(ceil_div(ceil_div(C, per_thread), 32) * 32, 32, 256));
}

void check_tokens(const Tensor& tokens) {
  check_cuda(tokens, "embedding tokens");
  check_dtype(tokens, DType::i32, "embedding tokens");
  MEGATRON_CHECK(tokens.ndim() == 2, "embedding tokens must be (B,S), got " << shape_str(tokens.shape()));
}

}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& weight, const EmbeddingParams& params) {
  check_tokens(tokens);
  check_cuda(weight, "embedding weight");
  MEGATRON_CHECK(weight.ndim() == 2, "embedding weight must be (V_local,C), got " << shape_str(weight.shape()));
  const int64_t B = tokens.dim(0), S = tokens.dim(1), V = weight.dim(0), C = weight.dim(1);
  check_cuda(out, "embedding out");
  check_shape(out, {S, B, C}, "embedding out");
  check_dtype(out, weight.dtype(), "embedding out");
  if (S * B == 0 || C == 0) return;
  dispatch_storage(weight.dtype(), "embedding_forward", [&]<class T>(std::type_identity<T>) {
    T* o = device_data<T>(out);
    const T* w = device_data<T>(weight);
    const int32_t* t = device_data<int32_t>(tokens);
    // Every row starts 16-byte aligned when the bases are and a row is a whole number of packs.
    const bool vector = is_aligned16(o) && is_aligned16(w) && C % kPack<T> == 0;
    const int threads = threads_for_row(C, vector ? kPack<T> : 1);
    const unsigned blocks = unsigned(std::min<int64_t>(S * B, kMaxGridBlocks));
    auto launch = [&](auto kernel) {
      kernel<<<blocks, threads, 0, stream()>>>(o, t, w, B, S, C, params.vocab_start, V);
      CUDA_CHECK_LAUNCH();
    };
    if (vector) {
      params.accumulate ? launch(embedding_forward_kernel<true, true, T>)
                        : launch(embedding_forward_kernel<true, false, T>);
    } else {
      params.accumulate ? launch(embedding_forward_kernel<false, true, T>)
                        : launch(embedding_forward_kernel<false, false, T>);
    }
  });
}

void cuda::embedding_backward(Tensor& dweight, const Tensor& dout, const Tensor& tokens,
                              const EmbeddingParams& params) {
  check_tokens(tokens);
  check_cuda(dweight, "embedding dweight");
  MEGATRON_CHECK(dweight.ndim() == 2, "embedding dweight must be (V_local,C), got " << shape_str(dweight.shape()));
  const int64_t B = tokens.dim(0), S = tokens.dim(1), V = dweight.dim(0), C = dweight.dim(1);
  check_cuda(dout, "embedding dout");
  check_shape(dout, {S, B, C}, "embedding dout");
  check_dtype(dweight, DType::f32, "embedding dweight");
  if (S * B == 0 || C == 0) return;
  dispatch_storage(dout.dtype(), "embedding_backward", [&]<class T>(std::type_identity<T>) {
    const unsigned blocks = unsigned(std::min<int64_t>(S * B, kMaxGridBlocks));
    embedding_backward_kernel<T>
        <<<blocks, threads_for_row(C, 1), 0, stream()>>>(device_data<float>(dweight), device_data<T>(dout),
                                                         device_data<int32_t>(tokens), B, S, C, params.vocab_start, V);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace megatron::ops
