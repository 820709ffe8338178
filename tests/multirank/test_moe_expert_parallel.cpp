// multirank-np: 2 4
// The MoE layer under expert parallelism and expert tensor parallelism (= TP, with sequence
// parallelism) equals the single-rank layer, in f64, with both token dispatchers: allgather (every
// rank gathers the expert TP x EP group's tokens) and alltoall (each rank sends its tokens' rows to
// their experts' ranks with variable split sizes, and receives the outputs back). Layouts: EP =
// world (every rank one EP rank holding E/EP experts), TP 2 x EP world/2 (2 ranks: TP 2 alone;
// 4: EP 2 x TP 2), where the two TP ranks of a replica hold the two halves of one micro-batch's
// sequence and each half of every one of their experts' FFN, and TP 2 x EP 2 with expert TP 1
// (--expert-tensor-parallel-size 1), where the two TP ranks of a replica are the EP ranks, each
// holding whole experts, and exchange their sequence halves; and TP 2 with expert TP 1 and no EP,
// where nothing is exchanged and each TP rank routes its sequence half on the device path. Each rank's output and input
// gradient equal the single rank's on that rank's tokens; each rank's expert gradients (its
// experts, its expert TP shard of each) equal the single rank's summed over the tokens of every
// replica in its expert TP x EP group (its experts served them all); the router's gradient summed over TP (as finalize_model_grads sums
// sequence-parallel parameters) and the shared expert's TP shard equal the single rank's on its
// replica's tokens (the data-parallel reduction sums them later). The routing losses are on, so
// the router's backward sees the probability gradients plus its own loss terms, whose counts are
// summed over the sequence shards. The two dispatchers then equal each other.
//
// Tolerance 1e-12 relative to the largest reference value: the same f64 sums in other orders
// (the reduce-scatters add the ranks' partials, TP shards add partial outputs; the single rank
// adds the experts' terms in expert order), a few units of 2^-53 each; a token served by the wrong
// expert, a missing partial, a row sent to the wrong rank, a TP shard of the wrong rows or a
// gradient scattered to the wrong rank is off by O(1).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>
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
// A micro-batch (S=4, B=2, H=16) per data-parallel replica.
Tensor input(int replica) { return test::randn({4, 2, 16}, DType::f64, 100 + uint64_t(replica)); }
Tensor output_grad(int replica) { return test::randn({4, 2, 16}, DType::f64, 200 + uint64_t(replica)); }

// The replica whose micro-batch this rank holds, and its sequence shard of a (S,B,H) tensor.
int replica(const ParallelContext& ctx) { return ctx.dp->rank(); }
Tensor sequence_shard(const Tensor& t, const ParallelContext& ctx) {
  const int64_t rows = t.dim(0) / ctx.tp_size();
  return t.slice(ctx.tp_rank() * rows, (ctx.tp_rank() + 1) * rows).clone();
}

// One forward and backward of the parallel layer on this rank's tokens: its output, input
// gradient and every parameter's gradient by name (the router's summed over TP).
struct LayerRun {
  Tensor y, dx;
  std::map<std::string, Tensor> grads;
};

LayerRun run_parallel(const ParallelContext& ctx, TokenDispatcherType dispatcher) {
  TransformerConfig config = moe_config();
  config.moe.moe_token_dispatcher_type = dispatcher;
  ParameterRegistry registry(ctx.tp_rank(), ctx.tp_size(), ctx.ep->rank(), ctx.ep->size(), ctx.expert_tp->rank(),
                             ctx.expert_tp->size());
  moe::MoELayer layer(registry, ctx, config, kPrefix);
  registry.allocate(DType::f64);
  registry.initialize(7);
  registry.zero_grads();
  moe::MoELayer::Saved saved;
  LayerRun run;
  run.y = layer.forward(sequence_shard(input(replica(ctx)), ctx), kForward, saved);
  run.dx = layer.backward(sequence_shard(output_grad(replica(ctx)), ctx), saved);
  // Experts that served only this rank's sequence half (no exchange: the expert TP x EP group is
  // this rank) hold that half's share: the expert data-parallel reduction, which then spans the TP
  // ranks, sums the halves, as finalize_model_grads sums the sequence-parallel parameters.
  const bool own_shard_only = ctx.tp_size() > 1 && ctx.expert_tp_ep->size() == 1;
  for (const auto& p : registry.params()) {
    if (p->spec.sequence_parallel || (own_shard_only && p->spec.expert_parallel))
      ctx.tp->all_reduce(p->main_grad, ReduceOp::sum);
    run.grads[p->spec.name] = p->main_grad.clone();
  }
  return run;
}

struct Layout {
  std::string name;
  ParallelSizes sizes;
};

std::vector<Layout> layouts() {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return {{"EP=" + std::to_string(world), {.ep = world}},
          {"TP=2 x EP=" + std::to_string(world / 2), {.tp = 2, .ep = world / 2}},
          {"TP=2 x EP=2 x expert TP=1", {.tp = 2, .ep = 2, .etp = 1}},
          // No exchange: each TP rank routes its sequence half on its tensors' device
          // (ops/moe_routing.h), the loads and loss sums all-reduced over the shards.
          {"TP=2 x expert TP=1", {.tp = 2, .etp = 1}}};
}

