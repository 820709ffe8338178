// Grouped GEMM kernel lab: times our bf16 grouped kernel (ops/cuda/grouped_gemm_kernels.cuh) in
// several tile shapes beside the per-expert loop of cuBLASLt GEMMs (ops::cuda::linear_forward /
// linear_backward, one call per expert, what the op ran before), on the expert GEMMs of the
// moe-1b-8x preset (hidden 2048, 8 SwiGLU experts of width 2816): fc1 (2048 -> 5632) and fc2
// (2816 -> 2048), each as forward (y = x W^T), dgrad (dx = dy W) and wgrad (dW += dy^T x, fp32).
// The tokens: micro-batch 4 x 2048, top-2, spread unevenly over the experts (and once evenly).
// Prints milliseconds, TFLOP/s (2 x rows x in x out per product) and the normwise error
// ||ours - loop|| / ||loop|| of every variant, a forward on WGMMA (grouped_gemm_wgmma.cuh, the
// candidate next step), and the op as shipped ("(library)").
//
// Build from the repository root, after building the library into build/<dir> (cmake --preset gpu;
// ninja -C build/gpu megatron_lib), as one command:
//   nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Isrc bench/kernels/grouped_gemm.cu
//        build/<dir>/libmegatron.a -L<cudnn lib dir> -l:libcudnn.so.9 -lcublasLt -lcublas
//        -Xcompiler -fopenmp -o build/grouped_gemm_bench
// (cuDNN's directory as CMake found it: grep CUDNN_LIBRARY build/<dir>/CMakeCache.txt; sm_90a, not
// sm_90, for the WGMMA variant of grouped_gemm_wgmma.cuh, forward only, not yet in the library.)
// Run: build/grouped_gemm_bench
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../gpu_lab.h"
#include "grouped_gemm_wgmma.cuh"
#include "megatron/core/tensor.h"
#include "megatron/cuda_runtime/device.h"
#include "megatron/ops/cuda/grouped_gemm_kernels.cuh"
#include "megatron/ops/gemm.h"
#include "megatron/ops/grouped_gemm.h"

using namespace megatron;
using namespace megatron::bench;
using namespace megatron::ops::cuda::grouped_gemm_detail;
using Bf16 = __nv_bfloat16;

namespace {

// Variants, named by tile shape: bm<M>_bn<N>_bk<K> the block tile, w<W> warps (warp tile in the
// comment), s<S> pipeline stages, <B>blk blocks per SM asked of the register allocator.
struct Variant {
  const char* name;
  void (*forward)(Bf16*, const Bf16*, const Bf16*, int64_t, int64_t, const RowGroups&, GroupTable*, cudaStream_t);
  void (*dgrad)(Bf16*, const Bf16*, const Bf16*, int64_t, int64_t, const RowGroups&, GroupTable*, cudaStream_t);
  void (*wgrad)(float*, const Bf16*, const Bf16*, int64_t, int64_t, const RowGroups&, GroupTable*, cudaStream_t);
};
template <class Cfg>
constexpr Variant variant(const char* name) {
  return {name, grouped_forward<Cfg, Bf16>, grouped_dgrad<Cfg, Bf16>, grouped_wgrad<Cfg, Bf16>};
}
const Variant kVariants[] = {
    variant<Tiles<128, 256, 64, 2, 4, 3>>("bm128_bn256_bk64_w8_s3"),       // warp 64x64, 144 KiB (shipped)
    variant<Tiles<128, 256, 64, 2, 4, 4>>("bm128_bn256_bk64_w8_s4"),       // warp 64x64, 192 KiB
    variant<Tiles<256, 128, 64, 4, 2, 3>>("bm256_bn128_bk64_w8_s3"),       // warp 64x64, 144 KiB
    variant<Tiles<128, 128, 64, 2, 2, 4>>("bm128_bn128_bk64_w4_s4"),       // warp 64x64, 128 KiB
    variant<Tiles<128, 128, 64, 2, 2, 3, 2>>("bm128_bn128_bk64_w4_s3_2blk"),  // warp 64x64, 96 KiB
    variant<Tiles<128, 128, 64, 2, 4, 3, 2>>("bm128_bn128_bk64_w8_s3_2blk"),  // warp 64x32, 96 KiB
    variant<Tiles<128, 128, 32, 2, 2, 4, 2>>("bm128_bn128_bk32_w4_s4_2blk"),  // warp 64x64, 64 KiB
};

// A GPU tensor's memory as the device type T.
template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(const_cast<void*>(t.raw()));
}

