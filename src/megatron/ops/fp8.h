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
//   blockwise (Megatron's blockwise, Transformer Engine's Float8BlockScaling, DeepSeek-V3's
//             recipe): current scaling with one f32 scale per block instead of per tensor, from
//             that block's own amax (fp8_quantize_blockwise): activations and output gradients in
//             1x128 tiles along the GEMM's reduction dimension, weights in 128x128 blocks. Nothing
//             is carried from one step to the next.
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/ops/gemm.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

enum class Fp8Scaling { delayed, current, blockwise };
enum class AmaxComputeAlgo { most_recent, max };

// The blocks of the blockwise recipe, of a 2-D tensor (rows, cols) whose cols are the GEMM's
// reduction dimension K. A last block along either dimension may be ragged (fewer elements).
enum class Fp8BlockShape {
  tile_1x128,     // 128 consecutive elements of one row (activations, output gradients)
  block_128x128,  // 128 rows x 128 columns (weights)
};
inline constexpr int64_t kFp8BlockSize = 128;

struct Fp8Recipe {
  DType forward_dtype = DType::e4m3;   // activations and weights
  DType backward_dtype = DType::e4m3;  // output gradients: e5m2 under Megatron's hybrid format
  Fp8Scaling scaling = Fp8Scaling::delayed;
  int64_t amax_history_len = 1;
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::most_recent;
  int64_t margin = 0;
};

// One tensor's scaling state under a per-tensor recipe (delayed, current), f32 on its device:
// scale (1), scale_inv (1) and amax_history (the recipe's history length; current scaling: 1),
// undefined until fp8_scaling_start. dtype: what the tensor is cast to; blocks: its block shape
// under the blockwise recipe, which keeps no state from one cast to the next.
struct Fp8TensorScaling {
  DType dtype = DType::e4m3;
  Fp8BlockShape blocks = Fp8BlockShape::tile_1x128;
  Tensor scale, scale_inv, amax_history;
};
// Starts `s` on `device` as Transformer Engine starts a tensor's: scale 1 and an empty history of
// `history_len`; nothing when it has started.
void fp8_scaling_start(Fp8TensorScaling& s, int64_t history_len, Device device);

// amax (1) f32 = max(amax, max |x|)        x: f32, bf16, f16 (f64 on the CPU)
MEGATRON_OP(fp8_amax, void(Tensor& amax, const Tensor& x));
// q = saturate(round(x * scale)) in q's dtype (e4m3 or e5m2), x's shape; scale (1) f32 read on the
// device. With amax defined, also amax = max(amax, max |x|), from the same pass over x.
MEGATRON_OP(fp8_quantize, void(Tensor& q, Tensor& amax, const Tensor& x, const Tensor& scale));
// fp8_quantize of a 2-D x (rows, cols) into q_t (cols, rows), its transpose, and into q (rows,
// cols) too where q is defined: the same bytes as fp8_quantize, from one pass over x. The
// transpose is the layout Hopper's FP8 GEMMs take for the backward's operands (Transformer
// Engine's cast-transpose); amax as in fp8_quantize.
MEGATRON_OP(fp8_quantize_transpose, void(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& x, const Tensor& scale));
// The update above for one tensor quantised to `fp8_dtype`: scale, scale_inv (1) and
// amax_history (N) f32, all on one device; the recipe's algorithm and margin apply.
MEGATRON_OP(fp8_update_scale,
            void(Tensor& scale, Tensor& scale_inv, Tensor& amax_history, DType fp8_dtype, const Fp8Recipe& recipe));
// fp8_update_scale of many tensors at once (entry i: scales[i], scale_invs[i], amax_histories[i],
// fp8_dtypes[i]; the vectors of one length), all on one device: on CUDA one launch per 64 of them
// instead of one each (the delayed recipe updates every FP8 operand of the model after a step).
MEGATRON_OP(fp8_update_scales,
            void(std::vector<Tensor>& scales, std::vector<Tensor>& scale_invs, std::vector<Tensor>& amax_histories,
                 const std::vector<DType>& fp8_dtypes, const Fp8Recipe& recipe));
