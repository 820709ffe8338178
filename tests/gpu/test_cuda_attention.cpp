// CUDA attention against the CPU op run in f64 on the same (bf16-exact) inputs, with the dropout
// mask shared bit for bit: our flash kernels, cuDNN's fused kernels (ops/cuda/attention_cudnn.h),
// the routing between them, the fused-QKV ops and split/merge. Every output starts as NaN.
//
// Error bounds. Every output is a sum of products whose terms the kernels round at most once in
// the 16-bit dtype (P before P V, P M before (P M)^T dO, dS before dS K and dS^T Q; cuDNN's graphs
// round at the same places) and otherwise compute in fp32. So, elementwise,
//   |gpu - ref| <= (2 u_16 [bf16, f16 only] + F u_f32) (|ref| + mag)
// where mag is the same sum taken over absolute values (computed below in f64, free of
// cancellation), 2 u_16 = one rounding inside plus the output's own rounding, and F u_f32 the
// fp32 part: a score error of HS u_f32 sigma (sigma = max scale sum_d |q_d k_d|) becomes a relative
// error of each probability through exp, twice (forward lse and backward recompute); sums of up
// to r S terms add r S u_f32 each; exp/log/divide add a few ulps. F = 2 HS sigma + 2 r S + HS + 16.
// f16 adds an absolute term: a probability (or dS) below f16's normal range (2^-14) is rounded to
// its subnormal spacing 2^-24, an error of up to 2^-25 whatever its size, and so is an output that
// small. So f16 outputs may be off by 2^-25 (exposure + 1) more, exposure being the sum of the other
// factor's magnitudes over the output's terms whose probability (dS) is below 2^-13 (twice the
// normal limit: the GPU's value may fall below it when the exact one does not): sum_j |v_j| for
// out, sum_i |dout_i| for dv, sum_j |k_j| for dq, sum_i |q_i| for dk (computed below).
// On top, 16-bit outputs must meet the normwise goal ||gpu - ref|| / ||ref|| <= 1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "megatron/context_parallel/load_balance.h"
#include "megatron/context_parallel/ring_attention.h"
#include "megatron/core/rng.h"
#include "megatron/ops/attention.h"
#include "megatron/ops/cuda/attention_cudnn.h"
#include "megatron/ops/cuda/attention_flash.h"
#include "megatron/ops/cuda/op_paths.h"
#include "megatron/ops/elementwise.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::AttentionParams;
using megatron::ops::cuda::CudnnAttention;
using megatron::ops::cuda::OpPath;

namespace {

class CudaAttention : public CudaTest {};

struct Dims {
  int64_t S, B, NH, G, HS;
  int64_t q_index(int64_t s, int64_t b, int64_t h, int64_t e) const { return ((s * B + b) * NH + h) * HS + e; }
  int64_t kv_index(int64_t s, int64_t b, int64_t g, int64_t e) const { return ((s * B + b) * G + g) * HS + e; }
  Shape q_shape() const { return {S, B, NH, HS}; }
  Shape kv_shape() const { return {S, B, G, HS}; }
  Shape qkv_shape() const { return {S, B, G, (NH / G + 2) * HS}; }
  ops::checks::AttentionDims checks() const { return {S, B, NH, G, HS}; }
  std::string str() const {
    return "S=" + std::to_string(S) + " B=" + std::to_string(B) + " NH=" + std::to_string(NH) +
           " G=" + std::to_string(G) + " HS=" + std::to_string(HS);
  }
};

// Absolute-value sums matching each output (see the file comment), for given f64 inputs and lse.
struct Magnitudes {
  Tensor out, dq, dk, dv;
  Tensor out_exposure, dq_exposure, dk_exposure, dv_exposure;  // f16's subnormal term (file comment)
  double sigma = 0.0;                                          // max over (b, h, i, j) of scale sum_d |q_id k_jd|
};

Magnitudes magnitudes(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                      const Tensor& out, const Tensor& lse, const AttentionParams& p) {
  Magnitudes m{Tensor::zeros(d.q_shape(), DType::f64),  Tensor::zeros(d.q_shape(), DType::f64),
               Tensor::zeros(d.kv_shape(), DType::f64), Tensor::zeros(d.kv_shape(), DType::f64),
               Tensor::zeros(d.q_shape(), DType::f64),  Tensor::zeros(d.q_shape(), DType::f64),
               Tensor::zeros(d.kv_shape(), DType::f64), Tensor::zeros(d.kv_shape(), DType::f64)};
  const CounterRng rng{p.seed, p.stream};
  const double scale = p.softmax_scale;
  const int64_t total_heads = p.total_heads == 0 ? d.NH : p.total_heads;
  const auto hidden = [&](int64_t b, int64_t i, int64_t j) {
    if (p.window >= 0 && i - j > p.window) return true;
    return p.segment_ids.defined() && p.segment_ids.item(b * d.S + i) != p.segment_ids.item(b * d.S + j);
  };
  const double* Q = q.data<double>();
  const double* K = k.data<double>();
  const double* V = v.data<double>();
  const double* DO = dout.data<double>();
  const double* O = out.data<double>();
  double *MO = m.out.data<double>(), *MQ = m.dq.data<double>(), *MK = m.dk.data<double>(), *MV = m.dv.data<double>();
  double *XO = m.out_exposure.data<double>(), *XQ = m.dq_exposure.data<double>();
  double *XK = m.dk_exposure.data<double>(), *XV = m.dv_exposure.data<double>();
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.NH; ++h) {
      const int64_t g = h / (d.NH / d.G);
      for (int64_t i = 0; i < d.S; ++i) {
        const double l = lse.item((b * d.NH + h) * d.S + i);
        double D = 0.0, abs_D = 0.0;  // sum_e dout_ie out_ie, and over absolute values
        for (int64_t e = 0; e < d.HS; ++e) {
          D += DO[d.q_index(i, b, h, e)] * O[d.q_index(i, b, h, e)];
          abs_D += std::fabs(DO[d.q_index(i, b, h, e)] * O[d.q_index(i, b, h, e)]);
        }
        for (int64_t j = 0; j < (p.causal ? i + 1 : d.S); ++j) {
          if (hidden(b, i, j)) continue;
          double s = 0.0, abs_s = 0.0, dp = 0.0, abs_dp = 0.0;
          for (int64_t e = 0; e < d.HS; ++e) {
            const double qk = Q[d.q_index(i, b, h, e)] * K[d.kv_index(j, b, g, e)];
            s += qk;
            abs_s += std::fabs(qk);
            dp += DO[d.q_index(i, b, h, e)] * V[d.kv_index(j, b, g, e)];
            abs_dp += std::fabs(DO[d.q_index(i, b, h, e)] * V[d.kv_index(j, b, g, e)]);
          }
          m.sigma = std::max(m.sigma, scale * abs_s);
          const double prob = std::exp(scale * s - l);
          const auto index = uint64_t(((b * total_heads + p.head_offset + h) * d.S + i) * d.S + j);
          const bool kept = p.dropout_p == 0.0f || rng.uniform(index) > p.dropout_p;
          const double mult = kept ? 1.0 / (1.0 - double(p.dropout_p)) : 0.0;
          const double abs_ds = prob * (mult * abs_dp + abs_D);
          const bool p_subnormal = prob * mult < 0x1p-13;
          const bool ds_subnormal = std::fabs(prob * (mult * dp - D) * scale) < 0x1p-13;
          for (int64_t e = 0; e < d.HS; ++e) {
            MO[d.q_index(i, b, h, e)] += prob * mult * std::fabs(V[d.kv_index(j, b, g, e)]);
            MV[d.kv_index(j, b, g, e)] += prob * mult * std::fabs(DO[d.q_index(i, b, h, e)]);
            MQ[d.q_index(i, b, h, e)] += scale * abs_ds * std::fabs(K[d.kv_index(j, b, g, e)]);
            MK[d.kv_index(j, b, g, e)] += scale * abs_ds * std::fabs(Q[d.q_index(i, b, h, e)]);
            if (p_subnormal) {
              XO[d.q_index(i, b, h, e)] += std::fabs(V[d.kv_index(j, b, g, e)]);
              XV[d.kv_index(j, b, g, e)] += std::fabs(DO[d.q_index(i, b, h, e)]);
            }
            if (ds_subnormal) {
              XQ[d.q_index(i, b, h, e)] += std::fabs(K[d.kv_index(j, b, g, e)]);
              XK[d.kv_index(j, b, g, e)] += std::fabs(Q[d.q_index(i, b, h, e)]);
            }
          }
        }
      }
    }
  }
  return m;
}

