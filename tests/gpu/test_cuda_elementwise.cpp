// Elementwise and layout ops on CUDA against the CPU op on the same values. Each of these rounds
// a single float operation (or none) into the output, and the CUDA kernels round every step
// explicitly (no fused multiply-add), so results must be bitwise equal to the CPU's on x86-64,
// whose baseline has no FMA for the compiler to contract into.
#include <cstring>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/elementwise.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaElementwise : public CudaTest {};

// Sizes around the 8-element vector step, odd ones included; misalign 1 takes the scalar path.
const int64_t kSizes[] = {1, 7, 8, 1000, 4099, (1 << 16) + 3};
const DType kFloating[] = {DType::f32, DType::bf16, DType::f16};

std::string label(DType out, DType in, int64_t n, int64_t misalign) {
  return std::string(dtype_name(out)) + "<-" + dtype_name(in) + " n=" + std::to_string(n) +
         " misalign=" + std::to_string(misalign);
}

}  // namespace

TEST_F(CudaElementwise, AddOutOfPlaceAndInPlace) {
  uint64_t seed = 1;
  for (const DType dtype : kFloating) {
    for (const int64_t n : kSizes) {
      for (const int64_t misalign : {0, 1}) {
        Pair a = random_pair({n}, dtype, seed++, 1.0, misalign);
        Pair b = random_pair({n}, dtype, seed++);
        Pair out = poisoned_pair({n}, dtype);
        ops::cpu::add(out.cpu, a.cpu, b.cpu);
        ops::cuda::add(out.gpu, a.gpu, b.gpu);
        EXPECT_TRUE(equals_cpu(out)) << label(dtype, dtype, n, misalign);
        ops::cpu::add(a.cpu, a.cpu, b.cpu);  // the residual add writes over its input
        ops::cuda::add(a.gpu, a.gpu, b.gpu);
        EXPECT_TRUE(equals_cpu(a)) << "in place " << label(dtype, dtype, n, misalign);
      }
    }
  }
}

TEST_F(CudaElementwise, AddScaledAccumulatesAcrossDtypes) {
  uint64_t seed = 100;
  for (const DType out_dtype : kFloating) {
    for (const DType in_dtype : kFloating) {
      for (const int64_t n : kSizes) {
        for (const int64_t misalign : {0, 1}) {
          Pair out = random_pair({n}, out_dtype, seed++, 1.0, misalign);
          Pair x = random_pair({n}, in_dtype, seed++);
          ops::cpu::add_scaled(out.cpu, x.cpu, -0.3f);
          ops::cuda::add_scaled(out.gpu, x.gpu, -0.3f);
          EXPECT_TRUE(equals_cpu(out)) << label(out_dtype, in_dtype, n, misalign);
        }
      }
    }
  }
}

TEST_F(CudaElementwise, ScaleAcrossDtypesAndInPlace) {
  uint64_t seed = 200;
  for (const DType out_dtype : kFloating) {
    for (const DType in_dtype : kFloating) {
      for (const int64_t n : kSizes) {
        Pair x = random_pair({n}, in_dtype, seed++);
        Pair out = poisoned_pair({n}, out_dtype, n % 2);
        ops::cpu::scale(out.cpu, x.cpu, 1.7f);
        ops::cuda::scale(out.gpu, x.gpu, 1.7f);
        EXPECT_TRUE(equals_cpu(out)) << label(out_dtype, in_dtype, n, n % 2);
      }
    }
  }
  Pair x = random_pair({4099}, DType::bf16, 300);
  ops::cpu::scale(x.cpu, x.cpu, 0.5f);
  ops::cuda::scale(x.gpu, x.gpu, 0.5f);
  EXPECT_TRUE(equals_cpu(x));
}

