// A dropless MoE layer routed on the device waits for nothing: its forward and backward enqueue
// behind a queue of GPU work without waiting for it (no copy to the host, no synchronisation),
// while the same layer with a capacity factor (routed on the host: the logits come back, as in
// Megatron) waits for the queue at its routing. The queue is 200 large f32 GEMMs (0.1-0.5 s);
// "waits" is judged at half of the time until the GPU is done, far from either case's expected
// value (about 0 and about 1 of it), so a loaded host does not flip the verdict.
#include <chrono>

#include "gpu/cuda_test_util.h"
#include "megatron/ops/gemm.h"
#include "megatron/parallel/comm.h"
#include "megatron/parameters/parameter_registry.h"
#include "megatron/transformer/moe/moe_layer.h"
#include "tiny_models.h"

using namespace megatron;
using namespace megatron::test;

namespace {

class CudaMoeLayer : public CudaTest {};

TransformerConfig moe_config(bool capacity) {
  TransformerConfig c = megatron::testing::llama_style(DType::bf16);
  c.hidden_size = 256;
  c.seq_length = c.max_position_embeddings = 256;
  c.hidden_dropout = 0.0f;
  c.moe.num_moe_experts = 8;
  c.moe.moe_router_topk = 2;
  c.moe.moe_ffn_hidden_size = 512;
  c.moe.moe_grouped_gemm = true;
  c.moe.moe_aux_loss_coeff = 1e-2;
  c.moe.moe_z_loss_coeff = 1e-3;
  if (capacity) c.moe.moe_expert_capacity_factor = 1.0;
  return c;
}

struct Timing {
  double enqueue_ms;  // host time of the layer's forward and backward calls
  double total_ms;    // until the GPU has finished the queue and the layer
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Timing time_behind_busy_gpu(bool capacity) {
  const TransformerConfig config = moe_config(capacity);
  ParallelContext ctx = ParallelContext::single_process();
  ParameterRegistry registry;
  moe::MoELayer layer(registry, ctx, config, "decoder.layers.0.mlp");
  registry.allocate(DType::bf16, gpu());
  registry.initialize(5);
  const int64_t S = config.seq_length, B = 4, H = config.hidden_size;
  const Tensor x = random_pair({S, B, H}, DType::bf16, 1).gpu, dy = random_pair({S, B, H}, DType::bf16, 2).gpu;
  const ForwardContext fwd{.training = true, .seed = 3, .step = 0};
  const auto forward_backward = [&] {
    moe::MoELayer::Saved saved;
    const Tensor y = layer.forward(x, fwd, saved);
    const Tensor dx = layer.backward(dy, saved);
  };
  forward_backward();  // warm-up: the caching allocator's blocks, the kernels' attributes
  cuda::synchronize();

  const int64_t n = 4096;
  const Tensor a = random_pair({n, n}, DType::f32, 3).gpu, w = random_pair({n, n}, DType::f32, 4).gpu;
  Tensor out = Tensor::empty({n, n}, DType::f32, gpu());
  // ~137 GFLOP each: 2-3 ms in full fp32, a fifth of that in TF32; either way far above 20 ms.
  for (int i = 0; i < 200; ++i) ops::cuda::linear_forward(out, a, w, Tensor());
  const auto t0 = std::chrono::steady_clock::now();
  forward_backward();
  const double enqueue_ms = ms_since(t0);
  cuda::synchronize();
  return {enqueue_ms, ms_since(t0)};
}

}  // namespace

TEST_F(CudaMoeLayer, DeviceRoutingWaitsForNothing) {
  const Timing t = time_behind_busy_gpu(false);
  ASSERT_GT(t.total_ms, 20.0) << "the queued GEMMs should keep the GPU busy longer than this";
  EXPECT_LT(t.enqueue_ms, 0.5 * t.total_ms) << "the layer waited for the GPU: " << t.enqueue_ms << " of "
                                            << t.total_ms << " ms";
}

// The control: the test can see a wait.
TEST_F(CudaMoeLayer, HostRoutingWaitsForTheQueue) {
  const Timing t = time_behind_busy_gpu(true);
  ASSERT_GT(t.total_ms, 20.0) << "the queued GEMMs should keep the GPU busy longer than this";
  EXPECT_GT(t.enqueue_ms, 0.5 * t.total_ms) << "the host-routed layer did not wait: " << t.enqueue_ms << " of "
                                            << t.total_ms << " ms";
}