// |gpu - ref| <= tol (|ref| + mag) [+ 2^-25 (exposure + 1) for f16] elementwise (guards checked
// too), and for 16-bit the normwise goal. The normwise error is recorded as a test property
// (--gtest_output=xml lists them).
::testing::AssertionResult close_to(const Pair& out, const Tensor& ref, const Tensor& mag, const Tensor& exposure,
                                    double tol, DType dt, const std::string& name) {
  const double subnormal = dt == DType::f16 ? 0x1p-25 : 0.0;
  Tensor bound = Tensor::empty(ref.shape(), DType::f64);
  for (int64_t i = 0; i < ref.numel(); ++i)
    bound.set_item(i, tol * (std::fabs(ref.item(i)) + mag.item(i)) + subnormal * (exposure.item(i) + 1.0));
  ::testing::AssertionResult ok = within_bound(out, ref, bound);
  if (!ok) return ok;
  const double err = normwise_error(out.gpu.to(Device::cpu()), ref);
  ::testing::Test::RecordProperty(name, std::to_string(err));
  if ((dt == DType::bf16 || dt == DType::f16) && !(err <= 1e-2))
    return ::testing::AssertionFailure() << "normwise error " << err << " above the 16-bit goal 1e-2";
  return ::testing::AssertionSuccess() << "normwise error " << err;
}

// Which GPU code a case runs: our kernels (mma, generic: flash_attention_*, the kernel the inputs
// select), cuDNN's graphs directly, or the op as the model calls it (routed).
enum class Path { mma, generic, cudnn, routed };
const char* path_name(Path path) {
  switch (path) {
    case Path::mma:
      return "mma";
    case Path::generic:
      return "generic";
    case Path::cudnn:
      return "cudnn";
    case Path::routed:
      return "routed";
  }
  return "?";
}

struct Case {
  Dims d;
  DType dt;
  int64_t misalign;  // shifts the 16-bit tensors off 16 bytes: the generic kernels
  Path path;
  bool segmented = false;   // random documents of 1-40 tokens (document masking)
  int64_t head_offset = 0;  // as a tensor-parallel rank: heads [offset, offset + NH) of 3 NH
  int64_t window = -1;      // sliding window (left size)
  bool key_segmented = false;  // keys with documents of their own (a ring attention block)
  // Packed documents (cu_seqlens, the variable-length path) on the GPU, against the CPU's
  // segment-id path on the same documents, of the lengths `packing` draws.
  bool packed = false;
  enum class Packing { mixed, uniform, long_tailed } packing = Packing::mixed;
  // AttentionParams::deterministic: the backward then runs twice more and must repeat its bits.
  bool deterministic = false;
};

// Segment ids (B,S) i32 of documents whose lengths `draw` gives (the last of a row cut short).
Tensor segments_of(const Dims& d, const std::function<int64_t()>& draw) {
  Tensor ids = Tensor::empty({d.B, d.S}, DType::i32);
  for (int64_t b = 0; b < d.B; ++b) {
    int32_t id = 0;
    int64_t left = draw();
    for (int64_t i = 0; i < d.S; ++i, --left) {
      if (left == 0) {
        ++id;
        left = draw();
      }
      ids.data<int32_t>()[b * d.S + i] = id;
    }
  }
  return ids;
}

// Documents with random lengths in [1, longest].
Tensor random_segments(const Dims& d, uint64_t seed, int64_t longest = 40) {
  HostRng rng(seed);
  return segments_of(d, [&] { return 1 + int64_t(rng.uniform_int(uint64_t(longest))); });
}

// The documents of a packed case: mixed, 1-150 tokens (some span several tiles, some share one);
// uniform, all of S/5 tokens (the last one shorter); long-tailed, log-uniform in [1, S] (many
// short documents, a few long: the bucketed graph's padding at its largest).
Tensor packed_segments(const Case& c, uint64_t seed) {
  HostRng rng(seed);
  switch (c.packing) {
    case Case::Packing::mixed:
      return random_segments(c.d, seed, 150);
    case Case::Packing::uniform:
      return segments_of(c.d, [&] { return std::max<int64_t>(1, c.d.S / 5); });
    case Case::Packing::long_tailed:
      return segments_of(c.d, [&] { return std::max<int64_t>(1, int64_t(std::pow(double(c.d.S), rng.uniform()))); });
  }
  return {};
}
const char* packing_name(Case::Packing packing) {
  switch (packing) {
    case Case::Packing::mixed:
      return "mixed";
    case Case::Packing::uniform:
      return "uniform";
    case Case::Packing::long_tailed:
      return "long-tailed";
  }
  return "?";
}

// The keys' own documents for queries in `documents`: each key keeps its document, or (half of the
// keys past a document's first) none of the queries' (-1), so every query still sees its
// document's first key, causally or not.
Tensor hidden_keys(const Tensor& documents, uint64_t seed) {
  HostRng rng(seed);
  Tensor ids = documents.clone();
  int32_t* id = ids.data<int32_t>();
  const int64_t S = ids.dim(1);
  for (int64_t i = 0; i < ids.numel(); ++i)
    if (i % S > 0 && id[i] == documents.data<int32_t>()[i - 1] && rng.uniform_int(2) == 0) id[i] = -1;
  return ids;
}

void gpu_forward(Path path, Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const Dims& d,
                 const AttentionParams& p) {
  if (path == Path::routed) return ops::cuda::attention_forward(out, lse, q, k, v, p);
  if (path != Path::cudnn) return ops::cuda::flash_attention_forward(out, lse, q, k, v, p);
  const CudnnAttention a = ops::cuda::cudnn_attention_separate(d.checks(), q.dtype(), p);
  ASSERT_TRUE(ops::cuda::cudnn_attention_applies(a, p, {out.raw(), q.raw(), k.raw(), v.raw()}));
  ops::cuda::cudnn_attention_forward(a, out.raw(), lse.data<float>(), q.raw(), k.raw(), v.raw(), p.cu_seqlens);
}

void gpu_backward(Path path, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                  const Tensor& v, const Tensor& out, const Tensor& lse, const Dims& d, const AttentionParams& p) {
  if (path == Path::routed) return ops::cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, p);
  if (path != Path::cudnn) return ops::cuda::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, p);
  const CudnnAttention a = ops::cuda::cudnn_attention_separate(d.checks(), q.dtype(), p);
  ASSERT_TRUE(ops::cuda::cudnn_attention_applies(
      a, p, {dq.raw(), dk.raw(), dv.raw(), dout.raw(), q.raw(), k.raw(), v.raw(), out.raw()}));
  ops::cuda::cudnn_attention_backward(a, dq.raw(), dk.raw(), dv.raw(), dout.raw(), q.raw(), k.raw(), v.raw(), out.raw(),
                                      lse.data<float>(), p.cu_seqlens);
}

// The error-bound factor of one problem (file comment) and the output tolerance for dtype dt.
struct Tolerance {
  double F, out;
};
Tolerance tolerance(const Dims& d, const Magnitudes& mag, DType dt) {
  const double F = 2.0 * double(d.HS) * mag.sigma + 2.0 * double(d.NH / d.G) * double(d.S) + double(d.HS) + 16.0;
  const bool is16 = dt == DType::bf16 || dt == DType::f16;
  return {F, (is16 ? 2.0 * unit_roundoff(dt) : 0.0) + F * kUnitRoundoffF32};
}

std::string case_name(const std::string& path, DType dt, const Dims& d, bool causal, float dropout) {
  return path + " " + dtype_name(dt) + " " + d.str() + (causal ? " causal" : " full") +
         " dropout=" + std::to_string(dropout);
}

// The same bytes in two GPU tensors.
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  if (ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "the tensors differ; normwise " << normwise_error(ha, hb);
}