ParallelState layout_state(const Layout& layout) {
  ParallelState st = make_state(layout.sizes, 30);
  st.ctx.sequence_parallel_given = true;  // takes effect at TP > 1 only
  return st;
}

using Param = std::tuple<TokenDispatcherType, int>;  // dispatcher, index into layouts()
class MoEExpertParallel : public ::testing::TestWithParam<Param> {};

TEST_P(MoEExpertParallel, LayerMatchesTheSingleRank) {
  const Layout layout = layouts()[size_t(std::get<1>(GetParam()))];
  const ParallelState st = layout_state(layout);
  const int replicas = st.ctx.dp->size(), mine = replica(st.ctx);
  const TransformerConfig config = moe_config();
  const LayerRun run = run_parallel(st.ctx, std::get<0>(GetParam()));

  const ParallelContext single = ParallelContext::single_process();
  ParameterRegistry ref_registry;
  moe::MoELayer ref(ref_registry, single, config, kPrefix);
  ref_registry.allocate(DType::f64);
  ref_registry.initialize(7);
  // The single rank on every replica's micro-batch, one at a time; gradients kept per replica.
  std::vector<Tensor> ref_grads;
  Tensor ref_y, ref_dx;
  for (int r = 0; r < replicas; ++r) {
    ref_registry.zero_grads();
    moe::MoELayer::Saved s;
    const Tensor y_r = ref.forward(input(r), kForward, s);
    const Tensor dx_r = ref.backward(output_grad(r), s);
    if (r == mine) ref_y = sequence_shard(y_r, st.ctx), ref_dx = sequence_shard(dx_r, st.ctx);
    ref_grads.push_back(ref_registry.grad_buffer().clone());
  }
  expect_close(run.y, ref_y, layout.name + " output");
  expect_close(run.dx, ref_dx, layout.name + " input gradient");

  // This rank's parameter shards, read out of the single rank's global gradients element by
  // element (Parameter::global_index names each local element's place).
  ParameterRegistry shards(st.ctx.tp_rank(), st.ctx.tp_size(), st.ctx.ep->rank(), st.ctx.ep->size(),
                           st.ctx.expert_tp->rank(), st.ctx.expert_tp->size());
  // The replicas whose tokens this rank's experts served: those of its expert TP x EP group.
  Tensor served_replicas = Tensor::empty({st.ctx.expert_tp_ep->size()}, DType::f32);
  st.ctx.expert_tp_ep->all_gather(served_replicas, Tensor::from_vector({float(mine)}, {1}));
  std::set<int> served;
  for (int64_t i = 0; i < served_replicas.numel(); ++i) served.insert(int(served_replicas.item(i)));
  moe::MoELayer shard_layer(shards, st.ctx, config, kPrefix);
  for (const auto& [name, grad] : run.grads) {
    const Parameter* q = ref_registry.find(name);
    const Parameter* p = shards.find(name);
    ASSERT_NE(q, nullptr) << name;
    ASSERT_EQ(p->local_shape, grad.shape()) << name;
    Tensor expected = Tensor::zeros(grad.shape(), DType::f64);
    for (int r = 0; r < replicas; ++r) {
      if (p->spec.expert_parallel ? !served.count(r) : r != mine) continue;
      const Tensor global = q->view_of(ref_grads[size_t(r)]).view({-1});
      for (int64_t i = 0; i < expected.numel(); ++i)
        expected.set_item(i, expected.item(i) + global.item(p->global_index(i)));
    }
    expect_close(grad, expected, layout.name + " " + name + " gradient");
  }
}

// The same exchange of tokens by two routes: the all-to-all dispatcher's results are the allgather
// dispatcher's.
class MoEExpertParallelDispatchers : public ::testing::TestWithParam<int> {};

TEST_P(MoEExpertParallelDispatchers, AllToAllEqualsAllGather) {
  const ParallelState st = layout_state(layouts()[size_t(GetParam())]);
  const LayerRun gathered = run_parallel(st.ctx, TokenDispatcherType::allgather);
  const LayerRun exchanged = run_parallel(st.ctx, TokenDispatcherType::alltoall);
  expect_close(exchanged.y, gathered.y, "output");
  expect_close(exchanged.dx, gathered.dx, "input gradient");
  for (const auto& [name, grad] : gathered.grads) expect_close(exchanged.grads.at(name), grad, name + " gradient");
}

std::string layout_name(int index) {
  return index == 0 ? "EpIsWorld" : index == 1 ? "Tp2" : index == 2 ? "Tp2Ep2ExpertTp1" : "Tp2ExpertTp1";
}

std::string param_name(const ::testing::TestParamInfo<Param>& param) {
  return std::string(std::get<0>(param.param) == TokenDispatcherType::allgather ? "allgather" : "alltoall") + "_" +
         layout_name(std::get<1>(param.param));
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoEExpertParallel,
                         ::testing::Combine(::testing::Values(TokenDispatcherType::allgather,
                                                              TokenDispatcherType::alltoall),
                                            ::testing::Values(0, 1, 2, 3)),
                         param_name);
std::string layout_param_name(const ::testing::TestParamInfo<int>& layout) { return layout_name(layout.param); }

INSTANTIATE_TEST_SUITE_P(Layouts, MoEExpertParallelDispatchers, ::testing::Values(0, 1, 2, 3), layout_param_name);

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
