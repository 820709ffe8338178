// AdamW on CUDA: one pass over the flat f32 master / moment / grad buffers, 8 elements per thread
// step through 16-byte accesses when every buffer is 16-byte aligned, writing the compute copy
// (bf16 / f32 / f16) from the updated master in the same pass, so no second kernel reads the
// master again; or, masters kept as remainders, joining and splitting them with the bf16
// parameters in the same pass. The update is written in the reference's order with explicit rounding and IEEE
// division and square root, so it rounds as the CPU does (no fused multiply-adds).
#include <cmath>

#include "megatron/core/param_remainder.h"
#include "megatron/ops/adamw.h"
#include "megatron/ops/checks/adamw.h"
#include "megatron/ops/cuda/fp8_cast_transpose.cuh"
#include "megatron/ops/cuda/kernel_util.cuh"

namespace megatron::ops::cuda {
namespace {

constexpr int kVec = 8;  // two 16-byte accesses of the f32 buffers, one of 16-bit ones

struct AdamWConstants {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias_correction1, bias_correction2;  // 1 - beta^t
};

// Updates element i in place; returns the new master value.
__device__ __forceinline__ float adamw_update(float& master, float& m, float& v, float grad, const AdamWConstants& c) {
  // g = grad * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  // p = p - lr (m / bc1 / (sqrt(v / bc2) + eps) + wd p)
  const float g = __fmul_rn(grad, c.grad_scale);
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(__fsub_rn(1.0f, c.beta1), g));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, c.beta2), g), g));
  const float denom = __fadd_rn(__fsqrt_rn(__fdiv_rn(v, c.bias_correction2)), c.eps);
  const float step = __fadd_rn(__fdiv_rn(__fdiv_rn(m, c.bias_correction1), denom), __fmul_rn(c.weight_decay, master));
  master = __fsub_rn(master, __fmul_rn(c.lr, step));
  return master;
}

// Where a kernel reads and writes the masters: an f32 buffer, and the compute copy of type P
// written from it (kWriteModel; none when the master is the parameter)...
// A policy's store also takes the thread's running max of the stored masters' magnitude bits, which
// a policy with kRecordsAmax merges into its amax at the kernel's end.
template <bool kWriteModel, class P>
struct F32Masters {
  static constexpr bool kRecordsAmax = false;
  float* master;
  P* model;
  bool model_aligned;  // the copy starts on a 16-byte boundary: written in 16-byte stores too
  __device__ __forceinline__ void load(int64_t i, float (&p)[kVec]) const { load_floats<kVec>(master + i, p); }
  __device__ __forceinline__ void store(int64_t i, const float (&p)[kVec], unsigned& /*amax_bits*/) const {
    store_floats<kVec>(master + i, p);
    if constexpr (kWriteModel) {
      if (model_aligned) {
        store_floats<kVec>(model + i, p);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) model[i + j] = from_float<P>(p[j]);
      }
    }
  }
  __device__ __forceinline__ float load1(int64_t i) const { return master[i]; }
  __device__ __forceinline__ void store1(int64_t i, float p, unsigned& /*amax_bits*/) const {
    master[i] = p;
    if constexpr (kWriteModel) model[i] = from_float<P>(p);
  }
  bool aligned() const { return is_aligned16(master); }
};

// ...or f32 masters and the FP8 codes cast from them at *scale (ops::adamw_step_fp8), their
// magnitudes' max recorded as fp8_quantize records it...
struct Fp8CodesMasters {
  static constexpr bool kRecordsAmax = true;
  float* master;
  __nv_fp8_storage_t* codes;
  const float* scale;
  float* amax;
  __nv_fp8_interpretation_t format;
  __device__ __forceinline__ void load(int64_t i, float (&p)[kVec]) const { load_floats<kVec>(master + i, p); }
  __device__ __forceinline__ void store(int64_t i, const float (&p)[kVec], unsigned& amax_bits) const {
    store_floats<kVec>(master + i, p);
    const float s = *scale;
    fp8::Pack<kVec> pack;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      pack.code[j] = fp8::cast(p[j], s, format);
      amax_bits = max(amax_bits, fp8::magnitude_bits(p[j]));
    }
    *reinterpret_cast<fp8::Pack<kVec>*>(codes + i) = pack;
  }
  __device__ __forceinline__ float load1(int64_t i) const { return master[i]; }
  __device__ __forceinline__ void store1(int64_t i, float p, unsigned& amax_bits) const {
    master[i] = p;
    codes[i] = fp8::cast(p, *scale, format);
    amax_bits = max(amax_bits, fp8::magnitude_bits(p));
  }
  bool aligned() const { return is_aligned16(master) && reinterpret_cast<uintptr_t>(codes) % kVec == 0; }
};