void check_case(const Case& c, bool causal, float dropout, uint64_t seed) {
  const Dims& d = c.d;
  AttentionParams p{causal, float(1.0 / std::sqrt(double(d.HS))), dropout, 77, stream_id("attention-test")};
  if (c.head_offset > 0) {
    p.head_offset = c.head_offset;
    p.total_heads = 3 * d.NH;
  }
  if (c.segmented) p.segment_ids = random_segments(d, seed + 5);
  p.window = c.window;
  if (c.key_segmented) p.key_segment_ids = hidden_keys(p.segment_ids, seed + 6);
  AttentionParams p_gpu = p;  // the same parameters with the segment ids on the GPU
  p_gpu.deterministic = c.deterministic;
  if (c.segmented) p_gpu.segment_ids = p.segment_ids.to(gpu());
  if (c.key_segmented) p_gpu.key_segment_ids = p.key_segment_ids.to(gpu());
  if (c.packed) {  // the CPU oracle keeps the segment ids, the GPU gets the same documents packed
    p.segment_ids = packed_segments(c, seed + 5);
    const Tensor cu_seqlens = ops::packed_cu_seqlens(p.segment_ids);
    p_gpu.cu_seqlens = cu_seqlens.to(gpu());
    p_gpu.max_seqlen = ops::longest_document(cu_seqlens);  // as the model passes it
  }
  const std::string what =
      case_name(path_name(c.path), c.dt, d, causal, dropout) + (c.segmented ? " segmented" : "") + " heads from " +
      std::to_string(c.head_offset) + " window " + std::to_string(c.window) + (c.key_segmented ? " key segments" : "") +
      (c.packed ? std::string(" packed ") + packing_name(c.packing) : "") + (c.deterministic ? " deterministic" : "");
  SCOPED_TRACE(what);
  const Pair q = random_pair(d.q_shape(), c.dt, seed, 1.0, c.misalign);
  const Pair k = random_pair(d.kv_shape(), c.dt, seed + 1, 1.0, c.misalign);
  const Pair v = random_pair(d.kv_shape(), c.dt, seed + 2, 1.0, c.misalign);
  const Pair dout = random_pair(d.q_shape(), c.dt, seed + 3, 1.0, c.misalign);
  Pair out = poisoned_pair(d.q_shape(), c.dt, c.misalign), lse = poisoned_pair({d.B, d.NH, d.S}, DType::f32);
  gpu_forward(c.path, out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, d, p_gpu);

  const Tensor q64 = f64(q.cpu), k64 = f64(k.cpu), v64 = f64(v.cpu), dout64 = f64(dout.cpu);
  Tensor ref_out = poisoned(d.q_shape(), DType::f64), ref_lse = poisoned({d.B, d.NH, d.S}, DType::f64);
  ops::cpu::attention_forward(ref_out, ref_lse, q64, k64, v64, p);

  // Backward runs on the GPU's forward results on both sides, so both compute the same function.
  const Tensor gpu_out = out.gpu.to(Device::cpu()), gpu_lse = lse.gpu.to(Device::cpu());
  const Pair out_in = pair_of(gpu_out, c.misalign), lse_in = pair_of(gpu_lse);
  Pair dq = poisoned_pair(d.q_shape(), c.dt, c.misalign), dk = poisoned_pair(d.kv_shape(), c.dt, c.misalign);
  Pair dv = poisoned_pair(d.kv_shape(), c.dt, c.misalign);
  gpu_backward(c.path, dq.gpu, dk.gpu, dv.gpu, dout.gpu, q.gpu, k.gpu, v.gpu, out_in.gpu, lse_in.gpu, d, p_gpu);
  for (int again = 0; c.deterministic && again < 2; ++again) {
    Tensor dq2 = Tensor::empty(dq.gpu.shape(), c.dt, gpu()), dk2 = Tensor::empty(dk.gpu.shape(), c.dt, gpu());
    Tensor dv2 = Tensor::empty(dv.gpu.shape(), c.dt, gpu());
    gpu_backward(c.path, dq2, dk2, dv2, dout.gpu, q.gpu, k.gpu, v.gpu, out_in.gpu, lse_in.gpu, d, p_gpu);
    EXPECT_TRUE(same_bits(dq2, dq.gpu)) << "dq, run " << again + 2;
    EXPECT_TRUE(same_bits(dk2, dk.gpu)) << "dk, run " << again + 2;
    EXPECT_TRUE(same_bits(dv2, dv.gpu)) << "dv, run " << again + 2;
  }
  Tensor ref_dq = poisoned(d.q_shape(), DType::f64), ref_dk = poisoned(d.kv_shape(), DType::f64);
  Tensor ref_dv = poisoned(d.kv_shape(), DType::f64);
  const Tensor out64 = f64(gpu_out), lse64 = f64(gpu_lse);
  ops::cpu::attention_backward(ref_dq, ref_dk, ref_dv, dout64, q64, k64, v64, out64, lse64, p);

  const Magnitudes mag = magnitudes(d, q64, k64, v64, dout64, out64, lse64, p);
  const Tolerance tol = tolerance(d, mag, c.dt);
  // lse (f32 on both dtypes): the score error HS u sigma, the sum's S u, a few ulps of log.
  const Tensor ones = filled(ref_lse.shape(), DType::f64, 1.0);
  EXPECT_TRUE(close_to(lse, ref_lse, ones, ones, tol.F * kUnitRoundoffF32, DType::f32, what + " lse"));
  EXPECT_TRUE(close_to(out, ref_out, mag.out, mag.out_exposure, tol.out, c.dt, what + " out"));
  EXPECT_TRUE(close_to(dq, ref_dq, mag.dq, mag.dq_exposure, tol.out, c.dt, what + " dq"));
  EXPECT_TRUE(close_to(dk, ref_dk, mag.dk, mag.dk_exposure, tol.out, c.dt, what + " dk"));
  EXPECT_TRUE(close_to(dv, ref_dv, mag.dv, mag.dv_exposure, tol.out, c.dt, what + " dv"));
}

void check_all_variants(const Case& c, uint64_t seed) {
  for (bool causal : {true, false}) {
    for (float dropout : {0.0f, 0.2f}) check_case(c, causal, dropout, seed += 10);
  }
}

