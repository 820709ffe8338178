// multirank-np: 2 4
// The MoE layer under expert parallelism (every rank of the world one EP rank holding E/EP
// experts) equals the single-rank layer, in f64, with both token dispatchers: allgather (every rank
// gathers the EP group's tokens) and alltoall (each rank sends its tokens' rows to their experts'
// ranks with variable split sizes, and receives the outputs back). Each rank's output and input
// gradient equal the single rank's on that rank's tokens; each rank's expert gradients equal the
// single rank's summed over every rank's tokens (its experts served them all); the router's and
// the shared expert's gradients equal the single rank's on this rank's tokens (the data-parallel
// reduction sums them later). The routing losses are on, so the router's backward sees the
// probability gradients plus its own loss terms. The two dispatchers then equal each other.
//
// Tolerance 1e-12 relative to the largest reference value: the same f64 sums in other orders
// (the allgather dispatcher's reduce-scatter adds the ranks' partials; the single rank adds the
// experts' terms in expert order), a few units of 2^-53 each; a token served by the wrong expert,
// a missing partial, a row sent to the wrong rank or a gradient scattered to the wrong rank is off
// by O(1).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "megatron/transformer/moe/moe_layer.h"
#include "multirank/multirank_util.h"
#include "unit/op_test_util.h"

namespace megatron::testing {
namespace {

TransformerConfig moe_config() {
  TransformerConfig c;
  c.num_layers = 1;
  c.hidden_size = 16;
  c.ffn_hidden_size = 24;
  c.seq_length = 4;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.init_method_std = 0.3f;
  c.params_dtype = DType::f64;
  c.moe.num_moe_experts = 8;
  c.moe.moe_router_topk = 2;
  c.moe.moe_ffn_hidden_size = 8;
  c.moe.moe_shared_expert_intermediate_size = 12;
  c.moe.moe_aux_loss_coeff = 0.1;
  c.moe.moe_z_loss_coeff = 0.01;
  c.moe.moe_grouped_gemm = true;
  return c;
}

void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.numel(), expected.numel()) << what;
  const double scale = std::max(1e-300, test::max_abs(expected));
  double worst = 0.0;
  for (int64_t i = 0; i < actual.numel(); ++i) worst = std::max(worst, std::fabs(actual.item(i) - expected.item(i)));
  EXPECT_LE(worst, 1e-12 * scale) << what << ": largest difference " << worst << " against max " << scale;
}

const std::string kPrefix = "decoder.layers.0.mlp";
const ForwardContext kForward{.training = true, .aux_loss_grad_scale = 0.5f};
Tensor input(int r) { return test::randn({4, 2, 16}, DType::f64, 100 + uint64_t(r)); }
Tensor output_grad(int r) { return test::randn({4, 2, 16}, DType::f64, 200 + uint64_t(r)); }

// One forward and backward of the EP layer on this rank's tokens: its output, input gradient and
// every parameter's gradient by name.
struct LayerRun {
  Tensor y, dx;
  std::map<std::string, Tensor> grads;
};

LayerRun run_expert_parallel(const ParallelContext& ctx, TokenDispatcherType dispatcher) {
  TransformerConfig config = moe_config();
  config.moe.moe_token_dispatcher_type = dispatcher;
  ParameterRegistry registry(0, 1, ctx.ep->rank(), ctx.ep->size());
  moe::MoELayer layer(registry, ctx, config, kPrefix);
  registry.allocate(DType::f64);
  registry.initialize(7);
  registry.zero_grads();
  moe::MoELayer::Saved saved;
  LayerRun run;
  run.y = layer.forward(input(ctx.ep->rank()), kForward, saved);
  run.dx = layer.backward(output_grad(ctx.ep->rank()), saved);
  for (const auto& p : registry.params()) run.grads[p->spec.name] = p->main_grad.clone();
  return run;
}

// The world as one EP group: every rank holds E / world experts.
ParallelState every_rank_one_ep_rank() {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return make_state({.ep = world}, 30);
}

class MoEExpertParallel : public ::testing::TestWithParam<TokenDispatcherType> {};

TEST_P(MoEExpertParallel, LayerMatchesTheSingleRank) {
  const ParallelState st = every_rank_one_ep_rank();
  const int ep = st.ctx.ep->size(), rank = st.ctx.ep->rank();
  const TransformerConfig config = moe_config();
  const LayerRun run = run_expert_parallel(st.ctx, GetParam());

  const ParallelContext single = ParallelContext::single_process();
  ParameterRegistry ref_registry;
  moe::MoELayer ref(ref_registry, single, config, kPrefix);
  ref_registry.allocate(DType::f64);
  ref_registry.initialize(7);
  // The single rank on every rank's tokens, one at a time; gradients kept per rank.
  std::vector<Tensor> ref_grads;
  Tensor ref_y, ref_dx;
  for (int r = 0; r < ep; ++r) {
    ref_registry.zero_grads();
    moe::MoELayer::Saved s;
    const Tensor y_r = ref.forward(input(r), kForward, s);
    const Tensor dx_r = ref.backward(output_grad(r), s);
    if (r == rank) ref_y = y_r, ref_dx = dx_r;
    ref_grads.push_back(ref_registry.grad_buffer().clone());
  }
  expect_close(run.y, ref_y, "output");
  expect_close(run.dx, ref_dx, "input gradient");

  const int64_t local_experts = config.moe.num_moe_experts / ep, first = rank * local_experts;
  for (const auto& [name, grad] : run.grads) {
    const Parameter* q = ref_registry.find(name);
    ASSERT_NE(q, nullptr) << name;
    Tensor expected;
    if (q->spec.expert_parallel) {
      EXPECT_EQ(grad.dim(0), local_experts) << name;
      expected = Tensor::zeros(grad.shape(), DType::f64);
      for (const Tensor& g : ref_grads) {
        const Tensor mine = q->view_of(g).slice(first, first + local_experts);
        for (int64_t i = 0; i < expected.numel(); ++i) expected.set_item(i, expected.item(i) + mine.item(i));
      }
    } else {
      expected = q->view_of(ref_grads[size_t(rank)]);
    }
    expect_close(grad, expected, name + " gradient");
  }
}

// The same exchange of tokens by two routes: the all-to-all dispatcher's results are the allgather
// dispatcher's.
TEST(MoEExpertParallelDispatchers, AllToAllEqualsAllGather) {
  const ParallelState st = every_rank_one_ep_rank();
  const LayerRun gathered = run_expert_parallel(st.ctx, TokenDispatcherType::allgather);
  const LayerRun exchanged = run_expert_parallel(st.ctx, TokenDispatcherType::alltoall);
  expect_close(exchanged.y, gathered.y, "output");
  expect_close(exchanged.dx, gathered.dx, "input gradient");
  for (const auto& [name, grad] : gathered.grads) expect_close(exchanged.grads.at(name), grad, name + " gradient");
}

std::string dispatcher_name(const ::testing::TestParamInfo<TokenDispatcherType>& dispatcher) {
  return dispatcher.param == TokenDispatcherType::allgather ? "allgather" : "alltoall";
}

INSTANTIATE_TEST_SUITE_P(Dispatchers, MoEExpertParallel,
                         ::testing::Values(TokenDispatcherType::allgather, TokenDispatcherType::alltoall),
                         dispatcher_name);

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