// ...or the bf16 parameters' bits and the masters' remainders (core/param_remainder.h): 16 bytes
// of each per kVec elements.
struct RemainderMasters {
  static constexpr bool kRecordsAmax = false;
  uint16_t* remainder;
  uint16_t* param;
  __device__ __forceinline__ void load(int64_t i, float (&p)[kVec]) const {
    const uint4 r = *reinterpret_cast<const uint4*>(remainder + i), q = *reinterpret_cast<const uint4*>(param + i);
    const uint16_t* rs = reinterpret_cast<const uint16_t*>(&r);
    const uint16_t* qs = reinterpret_cast<const uint16_t*>(&q);
#pragma unroll
    for (int j = 0; j < kVec; ++j) p[j] = __uint_as_float(join_master(qs[j], rs[j]));
  }
  __device__ __forceinline__ void store(int64_t i, const float (&p)[kVec], unsigned& /*amax_bits*/) const {
    uint4 r, q;
    uint16_t* rs = reinterpret_cast<uint16_t*>(&r);
    uint16_t* qs = reinterpret_cast<uint16_t*>(&q);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const SplitMaster s = split_master(__float_as_uint(p[j]));
      qs[j] = s.param;
      rs[j] = s.remainder;
    }
    *reinterpret_cast<uint4*>(remainder + i) = r;
    *reinterpret_cast<uint4*>(param + i) = q;
  }
  __device__ __forceinline__ float load1(int64_t i) const {
    return __uint_as_float(join_master(param[i], remainder[i]));
  }
  __device__ __forceinline__ void store1(int64_t i, float p, unsigned& /*amax_bits*/) const {
    const SplitMaster s = split_master(__float_as_uint(p));
    param[i] = s.param;
    remainder[i] = s.remainder;
  }
  bool aligned() const { return is_aligned16(remainder) && is_aligned16(param); }
};

// Elements [first, end) of one tensor (or piece), this thread's share: vectors of kVec from `first`
// at `start`, `start + stride`, ..., then the last n % kVec one by one.
template <bool kVector, class Masters>
__device__ __forceinline__ void adamw_elements(const Masters& masters, float* exp_avg, float* exp_avg_sq,
                                               const float* grad, int64_t first, int64_t end, int64_t start,
                                               int64_t stride, const AdamWConstants& c, unsigned& amax_bits) {
  int64_t done = first;
  if constexpr (kVector) {
    const int64_t groups = (end - first) / kVec;
    for (int64_t k = start; k < groups; k += stride) {
      const int64_t i = first + k * kVec;
      float p[kVec], m[kVec], v[kVec], g[kVec];
      masters.load(i, p);
      load_floats<kVec>(exp_avg + i, m);
      load_floats<kVec>(exp_avg_sq + i, v);
      load_floats<kVec>(grad + i, g);
#pragma unroll
      for (int j = 0; j < kVec; ++j) adamw_update(p[j], m[j], v[j], g[j], c);
      masters.store(i, p, amax_bits);
      store_floats<kVec>(exp_avg + i, m);
      store_floats<kVec>(exp_avg_sq + i, v);
    }
    done = first + groups * kVec;
  }
  for (int64_t i = done + start; i < end; i += stride) {
    float p = masters.load1(i);
    adamw_update(p, exp_avg[i], exp_avg_sq[i], grad[i], c);
    masters.store1(i, p, amax_bits);
  }
}

template <bool kVector, class Masters>
__global__ void adamw_kernel(Masters masters, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t n,
                             AdamWConstants c) {
  unsigned amax_bits = 0;
  adamw_elements<kVector>(masters, exp_avg, exp_avg_sq, grad, 0, n, int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                          int64_t(gridDim.x) * blockDim.x, c, amax_bits);
  if constexpr (Masters::kRecordsAmax) fp8::merge_amax(masters.amax, amax_bits);
}

// The pieces of one launch of adamw_step_pieces, passed as the kernel's parameter (CUDA 12.1's
// 32 KB of parameters; kMaxPieces keeps it under 12): piece i covers chunks [chunk_start[i],
// chunk_start[i + 1]) of kChunk elements, one thread block's work at a time.
constexpr int kMaxPieces = 256;
constexpr int64_t kChunk = int64_t(kVec) * kThreads * 4;
struct PieceTable {
  int count;
  int64_t chunk_start[kMaxPieces + 1];
  int64_t begin[kMaxPieces], numel[kMaxPieces];  // in the flat state
  const float* grad[kMaxPieces];
  void* model[kMaxPieces];
  float weight_decay[kMaxPieces];
  bool vector[kMaxPieces];  // every buffer of the piece 16-byte aligned
};

