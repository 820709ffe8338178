// Packed documents on one GPU: the variable-length attention path (AttentionParams::cu_seqlens)
// on cuDNN's ragged batch and on our kernels, against what the same documents cost without it,
// forward and backward, bf16, causal, at llama-1b's heads (NH 32, G 8, HS 64) and llama-8b's
// (HS 128), T = 32768 real tokens packed in one row (Megatron's THD form, which cuDNN's ragged
// batch takes), as documents of long-tailed lengths (log-uniform in [64, 8192], pretraining's
// packing), mixed lengths (uniform in [256, 2048]) and uniform lengths (all 512, all 2048):
//   varlen, routed     the op as `megatron train --reset-attention-mask` calls it at CP 1
//                      (cu_seqlens and max_seqlen): cuDNN's ragged batch where it applies (the
//                      path column says which ran, from ops/cuda/op_paths.h)
//   varlen, ours       the same on our flash kernels (attention_flash.h), which skip the key
//                      tiles outside each query tile's documents
//   document masks     the same documents as segment ids: our kernels visit every key tile up to
//                      the diagonal and mask element by element (S^2/2 work; the path before)
//   dense causal       the row as one plain causal sequence, documents ignored (cuDNN): attention
//                      over the same token count without any document structure
//   padded             every document a row of its own, padded to the longest (cuDNN): the
//                      padding alternative at the same real tokens, computing documents x longest
// Columns: median ms of 5 timed runs (after 1 warm-up run, which also builds cuDNN's plans) per
// pass, the path's time over the routed varlen's, and TFLOP/s of the useful work (FlashAttention's
// count over the documents: forward 2 sum_d len_d^2 NH HS, backward 2.5 times that). The varlen
// checks are their out's normwise error against the document-mask path's (bf16 goal 1e-2).
//
// Build: ninja -C build/gpu attention_varlen_bench. Run: build/gpu/attention_varlen_bench
// Measured: docs/PERFORMANCE.md, "Packed documents (variable-length attention)".
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gpu_lab.h"
#include "megatron/core/rng.h"
#include "megatron/core/tensor.h"
#include "megatron/cuda_runtime/device.h"
#include "megatron/ops/attention.h"
#include "megatron/ops/cuda/attention_cudnn.h"
#include "megatron/ops/cuda/attention_flash.h"
#include "megatron/ops/cuda/op_paths.h"

using namespace megatron;
using namespace megatron::bench;

namespace {

constexpr int64_t kRows = 1, kRowLength = 32768, kHeads = 32, kGroups = 8;

// A packing: the lengths of the documents of each row, filling it exactly.
struct Packing {
  std::string name;
  std::vector<std::vector<int64_t>> rows;
};

// Documents whose lengths `draw` gives, the last one of a row cut to fit.
Packing packing(const std::string& name, const std::function<int64_t()>& draw) {
  Packing p{name, {}};
  for (int64_t b = 0; b < kRows; ++b) {
    std::vector<int64_t> docs;
    for (int64_t left = kRowLength; left > 0;) {
      const int64_t len = std::min(left, draw());
      docs.push_back(len);
      left -= len;
    }
    p.rows.push_back(docs);
  }
  return p;
}

std::vector<Packing> packings() {
  HostRng rng(7);
  const auto uniform = [&] { return rng.uniform_int(1u << 30) / double(1u << 30); };
  return {packing("long-tailed 64-8192", [&] { return int64_t(64.0 * std::pow(128.0, uniform())); }),
          packing("mixed 256-2048", [&] { return 256 + int64_t(rng.uniform_int(2048 - 256 + 1)); }),
          packing("uniform 512", [] { return int64_t(512); }), packing("uniform 2048", [] { return int64_t(2048); })};
}

struct Pass {
  double forward_ms, backward_ms;
  double total() const { return forward_ms + backward_ms; }
};

struct Inputs {
  Tensor q, k, v, dout;
};
// Random q, k, v, dout for (S,B) at head dim HS, made once per shape.
const Inputs& inputs(int64_t S, int64_t B, int64_t HS) {
  static std::map<std::array<int64_t, 3>, Inputs> made;
  const std::array<int64_t, 3> key{S, B, HS};
  if (!made.contains(key)) {
    const Shape qs{S, B, kHeads, HS}, kvs{S, B, kGroups, HS};
    made[key] = {random_gpu(qs, 1), random_gpu(kvs, 2), random_gpu(kvs, 3), random_gpu(qs, 4)};
  }
  return made[key];
}

// Which kernels run the attention: the op as routed, or our flash kernels.
enum class Kernels { routed, ours };

// Times forward and backward of causal attention over (S,B) with `params` (documents or none).
Pass time_attention(int64_t S, int64_t B, int64_t HS, const ops::AttentionParams& params, Tensor* out_copy,
                    Kernels kernels = Kernels::routed) {
  const Shape qs{S, B, kHeads, HS}, kvs{S, B, kGroups, HS};
  const auto& [q, k, v, dout] = inputs(S, B, HS);
  const Device gpu = Device::cuda(0);
  Tensor out = Tensor::empty(qs, DType::bf16, gpu), lse = Tensor::empty({B, kHeads, S}, DType::f32, gpu);
  Tensor dq = Tensor::empty(qs, DType::bf16, gpu), dk = Tensor::empty(kvs, DType::bf16, gpu);
  Tensor dv = Tensor::empty(kvs, DType::bf16, gpu);
  const bool ours = kernels == Kernels::ours;
  const double fwd = median_ms(
      [&] {
        if (ours) return ops::cuda::flash_attention_forward(out, lse, q, k, v, params);
        ops::attention_forward(out, lse, q, k, v, params);
      },
      1, 5);
  const double bwd = median_ms(
      [&] {
        if (ours) return ops::cuda::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, params);
        ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, params);
      },
      1, 5);
  if (out_copy) *out_copy = out.to(Device::cpu());
  return {fwd, bwd};
}