// attention_forward_qkv / attention_backward_qkv: q, k, v read in place from qkv (MHA on cuDNN) or
// split out around the separate op; against split + the CPU op (+ merge) in f64.
// With documents (segment ids (B,S), or undefined), the GPU gets them packed (cu_seqlens).
void check_fused_case(const Dims& d, DType dt, bool causal, float dropout, uint64_t seed,
                      const Tensor& documents = {}) {
  AttentionParams p{causal, float(1.0 / std::sqrt(double(d.HS))), dropout, 77, stream_id("attention-test")};
  AttentionParams p_gpu = p;
  if (documents.defined()) {
    p.segment_ids = documents;
    const Tensor cu_seqlens = ops::packed_cu_seqlens(documents);
    p_gpu.cu_seqlens = cu_seqlens.to(gpu());
    p_gpu.max_seqlen = ops::longest_document(cu_seqlens);
  }
  const std::string what = case_name("fused", dt, d, causal, dropout) + (documents.defined() ? " packed" : "");
  SCOPED_TRACE(what);
  const Pair qkv = random_pair(d.qkv_shape(), dt, seed), dout = random_pair(d.q_shape(), dt, seed + 3);
  Pair out = poisoned_pair(d.q_shape(), dt), lse = poisoned_pair({d.B, d.NH, d.S}, DType::f32);
  ops::cuda::attention_forward_qkv(out.gpu, lse.gpu, qkv.gpu, d.NH, p_gpu);

  const Tensor qkv64 = f64(qkv.cpu), dout64 = f64(dout.cpu);
  Tensor q64 = Tensor::empty(d.q_shape(), DType::f64), k64 = Tensor::empty(d.kv_shape(), DType::f64);
  Tensor v64 = Tensor::empty(d.kv_shape(), DType::f64);
  ops::cpu::qkv_split(q64, k64, v64, qkv64);
  Tensor ref_out = poisoned(d.q_shape(), DType::f64), ref_lse = poisoned({d.B, d.NH, d.S}, DType::f64);
  ops::cpu::attention_forward(ref_out, ref_lse, q64, k64, v64, p);

  const Tensor gpu_out = out.gpu.to(Device::cpu()), gpu_lse = lse.gpu.to(Device::cpu());
  const Pair out_in = pair_of(gpu_out), lse_in = pair_of(gpu_lse);
  Pair dqkv = poisoned_pair(d.qkv_shape(), dt);
  ops::cuda::attention_backward_qkv(dqkv.gpu, dout.gpu, qkv.gpu, out_in.gpu, lse_in.gpu, d.NH, p_gpu);
  Tensor ref_dq = poisoned(d.q_shape(), DType::f64), ref_dk = poisoned(d.kv_shape(), DType::f64);
  Tensor ref_dv = poisoned(d.kv_shape(), DType::f64), ref_dqkv = poisoned(d.qkv_shape(), DType::f64);
  const Tensor out64 = f64(gpu_out), lse64 = f64(gpu_lse);
  ops::cpu::attention_backward(ref_dq, ref_dk, ref_dv, dout64, q64, k64, v64, out64, lse64, p);
  ops::cpu::qkv_merge(ref_dqkv, ref_dq, ref_dk, ref_dv);

  const Magnitudes mag = magnitudes(d, q64, k64, v64, dout64, out64, lse64, p);
  Tensor mag_dqkv = poisoned(d.qkv_shape(), DType::f64), exposure_dqkv = poisoned(d.qkv_shape(), DType::f64);
  ops::cpu::qkv_merge(mag_dqkv, mag.dq, mag.dk, mag.dv);
  ops::cpu::qkv_merge(exposure_dqkv, mag.dq_exposure, mag.dk_exposure, mag.dv_exposure);
  const Tolerance tol = tolerance(d, mag, dt);
  const Tensor ones = filled(ref_lse.shape(), DType::f64, 1.0);
  EXPECT_TRUE(close_to(lse, ref_lse, ones, ones, tol.F * kUnitRoundoffF32, DType::f32, what + " lse"));
  EXPECT_TRUE(close_to(out, ref_out, mag.out, mag.out_exposure, tol.out, dt, what + " out"));
  EXPECT_TRUE(close_to(dqkv, ref_dqkv, mag_dqkv, exposure_dqkv, tol.out, dt, what + " dqkv"));
}

// ---- what one context-parallel rank computes over the ring (context_parallel/ring_attention.h) --

using context_parallel::CpChunks;

// Rows [from, from + n) of a sequence-major host tensor copied to rows [at, at + n) of dst.
void copy_rows(Tensor& dst, int64_t at, const Tensor& src, int64_t from, int64_t n) {
  const size_t row = size_t(src.numel() / src.dim(0)) * src.element_size();
  std::memcpy(static_cast<char*>(dst.raw()) + size_t(at) * row,
              static_cast<const char*>(src.raw()) + size_t(from) * row, size_t(n) * row);
}

// A CP rank's rows of a sequence-major host tensor: chunk `first`, then chunk `second`.
Tensor rank_rows(const Tensor& full, const CpChunks& c) {
  Shape shape = full.shape();
  shape[0] = 2 * c.length;
  Tensor local = Tensor::empty(shape, full.dtype());
  for (int half = 0; half < 2; ++half) copy_rows(local, half * c.length, full, c.start(half), c.length);
  return local;
}

// Half `half` of the last (the rank's sequence) dim of a host tensor: lse (B,NH,2L), segment ids (B,2L).
Tensor sequence_half(const Tensor& t, int half) {
  const int64_t S = t.dim(-1), L = S / 2, rows = t.numel() / S;
  const size_t es = t.element_size();
  Shape shape = t.shape();
  shape.back() = L;
  Tensor out = Tensor::empty(shape, t.dtype());
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(out.raw()) + size_t(i * L) * es,
                static_cast<const char*>(t.raw()) + size_t(i * S + half * L) * es, size_t(L) * es);
  return out;
}

// A rank's results put back at their true positions: rows of a sequence-major tensor, or the last
// dim of lse.
void place_rows(Tensor& full, const Tensor& local_gpu, const CpChunks& c) {
  const Tensor local = local_gpu.to(Device::cpu());
  for (int half = 0; half < 2; ++half) copy_rows(full, c.start(half), local, half * c.length, c.length);
}
void place_lse(Tensor& full, const Tensor& local_gpu, const CpChunks& c) {
  const Tensor local = local_gpu.to(Device::cpu());
  const int64_t S = full.dim(-1), L = c.length, rows = full.numel() / S;
  for (int64_t i = 0; i < rows; ++i)
    for (int half = 0; half < 2; ++half)
      std::memcpy(full.data<float>() + i * S + c.start(half), local.data<float>() + i * 2 * L + half * L,
                  size_t(L) * sizeof(float));
}

// One rank's operands (on the GPU) and results.
struct RingRank {
  CpChunks chunks;
  Tensor q, k, v, dout, out, lse, dq, dk, dv;
  AttentionParams params;           // causal, with the rank's segment ids (B,2L) under documents
  std::array<Tensor, 2> segments;  // (B,L) per chunk under documents
  std::array<Tensor, 2> lse_halves;
};

// A ring block's operands: local query chunk b.q_half of `rank` over key chunk b.kv_half of `held`,
// unmasked but for documents (ring_attention.cpp's block_operands).
AttentionParams block_params(const RingRank& rank, const RingRank& held, const context_parallel::RingBlock& b) {
  AttentionParams p = rank.params;
  p.causal = false;
  p.segment_ids = rank.segments[size_t(b.q_half)];
  p.key_segment_ids = held.segments[size_t(b.kv_half)];
  return p;
}
Tensor half_rows(const Tensor& t, int half, int64_t L) { return t.slice(half * L, (half + 1) * L); }