// bf16 products of K up to a few thousand terms against another fp32-accumulating GEMM: both
// round to bf16 once, so ~2^-8 normwise; 1e-2 flags a wrong result.
const char* verdict(double error) { return error <= 1e-2 ? "ok" : "FAIL"; }

struct Problem {
  const char* name;
  int64_t in, out;
  std::vector<int64_t> counts;
};

// One table row; error NaN for the rows that are the reference themselves (left blank).
void print_row(const std::string& shape, const char* product, const char* variant, double ms, double flops,
               double error) {
  char check[48] = "";
  if (!std::isnan(error)) std::snprintf(check, sizeof(check), "%.1e %s", error, verdict(error));
  std::printf("| %-34s | %-5s | %-28s | %7.3f | %6.1f | %s |\n", shape.c_str(), product, variant, ms,
              flops / ms * 1e-9, check);
}

void run_problem(const Problem& pr) {
  const Device gpu = Device::cuda(0);
  const int64_t E = int64_t(pr.counts.size()), in = pr.in, out = pr.out;
  int64_t N = 0;
  for (int64_t c : pr.counts) N += c;
  const double flops = 2.0 * double(N) * double(in) * double(out);
  const std::string shape = std::string(pr.name) + " N" + std::to_string(N) + " " + std::to_string(in) + "->" +
                            std::to_string(out);
  const Tensor x = random_gpu({N, in}, 1), w = random_gpu({E, out, in}, 2, DType::bf16, 0.02f),
               dy = random_gpu({N, out}, 3);
  const Tensor dw0 = random_gpu({E, out, in}, 4, DType::f32);
  cudaStream_t stream = cuda::current_stream();
  const std::vector<int64_t>& counts = pr.counts;

  // The per-expert cuBLASLt loop: the reference values and the baseline time.
  Tensor y_ref = Tensor::empty({N, out}, DType::bf16, gpu), dx_ref = Tensor::empty({N, in}, DType::bf16, gpu);
  Tensor dw_ref = dw0.clone();
  const auto loop = [&](Tensor& y, Tensor& dx, Tensor& dw) {
    int64_t begin = 0;
    for (int64_t e = 0; e < E; begin += counts[size_t(e)], ++e) {
      const int64_t end = begin + counts[size_t(e)];
      if (end == begin) continue;
      Tensor no_bias, y_e = y.defined() ? y.slice(begin, end) : Tensor();
      Tensor dx_e = dx.defined() ? dx.slice(begin, end) : Tensor(), dw_e = dw.defined() ? dw.select(e) : Tensor();
      if (y_e.defined()) ops::cuda::linear_forward(y_e, x.slice(begin, end), w.select(e), Tensor());
      if (dx_e.defined() || dw_e.defined())
        ops::cuda::linear_backward(dx_e, dw_e, no_bias, dy.slice(begin, end), x.slice(begin, end), w.select(e),
                                   ops::GradWrite::accumulate);
    }
  };
  Tensor none;
  loop(y_ref, none, none);
  loop(none, dx_ref, none);
  loop(none, none, dw_ref);  // dW = dw0 + dy^T x: the value every variant's single call must give
  print_row(shape, "fwd", "per-expert cuBLASLt loop", median_ms([&] { loop(y_ref, none, none); }), flops, NAN);
  print_row(shape, "dgrad", "per-expert cuBLASLt loop", median_ms([&] { loop(none, dx_ref, none); }), flops, NAN);
  Tensor dw_scratch = dw0.clone();
  print_row(shape, "wgrad", "per-expert cuBLASLt loop", median_ms([&] { loop(none, none, dw_scratch); }), flops, NAN);

  Tensor y = Tensor::empty({N, out}, DType::bf16, gpu), dx = Tensor::empty({N, in}, DType::bf16, gpu);
  const RowGroups rows{counts.data(), nullptr, int(E), int(N)};  // host counts: the table as a kernel parameter
  for (const Variant& v : kVariants) {
    const auto fwd = [&] { v.forward(ptr<Bf16>(y), ptr<Bf16>(x), ptr<Bf16>(w), in, out, rows, nullptr, stream); };
    const auto dgrad = [&] { v.dgrad(ptr<Bf16>(dx), ptr<Bf16>(dy), ptr<Bf16>(w), in, out, rows, nullptr, stream); };
    Tensor dw = dw0.clone();
    const auto wgrad = [&] { v.wgrad(ptr<float>(dw), ptr<Bf16>(dy), ptr<Bf16>(x), in, out, rows, nullptr, stream); };
    CUDA_CHECK(cudaMemset(y.raw(), 0xff, y.nbytes()));  // NaN: an element left unwritten fails
    CUDA_CHECK(cudaMemset(dx.raw(), 0xff, dx.nbytes()));
    fwd();
    dgrad();
    wgrad();
    CUDA_CHECK(cudaDeviceSynchronize());
    const double e_y = normwise_error(y, y_ref), e_dx = normwise_error(dx, dx_ref), e_dw = normwise_error(dw, dw_ref);
    print_row(shape, "fwd", v.name, median_ms(fwd), flops, e_y);
    print_row(shape, "dgrad", v.name, median_ms(dgrad), flops, e_dx);
    print_row(shape, "wgrad", v.name, median_ms(wgrad), flops, e_dw);
  }
  // The op as shipped (grouped_gemm.cu's tile choice, its routing and path counting included).
  Tensor dw = dw0.clone();
  print_row(shape, "fwd", "(library)", median_ms([&] { ops::cuda::grouped_linear_forward(y, x, w, counts); }), flops,
            NAN);
  print_row(shape, "dgrad", "(library)", median_ms([&] {
              ops::cuda::grouped_linear_backward(dx, none, dy, x, w, counts, ops::GradWrite::accumulate);
            }),
            flops, NAN);
  print_row(shape, "wgrad", "(library)", median_ms([&] {
              ops::cuda::grouped_linear_backward(none, dw, dy, x, w, counts, ops::GradWrite::accumulate);
            }),
            flops, NAN);
  std::fflush(stdout);
}

