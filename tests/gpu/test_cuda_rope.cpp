// CUDA RoPE against the CPU op run in f64 on the same (bf16-exact) inputs: rotary percent,
// interleaved pairs, position offset, in place, every output poisoned; and the in-place rotation
// of a fused QKV projection's query and key heads (rope_*_qkv) the same way; its backward with the
// FP8 cast fused (rope_backward_qkv_fp8) against the unfused CUDA pair bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/fp8.h"
#include "megatron/ops/rope.h"

using namespace megatron;
using namespace megatron::test;
using megatron::ops::RopeParams;

namespace {

class CudaRope : public CudaTest {};

// The angles are the same float on both sides (inv_freq from the same host expression). f32:
// cosf/sinf are within 2 ulp on CUDA, then two products and a sum: |error| <= ~5 u (|x1| + |x2|),
// and |x1| + |x2| <= 2 max|x| ~ 2 max|y| (a rotation keeps the pair's norm), so factor 16 with the
// max|ref| term of `matches` covers it. bf16/f16: one rounding of the result, factor 2.
double factor_for(DType dt) { return dt == DType::f32 ? 16.0 : 2.0; }

struct Case {
  int64_t S, B, H, D;
  RopeParams p;
};

}  // namespace

TEST_F(CudaRope, ForwardAndBackwardMatchCpuF64) {
  const Case cases[] = {
      {37, 2, 3, 64, {10000.0f, 1.0f, false, 0}},            // full rotation, GPT-NeoX pairs
      {37, 2, 3, 64, {10000.0f, 1.0f, true, 0}},             // interleaved pairs
      {20, 1, 4, 128, {500000.0f, 0.5f, false, 4000}},       // partial rotation, long positions
      {9, 2, 2, 12, {10000.0f, 0.5f, true, 3}},              // rot_dim 6 of 12, interleaved
      {40, 2, 2, 64, {500000.0f, 1.0f, false, 100, 32.0f}},  // Llama-3.2's frequency scaling
  };
  uint64_t seed = 500;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const Case& c : cases) {
      const std::string what = std::string(dtype_name(dt)) + " D=" + std::to_string(c.D) +
                               " percent=" + std::to_string(c.p.percent) + (c.p.interleaved ? " interleaved" : "");
      const Shape shape{c.S, c.B, c.H, c.D};
      const Pair x = random_pair(shape, dt, ++seed);
      Pair y = poisoned_pair(shape, dt), dx = poisoned_pair(shape, dt);
      ops::cuda::rope_forward(y.gpu, x.gpu, c.p);
      ops::cuda::rope_backward(dx.gpu, x.gpu, c.p);
      Tensor ry = poisoned(shape, DType::f64), rdx = poisoned(shape, DType::f64);
      ops::cpu::rope_forward(ry, f64(x.cpu), c.p);
      ops::cpu::rope_backward(rdx, f64(x.cpu), c.p);
      EXPECT_TRUE(matches(y, ry, unit_roundoff(dt), factor_for(dt))) << what << " forward";
      EXPECT_TRUE(matches(dx, rdx, unit_roundoff(dt), factor_for(dt))) << what << " backward";

      // In place (y aliases x) gives the out-of-place result exactly: each thread reads its pair
      // before writing it.
      Tensor inplace = x.cpu.to(gpu());
      ops::cuda::rope_forward(inplace, inplace, c.p);
      EXPECT_EQ(inplace.to_vector(), y.gpu.to_vector()) << what << " in place";
    }
  }
}

TEST_F(CudaRope, RejectsOddRotaryDimAndF64) {
  Tensor x = Tensor::zeros({2, 1, 1, 10}, DType::f32, gpu()), y = Tensor::zeros({2, 1, 1, 10}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::rope_forward(y, x, {10000.0f, 0.5f, false, 0}); }, "even"));
  Tensor x64 = Tensor::zeros({2, 1, 1, 8}, DType::f64, gpu()), y64 = Tensor::zeros({2, 1, 1, 8}, DType::f64, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::rope_forward(y64, x64, {}); }, "f64"));
}

