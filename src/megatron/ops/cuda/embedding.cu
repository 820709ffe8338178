// Token embedding lookup on CUDA. tokens are (B,S) as the loader gives them; rows are written
// sequence-major (S,B,C), so the transpose is folded into the lookup (as on the CPU).
//   forward:  one block per output row (grid-stride), 16-byte packs along C when rows are aligned.
//   backward: dweight rows receive float atomicAdds. Atomics make the order of additions into a
//             row that several tokens share vary from run to run, so dweight may differ in the
//             last bits between runs. With params.deterministic, a stable radix sort of the rows
//             by id instead gives each id's rows in token order, and one block adds them into
//             its dweight row in that order: the CPU op's additions, so its bits on every run.
//             Slower where one id holds many rows (its block adds them one after another), so
//             only on request (Megatron's --deterministic-mode).
#include <bit>
#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "megatron/ops/cuda/kernel_util.cuh"
#include "megatron/ops/cuda/op_paths.h"
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

// The deterministic backward's sort input: keys[r] = local row of token r = (s, b), or V when
// another vocab-parallel rank owns it (sorted last, skipped); rows[r] = r.
__global__ void embedding_sort_keys_kernel(int32_t* keys, int32_t* rows, const int32_t* tokens, int64_t B, int64_t S,
                                           int64_t vocab_start, int64_t vocab_local) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < S * B; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = local_row(tokens[(r % B) * S + r / B], vocab_start, vocab_local);
    keys[r] = int32_t(row < 0 ? vocab_local : row);
    rows[r] = int32_t(r);
  }
}

// After the stable sort, a block per id (at its first sorted position) adds the id's dout rows, in
// token order, into its dweight row: acc = acc + g, rounded each time, as the CPU op. V elements a
// thread: one, or a 16-byte pack of dout.
template <int V, class T>
__global__ void embedding_backward_in_order_kernel(float* dweight, const T* dout, const int32_t* keys,
                                                   const int32_t* rows, int64_t N, int64_t C, int64_t vocab_local) {
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const int32_t id = keys[i];
    if (id >= vocab_local || (i > 0 && keys[i - 1] == id)) continue;  // the same for the whole block
    int64_t end = i + 1;
    while (end < N && keys[end] == id) ++end;
    float* d = dweight + int64_t(id) * C;
    for (int64_t c = int64_t(threadIdx.x) * V; c < C; c += int64_t(blockDim.x) * V) {
      float acc[V];
      load_pack<V>(d + c, acc);
#pragma unroll 4
      for (int64_t j = i; j < end; ++j) {
        float g[V];
        load_pack<V>(dout + int64_t(rows[j]) * C + c, g);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = __fadd_rn(acc[e], g[e]);
      }
      store_pack<V>(d + c, acc);
    }
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

// The deterministic backward (params.deterministic): sort, then add each id's rows in token order.
void embedding_backward_in_order(Tensor& dweight, const Tensor& dout, const Tensor& tokens, int64_t vocab_start) {
  const int64_t B = tokens.dim(0), S = tokens.dim(1), V = dweight.dim(0), C = dweight.dim(1), N = S * B;
  MEGATRON_CHECK(N < std::numeric_limits<int32_t>::max() && V < std::numeric_limits<int32_t>::max(),
                 "deterministic embedding backward: " << N << " tokens and " << V
                                                      << " rows must each be below 2^31 (cub's sort indexes them "
                                                         "as int32); use fewer tokens a micro-batch");
  Tensor sort = Tensor::empty({4, N}, DType::i32, dweight.device());
  int32_t* keys = device_data<int32_t>(sort);
  int32_t* rows = keys + N;
  int32_t* sorted_keys = keys + 2 * N;
  int32_t* sorted_rows = keys + 3 * N;
  embedding_sort_keys_kernel<<<unsigned(std::min<int64_t>(ceil_div(N, 256), kMaxGridBlocks)), 256, 0, stream()>>>(
      keys, rows, device_data<int32_t>(tokens), B, S, vocab_start, V);
  CUDA_CHECK_LAUNCH();
  // Keys lie in [0, V]: only their low bit_width(V) bits are sorted on.
  const int end_bit = std::max(1, int(std::bit_width(uint64_t(V))));
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, sorted_keys, rows, sorted_rows, int(N), 0,
                                             end_bit, stream()));
  Tensor temp = Tensor::empty({std::max<int64_t>(int64_t(temp_bytes), 1)}, DType::u8, dweight.device());
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, keys, sorted_keys, rows, sorted_rows, int(N), 0,
                                             end_bit, stream()));
  dispatch_storage(dout.dtype(), "embedding_backward", [&]<class T>(std::type_identity<T>) {
    float* d = device_data<float>(dweight);
    const T* g = device_data<T>(dout);
    const bool vector = is_aligned16(d) && is_aligned16(g) && C % kPack<T> == 0;
    const unsigned blocks = unsigned(std::min<int64_t>(N, kMaxGridBlocks));
    const int threads = threads_for_row(C, vector ? kPack<T> : 1);
    auto launch = [&](auto kernel) {
      kernel<<<blocks, threads, 0, stream()>>>(d, g, sorted_keys, sorted_rows, N, C, V);
      CUDA_CHECK_LAUNCH();
    };
    vector ? launch(embedding_backward_in_order_kernel<kPack<T>, T>) : launch(embedding_backward_in_order_kernel<1, T>);
  });
  count_op_path(OpPath::embedding_backward_in_token_order);
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
  if (params.deterministic) return embedding_backward_in_order(dweight, dout, tokens, params.vocab_start);
  dispatch_storage(dout.dtype(), "embedding_backward", [&]<class T>(std::type_identity<T>) {
    const unsigned blocks = unsigned(std::min<int64_t>(S * B, kMaxGridBlocks));
    embedding_backward_kernel<T>
        <<<blocks, threads_for_row(C, 1), 0, stream()>>>(device_data<float>(dweight), device_data<T>(dout),
                                                         device_data<int32_t>(tokens), B, S, C, params.vocab_start, V);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace megatron::ops