TEST_F(CudaElementwise, CastBetweenAllStorageDtypes) {
  uint64_t seed = 400;
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
  for (const DType out_dtype : dtypes) {
    for (const DType in_dtype : dtypes) {
      for (const int64_t n : kSizes) {
        for (const int64_t misalign : {0, 1}) {
          // Scale 1e3 reaches f16's coarse range too, so its rounding is exercised.
          Pair x = random_pair({n}, in_dtype, seed++, 1e3, misalign);
          Pair out = poisoned_pair({n}, out_dtype);
          ops::cpu::cast(out.cpu, x.cpu);
          ops::cuda::cast(out.gpu, x.gpu);
          EXPECT_TRUE(equals_cpu(out)) << label(out_dtype, in_dtype, n, misalign);
        }
      }
    }
  }
}

TEST_F(CudaElementwise, Transpose01AnyRowWidth) {
  // (B,S) i32 tokens <-> (S,B), and activations whose trailing block takes each word width.
  Tensor tokens = Tensor::empty({3, 5}, DType::i32);
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.set_item(i, double(i * 7 % 11));
  Pair in_tokens = pair_of(tokens);
  Pair out_tokens = pair_of(Tensor::zeros({5, 3}, DType::i32));
  ops::cpu::transpose01(out_tokens.cpu, in_tokens.cpu);
  ops::cuda::transpose01(out_tokens.gpu, in_tokens.gpu);
  EXPECT_TRUE(equals_cpu(out_tokens));

  const struct {
    Shape shape;
    DType dtype;
    int64_t misalign;
  } cases[] = {{{4, 7, 3}, DType::f32, 0},   {{5, 6, 8}, DType::bf16, 0},   {{3, 4, 1}, DType::bf16, 1},
               {{2, 9, 4}, DType::f32, 1},   {{6, 5, 2, 4}, DType::f32, 0}, {{33, 17}, DType::bf16, 0},
               {{8, 16, 64}, DType::bf16, 0}};
  uint64_t seed = 500;
  for (const auto& c : cases) {
    Shape swapped = c.shape;
    std::swap(swapped[0], swapped[1]);
    Pair in = random_pair(c.shape, c.dtype, seed++, 1.0, c.misalign);
    Pair out = poisoned_pair(swapped, c.dtype, c.misalign);
    ops::cpu::transpose01(out.cpu, in.cpu);
    ops::cuda::transpose01(out.gpu, in.gpu);
    EXPECT_TRUE(equals_cpu(out)) << shape_str(c.shape) << " " << dtype_name(c.dtype);
  }
}

// 2-D matrices of one-element rows go through shared-memory tiles: ragged edges, every element width.
TEST_F(CudaElementwise, Transpose01OfMatricesMatchesTheCpuByteForByte) {
  for (const DType dtype : {DType::e4m3, DType::bf16, DType::f32})
    for (const Shape& shape : {Shape{257, 129}, Shape{32, 96}, Shape{1, 70}, Shape{4096, 3}}) {
      Tensor in = Tensor::empty(shape, dtype);
      auto* bytes = static_cast<uint8_t*>(in.raw());
      for (size_t b = 0; b < in.nbytes(); ++b) bytes[b] = uint8_t((b * 131 + 7) % 251);
      Tensor out_cpu = Tensor::empty({shape[1], shape[0]}, dtype), out_gpu = out_cpu.to(gpu());
      ops::cpu::transpose01(out_cpu, in);
      ops::cuda::transpose01(out_gpu, in.to(gpu()));
      const Tensor back = out_gpu.to(Device::cpu());
      EXPECT_EQ(std::memcmp(back.raw(), out_cpu.raw(), out_cpu.nbytes()), 0)
          << shape_str(shape) << " " << dtype_name(dtype);
    }
}

TEST_F(CudaElementwise, RejectsF64AndCpuTensors) {
  Tensor a = Tensor::empty({4}, DType::f64, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::add(a, a, a); }, "CPU-only"));
  Tensor host = Tensor::empty({4}, DType::f32);
  Tensor dev = Tensor::empty({4}, DType::f32, gpu());
  EXPECT_TRUE(throws_error_naming([&] { ops::cuda::scale(dev, host, 2.0f); }, "scale x is on cpu"));
}