namespace {

struct QkvCase {
  int64_t S, B, NH, G, D;
  RopeParams p;
  int64_t misalign;  // elements off 16-byte alignment: the kernel's one-channel packs
};

// Channels the fused op must not write: every channel of the value heads, and those past rot_dim
// of the query and key heads. Their bits equal the input's.
::testing::AssertionResult untouched_channels_equal(const Tensor& actual, const Tensor& input, const QkvCase& c) {
  const int64_t r = c.NH / c.G, rot_dim = int64_t(double(c.D) * double(c.p.percent));
  for (int64_t i = 0; i < input.numel(); ++i) {
    const int64_t channel = i % c.D, head = (i / c.D) % (r + 2);
    if ((head == r + 1 || channel >= rot_dim) && actual.item(i) != input.item(i))
      return ::testing::AssertionFailure() << "element " << i << " (head " << head << " of its group, channel "
                                           << channel << ") changed from " << input.item(i) << " to " << actual.item(i);
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST_F(CudaRope, FusedQkvMatchesCpuF64) {
  const QkvCase cases[] = {
      {33, 2, 24, 8, 128, {500000.0f, 1.0f, false, 0, 32.0f}, 0},  // Llama-3.2-3B's heads: 16-byte packs
      {17, 3, 4, 4, 64, {10000.0f, 1.0f, true, 5}, 0},             // MHA, interleaved packs
      {20, 1, 8, 1, 128, {10000.0f, 0.5f, false, 4000}, 0},        // one kv head, partial rotation
      {9, 2, 6, 3, 24, {10000.0f, 1.0f, false, 2}, 0},             // half 12: one-channel packs in bf16
      {9, 2, 6, 2, 12, {10000.0f, 0.5f, true, 3}, 0},              // rot_dim 6 of 12, interleaved pairs
      {11, 2, 6, 2, 64, {10000.0f, 1.0f, false, 0}, 1},            // misaligned: one-channel packs
      {11, 2, 6, 2, 64, {10000.0f, 1.0f, true, 0}, 1},             // misaligned, interleaved pairs
  };
  uint64_t seed = 900;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const QkvCase& c : cases) {
      const Shape shape{c.S, c.B, c.G, (c.NH / c.G + 2) * c.D};
      for (const bool inverse : {false, true}) {
        const std::string what = std::string(dtype_name(dt)) + " NH=" + std::to_string(c.NH) +
                                 " G=" + std::to_string(c.G) + " D=" + std::to_string(c.D) +
                                 " percent=" + std::to_string(c.p.percent) + (c.p.interleaved ? " interleaved" : "") +
                                 " misalign=" + std::to_string(c.misalign) + (inverse ? " backward" : " forward");
        Pair qkv = random_pair(shape, dt, ++seed, 1.0, c.misalign);
        Tensor ref = f64(qkv.cpu);
        if (inverse) {
          ops::cuda::rope_backward_qkv(qkv.gpu, c.NH, c.p);
          ops::cpu::rope_backward_qkv(ref, c.NH, c.p);
        } else {
          ops::cuda::rope_forward_qkv(qkv.gpu, c.NH, c.p);
          ops::cpu::rope_forward_qkv(ref, c.NH, c.p);
        }
        // The rope kernel's arithmetic (same float angles, cosf/sinf, two products and a sum), so
        // the separate op's tolerance and its reason (factor_for above) carry over.
        EXPECT_TRUE(matches(qkv, ref, unit_roundoff(dt), factor_for(dt))) << what;
        EXPECT_TRUE(untouched_channels_equal(qkv.gpu.to(Device::cpu()), qkv.cpu, c)) << what;
      }
    }
  }
}

TEST_F(CudaRope, FusedQkvRejectsBadLayout) {
  Tensor qkv = Tensor::zeros({2, 1, 2, 5 * 8}, DType::bf16, gpu());  // NH = 6 over G = 2
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::rope_forward_qkv(qkv, 8, {}); }, "rope qkv"));
  Tensor qkv64 = Tensor::zeros({2, 1, 2, 5 * 8}, DType::f64, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::rope_backward_qkv(qkv64, 6, {}); }, "f64"));
}

