// CUDA attention (flash forward and backward, fused-QKV split/merge) against the CPU op run in
// f64 on the same (bf16-exact) inputs, with the dropout mask shared bit for bit.
//
// Error bounds. Every output is a sum of products whose terms the kernels round at most once in
// bf16 (P before P V, P M before (P M)^T dO, dS before dS K and dS^T Q) and otherwise compute in
// fp32. So, elementwise,
//   |gpu - ref| <= (2 u_bf16 [bf16 only] + F u_f32) (|ref| + mag)
// where mag is the same sum taken over absolute values (computed below in f64, free of
// cancellation), 2 u_bf16 = one rounding inside plus the output's own rounding, and F u_f32 the
// fp32 part: a score error of HS u_f32 sigma (sigma = max scale sum_d |q_d k_d|) becomes a relative
// error of each probability through exp, twice (forward lse and backward recompute); sums of up
// to r S terms add r S u_f32 each; exp/log/divide add a few ulps. F = 2 HS sigma + 2 r S + HS + 16.
// On top, bf16 outputs must meet the normwise goal ||gpu - ref|| / ||ref|| <= 1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "megatron/core/rng.h"
#include "megatron/ops/attention.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::AttentionParams;

namespace {

class CudaAttention : public CudaTest {};

struct Dims {
  int64_t S, B, NH, G, HS;
  int64_t q_index(int64_t s, int64_t b, int64_t h, int64_t e) const { return ((s * B + b) * NH + h) * HS + e; }
  int64_t kv_index(int64_t s, int64_t b, int64_t g, int64_t e) const { return ((s * B + b) * G + g) * HS + e; }
  Shape q_shape() const { return {S, B, NH, HS}; }
  Shape kv_shape() const { return {S, B, G, HS}; }
};

// Absolute-value sums matching each output (see the file comment), for given f64 inputs and lse.
struct Magnitudes {
  Tensor out, dq, dk, dv;
  double sigma = 0.0;  // max over (b, h, i, j) of scale sum_d |q_id k_jd|
};

Magnitudes magnitudes(const Dims& d, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                      const Tensor& out, const Tensor& lse, const AttentionParams& p) {
  Magnitudes m{Tensor::zeros(d.q_shape(), DType::f64), Tensor::zeros(d.q_shape(), DType::f64),
               Tensor::zeros(d.kv_shape(), DType::f64), Tensor::zeros(d.kv_shape(), DType::f64)};
  const CounterRng rng{p.seed, p.stream};
  const double scale = p.softmax_scale;
  const int64_t total_heads = p.total_heads == 0 ? d.NH : p.total_heads;
  const auto hidden = [&](int64_t b, int64_t i, int64_t j) {
    return p.segment_ids.defined() && p.segment_ids.item(b * d.S + i) != p.segment_ids.item(b * d.S + j);
  };
  const double* Q = q.data<double>();
  const double* K = k.data<double>();
  const double* V = v.data<double>();
  const double* DO = dout.data<double>();
  const double* O = out.data<double>();
  double *MO = m.out.data<double>(), *MQ = m.dq.data<double>(), *MK = m.dk.data<double>(), *MV = m.dv.data<double>();
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.NH; ++h) {
      const int64_t g = h / (d.NH / d.G);
      for (int64_t i = 0; i < d.S; ++i) {
        const double l = lse.item((b * d.NH + h) * d.S + i);
        double abs_D = 0.0;  // sum_e |dout_ie out_ie|
        for (int64_t e = 0; e < d.HS; ++e) abs_D += std::fabs(DO[d.q_index(i, b, h, e)] * O[d.q_index(i, b, h, e)]);
        for (int64_t j = 0; j < (p.causal ? i + 1 : d.S); ++j) {
          if (hidden(b, i, j)) continue;
          double s = 0.0, abs_s = 0.0, abs_dp = 0.0;
          for (int64_t e = 0; e < d.HS; ++e) {
            const double qk = Q[d.q_index(i, b, h, e)] * K[d.kv_index(j, b, g, e)];
            s += qk;
            abs_s += std::fabs(qk);
            abs_dp += std::fabs(DO[d.q_index(i, b, h, e)] * V[d.kv_index(j, b, g, e)]);
          }
          m.sigma = std::max(m.sigma, scale * abs_s);
          const double prob = std::exp(scale * s - l);
          const auto index = uint64_t(((b * total_heads + p.head_offset + h) * d.S + i) * d.S + j);
          const bool kept = p.dropout_p == 0.0f || rng.uniform(index) > p.dropout_p;
          const double mult = kept ? 1.0 / (1.0 - double(p.dropout_p)) : 0.0;
          const double abs_ds = prob * (mult * abs_dp + abs_D);
          for (int64_t e = 0; e < d.HS; ++e) {
            MO[d.q_index(i, b, h, e)] += prob * mult * std::fabs(V[d.kv_index(j, b, g, e)]);
            MV[d.kv_index(j, b, g, e)] += prob * mult * std::fabs(DO[d.q_index(i, b, h, e)]);
            MQ[d.q_index(i, b, h, e)] += scale * abs_ds * std::fabs(K[d.kv_index(j, b, g, e)]);
            MK[d.kv_index(j, b, g, e)] += scale * abs_ds * std::fabs(Q[d.q_index(i, b, h, e)]);
          }
        }
      }
    }
  }
  return m;
}

