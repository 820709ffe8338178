#pragma once
// FP8: the per-tensor quantiser, the scaling recipes' scale update, and the FP8 GEMM.
//
// A quantised tensor q holds x * scale rounded to e4m3 or e5m2 (core/dtype.h: nearest even,
// saturating to +-448 / +-57344); it stands for q * scale_inv, scale_inv = 1 / scale. A tensor's
// scaling state is three f32 tensors on its device: scale (1), scale_inv (1) and amax_history
// (history length). amax accumulators take max(amax, max |x|) with NaN larger than everything, so
// a NaN reaches the scale update, which then keeps the old scale (Transformer Engine's rule).
//
// The recipes (Transformer Engine's semantics):
//   delayed:  the cast uses the scale computed from earlier steps and records this tensor's amax
//             in amax_history[0]; after the step fp8_update_scale takes amax = max(history) or
//             history[0] (most_recent), sets scale = (fp8_max / amax) / 2^margin when amax is
//             finite and positive (else keeps it), and rolls the history (TE's torch.roll by -1,
//             then history[0] = 0), so the history holds the last N steps' amaxes.
//   current (Megatron's tensorwise): fp8_amax into a history of length 1, fp8_update_scale with
//             margin 0, then the cast: the scale of this very tensor.
#include "megatron/core/tensor.h"
#include "megatron/ops/gemm.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

enum class Fp8Scaling { delayed, current };
enum class AmaxComputeAlgo { most_recent, max };

struct Fp8Recipe {
  DType forward_dtype = DType::e4m3;   // activations and weights
  DType backward_dtype = DType::e4m3;  // output gradients: e5m2 under Megatron's hybrid format
  Fp8Scaling scaling = Fp8Scaling::delayed;
  int64_t amax_history_len = 1;
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::most_recent;
  int64_t margin = 0;
};

// amax (1) f32 = max(amax, max |x|)        x: f32, bf16, f16 (f64 on the CPU)
MEGATRON_OP(fp8_amax, void(Tensor& amax, const Tensor& x));
// q = saturate(round(x * scale)) in q's dtype (e4m3 or e5m2), x's shape; scale (1) f32 read on the
// device. With amax defined, also amax = max(amax, max |x|), from the same pass over x.
MEGATRON_OP(fp8_quantize, void(Tensor& q, Tensor& amax, const Tensor& x, const Tensor& scale));
// fp8_quantize of a 2-D x (rows, cols) into q_t (cols, rows), its transpose, and into q (rows,
// cols) too where q is defined: the same bytes as fp8_quantize, from one pass over x. The
// transpose is the layout Hopper's FP8 GEMMs take for the backward's operands (Transformer
// Engine's cast-transpose); amax as in fp8_quantize.
MEGATRON_OP(fp8_quantize_transpose,
            void(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& scale));
// The update above for one tensor quantised to `fp8_dtype`: scale, scale_inv (1) and
// amax_history (N) f32, all on one device; the recipe's algorithm and margin apply.
MEGATRON_OP(fp8_update_scale,
            void(Tensor& scale, Tensor& scale_inv, Tensor& amax_history, DType fp8_dtype, const Fp8Recipe& recipe));
// C = alpha * (a_scale_inv op(A)) (b_scale_inv op(B)) + beta * C, FP32 accumulation.
// A, B: 2-D e4m3 / e5m2 (not both e5m2), scale_invs (1) f32; C: bf16, f16 or f32 (2-D).
// On CUDA (cuBLASLt, compute capability 8.9 or newer) Hopper's rule holds: FP8 GEMMs take A
// row-major and B transposed (C = A B^T); other transposes are served by transposed copies (a
// caller that has fp8_quantize_transpose's layouts passes them and none is made). K and C's column count must be multiples of 16 there.
// The CPU emulates it: the FP8 values exactly, products summed in f64, one rounding to C.
MEGATRON_OP(fp8_matmul, void(Tensor& c, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                             const Tensor& b_scale_inv, const MatmulParams& params));

}  // namespace megatron::ops