// Every rank of a CP group of C runs, on this one GPU, what ring_attention_forward/backward run:
// step 0's causal attention over its own rows, then at step i the blocks of ring_step_blocks over
// the keys of rank (r - i) mod C, merged by attention_merge; backward adds each block's dq to the
// rank's rows and its dk, dv to the key owner's (add_scaled, in bf16, as the ring does). The
// results at their true positions are checked against the CPU's full attention in f64.
void check_ring(const Dims& d, int64_t C, bool documents, uint64_t seed) {
  const DType dt = DType::bf16;
  const std::string what = "ring C=" + std::to_string(C) + " " + d.str() + (documents ? " documents" : "");
  SCOPED_TRACE(what);
  AttentionParams p{true, float(1.0 / std::sqrt(double(d.HS))), 0.0f, 0, 0};
  if (documents) p.segment_ids = random_segments(d, seed + 5);
  const Tensor q = randn(d.q_shape(), dt, seed), k = randn(d.kv_shape(), dt, seed + 1);
  const Tensor v = randn(d.kv_shape(), dt, seed + 2), dout = randn(d.q_shape(), dt, seed + 3);
  std::vector<RingRank> ranks(static_cast<size_t>(C));
  for (int64_t r = 0; r < C; ++r) {
    RingRank& rank = ranks[size_t(r)];
    rank.chunks = context_parallel::cp_chunks(d.S, C, r);
    rank.q = rank_rows(q, rank.chunks).to(gpu());
    rank.k = rank_rows(k, rank.chunks).to(gpu());
    rank.v = rank_rows(v, rank.chunks).to(gpu());
    rank.dout = rank_rows(dout, rank.chunks).to(gpu());
    rank.params = AttentionParams{p.causal, p.softmax_scale, 0.0f, 0, 0};
    if (documents) {
      const Tensor local = context_parallel::split_sequence(p.segment_ids, C, r);
      rank.params.segment_ids = local.to(gpu());
      for (int h = 0; h < 2; ++h) rank.segments[size_t(h)] = sequence_half(local, h).to(gpu());
    }
  }
  const int64_t L = d.S / (2 * C);
  Tensor block_out = Tensor::empty({L, d.B, d.NH, d.HS}, dt, gpu());
  Tensor block_lse = Tensor::empty({d.B, d.NH, L}, DType::f32, gpu());
  for (int64_t r = 0; r < C; ++r) {
    RingRank& rank = ranks[size_t(r)];
    rank.out = Tensor::empty({2 * L, d.B, d.NH, d.HS}, dt, gpu());
    rank.lse = Tensor::empty({d.B, d.NH, 2 * L}, DType::f32, gpu());
    ops::attention_forward(rank.out, rank.lse, rank.q, rank.k, rank.v, rank.params);
    for (int64_t step = 1; step < C; ++step) {
      const RingRank& held = ranks[size_t((r - step + C) % C)];
      for (const context_parallel::RingBlock& b : context_parallel::ring_step_blocks(step, r, C)) {
        ops::attention_forward(block_out, block_lse, half_rows(rank.q, b.q_half, L), half_rows(held.k, b.kv_half, L),
                               half_rows(held.v, b.kv_half, L), block_params(rank, held, b));
        ops::attention_merge(rank.out, rank.lse, block_out, block_lse, b.q_half * L);
      }
    }
  }
  // Backward: every rank's step 0 first, which overwrites dq and starts its own keys' dk, dv.
  for (RingRank& rank : ranks) {
    rank.dq = Tensor::empty(rank.q.shape(), dt, gpu());
    rank.dk = Tensor::empty(rank.k.shape(), dt, gpu());
    rank.dv = Tensor::empty(rank.v.shape(), dt, gpu());
    ops::attention_backward(rank.dq, rank.dk, rank.dv, rank.dout, rank.q, rank.k, rank.v, rank.out, rank.lse,
                            rank.params);
    const Tensor lse_host = rank.lse.to(Device::cpu());
    for (int h = 0; h < 2; ++h) rank.lse_halves[size_t(h)] = sequence_half(lse_host, h).to(gpu());
  }
  Tensor dq_block = Tensor::empty({L, d.B, d.NH, d.HS}, dt, gpu());
  Tensor dk_block = Tensor::empty({L, d.B, d.G, d.HS}, dt, gpu()), dv_block = Tensor::empty(dk_block.shape(), dt, gpu());
  for (int64_t r = 0; r < C; ++r) {
    RingRank& rank = ranks[size_t(r)];
    for (int64_t step = 1; step < C; ++step) {
      RingRank& held = ranks[size_t((r - step + C) % C)];
      for (const context_parallel::RingBlock& b : context_parallel::ring_step_blocks(step, r, C)) {
        ops::attention_backward(dq_block, dk_block, dv_block, half_rows(rank.dout, b.q_half, L),
                                half_rows(rank.q, b.q_half, L), half_rows(held.k, b.kv_half, L),
                                half_rows(held.v, b.kv_half, L), half_rows(rank.out, b.q_half, L),
                                rank.lse_halves[size_t(b.q_half)], block_params(rank, held, b));
        Tensor dq_rows = half_rows(rank.dq, b.q_half, L), dk_rows = half_rows(held.dk, b.kv_half, L);
        Tensor dv_rows = half_rows(held.dv, b.kv_half, L);
        ops::add_scaled(dq_rows, dq_block, 1.0f);
        ops::add_scaled(dk_rows, dk_block, 1.0f);
        ops::add_scaled(dv_rows, dv_block, 1.0f);
      }
    }
  }
  Tensor out = Tensor::empty(d.q_shape(), dt), lse = Tensor::empty({d.B, d.NH, d.S}, DType::f32);
  Tensor dq = Tensor::empty(d.q_shape(), dt), dk = Tensor::empty(d.kv_shape(), dt), dv = Tensor::empty(d.kv_shape(), dt);
  for (const RingRank& rank : ranks) {
    place_rows(out, rank.out, rank.chunks);
    place_lse(lse, rank.lse, rank.chunks);
    place_rows(dq, rank.dq, rank.chunks);
    place_rows(dk, rank.dk, rank.chunks);
    place_rows(dv, rank.dv, rank.chunks);
  }

  // The reference: the CPU op over the whole sequence in f64; backward from the ring's out and lse,
  // as check_case does, so both sides differentiate the same function.
  const Tensor q64 = f64(q), k64 = f64(k), v64 = f64(v), dout64 = f64(dout);
  Tensor ref_out = poisoned(d.q_shape(), DType::f64), ref_lse = poisoned({d.B, d.NH, d.S}, DType::f64);
  ops::cpu::attention_forward(ref_out, ref_lse, q64, k64, v64, p);
  const Tensor out64 = f64(out), lse64 = f64(lse);
  Tensor ref_dq = poisoned(d.q_shape(), DType::f64), ref_dk = poisoned(d.kv_shape(), DType::f64);
  Tensor ref_dv = poisoned(d.kv_shape(), DType::f64);
  ops::cpu::attention_backward(ref_dq, ref_dk, ref_dv, dout64, q64, k64, v64, out64, lse64, p);

  // Tolerance: the single op's (file comment) plus one bf16 rounding per merge or add_scaled that
  // an element goes through. A row merges at most 2 blocks per step, and a key chunk receives at
  // most 2 blocks from each other rank: 2 (C - 1) roundings more. lse: each merge's exp, log and
  // add, a few f32 ulps of (|lse| + 1) per merge, 16 counted.
  const Magnitudes mag = magnitudes(d, q64, k64, v64, dout64, out64, lse64, p);
  const Tolerance tol = tolerance(d, mag, dt);
  const double ring_tol = tol.out + 2.0 * double(C - 1) * unit_roundoff(dt);
  const Tensor ones = filled(ref_lse.shape(), DType::f64, 1.0);
  EXPECT_TRUE(close_to(pair_of(lse), ref_lse, ones, ones, (tol.F + 16.0 * double(C - 1)) * kUnitRoundoffF32,
                       DType::f32, what + " lse"));
  EXPECT_TRUE(close_to(pair_of(out), ref_out, mag.out, mag.out_exposure, ring_tol, dt, what + " out"));
  EXPECT_TRUE(close_to(pair_of(dq), ref_dq, mag.dq, mag.dq_exposure, ring_tol, dt, what + " dq"));
  EXPECT_TRUE(close_to(pair_of(dk), ref_dk, mag.dk, mag.dk_exposure, ring_tol, dt, what + " dk"));
  EXPECT_TRUE(close_to(pair_of(dv), ref_dv, mag.dv, mag.dv_exposure, ring_tol, dt, what + " dv"));
}

}  // namespace

// The ring's blocks and merges on one GPU within bf16 tolerance of full attention (check_ring):
// CP = 2 and 4, GQA at head dims 64 (the blocks on cuDNN, as the model routes them) and 128, with
// and without documents (the blocks then on our kernels, with the keys' own segment ids).
TEST_F(CudaAttention, RingBlocksAndMergeMatchFullAttention) {
  uint64_t seed = 8000;
  for (const int64_t C : {int64_t(2), int64_t(4)}) {
    check_ring({256, 2, 4, 2, 64}, C, false, seed += 100);
    check_ring({256, 1, 4, 2, 128}, C, false, seed += 100);
    check_ring({256, 2, 4, 2, 64}, C, true, seed += 100);
  }
}

// S = 37: one partial tile; S = 130, 200 and 300: several key tiles (online-softmax rescaling, the
// double-buffered pipeline) with a partial last one, and in the backward several key blocks, whose
// causal diagonal steps skip the warps of keys after the query tile.
TEST_F(CudaAttention, TensorCorePathMatchesCpuF64) {
  const Case cases[] = {
      {{37, 2, 4, 2, 16}, DType::bf16, 0, Path::mma},   {{37, 2, 4, 2, 64}, DType::bf16, 0, Path::mma},
      {{37, 2, 4, 2, 128}, DType::bf16, 0, Path::mma},  {{200, 1, 4, 1, 64}, DType::bf16, 0, Path::mma},
      {{130, 2, 2, 2, 128}, DType::bf16, 0, Path::mma}, {{70, 1, 4, 4, 32}, DType::bf16, 0, Path::mma},
      {{300, 1, 4, 2, 64}, DType::bf16, 0, Path::mma},
  };
  uint64_t seed = 1000;
  for (const Case& c : cases) check_all_variants(c, seed += 100);
}