// The forward on WGMMA (grouped_gemm_wgmma.cuh), checked against the per-expert loop the same
// way. Run after every other row: a fault here cannot cost the rows before it.
void run_wgmma_forward(const Problem& pr) {
  const Device gpu = Device::cuda(0);
  const int64_t E = int64_t(pr.counts.size()), in = pr.in, out = pr.out;
  int64_t N = 0;
  for (int64_t c : pr.counts) N += c;
  const double flops = 2.0 * double(N) * double(in) * double(out);
  const std::string shape = std::string(pr.name) + " N" + std::to_string(N) + " " + std::to_string(in) + "->" +
                            std::to_string(out);
  const Tensor x = random_gpu({N, in}, 1), w = random_gpu({E, out, in}, 2, DType::bf16, 0.02f);
  Tensor y_ref = Tensor::empty({N, out}, DType::bf16, gpu), y = Tensor::empty({N, out}, DType::bf16, gpu);
  int64_t begin = 0;
  for (int64_t e = 0; e < E; begin += pr.counts[size_t(e)], ++e) {
    if (pr.counts[size_t(e)] == 0) continue;
    Tensor y_e = y_ref.slice(begin, begin + pr.counts[size_t(e)]);
    ops::cuda::linear_forward(y_e, x.slice(begin, begin + pr.counts[size_t(e)]), w.select(e), Tensor());
  }
  cudaStream_t stream = cuda::current_stream();
  const auto run = [&](auto launch, const char* name) {
    CUDA_CHECK(cudaMemset(y.raw(), 0xff, y.nbytes()));
    const auto fwd = [&] { launch(ptr<Bf16>(y), ptr<Bf16>(x), ptr<Bf16>(w), in, out, pr.counts.data(), int(E), stream); };
    fwd();
    CUDA_CHECK(cudaDeviceSynchronize());
    print_row(shape, "fwd", name, median_ms(fwd), flops, normwise_error(y, y_ref));
    std::fflush(stdout);
  };
  run(grouped_forward_wgmma<0>, "wgmma_bm128_bn256_bk64_s4");
  run(grouped_forward_wgmma<1>, "wgmma_bm128_bn256_bk64_s4_inflight1");
}

}  // namespace

int main() {
  cuda::init_device(0);
  // Top-2 of micro-batch 4 x seq 2048 = 16384 expert rows over 8 experts, unevenly (a trained router's
  // load) and evenly.
  const std::vector<int64_t> uneven{2560, 1536, 2048, 3072, 1024, 2560, 2048, 1536};
  const std::vector<int64_t> even(8, 2048);
  const Problem problems[] = {
      {"moe-1b-8x fc1", 2048, 2 * 2816, uneven},
      {"moe-1b-8x fc2", 2816, 2048, uneven},
      {"moe-1b-8x fc1 even", 2048, 2 * 2816, even},
      {"moe-1b-8x fc2 even", 2816, 2048, even},
  };
  std::printf("| problem | prod | variant | ms | TFLOP/s | normwise error vs loop |\n|---|---|---|---|---|---|\n");
  for (const Problem& pr : problems) run_problem(pr);
  for (const Problem& pr : problems) run_wgmma_forward(pr);
  return 0;
}