// |gpu - ref| <= tol (|ref| + mag) elementwise (guards checked too), and for bf16 the normwise goal.
// The normwise error is recorded as a test property (--gtest_output=xml lists them).
// abs_floor: an absolute allowance for f16's subnormal range (see check_case).
::testing::AssertionResult close_to(const Pair& out, const Tensor& ref, const Tensor& mag, double tol, DType dt,
                                    const std::string& name, double abs_floor = 0.0) {
  Tensor bound = Tensor::empty(ref.shape(), DType::f64);
  for (int64_t i = 0; i < ref.numel(); ++i) bound.set_item(i, tol * (std::fabs(ref.item(i)) + mag.item(i)) + abs_floor);
  ::testing::AssertionResult ok = within_bound(out, ref, bound);
  if (!ok) return ok;
  const double err = normwise_error(out.gpu.to(Device::cpu()), ref);
  ::testing::Test::RecordProperty(name, std::to_string(err));
  if (dt != DType::f32 && !(err <= 1e-2))
    return ::testing::AssertionFailure() << "normwise error " << err << " above the 16-bit goal 1e-2";
  return ::testing::AssertionSuccess() << "normwise error " << err;
}

struct Case {
  Dims d;
  DType dt;
  int64_t misalign;  // shifts the 16-bit tensors off 16 bytes: the generic kernels
  std::string path;
  bool segmented = false;   // random documents of 1-40 tokens (document masking)
  int64_t head_offset = 0;  // as a tensor-parallel rank: heads [offset, offset + NH) of 3 NH
};

// Segment ids (B,S) i32 of documents with random lengths in [1, 40].
Tensor random_segments(const Dims& d, uint64_t seed) {
  HostRng rng(seed);
  Tensor ids = Tensor::empty({d.B, d.S}, DType::i32);
  for (int64_t b = 0; b < d.B; ++b) {
    int32_t id = 0;
    int64_t left = 1 + int64_t(rng.uniform_int(40));
    for (int64_t i = 0; i < d.S; ++i, --left) {
      if (left == 0) {
        ++id;
        left = 1 + int64_t(rng.uniform_int(40));
      }
      ids.data<int32_t>()[b * d.S + i] = id;
    }
  }
  return ids;
}

