#pragma once
// Rotary position embedding on x (S,B,H,D), Megatron's convention:
//   rot_dim = int(D * rotary_percent) (even); inv_freq[j] = 1 / base^(2j / rot_dim), j < rot_dim/2,
//   computed in float32; angle = (position_offset + s) * inv_freq[j].
//   Non-interleaved (default, GPT-NeoX style): pairs are (i, i + rot_dim/2):
//     y[i] = x[i] cos - x[i+h] sin,  y[i+h] = x[i+h] cos + x[i] sin   (h = rot_dim/2)
//   Interleaved: pairs are (2j, 2j+1) with the same angle j.
//   Channels >= rot_dim pass through. Backward applies the inverse rotation; dx overwritten.
//   scaling_factor > 0: Llama-3.x frequency scaling (Megatron's --use-rope-scaling, with its fixed
//   low_freq_factor 1, high_freq_factor 4, original context 8192): with wavelength
//   w = 2 pi / inv_freq[j], frequencies with w < 8192/4 stay, those with w > 8192/1 are divided by
//   the factor, and those between blend the two: s = (8192 / w - 1) / (4 - 1),
//   inv_freq = (1 - s) inv_freq / factor + s inv_freq.
//   seq_len_interpolation_factor f (Megatron's --rotary-seq-len-interpolation-factor): the angles
//   of position p / f, as inv_freq / f (Hugging Face's linear scaling computes it so; Megatron
//   divides the positions, the same angles up to an ulp).
// y may alias x (in place).
#include "megatron/core/tensor.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

struct RopeParams {
  float base = 10000.0f;
  float percent = 1.0f;
  bool interleaved = false;
  int64_t position_offset = 0;
  float scaling_factor = 0.0f;  // Llama-3.x scaling factor; 0: none
  float seq_len_interpolation_factor = 1.0f;
};

// inv_freq[j] of the rotation above, in float32, for both backends (j < rot_dim / 2).
float rope_inv_freq(int64_t j, int64_t rot_dim, const RopeParams& params);

MEGATRON_OP(rope_forward, void(Tensor& y, const Tensor& x, const RopeParams& params));
MEGATRON_OP(rope_backward, void(Tensor& dx, const Tensor& dy, const RopeParams& params));

// The same rotation, in place, of the query and key heads of a fused QKV projection
// qkv (S,B,G,(r+2)*D), r = num_heads / G, in the layout qkv_split reads (ops/attention.h): each
// group's r query heads, then its key head, are rotated as rope_forward (rope_backward for the
// gradient dqkv) rotates q and k; the value heads are untouched. Equal, bit for bit on the CPU, to
// split + rope of q and k + merge, without the copies: the attention then reads the rotated
// projection in place (attention_forward_qkv).
MEGATRON_OP(rope_forward_qkv, void(Tensor& qkv, int64_t num_heads, const RopeParams& params));
MEGATRON_OP(rope_backward_qkv, void(Tensor& dqkv, int64_t num_heads, const RopeParams& params));
// rope_backward_qkv's result cast to FP8 for the QKV projection's backward, dqkv left as it is:
// the bytes of rope_backward_qkv (in dqkv's dtype) followed by ops::fp8_quantize_transpose(q,
// q_t, amax, result viewed as (S*B, G*(r+2)*D), scale), without the result ever stored (the
// activation-fused casts of ops/activation.h; the delayed FP8 recipe's).
MEGATRON_OP(rope_backward_qkv_fp8, void(Tensor& q, Tensor& q_t, Tensor& amax, const Tensor& dqkv, int64_t num_heads,
                                        const RopeParams& params, const Tensor& scale));

}  // namespace megatron::ops
