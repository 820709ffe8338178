// cuBLASLt algorithm lab: how far the heuristic's first answer (what ops/cuda/gemm.cu runs) is
// from the fastest algorithm cuBLASLt offers for the same problem. For every GEMM of a llama-3b
// layer at micro-batch 2 x 2048 (forward, input gradient, weight gradient of QKV, projection,
// fc1, fc2), in bf16 and in FP8 (hybrid: e4m3 activations and weights, e5m2 gradients; weight
// gradients into f32 with beta 1, as the main-grad accumulation does), it asks the heuristic for
// up to 32 algorithms, times each (median of 15 CUDA-event timings after 3 warm-ups) and prints the
// first algorithm's time, the fastest's, and the fastest's rank in the heuristic's list.
//
// Build from the repository root:
//   nvcc -O3 -std=c++20 -arch=sm_90 bench/kernels/gemm_algos.cu -lcublasLt -o build/gemm_algos_bench
// Run: build/gemm_algos_bench
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

#define CHECK_CUDA(x)                                                                    \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)
#define CHECK_BLAS(x)                                                                              \
  do {                                                                                             \
    cublasStatus_t s_ = (x);                                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cublasLtGetStatusName(s_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

// Column-major D (m, n) = A^T B + beta D with A stored (k, m) and B (k, n), both k-major: the only
// layout FP8 takes on Hopper, and the one the row-major front end hands cuBLASLt for y = x W^T.
struct Problem {
  const char* name;
  int64_t m, n, k;
  cudaDataType a, b, d;
  float beta;
};

size_t bytes_of(cudaDataType t) {
  switch (t) {
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: return 1;
    case CUDA_R_16BF: return 2;
    default: return 4;
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(cublasLtHandle_t lt, const Problem& p, void* workspace, size_t workspace_bytes) {
  void *a = nullptr, *b = nullptr, *d = nullptr;
  CHECK_CUDA(cudaMalloc(&a, p.k * p.m * bytes_of(p.a)));
  CHECK_CUDA(cudaMalloc(&b, p.k * p.n * bytes_of(p.b)));
  CHECK_CUDA(cudaMalloc(&d, p.m * p.n * bytes_of(p.d)));
  CHECK_CUDA(cudaMemset(a, 0x11, p.k * p.m * bytes_of(p.a)));  // small finite values in every type
  CHECK_CUDA(cudaMemset(b, 0x11, p.k * p.n * bytes_of(p.b)));
  CHECK_CUDA(cudaMemset(d, 0, p.m * p.n * bytes_of(p.d)));
  float* scale = nullptr;
  CHECK_CUDA(cudaMalloc(&scale, sizeof(float)));
  const float one = 1.0f;
  CHECK_CUDA(cudaMemcpy(scale, &one, sizeof(float), cudaMemcpyHostToDevice));

  cublasLtMatmulDesc_t desc;
  CHECK_BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
  const bool fp8 = bytes_of(p.a) == 1;
  if (fp8) {
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof(scale)));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale, sizeof(scale)));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, p.a, p.k, p.m, p.k));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, p.b, p.k, p.n, p.k));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&ld, p.d, p.m, p.n, p.m));
  cublasLtMatmulPreference_t pref;
  CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof(workspace_bytes)));
  constexpr int kMaxAlgos = 32;
  cublasLtMatmulHeuristicResult_t results[kMaxAlgos];
  int found = 0;
  CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, kMaxAlgos, results, &found));

  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int i = 0; i < found; ++i) {
    std::vector<float> samples;
    bool ok = true;
    for (int rep = 0; rep < 18 && ok; ++rep) {
      CHECK_CUDA(cudaEventRecord(start));
      ok = cublasLtMatmul(lt, desc, &one, a, la, b, lb, &p.beta, d, ld, d, ld, &results[i].algo, workspace,
                          workspace_bytes, nullptr) == CUBLAS_STATUS_SUCCESS;
      CHECK_CUDA(cudaEventRecord(stop));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      if (rep >= 3) samples.push_back(ms);
    }
    times.push_back(ok ? median(samples) : 1e9f);
  }
  const int best = int(std::min_element(times.begin(), times.end()) - times.begin());
  const double flop = 2.0 * p.m * p.n * p.k;
  std::printf("| %s | %lld x %lld x %lld | %d | %.1f us (%.0f TFLOP/s) | %.1f us (%.0f TFLOP/s) | %d | %.1f%% |\n",
              p.name, (long long)p.m, (long long)p.n, (long long)p.k, found, 1e3 * times[0],
              flop / (times[0] * 1e-3) / 1e12, 1e3 * times[best], flop / (times[best] * 1e-3) / 1e12, best,
              100.0 * (times[0] - times[best]) / times[0]);
  std::fflush(stdout);

  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  CHECK_CUDA(cudaFree(scale));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaFree(d));
}

}  // namespace

int main() {
  cublasLtHandle_t lt;
  CHECK_BLAS(cublasLtCreate(&lt));
  const size_t workspace_bytes = size_t(32) << 20;  // ops/cuda's cuBLASLt workspace
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));

  // llama-3b: hidden 3072, QKV 5120 (24 heads, 8 groups of 128), MLP 8192 (fc1 2 x 8192), 4096
  // tokens. Row-major y (T, N) = x (T, K) W^T is column-major D (N, T): m = N, n = T.
  const int64_t T = 4096, H = 3072, QKV = 5120, F = 8192;
  struct Gemm {
    const char* name;
    int64_t out, in;
  };
  const Gemm layers[] = {{"qkv", QKV, H}, {"proj", H, H}, {"fc1", 2 * F, H}, {"fc2", H, F}};
  const cudaDataType bf = CUDA_R_16BF, f32 = CUDA_R_32F, e4 = CUDA_R_8F_E4M3, e5 = CUDA_R_8F_E5M2;
  std::printf("| GEMM | m x n x k | algorithms | heuristic's first | fastest | its rank | saved |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const bool fp8 : {false, true}) {
    const cudaDataType act = fp8 ? e4 : bf, grad = fp8 ? e5 : bf;
    for (const Gemm& g : layers) {
      char fwd[64], dgrad[64], wgrad[64];
      std::snprintf(fwd, sizeof fwd, "%s %s forward", fp8 ? "fp8" : "bf16", g.name);
      std::snprintf(dgrad, sizeof dgrad, "%s %s dgrad", fp8 ? "fp8" : "bf16", g.name);
      std::snprintf(wgrad, sizeof wgrad, "%s %s wgrad", fp8 ? "fp8" : "bf16", g.name);
      // forward: y (T, out) = x W^T; dgrad: dx (T, in) = dy W, W^T k-major; wgrad: dW (out, in) = dy^T x.
      run(lt, {fwd, g.out, T, g.in, act, act, bf, 0.0f}, workspace, workspace_bytes);
      run(lt, {dgrad, g.in, T, g.out, act, grad, bf, 0.0f}, workspace, workspace_bytes);
      run(lt, {wgrad, g.in, g.out, T, act, grad, f32, 1.0f}, workspace, workspace_bytes);
    }
  }
  CHECK_CUDA(cudaFree(workspace));
  cublasLtDestroy(lt);
  return 0;
}