// C = alpha * (a_scale_inv op(A)) (b_scale_inv op(B)) + beta * C, FP32 accumulation.
// A, B: 2-D e4m3 / e5m2 (not both e5m2), scale_invs (1) f32; C: bf16, f16 or f32 (2-D).
// On CUDA (cuBLASLt, compute capability 8.9 or newer) Hopper's rule holds: FP8 GEMMs take A
// row-major and B transposed (C = A B^T); other transposes are served by transposed copies (a
// caller that has fp8_quantize_transpose's layouts passes them and none is made). K and C's
// column count must be multiples of 16 there. The CPU emulates it: the FP8 values exactly,
// products summed in f64, one rounding to C.
MEGATRON_OP(fp8_matmul, void(Tensor& c, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                             const Tensor& b_scale_inv, const MatmulParams& params));

// ---- blockwise scaling ----
// A block's scale is Transformer Engine's (compute_scale_from_amax with power_2_scale on and
// amax_epsilon 0, the Float8BlockScaling defaults): amax = max |x| over the block; scale = 1 when
// amax is 0, infinite or NaN, else fp8_max / amax in f32 (FLT_MAX if that overflows), then its
// mantissa cleared, i.e. rounded down to a power of two (so q * scale_inv is exact and the
// block's largest element never saturates). scale_inv = 1 / scale.
//
// The scale_inv tensor of a (rows, cols) tensor is f32, in the layout cuBLASLt's block-scaled
// GEMMs read (Transformer Engine's "GEMM-ready" layout; the padding is written as 0):
//   1x128:    (ceil(cols / 128), round_up(rows, 4)); [j, r] is the scale_inv of row r's elements
//             [128 j, 128 j + 128): one column of scales per tile column, rows contiguous.
//   128x128:  (ceil(rows / 128), round_up(ceil(cols / 128), 4)); [i, j] is the block of rows
//             [128 i, ...) and columns [128 j, ...), its column blocks contiguous.
Shape fp8_block_scale_shape(int64_t rows, int64_t cols, Fp8BlockShape blocks);
// Quantises a 2-D x (rows, cols) into the layouts the recipe's GEMMs take, from one pass over x:
//   q (rows, cols) and q_scale_inv: x in `blocks` along cols (skipped when q is undefined);
//   q_t (cols, rows) and q_t_scale_inv: x^T in the same block shape along x's rows (skipped when
//     q_t is undefined). For 1x128 tiles these are other tiles (128 consecutive rows of one column
//     of x: the token dimension of the weight-gradient GEMM), so q_t is not q's transpose; a
//     128x128 block is the same block either way, so q_t is q transposed, scales transposed.
// q, q_t: e4m3 or e5m2 (one dtype); x: f32, bf16, f16 (f64 on the CPU).
MEGATRON_OP(fp8_quantize_blockwise, void(Tensor& q, Tensor& q_scale_inv, Tensor& q_t, Tensor& q_t_scale_inv,
                                         const Tensor& x, Fp8BlockShape blocks));
// C (M,N) = alpha A B^T + beta C with block scales: A (M,K) and B (N,K), both quantised along K
// by fp8_quantize_blockwise (`a_blocks`, `b_blocks`; not both 128x128, which neither cuBLASLt nor
// Transformer Engine multiplies), params.trans_a no and trans_b yes (Hopper's TN form, the only
// one: a block-scaled operand cannot be transposed after its cast). C: bf16, f16 or f32.
// On CUDA: cuBLASLt's VEC128_32F / BLK128x128_32F scale modes (compute capability 9.0). The CPU
// emulates it: each FP8 value times its block's scale_inv, exactly, products summed in f64, one
// rounding to C.
MEGATRON_OP(fp8_matmul_blockwise,
            void(Tensor& c, const Tensor& a, const Tensor& a_scale_inv, Fp8BlockShape a_blocks, const Tensor& b,
                 const Tensor& b_scale_inv, Fp8BlockShape b_blocks, const MatmulParams& params));

}  // namespace megatron::ops