void run(const Packing& pk, int64_t HS) {
  const float scale = float(1.0 / std::sqrt(double(HS)));
  Tensor segments = Tensor::empty({kRows, kRowLength}, DType::i32);
  double useful = 0.0;  // sum_d len_d^2 / 2 (causal pairs)
  int64_t documents = 0, longest = 0;
  for (int64_t b = 0; b < kRows; ++b) {
    int64_t s = 0;
    for (size_t d = 0; d < pk.rows[size_t(b)].size(); ++d) {
      const int64_t len = pk.rows[size_t(b)][d];
      for (int64_t n = 0; n < len; ++n) segments.data<int32_t>()[b * kRowLength + s++] = int32_t(d);
      useful += 0.5 * double(len) * double(len);
      longest = std::max(longest, len);
      ++documents;
    }
  }
  const double fwd_flops = 4.0 * useful * double(kHeads) * double(HS);
  ops::AttentionParams varlen{true, scale, 0.0f, 0, 0}, masked = varlen, dense = varlen;
  const Tensor cu_seqlens = ops::packed_cu_seqlens(segments);
  varlen.cu_seqlens = cu_seqlens.to(Device::cuda(0));
  varlen.max_seqlen = ops::longest_document(cu_seqlens);
  masked.segment_ids = segments.to(Device::cuda(0));
  using ops::cuda::OpPath;
  const int64_t on_cudnn = ops::cuda::op_path_count(OpPath::attention_forward_cudnn_packed);
  Tensor varlen_out, ours_out, masked_out;
  const Pass v = time_attention(kRowLength, kRows, HS, varlen, &varlen_out);
  const bool routed_to_cudnn = ops::cuda::op_path_count(OpPath::attention_forward_cudnn_packed) > on_cudnn;
  const Pass o = time_attention(kRowLength, kRows, HS, varlen, &ours_out, Kernels::ours);
  const Pass m = time_attention(kRowLength, kRows, HS, masked, &masked_out);
  const Pass c = time_attention(kRowLength, kRows, HS, dense, nullptr);
  const Pass p = time_attention(longest, documents, HS, dense, nullptr);
  const auto check_of = [&](const Tensor& out) {
    const double error = normwise_error(out, masked_out);
    char text[64];
    std::snprintf(text, sizeof text, "out vs masks %.1e %s", error, error <= 1e-2 ? "ok" : "FAIL");
    return std::string(text);
  };
  const auto line = [&](const char* path, const Pass& t, int64_t tokens, const std::string& check) {
    std::printf("| HS %lld | %s (%lld docs, longest %lld) | %s | %lld | %.3f | %.3f | %.3f | %.2fx | %.1f | %s |\n",
                (long long)HS, pk.name.c_str(), (long long)documents, (long long)longest, path, (long long)tokens,
                t.forward_ms, t.backward_ms, t.total(), t.total() / v.total(),
                (fwd_flops * 3.5) / t.total() * 1e-9, check.c_str());
  };
  line(routed_to_cudnn ? "varlen, routed: cuDNN ragged batch" : "varlen, routed: our kernels (cuDNN declined)", v,
       kRows * kRowLength, check_of(varlen_out));
  line("varlen, our kernels", o, kRows * kRowLength, check_of(ours_out));
  line("document masks (segment ids)", m, kRows * kRowLength, "");
  line("dense causal (no documents)", c, kRows * kRowLength, "");
  line("padded (a row per document)", p, documents * longest, "");
  std::fflush(stdout);
}

}  // namespace

int main() {
  try {
    const cuda::DeviceInfo info = cuda::init_device(0);
    std::printf("device: %s, %d SMs, cuDNN %zu; bf16, causal, NH %lld, G %lld, %lld row of %lld tokens\n\n",
                info.name.c_str(), info.multiprocessors, size_t(ops::cuda::cudnn_runtime_version()), (long long)kHeads,
                (long long)kGroups, (long long)kRows, (long long)kRowLength);
    std::printf(
        "| head dim | packing | path | tokens computed | fwd ms | bwd ms | fwd+bwd ms | time / routed varlen's | "
        "useful TFLOP/s | check |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
    const std::vector<Packing> all = packings();
    for (const int64_t HS : {int64_t(64), int64_t(128)})
      for (const Packing& pk : all) run(pk, HS);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_varlen_bench: %s\n", e.what());
    return 2;
  }
}
