#pragma once
// The grouped GEMM of the MoE experts (--moe-grouped-gemm): rows of x are grouped by expert,
// expert e owning rows.counts[e] consecutive rows (counts sum to the rows) and its weight weight[e]
// of the (E, out, in) stack. The counts are known on the host, or, when the routing ran on the
// device (ops/moe_routing.h), only as the device's row offsets: our bf16/f16 CUDA kernel reads
// those in place; the cuBLAS path (f32, other shapes) and the CPU read them on the host (on CUDA a
// copy back that waits for the device). One call covers every expert (one cuBLAS grouped launch on CUDA); the
// per-expert loop of linear ops (gemm.h) computes the same. As gemm.h, backward overwrites dX and
// accumulates dW into the fp32 main grad (an expert without rows adds nothing) or writes dW over
// it (GradWrite::overwrite: an expert without rows gets zeros).
#include <vector>

#include "megatron/core/tensor.h"
#include "megatron/ops/gemm.h"
#include "megatron/ops/op.h"

namespace megatron::ops {

// Which rows belong to which expert.
struct ExpertRows {
  std::vector<int64_t> counts;  // (E) each expert's rows; empty when only `offsets` is known
  Tensor offsets;               // (E+1) i32 row offsets on the operands' device; undefined with counts

  // Host counts are the common case: a vector converts implicitly.
  ExpertRows(std::vector<int64_t> host_counts) : counts(std::move(host_counts)) {}  // NOLINT(google-explicit-constructor)
  static ExpertRows on_device(Tensor row_offsets) {
    ExpertRows rows({});
    rows.offsets = std::move(row_offsets);
    return rows;
  }
  int64_t experts() const { return offsets.defined() ? offsets.numel() - 1 : int64_t(counts.size()); }
  // The counts on the host: read back from the offsets when only they are known.
  std::vector<int64_t> host_counts() const {
    if (!offsets.defined()) return counts;
    const Tensor host = offsets.to(Device::cpu());
    std::vector<int64_t> c(static_cast<size_t>(experts()));
    for (int64_t e = 0; e < experts(); ++e) c[size_t(e)] = int64_t(host.item(e + 1) - host.item(e));
    return c;
  }
};

// With counts on the host and at least this many rows per expert on average, CUDA runs one
// cuBLASLt GEMM per expert instead of one launch of its grouped kernel: at moe-1b-8x's 2048-row
// experts cuBLASLt's Hopper kernels ran 730-740 TFLOP/s per expert against the kernel's 320-360
// (H100, 2026-11-28), and a training step 145 against 187 ms. A caller holding only device
// offsets reads the counts back (one wait) to take this path.
constexpr int64_t kPerExpertGemmRows = 1024;

// y (N,out): rows of e = x rows of e (N_e,in) @ weight[e]^T
MEGATRON_OP(grouped_linear_forward,
            void(Tensor& y, const Tensor& x, const Tensor& weight, const ExpertRows& rows));
// dx (N,in): rows of e = dy rows of e @ weight[e]       (overwrites; skipped when dx undefined)
// dweight (E,out,in): [e] += dy_e^T @ x_e               (or = with GradWrite::overwrite; skipped
//                                                       when undefined)
MEGATRON_OP(grouped_linear_backward, void(Tensor& dx, Tensor& dweight, const Tensor& dy, const Tensor& x,
                                          const Tensor& weight, const ExpertRows& rows, GradWrite dweight_write));

}  // namespace megatron::ops
