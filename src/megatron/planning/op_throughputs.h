#pragma once
// Throughputs this engine measured, for megatron plan's step time. Each row says where its numbers
// come from (docs/PERFORMANCE.md sections); a device without a row is planned with the H100's.
namespace megatron::planning {

struct OpThroughputs {
  const char* device;
  // bf16 GEMMs (cuBLASLt) in the training step: llama-1b mbs 8, whose 6 x 16384 tokens x 787M
  // matmul parameters = 77.3 TFLOP took 106.4 ms of device time (PERFORMANCE.md, 2026-11-25,
  // "Our llama-1b iteration"): 727 TFLOP/s.
  double gemm_tflops;
  // Causal flash attention forward + backward (cuDNN): the same iteration's 28.3 ms for 16 layers of
  // B8 S2048 NH32 d64 (forward 2·B·S²·NH·d, backward 2.5x that): 272 TFLOP/s.
  double attention_tflops;
  // Elementwise ops (SwiGLU, RoPE, add+norm, QKV split/merge): 31.5 ms of that iteration. Planned as
  // `elementwise_passes` passes over each layer's (hidden + ffn) activation bytes per token at
  // `hbm_tbps`; 24 passes at 3.0 TB/s reproduce the measured 31.5 ms.
  double hbm_tbps;
  double elementwise_passes;
  // AdamW (multi-tensor, fp32 master and moments, 16-bit copy written): 30 bytes per parameter;
  // llama-1b's 0.85B parameters in 9.1 ms: 2.8 TB/s.
  double adamw_tbps;
  // Host gaps between ops: 10.7 ms of a 188.7 ms step (the same iteration).
  double host_gap_factor;
  // Ring bus bandwidth of NCCL all-reduce between GPUs of one host (nccl-tests' definition):
  // 360 GB/s, the order NVLink 4 gives on H100 SXM; not measured by this engine yet.
  double link_gbps;
  // Optimizer CPU offload (optimizer/adamw_state.h), not measured by this engine yet: the CPU AdamW op
  // streams about 30 bytes per element through host memory, planned at 40 GB/s (a 16-core host's
  // share of its memory bandwidth); gradients down and parameters up over PCIe Gen5 x16 from pinned
  // memory at 25 GB/s, one direction at a time on the copy stream, overlapped with the update.
  double host_adamw_gbps;
  double pcie_gbps;
};

inline constexpr OpThroughputs kH100Throughputs{
    "H100 80GB HBM3 (bf16)", 727.0, 272.0, 3.0, 24.0, 2.8, 188.7 / 178.0, 360.0, 40.0, 25.0};

}  // namespace megatron::planning