void check_case(const Case& c, bool causal, float dropout, uint64_t seed) {
  const Dims& d = c.d;
  AttentionParams p{causal, float(1.0 / std::sqrt(double(d.HS))), dropout, 77, stream_id("attention-test")};
  if (c.head_offset > 0) {
    p.head_offset = c.head_offset;
    p.total_heads = 3 * d.NH;
  }
  if (c.segmented) p.segment_ids = random_segments(d, seed + 5);
  AttentionParams p_gpu = p;  // the same parameters with the segment ids on the GPU
  if (c.segmented) p_gpu.segment_ids = p.segment_ids.to(gpu());
  const std::string what = c.path + " " + dtype_name(c.dt) + " S=" + std::to_string(d.S) +
                           " NH=" + std::to_string(d.NH) + " G=" + std::to_string(d.G) + " HS=" + std::to_string(d.HS) +
                           (causal ? " causal" : " full") + " dropout=" + std::to_string(dropout) +
                           (c.segmented ? " segmented" : "") + " heads from " + std::to_string(c.head_offset);
  SCOPED_TRACE(what);
  const Pair q = random_pair(d.q_shape(), c.dt, seed, 1.0, c.misalign);
  const Pair k = random_pair(d.kv_shape(), c.dt, seed + 1, 1.0, c.misalign);
  const Pair v = random_pair(d.kv_shape(), c.dt, seed + 2, 1.0, c.misalign);
  const Pair dout = random_pair(d.q_shape(), c.dt, seed + 3, 1.0, c.misalign);
  Pair out = poisoned_pair(d.q_shape(), c.dt, c.misalign), lse = poisoned_pair({d.B, d.NH, d.S}, DType::f32);
  ops::cuda::attention_forward(out.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, p_gpu);

  const Tensor q64 = f64(q.cpu), k64 = f64(k.cpu), v64 = f64(v.cpu), dout64 = f64(dout.cpu);
  Tensor ref_out = poisoned(d.q_shape(), DType::f64), ref_lse = poisoned({d.B, d.NH, d.S}, DType::f64);
  ops::cpu::attention_forward(ref_out, ref_lse, q64, k64, v64, p);

  // Backward runs on the GPU's forward results on both sides, so both compute the same function.
  const Tensor gpu_out = out.gpu.to(Device::cpu()), gpu_lse = lse.gpu.to(Device::cpu());
  const Pair out_in = pair_of(gpu_out, c.misalign), lse_in = pair_of(gpu_lse);
  Pair dq = poisoned_pair(d.q_shape(), c.dt, c.misalign), dk = poisoned_pair(d.kv_shape(), c.dt, c.misalign);
  Pair dv = poisoned_pair(d.kv_shape(), c.dt, c.misalign);
  ops::cuda::attention_backward(dq.gpu, dk.gpu, dv.gpu, dout.gpu, q.gpu, k.gpu, v.gpu, out_in.gpu, lse_in.gpu, p_gpu);
  Tensor ref_dq = poisoned(d.q_shape(), DType::f64), ref_dk = poisoned(d.kv_shape(), DType::f64);
  Tensor ref_dv = poisoned(d.kv_shape(), DType::f64);
  const Tensor out64 = f64(gpu_out), lse64 = f64(gpu_lse);
  ops::cpu::attention_backward(ref_dq, ref_dk, ref_dv, dout64, q64, k64, v64, out64, lse64, p);

  const Magnitudes mag = magnitudes(d, q64, k64, v64, dout64, out64, lse64, p);
  const double F = 2.0 * double(d.HS) * mag.sigma + 2.0 * double(d.NH / d.G) * double(d.S) + double(d.HS) + 16.0;
  // 16-bit storage: the rounding of the inputs to the P V and dS products and of the outputs.
  const double tol = (c.dt == DType::f32 ? 0.0 : 2.0 * unit_roundoff(c.dt)) + F * kUnitRoundoffF32;
  // f16 holds values below 2^-14 as subnormals, with an absolute error up to 2^-25 instead of a
  // relative one: the outputs, and each term of the P V, P^T dO and dS K / dS^T Q sums whose P or
  // dS is that small. Those sums have at most r S terms, each factor bounded by the keep scale,
  // the softmax scale (at most 1 here) and the largest input.
  double max_input = 0.0;
  for (const Tensor* t : {&q64, &k64, &v64, &dout64})
    for (int64_t i = 0; i < t->numel(); ++i) max_input = std::max(max_input, std::fabs(t->item(i)));
  const double keep_scale = 1.0 / (1.0 - double(dropout));
  const double floor =
      c.dt == DType::f16 ? 0x1p-25 * (1.0 + double(d.NH / d.G) * double(d.S) * keep_scale * max_input) : 0.0;
  // lse (f32 on both dtypes): the score error HS u sigma, the sum's S u, a few ulps of log.
  const Tensor ones = filled(ref_lse.shape(), DType::f64, 1.0);
  EXPECT_TRUE(close_to(lse, ref_lse, ones, F * kUnitRoundoffF32, DType::f32, what + " lse"));
  EXPECT_TRUE(close_to(out, ref_out, mag.out, tol, c.dt, what + " out", floor));
  EXPECT_TRUE(close_to(dq, ref_dq, mag.dq, tol, c.dt, what + " dq", floor));
  EXPECT_TRUE(close_to(dk, ref_dk, mag.dk, tol, c.dt, what + " dk", floor));
  EXPECT_TRUE(close_to(dv, ref_dv, mag.dv, tol, c.dt, what + " dv", floor));
}

