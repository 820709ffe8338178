#pragma once
// Which implementation each CUDA op call ran on, counted since the process started. The CUDA ops
// route themselves: attention to cuDNN's fused kernels or to ours (cudnn_attention_applies), the
// linear layers' bias and GELU to cuBLASLt epilogues or to separate kernels. A fallback is silent
// (at most one warning per shape), so a test that means to exercise a fast path asserts through
// these counts that the path ran. One relaxed atomic increment per call. Free of CUDA headers.
#include <cstdint>

namespace megatron::ops::cuda {

enum class OpPath {
  attention_forward_cudnn,  // cuDNN's fused flash attention (attention_cudnn.h)
  attention_backward_cudnn,
  attention_forward_cudnn_packed,  // ... on packed documents, as its ragged batch (cu_seqlens)
  attention_backward_cudnn_packed,
  attention_forward_ours,  // our FlashAttention-2 kernels (attention_flash.h), packed documents too
  attention_backward_ours,
  attention_backward_cudnn_deterministic,  // a cuDNN backward above on the graph without dq atomics
                                           // (AttentionParams::deterministic), counted there too
  embedding_backward_in_token_order,       // the sorted, fixed-order embedding backward
                                           // (EmbeddingParams::deterministic)
  gemm_bias_epilogue,                      // BIAS: the forward bias inside the GEMM
  gemm_gelu_aux_epilogue,                  // GELU_AUX(_BIAS): fc1 writes GELU(x W^T + b) and its input
  gemm_dgelu_epilogue,                     // DGELU: fc2's input gradient times GELU'
  gemm_bgradb_epilogue,                    // BGRADB: the bias gradient out of the weight-gradient GEMM
  gemm_epilogue_unfused,                   // a bias or 16-bit GELU op that ran without its epilogue (no
                                           // cuBLASLt algorithm, or a shape or alignment that rules it out)
  grouped_gemm_mma,                        // one product of the MoE experts' GEMMs (grouped_gemm.h) in one launch
                                           // of our bf16/f16 tensor-core kernel (grouped_gemm_kernels.cuh)
  grouped_gemm_cublas,                     // ... in one cuBLAS grouped launch (f32, or shapes our kernel does not take)
  grouped_gemm_per_expert,                 // ... one cuBLASLt GEMM per expert (many rows each, or no grouped kernel)
  gemm_algo_of_size_class,                 // a GEMM of a shape not seen before on the algorithm cuBLASLt chose for
                                           // another shape of its size class (gemm.cu), checked for this one
};
inline constexpr int kOpPaths = int(OpPath::gemm_algo_of_size_class) + 1;

void count_op_path(OpPath path);
int64_t op_path_count(OpPath path);

}  // namespace megatron::ops::cuda