// f16 (--fp16) takes the same tensor-core kernels; document masking and tensor-parallel head
// offsets (dropout's global head index) on both paths.
TEST_F(CudaAttention, F16SegmentsAndHeadOffsetsMatchCpuF64) {
  const Case cases[] = {
      {{130, 2, 4, 2, 64}, DType::f16, 0, Path::mma},
      {{130, 2, 2, 2, 128}, DType::f16, 0, Path::mma},
      {{200, 2, 4, 2, 64}, DType::bf16, 0, Path::mma, true},
      {{130, 1, 2, 2, 128}, DType::bf16, 0, Path::mma, true, 2},
      {{70, 2, 4, 2, 64}, DType::f16, 0, Path::mma, true, 4},
      {{70, 2, 4, 2, 24}, DType::f16, 0, Path::generic, true, 4},
      {{70, 1, 2, 1, 64}, DType::f32, 0, Path::generic, true},
      {{130, 2, 4, 2, 64}, DType::bf16, 0, Path::routed, true},  // segment ids keep the op off cuDNN
  };
  uint64_t seed = 4000;
  for (const Case& c : cases) check_all_variants(c, seed += 100);
}

// Keys with segment ids of their own (context parallelism's ring blocks) on both paths and routed.
TEST_F(CudaAttention, KeySegmentIdsMatchCpuF64) {
  const Case cases[] = {
      {{130, 2, 4, 2, 64}, DType::bf16, 0, Path::mma, true, 0, -1, true},
      {{70, 1, 2, 1, 24}, DType::f32, 0, Path::generic, true, 0, -1, true},
      {{130, 2, 4, 2, 128}, DType::bf16, 0, Path::routed, true, 0, -1, true},
  };
  uint64_t seed = 6000;
  for (const Case& c : cases) check_all_variants(c, seed += 100);
}

// The variable-length path (packed documents, cu_seqlens) on both kernels and routed (two rows keep
// the op off cuDNN's ragged batch), with several rows, tensor-parallel head offsets, windows and f16: the kernels skip
// the key tiles outside each query tile's documents and mask only the tiles on a boundary, so these
// cases cover tiles wholly inside, wholly outside and across documents, forward and backward.
TEST_F(CudaAttention, PackedDocumentsMatchCpuF64) {
  const Case cases[] = {
      {{300, 2, 4, 2, 64}, DType::bf16, 0, Path::mma, false, 0, -1, false, true},
      {{300, 1, 4, 2, 128}, DType::bf16, 0, Path::mma, false, 0, -1, false, true},
      {{200, 2, 4, 2, 64}, DType::f16, 0, Path::mma, false, 4, -1, false, true},
      {{130, 2, 4, 2, 64}, DType::bf16, 0, Path::mma, false, 0, 17, false, true},
      {{70, 2, 4, 2, 24}, DType::f32, 0, Path::generic, false, 0, -1, false, true},
      {{130, 2, 4, 2, 64}, DType::bf16, 1, Path::generic, false, 0, -1, false, true},
      {{300, 2, 4, 2, 64}, DType::bf16, 0, Path::routed, false, 0, -1, false, true},
  };
  uint64_t seed = 7000;
  for (const Case& c : cases) check_all_variants(c, seed += 100);
}

// The log-sum-exp merge of a block of rows at an offset into running (out, lse), some of the
// block's rows having seen no key (lse -inf: left as they were). out rounds once into its dtype
// from float arithmetic on both sides, whose exp and log may differ by a few f32 ulps: 2 u of the
// dtype plus 16 f32 u. lse is float on both: 16 u.
TEST_F(CudaAttention, MergeMatchesCpu) {
  const int64_t S = 16, Sb = 8, B = 2, NH = 3, HS = 24, offset = 5;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Pair out = random_pair({S, B, NH, HS}, dt, 1), lse = random_pair({B, NH, S}, DType::f32, 2, 2.0);
    const Pair block_out = random_pair({Sb, B, NH, HS}, dt, 3);
    Tensor block_lse = randn({B, NH, Sb}, DType::f32, 4, 2.0);
    for (int64_t i = 0; i < block_lse.numel(); i += 5) block_lse.set_item(i, -INFINITY);
    const Pair block_lse_pair = pair_of(block_lse);
    ops::cuda::attention_merge(out.gpu, lse.gpu, block_out.gpu, block_lse_pair.gpu, offset);
    ops::cpu::attention_merge(out.cpu, lse.cpu, block_out.cpu, block_lse_pair.cpu, offset);
    EXPECT_TRUE(matches_cpu(out, unit_roundoff(dt), 2.0 + 16.0 * kUnitRoundoffF32 / unit_roundoff(dt)));
    EXPECT_TRUE(matches_cpu(lse, kUnitRoundoffF32, 16.0));
  }
}

// Sliding windows (Mistral): narrower than a tile, across tiles, with documents, on both paths,
// and routed (a window keeps the op off cuDNN).
TEST_F(CudaAttention, SlidingWindowsMatchCpuF64) {
  const Case cases[] = {
      {{130, 2, 4, 2, 64}, DType::bf16, 0, Path::mma, false, 0, 5},
      {{200, 1, 4, 2, 128}, DType::bf16, 0, Path::mma, false, 0, 70},
      {{130, 2, 4, 2, 64}, DType::f16, 0, Path::mma, true, 0, 17},
      {{70, 2, 4, 2, 24}, DType::f32, 0, Path::generic, false, 0, 3},
      {{130, 2, 4, 2, 64}, DType::bf16, 0, Path::routed, false, 0, 31},
  };
  uint64_t seed = 6000;
  for (const Case& c : cases) check_all_variants(c, seed += 100);
}

TEST_F(CudaAttention, GenericPathMatchesCpuF64) {
  const Case cases[] = {
      {{37, 2, 4, 2, 16}, DType::f32, 0, Path::generic},
      {{70, 1, 2, 1, 64}, DType::f32, 0, Path::generic},
      {{37, 2, 4, 2, 24}, DType::bf16, 0, Path::generic},  // head dim without a tensor-core kernel
      {{37, 2, 4, 2, 64}, DType::bf16, 1, Path::generic},  // misaligned tensors
  };
  uint64_t seed = 2000;
  for (const Case& c : cases) check_all_variants(c, seed += 100);
}

TEST_F(CudaAttention, QkvSplitAndMergeEqualCpu) {
  uint64_t seed = 3000;
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t HS : {int64_t(16), int64_t(6)}) {  // 16: 16-byte copies; 6 bf16 = 12 bytes: element copies
      const int64_t S = 5, B = 2, NH = 6, G = 2, r = NH / G;
      const Pair qkv = random_pair({S, B, G, (r + 2) * HS}, dt, ++seed);
      Pair q = poisoned_pair({S, B, NH, HS}, dt), k = poisoned_pair({S, B, G, HS}, dt);
      Pair v = poisoned_pair({S, B, G, HS}, dt);
      ops::cuda::qkv_split(q.gpu, k.gpu, v.gpu, qkv.gpu);
      ops::cpu::qkv_split(q.cpu, k.cpu, v.cpu, qkv.cpu);
      EXPECT_TRUE(equals_cpu(q)) << dtype_name(dt) << " HS=" << HS << " q";
      EXPECT_TRUE(equals_cpu(k)) << dtype_name(dt) << " HS=" << HS << " k";
      EXPECT_TRUE(equals_cpu(v)) << dtype_name(dt) << " HS=" << HS << " v";
      Pair merged = poisoned_pair(qkv.cpu.shape(), dt);
      ops::cuda::qkv_merge(merged.gpu, q.gpu, k.gpu, v.gpu);
      ops::cpu::qkv_merge(merged.cpu, q.cpu, k.cpu, v.cpu);
      EXPECT_TRUE(equals_cpu(merged)) << dtype_name(dt) << " HS=" << HS << " merge";
    }
  }
}