// The backward's FP8-cast form writes what rope_backward_qkv followed by fp8_quantize_transpose of
// its (S*B, G*(r+2)*D) rows writes, bit for bit (the same angles, cosf/sinf and explicitly rounded
// products; the fused kernel's vector path where D and half are multiples of 8, its element path
// otherwise), leaving dqkv as it was.
TEST_F(CudaRope, FusedQkvBackwardWithFp8CastMatchesTheUnfusedPair) {
  const QkvCase cases[] = {
      {33, 2, 24, 8, 128, {500000.0f, 1.0f, false, 0, 32.0f}, 0},  // Llama-3.2-3B's heads: vectors
      {17, 3, 4, 4, 64, {10000.0f, 1.0f, true, 5}, 0},             // MHA, interleaved vectors
      {20, 1, 8, 1, 128, {10000.0f, 0.5f, false, 4000}, 0},        // one kv head, partial rotation
      {9, 2, 6, 3, 24, {10000.0f, 1.0f, false, 2}, 0},             // half 12: the element path
      {9, 2, 6, 2, 12, {10000.0f, 0.5f, true, 3}, 0},              // rot_dim 6 of 12, interleaved
  };
  uint64_t seed = 1300;
  for (DType dt : {DType::f32, DType::bf16})
    for (DType q_dtype : {DType::e4m3, DType::e5m2})
      for (const QkvCase& c : cases) {
        const Shape shape{c.S, c.B, c.G, (c.NH / c.G + 2) * c.D};
        const int64_t rows = c.S * c.B, cols = shape_numel(shape) / rows;
        const std::string what = std::string(dtype_name(dt)) + " -> " + dtype_name(q_dtype) +
                                 " NH=" + std::to_string(c.NH) + " G=" + std::to_string(c.G) +
                                 " D=" + std::to_string(c.D) + (c.p.interleaved ? " interleaved" : "");
        const Tensor dqkv = randn(shape, dt, ++seed).to(gpu());
        const Tensor before = dqkv.to(Device::cpu());
        const Tensor scale = Tensor::from_vector({300.0f}, {1}).to(gpu());
        Tensor q = Tensor::empty({rows, cols}, q_dtype, gpu()), q_t = Tensor::empty({cols, rows}, q_dtype, gpu());
        Tensor amax = Tensor::zeros({1}, DType::f32, gpu());
        ops::cuda::rope_backward_qkv_fp8(q, q_t, amax, dqkv, c.NH, c.p, scale);
        Tensor turned = dqkv.clone();
        ops::cuda::rope_backward_qkv(turned, c.NH, c.p);
        Tensor uq = Tensor::empty({rows, cols}, q_dtype, gpu()), uq_t = Tensor::empty({cols, rows}, q_dtype, gpu());
        Tensor unfused_amax = Tensor::zeros({1}, DType::f32, gpu());
        ops::cuda::fp8_quantize_transpose(uq, uq_t, unfused_amax, turned.view({rows, cols}), scale);
        for (const auto& [got, want] : {std::pair<const Tensor*, const Tensor*>{&q, &uq}, {&q_t, &uq_t}}) {
          const Tensor g = got->to(Device::cpu()), w = want->to(Device::cpu());
          EXPECT_EQ(std::memcmp(g.raw(), w.raw(), g.nbytes()), 0) << what;
        }
        EXPECT_EQ(amax.item(), unfused_amax.item()) << what;
        const Tensor after = dqkv.to(Device::cpu());
        EXPECT_EQ(std::memcmp(after.raw(), before.raw(), after.nbytes()), 0) << what << ": dqkv changed";
      }
}