// The masters of one piece, from the flat buffer (if any) and the piece's compute copy: f32
// masters (the flat buffer, or the f32 parameter itself where there is none) writing a copy of
// type P (kWriteModel)...
template <bool kWriteModel, class P>
struct F32PieceMasters {
  float* flat;  // null: the piece's parameter is its master
  __device__ __forceinline__ F32Masters<kWriteModel, P> of(const PieceTable& t, int i) const {
    if constexpr (kWriteModel) {
      P* model = static_cast<P*>(t.model[i]);
      return {flat + t.begin[i], model, is_aligned16(model)};
    } else {
      return {flat != nullptr ? flat + t.begin[i] : static_cast<float*>(t.model[i]), nullptr, false};
    }
  }
};

// ...or remainders beside the bf16 parameters.
struct RemainderPieceMasters {
  uint16_t* flat;
  __device__ __forceinline__ RemainderMasters of(const PieceTable& t, int i) const {
    return {flat + t.begin[i], static_cast<uint16_t*>(t.model[i])};
  }
};

// Chunk by chunk across the grid: each block finds its chunk's piece by binary search over the
// table and updates that chunk's elements with the piece's weight decay.
template <class PieceMasters>
__global__ void __launch_bounds__(kThreads)
    adamw_pieces_kernel(const __grid_constant__ PieceTable table, PieceMasters pieces, float* exp_avg,
                        float* exp_avg_sq, AdamWConstants c) {
  const int64_t chunks = table.chunk_start[table.count];
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    int lo = 0, hi = table.count - 1;  // the last piece whose first chunk is at or before `chunk`
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (table.chunk_start[mid] <= chunk)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int i = lo;
    const int64_t first = (chunk - table.chunk_start[i]) * kChunk, end = min(table.numel[i], first + kChunk);
    AdamWConstants own = c;
    own.weight_decay = table.weight_decay[i];
    const auto masters = pieces.of(table, i);
    float* m = exp_avg + table.begin[i];
    float* v = exp_avg_sq + table.begin[i];
    unsigned amax_bits = 0;
    if (table.vector[i])
      adamw_elements<true>(masters, m, v, table.grad[i], first, end, threadIdx.x, blockDim.x, own, amax_bits);
    else
      adamw_elements<false>(masters, m, v, table.grad[i], first, end, threadIdx.x, blockDim.x, own, amax_bits);
  }
}

// The step's constants, the bias corrections in double on the host as torch and the CPU reference
// compute them.
AdamWConstants constants_of(const AdamWParams& params) {
  MEGATRON_CHECK(params.step >= 1, "adamw step " << params.step << " must be >= 1 (steps count from 1)");
  MEGATRON_CHECK(params.beta1 >= 0.0f && params.beta1 < 1.0f && params.beta2 >= 0.0f && params.beta2 < 1.0f,
                 "adamw betas (" << params.beta1 << ", " << params.beta2 << ") must be in [0, 1)");
  return {params.lr,
          params.beta1,
          params.beta2,
          params.eps,
          params.weight_decay,
          params.grad_scale,
          float(1.0 - std::pow(double(params.beta1), double(params.step))),
          float(1.0 - std::pow(double(params.beta2), double(params.step)))};
}

void check_cuda_master_dtype(const Tensor& master, const char* name) {
  MEGATRON_CHECK(master.dtype() == DType::f32 || master.dtype() == DType::u16,
                 name << " has dtype " << dtype_name(master.dtype())
                      << "; master weights on CUDA are f32, or u16 remainders of bf16 parameters");
}

void check_cuda_copy_dtype(const Tensor& copy, const char* name) {
  const DType d = copy.dtype();
  MEGATRON_CHECK(d == DType::bf16 || d == DType::f16 || d == DType::f32,
                 name << " has dtype " << dtype_name(d) << "; CUDA writes bf16, f16 or f32 copies");
}

constexpr checks::AdamWBackend kCudaAdamW{check_cuda, check_cuda_master_dtype, check_cuda_copy_dtype};