TEST_F(CudaAttention, RejectsF64AndBadGrouping) {
  const AttentionParams p{true, 0.5f, 0.0f, 0, 0};
  Tensor q = Tensor::zeros({4, 1, 2, 16}, DType::f64, gpu()), kv = Tensor::zeros({4, 1, 1, 16}, DType::f64, gpu());
  Tensor out = Tensor::zeros({4, 1, 2, 16}, DType::f64, gpu()), lse = Tensor::zeros({1, 2, 4}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::attention_forward(out, lse, q, kv, kv, p); }, "f64"));
  Tensor q3 = Tensor::zeros({4, 1, 3, 16}, DType::f32, gpu()), kv2 = Tensor::zeros({4, 1, 2, 16}, DType::f32, gpu());
  Tensor out3 = Tensor::zeros({4, 1, 3, 16}, DType::f32, gpu()), lse3 = Tensor::zeros({1, 3, 4}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::attention_forward(out3, lse3, q3, kv2, kv2, p); }, "NH % G"));
}

// cuDNN's graphs: bf16 and f16, head dims 64 and 128, MHA, GQA and MQA, partial and several tiles.
TEST_F(CudaAttention, CudnnPathMatchesCpuF64) {
  const Case cases[] = {
      {{37, 2, 4, 2, 64}, DType::bf16, 0, Path::cudnn},   {{37, 2, 4, 2, 128}, DType::bf16, 0, Path::cudnn},
      {{200, 1, 4, 1, 64}, DType::bf16, 0, Path::cudnn},  {{130, 2, 2, 2, 128}, DType::bf16, 0, Path::cudnn},
      {{300, 1, 4, 4, 64}, DType::f16, 0, Path::cudnn},   {{70, 2, 4, 2, 128}, DType::f16, 0, Path::cudnn},
      {{130, 1, 4, 2, 64}, DType::bf16, 0, Path::routed},  // the op, routed to cuDNN
  };
  uint64_t seed = 4000;
  for (const Case& c : cases) {
    for (bool causal : {true, false}) check_case(c, causal, 0.0f, seed += 10);
  }
}

// Packed documents on cuDNN's ragged batch (attention_cudnn.h), directly and routed: uniform, mixed
// and long-tailed lengths (the bucketed graph's padding entries and padded stats), MHA, GQA and MQA,
// head dims 64 and 128, bf16 and f16, causal and not, forward and backward, within the tolerances
// of the file comment. The routed cases also check through op_paths that cuDNN ran them.
TEST_F(CudaAttention, CudnnPackedDocumentsMatchCpuF64) {
  if (!ops::cuda::cudnn_ragged_batch_supported())
    GTEST_SKIP() << "cuDNN " << ops::cuda::cudnn_runtime_version()
                 << " on this GPU has no ragged batch (needs cuDNN 9.6+, sm_90+): packed documents run on our kernels";
  using P = Case::Packing;
  const Case cases[] = {
      {{300, 1, 4, 2, 64}, DType::bf16, 0, Path::cudnn, false, 0, -1, false, true, P::uniform},
      {{300, 1, 4, 2, 128}, DType::bf16, 0, Path::cudnn, false, 0, -1, false, true, P::uniform},
      {{300, 1, 4, 2, 64}, DType::bf16, 0, Path::cudnn, false, 0, -1, false, true, P::long_tailed},
      {{400, 1, 4, 2, 128}, DType::bf16, 0, Path::cudnn, false, 0, -1, false, true, P::long_tailed},
      {{300, 1, 4, 1, 64}, DType::bf16, 0, Path::cudnn, false, 0, -1, false, true, P::mixed},
      {{200, 1, 4, 4, 128}, DType::f16, 0, Path::cudnn, false, 0, -1, false, true, P::mixed},
      {{260, 1, 4, 2, 64}, DType::bf16, 0, Path::routed, false, 0, -1, false, true, P::long_tailed},
      {{260, 1, 4, 2, 128}, DType::bf16, 0, Path::routed, false, 0, -1, false, true, P::uniform},
  };
  uint64_t seed = 8000;
  for (const Case& c : cases) {
    for (bool causal : {true, false}) {
      const int64_t forward = ops::cuda::op_path_count(OpPath::attention_forward_cudnn_packed);
      const int64_t backward = ops::cuda::op_path_count(OpPath::attention_backward_cudnn_packed);
      check_case(c, causal, 0.0f, seed += 10);
      EXPECT_EQ(ops::cuda::op_path_count(OpPath::attention_forward_cudnn_packed), forward + 1)
          << packing_name(c.packing) << " " << c.d.str() << ": the forward did not run on cuDNN's ragged batch";
      EXPECT_EQ(ops::cuda::op_path_count(OpPath::attention_backward_cudnn_packed), backward + 1)
          << packing_name(c.packing) << " " << c.d.str() << ": the backward did not run on cuDNN's ragged batch";
    }
  }
}

// The graph shape of packed documents, worked by hand (no GPU needed): documents rounded up to a
// power of two, the longest document (max_seqlen, 0 = S) to a power of two of at least 64 and at
// most S rounded up to 64; the operands' own B, S and strides kept for the offsets.
TEST(CudnnAttentionShape, BucketsPackedDocuments) {
  const Dims d{300, 1, 4, 2, 64};
  const auto shape = [&](std::vector<float> cu, int64_t max_seqlen) {
    AttentionParams p{true, 0.125f, 0.0f, 5, 6};
    p.cu_seqlens = Tensor::from_vector(cu, {int64_t(cu.size())}, DType::i32);
    p.max_seqlen = max_seqlen;
    return ops::cuda::cudnn_attention_separate(d.checks(), DType::bf16, p);
  };
  const CudnnAttention five = shape({0, 10, 110, 200, 250, 300}, 100);
  EXPECT_TRUE(five.packed());
  EXPECT_EQ(five.B, 8);
  EXPECT_EQ(five.S, 128);
  EXPECT_EQ(five.packed_rows, 1);
  EXPECT_EQ(five.packed_row_length, 300);
  EXPECT_EQ(five.q_strides, (std::array<int64_t, 3>{4 * 64, 64, 4 * 64}));
  EXPECT_EQ(shape({0, 10, 110, 200, 250, 300}, 10).S, 64);  // at least 64
  EXPECT_EQ(shape({0, 10, 110, 200, 250, 300}, 0).S, 320);  // S = 300: 512 capped at 320
  EXPECT_EQ(shape({0, 300}, 300).B, 1);
  EXPECT_EQ(shape({0, 1, 2, 3, 4, 5, 6, 7, 8, 300}, 292).B, 16);  // 9 documents
  const CudnnAttention rows =
      ops::cuda::cudnn_attention_separate(d.checks(), DType::bf16, AttentionParams{true, 0.125f, 0.0f, 5, 6});
  EXPECT_FALSE(rows.packed());
  EXPECT_EQ(rows.B, 1);
  EXPECT_EQ(rows.S, 300);
}

// cuDNN reads k and v from qkv and writes dk and dv into dqkv in place, q and dq too for MHA (GQA's
// through a copy); dropout and head dim 32 split and merge around our kernels.
TEST_F(CudaAttention, FusedQkvMatchesCpuF64) {
  struct FusedCase {
    Dims d;
    DType dt;
    float dropout;
  };
  const FusedCase cases[] = {
      {{70, 2, 4, 4, 64}, DType::bf16, 0.0f}, {{37, 2, 2, 2, 128}, DType::f16, 0.0f},
      {{37, 2, 4, 2, 64}, DType::bf16, 0.0f}, {{37, 2, 4, 4, 64}, DType::bf16, 0.2f},
      {{37, 2, 4, 4, 32}, DType::bf16, 0.0f},
  };
  uint64_t seed = 5000;
  for (const FusedCase& c : cases) {
    for (bool causal : {true, false}) {
      const int64_t before = ops::cuda::op_path_count(OpPath::attention_backward_cudnn);
      check_fused_case(c.d, c.dt, causal, c.dropout, seed += 10);
      const bool cudnn = c.dropout == 0.0f && c.d.HS != 32;  // GQA as well as MHA
      EXPECT_EQ(ops::cuda::op_path_count(OpPath::attention_backward_cudnn), before + (cudnn ? 1 : 0)) << c.d.str();
    }
  }
  // Packed documents in one row: on cuDNN's ragged batch, k and v (and MHA's q) in place (the
  // operands' token stride is qkv's, G (r + 2) HS).
  for (const Dims& d : {Dims{200, 1, 4, 4, 64}, Dims{200, 1, 4, 2, 128}}) {
    for (bool causal : {true, false}) {
      const int64_t before = ops::cuda::op_path_count(OpPath::attention_backward_cudnn_packed);
      seed += 10;
      check_fused_case(d, DType::bf16, causal, 0.0f, seed, random_segments(d, seed + 5, 90));
      const int64_t ran = ops::cuda::cudnn_ragged_batch_supported() ? 1 : 0;
      EXPECT_EQ(ops::cuda::op_path_count(OpPath::attention_backward_cudnn_packed), before + ran) << d.str();
    }
  }
}

