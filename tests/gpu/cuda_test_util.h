#pragma once
// Shared by tests/gpu/test_cuda_*.cpp (STYLE 13): every CUDA op runs on the same inputs as its CPU
// reference (ops::cpu::, the oracle) and every output is compared element by element.
//   - Inputs: Pair holds one tensor on each device with identical bytes (random_pair: seeded,
//     bf16-exact N(0,1) values from unit/op_test_util.h; pair_of: any host tensor).
//   - Outputs start as NaN on both sides (poisoned_pair), so an element the kernel forgets to
//     write fails the comparison. Accumulated outputs start from the same random values instead.
//   - Every GPU tensor is a view into a larger buffer with guard elements before and after; a
//     kernel writing outside its tensor breaks them (checked by matches_cpu and guards_intact).
//     `misalign` shifts the view off 16-byte alignment to exercise the kernels' scalar paths.
//   - matches_cpu / matches: |gpu - ref| <= factor u (|ref| + max|ref|) everywhere, u the unit
//     roundoff of the output dtype, `factor` written down with its reason in each test; NaN
//     anywhere fails. The failure message also gives the normwise error ||gpu - ref|| / ||ref||.
//     ref is the CPU op in the output's dtype (out.cpu) or, for long reductions, in f64.
//   - within_bound: |gpu - ref| <= bound elementwise, the bound derived from an error analysis.
//   - equals_cpu: bitwise equality, for ops that round exactly as the CPU does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/cuda_runtime/context.h"
#include "megatron/cuda_runtime/device.h"
#include "unit/op_test_util.h"

namespace megatron::test {

inline Device gpu() { return Device::cuda(0); }

// Fixture for every GPU test: a GPU must be visible; device 0 is initialised once per test.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(cuda::device_count(), 0) << "gpu tests need a GPU (run them on the GPU machine: ctest -L gpu)";
    cuda::init_device(0);
  }
};

// Guard elements on each side of a GPU view: a stray write within this distance is caught.
constexpr int64_t kGuardElements = 64;

// One tensor on the CPU and its byte-identical twin on the GPU.
struct Pair {
  Tensor cpu;
  Tensor gpu;          // a view into buffer
  Tensor buffer;       // the whole GPU allocation: guard, (misalign), gpu, guard
  Tensor guard_image;  // host copy of buffer as uploaded; its guard bytes must survive

  // Bytes of buffer outside gpu are unchanged.
  ::testing::AssertionResult guards_intact() const {
    const Tensor now = buffer.to(Device::cpu());
    const size_t es = buffer.element_size();
    const size_t before = size_t(buffer.numel() - gpu.numel() - kGuardElements) * es;
    const size_t after_begin = before + gpu.nbytes();
    const auto* a = static_cast<const unsigned char*>(now.raw());
    const auto* b = static_cast<const unsigned char*>(guard_image.raw());
    for (size_t i = 0; i < buffer.nbytes(); ++i) {
      if (i >= before && i < after_begin) continue;
      if (a[i] != b[i]) {
        return ::testing::AssertionFailure()
               << "guard byte " << i << " of the buffer around the output changed ("
               << (i < before ? "before" : "after") << " the tensor): out of bounds write";
      }
    }
    return ::testing::AssertionSuccess();
  }
};

// host (a CPU tensor) and a GPU copy of it placed `misalign` elements past a guard.
inline Pair pair_of(const Tensor& host, int64_t misalign = 0) {
  Pair p;
  p.cpu = host.clone();
  const int64_t front = kGuardElements + misalign, n = host.numel();
  // Guard pattern: bytes 0xA5, which read as a finite, odd value in every dtype used here.
  Tensor image = Tensor::empty({front + n + kGuardElements}, host.dtype());
  std::memset(image.raw(), 0xA5, image.nbytes());
  std::memcpy(static_cast<char*>(image.raw()) + size_t(front) * host.element_size(), host.raw(), host.nbytes());
  p.buffer = image.to(gpu());
  p.guard_image = image;
  p.gpu = p.buffer.slice(front, front + n).view(host.shape());
  return p;
}

inline Pair random_pair(const Shape& shape, DType dtype, uint64_t seed, double scale = 1.0, int64_t misalign = 0) {
  return pair_of(randn(shape, dtype, seed, scale), misalign);
}

inline Pair poisoned_pair(const Shape& shape, DType dtype, int64_t misalign = 0) {
  return pair_of(poisoned(shape, dtype), misalign);
}

// ||a - r|| / ||r|| over all elements (0 when both are zero).
inline double normwise_error(const Tensor& actual, const Tensor& ref) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.item(i), d = actual.item(i) - r;
    diff += d * d;
    norm += r * r;
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

// The op's GPU output (out.gpu) against a CPU reference `ref` (any floating dtype; f64 when the
// reference is the CPU op run in double on the same values); also checks the guards.
inline ::testing::AssertionResult matches(const Pair& out, const Tensor& ref, double unit_roundoff, double factor) {
  const Tensor actual = out.gpu.to(Device::cpu());
  ::testing::AssertionResult close = matches_reference(actual, ref, unit_roundoff, factor);
  if (!close) return close << "; normwise error " << normwise_error(actual, ref);
  return out.guards_intact();
}

// The GPU output against the CPU op run in the same dtype (out.cpu).
inline ::testing::AssertionResult matches_cpu(const Pair& out, double unit_roundoff, double factor) {
  return matches(out, out.cpu, unit_roundoff, factor);
}

// |gpu - ref| <= bound elementwise, for a bound the test derives from an error analysis (e.g. the
// dot-product bound gamma_K |A||B|, computed with the CPU op on absolute values); guards too.
inline ::testing::AssertionResult within_bound(const Pair& out, const Tensor& ref, const Tensor& bound) {
  const Tensor actual = out.gpu.to(Device::cpu());
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = actual.item(i), r = ref.item(i), b = bound.item(i);
    if (!(std::fabs(a - r) <= b)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a << " vs expected " << r << ", error " << std::fabs(a - r)
             << " exceeds the bound " << b << "; normwise error " << normwise_error(actual, ref);
    }
  }
  return out.guards_intact();
}

// An f64 CPU copy holding |t|: operands for error bounds.
inline Tensor abs_f64(const Tensor& t) {
  Tensor a = t.to(Device::cpu()).to(DType::f64);
  for (int64_t i = 0; i < a.numel(); ++i) a.set_item(i, std::fabs(a.item(i)));
  return a;
}

// An f64 CPU copy of t: inputs of the CPU op run in double, the oracle for long reductions
// (the float CPU result carries rounding errors of the same size as the GPU's).
inline Tensor f64(const Tensor& t) { return t.to(Device::cpu()).to(DType::f64); }

// Exact equality (integer-valued results, copies, layout ops), guards included.
inline ::testing::AssertionResult equals_cpu(const Pair& out) {
  const Tensor actual = out.gpu.to(Device::cpu());
  if (std::memcmp(actual.raw(), out.cpu.raw(), actual.nbytes()) != 0) {
    for (int64_t i = 0; i < actual.numel(); ++i) {
      if (actual.item(i) != out.cpu.item(i) && !(std::isnan(actual.item(i)) && std::isnan(out.cpu.item(i)))) {
        return ::testing::AssertionFailure()
               << "element " << i << ": " << actual.item(i) << " vs expected " << out.cpu.item(i);
      }
    }
  }
  return out.guards_intact();
}

}  // namespace megatron::test