template <class Masters>
void launch_adamw(const Masters& masters, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t n,
                  const AdamWConstants& c) {
  if (n == 0) return;
  const bool vector = masters.aligned() && is_aligned16(exp_avg) && is_aligned16(exp_avg_sq) && is_aligned16(grad);
  if (vector) {
    adamw_kernel<true>
        <<<grid_for(ceil_div(n, kVec)), kThreads, 0, stream()>>>(masters, exp_avg, exp_avg_sq, grad, n, c);
  } else {
    adamw_kernel<false><<<grid_for(n), kThreads, 0, stream()>>>(masters, exp_avg, exp_avg_sq, grad, n, c);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

}  // namespace megatron::ops::cuda

// The ops, each defined against its one declaration (MEGATRON_OP in ops/<family>.h).
namespace megatron::ops {

void cuda::adamw_step(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, Tensor& model_param,
                      const AdamWParams& params) {
  checks::check_adamw_step(master, exp_avg, exp_avg_sq, grad, model_param, params, kCudaAdamW);
  const bool remainders = master.dtype() == DType::u16;
  const AdamWConstants c = constants_of(params);
  float* m = device_data<float>(exp_avg);
  float* v = device_data<float>(exp_avg_sq);
  const float* g = device_data<float>(grad);
  const int64_t n = master.numel();
  if (remainders) {
    return launch_adamw(
        RemainderMasters{static_cast<uint16_t*>(master.raw()), static_cast<uint16_t*>(model_param.raw())}, m, v, g, n,
        c);
  }
  float* p = device_data<float>(master);
  if (!model_param.defined()) return launch_adamw(F32Masters<false, float>{p, nullptr, false}, m, v, g, n, c);
  dispatch_storage(model_param.dtype(), "adamw model_param", [&]<class P>(std::type_identity<P>) {
    launch_adamw(F32Masters<true, P>{p, device_data<P>(model_param), is_aligned16(model_param.raw())}, m, v, g, n, c);
  });
}

void cuda::adamw_step_pieces(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, std::vector<AdamWPiece>& pieces,
                             const AdamWParams& params) {
  checks::check_adamw_step_pieces(master, exp_avg, exp_avg_sq, pieces, params, kCudaAdamW);
  const bool remainders = master.defined() && master.dtype() == DType::u16;
  const AdamWConstants c = constants_of(params);
  float* m = device_data<float>(exp_avg);
  float* v = device_data<float>(exp_avg_sq);
  // One launch per compute-copy dtype and kMaxPieces pieces, in order.
  const auto launch = [&](const auto& piece_masters, DType model_dtype) {
    PieceTable table{};
    const auto flush = [&] {
      if (table.count == 0) return;
      const int64_t chunks = table.chunk_start[table.count];
      adamw_pieces_kernel<<<grid_for(chunks, /*threads=*/1), kThreads, 0, stream()>>>(table, piece_masters, m, v, c);
      CUDA_CHECK_LAUNCH();
      table.count = 0;
    };
    for (AdamWPiece& piece : pieces) {
      const int64_t n = piece.grad.numel();
      if (n == 0 || piece.model_param.dtype() != model_dtype) continue;
      const int i = table.count++;
      table.begin[i] = piece.begin;
      table.numel[i] = n;
      table.grad[i] = device_data<float>(piece.grad);
      table.model[i] = piece.model_param.raw();
      table.weight_decay[i] = piece.weight_decay;
      const void* masters =
          master.defined() ? static_cast<const char*>(master.raw()) + piece.begin * int64_t(dtype_size(master.dtype()))
                           : piece.model_param.raw();
      table.vector[i] = is_aligned16(masters) && is_aligned16(m + piece.begin) && is_aligned16(v + piece.begin) &&
                        is_aligned16(table.grad[i]) && (!remainders || is_aligned16(table.model[i]));
      table.chunk_start[i + 1] = table.chunk_start[i] + ceil_div(n, kChunk);
      if (table.count == kMaxPieces) flush();
    }
    flush();
  };
  if (remainders) return launch(RemainderPieceMasters{static_cast<uint16_t*>(master.raw())}, DType::bf16);
  if (!master.defined()) return launch(F32PieceMasters<false, float>{nullptr}, DType::f32);
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    dispatch_storage(dtype, "adamw piece model_param", [&]<class P>(std::type_identity<P>) {
      launch(F32PieceMasters<true, P>{device_data<float>(master)}, dtype);
    });
  }
}

void cuda::adamw_step_fp8(Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad, Tensor& codes,
                          Tensor& codes_amax, const Tensor& codes_scale, const AdamWParams& params) {
  checks::check_adamw_step_fp8(master, exp_avg, exp_avg_sq, grad, codes, codes_amax, codes_scale, params, kCudaAdamW);
  const AdamWConstants c = constants_of(params);
  launch_adamw(
      Fp8CodesMasters{device_data<float>(master), static_cast<__nv_fp8_storage_t*>(codes.raw()),
                      device_data<float>(codes_scale), device_data<float>(codes_amax), fp8::format_of(codes.dtype())},
      device_data<float>(exp_avg), device_data<float>(exp_avg_sq), device_data<float>(grad), master.numel(), c);
}

}  // namespace megatron::ops