// --deterministic-mode's backward: dq without float atomics, on cuDNN's dP-workspace graph (directly,
// routed, packed documents) and on our generic kernels where the tensor-core ones would run
// (Path::mma's inputs, with dropout and documents too). Long sequences, so dq sums many key
// blocks, whose atomics would land in a varying order. Each case runs its backward three times
// for the same bits, and within the file comment's tolerances of the CPU op in f64.
TEST_F(CudaAttention, DeterministicBackwardRepeatsItsBitsAndMatchesCpuF64) {
  using P = Case::Packing;
  std::vector<Case> cases = {
      {{1024, 2, 8, 2, 64}, DType::bf16, 0, Path::cudnn},     {{512, 2, 4, 4, 128}, DType::bf16, 0, Path::cudnn},
      {{700, 2, 8, 2, 64}, DType::f16, 0, Path::routed},      {{512, 2, 4, 2, 64}, DType::bf16, 0, Path::mma},
      {{300, 2, 4, 2, 128}, DType::bf16, 0, Path::mma, true},
  };
  if (ops::cuda::cudnn_ragged_batch_supported())
    cases.push_back({{600, 1, 8, 2, 64}, DType::bf16, 0, Path::cudnn, false, 0, -1, false, true, P::mixed});
  uint64_t seed = 9000;
  for (Case c : cases) {
    c.deterministic = true;
    for (bool causal : {true, false}) check_case(c, causal, 0.0f, seed += 10);
    if (c.path == Path::mma) check_case(c, true, 0.2f, seed += 10);
  }
}

// The ops run cuDNN exactly where cudnn_attention_applies says so, and it says so for bf16/f16 at
// head dims 64 and 128 without dropout on 16-byte aligned tensors: there the op's forward equals
// cuDNN's bit for bit (both deterministic), elsewhere our kernels'.
TEST_F(CudaAttention, RoutesToCudnnWhereItApplies) {
  struct Route {
    DType dt;
    int64_t HS;
    float dropout;
    int64_t misalign;
    bool cudnn;
  };
  const Route routes[] = {
      {DType::bf16, 64, 0.0f, 0, true},  {DType::bf16, 128, 0.0f, 0, true}, {DType::f16, 64, 0.0f, 0, true},
      {DType::bf16, 64, 0.1f, 0, false}, {DType::bf16, 32, 0.0f, 0, false}, {DType::f32, 64, 0.0f, 0, false},
      {DType::bf16, 64, 0.0f, 1, false},
  };
  for (const Route& r : routes) {
    const Dims d{64, 2, 4, 2, r.HS};
    const AttentionParams p{true, 0.125f, r.dropout, 5, 6};
    SCOPED_TRACE(case_name("routing", r.dt, d, true, r.dropout) + " misalign=" + std::to_string(r.misalign));
    const Pair q = random_pair(d.q_shape(), r.dt, 1, 1.0, r.misalign),
               k = random_pair(d.kv_shape(), r.dt, 2, 1.0, r.misalign);
    const Pair v = random_pair(d.kv_shape(), r.dt, 3, 1.0, r.misalign);
    Pair out = poisoned_pair(d.q_shape(), r.dt, r.misalign), lse = poisoned_pair({d.B, d.NH, d.S}, DType::f32);
    Pair want = poisoned_pair(d.q_shape(), r.dt, r.misalign), want_lse = poisoned_pair({d.B, d.NH, d.S}, DType::f32);
    const CudnnAttention a = ops::cuda::cudnn_attention_separate(d.checks(), r.dt, p);
    EXPECT_EQ(ops::cuda::cudnn_attention_applies(a, p, {out.gpu.raw(), q.gpu.raw(), k.gpu.raw(), v.gpu.raw()}),
              r.cudnn);
    ops::cuda::attention_forward(out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, p);
    if (r.cudnn) {
      ops::cuda::cudnn_attention_forward(a, want.gpu.raw(), want_lse.gpu.data<float>(), q.gpu.raw(), k.gpu.raw(),
                                         v.gpu.raw(), p.cu_seqlens);
    } else {
      ops::cuda::flash_attention_forward(want.gpu, want_lse.gpu, q.gpu, k.gpu, v.gpu, p);
    }
    EXPECT_TRUE(same_bits(out.gpu, want.gpu));
    EXPECT_TRUE(same_bits(lse.gpu, want_lse.gpu));
  }
  // The fused layout runs on cuDNN: MHA in place, GQA with k and v in place (q through a copy).
  const AttentionParams p{true, 0.125f, 0.0f, 5, 6};
  for (const Dims& m : {Dims{64, 2, 4, 4, 64}, Dims{64, 2, 4, 2, 64}}) {
    const Tensor qkv = Tensor::zeros(m.qkv_shape(), DType::bf16, gpu()),
                 out = Tensor::zeros(m.q_shape(), DType::bf16, gpu());
    const char* base = static_cast<const char*>(qkv.raw());
    const int64_t r = m.NH / m.G;
    EXPECT_TRUE(ops::cuda::cudnn_attention_applies(ops::cuda::cudnn_attention_fused(m.checks(), DType::bf16, p), p,
                                                   {out.raw(), base, base + r * 128, base + (r + 1) * 128}))
        << m.str();
  }
  // Document masking (segment ids) keeps our kernels even where everything else suits cuDNN.
  const Dims d{16, 1, 2, 2, 64};
  AttentionParams segmented{true, 0.125f, 0.0f, 5, 6};
  segmented.segment_ids = Tensor::zeros({d.B, d.S}, DType::i32, gpu());
  const Tensor q = Tensor::zeros(d.q_shape(), DType::bf16, gpu()), o = Tensor::zeros(d.q_shape(), DType::bf16, gpu());
  EXPECT_FALSE(
      ops::cuda::cudnn_attention_applies(ops::cuda::cudnn_attention_separate(d.checks(), DType::bf16, segmented),
                                         segmented, {o.raw(), q.raw(), q.raw(), q.raw()}));
  // Packed documents (cu_seqlens) in one row run as cuDNN's ragged batch where cuDNN has it (9.6+
  // on sm_90+), in several rows on our kernels.
  AttentionParams packed{true, 0.125f, 0.0f, 5, 6};
  packed.cu_seqlens = Tensor::from_vector({0, 7, 16}, {3}, DType::i32).to(gpu());
  EXPECT_EQ(ops::cuda::cudnn_ragged_batch_supported(),
            ops::cuda::cudnn_attention_applies(ops::cuda::cudnn_attention_separate(d.checks(), DType::bf16, packed),
                                               packed, {o.raw(), q.raw(), q.raw(), q.raw()}))
      << "cuDNN " << ops::cuda::cudnn_runtime_version();
  const Dims rows{8, 2, 2, 2, 64};
  AttentionParams packed_rows = packed;
  packed_rows.cu_seqlens = Tensor::from_vector({0, 3, 8, 16}, {4}, DType::i32).to(gpu());
  const Tensor q2 = Tensor::zeros(rows.q_shape(), DType::bf16, gpu()),
               o2 = Tensor::zeros(rows.q_shape(), DType::bf16, gpu());
  EXPECT_FALSE(
      ops::cuda::cudnn_attention_applies(ops::cuda::cudnn_attention_separate(rows.checks(), DType::bf16, packed_rows),
                                         packed_rows, {o2.raw(), q2.raw(), q2.raw(), q2.raw()}));
}