void check_all_variants(const Case& c, uint64_t seed) {
  for (bool causal : {true, false}) {
    for (float dropout : {0.0f, 0.2f}) check_case(c, causal, dropout, seed += 10);
  }
}

}  // namespace

// S = 37: one partial tile; S = 130, 200 and 300: several key tiles (online-softmax rescaling, the
// double-buffered pipeline) with a partial last one, and in the backward several key blocks, whose
// causal diagonal steps skip the warps of keys after the query tile.
TEST_F(CudaAttention, TensorCorePathMatchesCpuF64) {
  const Case cases[] = {
      {{37, 2, 4, 2, 16}, DType::bf16, 0, "mma"},   {{37, 2, 4, 2, 64}, DType::bf16, 0, "mma"},
      {{37, 2, 4, 2, 128}, DType::bf16, 0, "mma"},  {{200, 1, 4, 1, 64}, DType::bf16, 0, "mma"},
      {{130, 2, 2, 2, 128}, DType::bf16, 0, "mma"}, {{70, 1, 4, 4, 32}, DType::bf16, 0, "mma"},
      {{300, 1, 4, 2, 64}, DType::bf16, 0, "mma"},
  };
  uint64_t seed = 1000;
  for (const Case& c : cases) check_all_variants(c, seed += 100);
}

// f16 (--fp16) takes the same tensor-core kernels; document masking and tensor-parallel head
// offsets (dropout's global head index) on both paths.
TEST_F(CudaAttention, F16SegmentsAndHeadOffsetsMatchCpuF64) {
  const Case cases[] = {
      {{130, 2, 4, 2, 64}, DType::f16, 0, "mma"},          {{130, 2, 2, 2, 128}, DType::f16, 0, "mma"},
      {{200, 2, 4, 2, 64}, DType::bf16, 0, "mma", true},   {{130, 1, 2, 2, 128}, DType::bf16, 0, "mma", true, 2},
      {{70, 2, 4, 2, 64}, DType::f16, 0, "mma", true, 4},  {{70, 2, 4, 2, 24}, DType::f16, 0, "generic", true, 4},
      {{70, 1, 2, 1, 64}, DType::f32, 0, "generic", true},
  };
  uint64_t seed = 4000;
  for (const Case& c : cases) check_all_variants(c, seed += 100);
}

TEST_F(CudaAttention, GenericPathMatchesCpuF64) {
  const Case cases[] = {
      {{37, 2, 4, 2, 16}, DType::f32, 0, "generic"},
      {{70, 1, 2, 1, 64}, DType::f32, 0, "generic"},
      {{37, 2, 4, 2, 24}, DType::bf16, 0, "generic"},  // head dim without a tensor-core kernel
      {{37, 2, 4, 2, 64}, DType::bf16, 1, "generic"},  // misaligned tensors
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
