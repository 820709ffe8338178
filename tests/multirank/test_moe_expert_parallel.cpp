// multirank-np: 2 4
// The MoE layer under expert parallelism (the allgather dispatcher, every rank of the world one EP
// rank holding E/EP experts) equals the single-rank layer, in f64: each rank's output and input
// gradient equal the single rank's on that rank's tokens; each rank's expert gradients equal the
// single rank's summed over every rank's tokens (its experts served them all); the router's and
// the shared expert's gradients equal the single rank's on this rank's tokens (the data-parallel
// reduction sums them later). The routing losses are on, so the router's backward sees the
// reduce-scattered probability gradients plus its own loss terms.
//
// Tolerance 1e-12 relative to the largest reference value: the same f64 sums in other orders
// (the reduce-scatter adds the ranks' partials; the single rank adds the experts' terms in expert
// order), a few units of 2^-53 each; a token served by the wrong expert, a missing partial or a
// gradient scattered to the wrong rank is off by O(1).
#include <mpi.h>

#include <algorithm>
#include <cmath>
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

TEST(MoEExpertParallel, LayerMatchesTheSingleRank) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ParallelSizes sizes;
  sizes.ep = world;
  ParallelState st = make_state(sizes, 30);
  const int ep = st.ctx.ep->size(), rank = st.ctx.ep->rank();
  ASSERT_EQ(ep, world);
  const TransformerConfig config = moe_config();
  const std::string prefix = "decoder.layers.0.mlp";
  ParameterRegistry registry(0, 1, rank, ep);
  moe::MoELayer layer(registry, st.ctx, config, prefix);
  registry.allocate(DType::f64);
  registry.initialize(7);
  const ParallelContext single = ParallelContext::single_process();
  ParameterRegistry ref_registry;
  moe::MoELayer ref(ref_registry, single, config, prefix);
  ref_registry.allocate(DType::f64);
  ref_registry.initialize(7);

  const ForwardContext fwd{.training = true, .aux_loss_grad_scale = 0.5f};
  const auto input = [](int r) { return test::randn({4, 2, 16}, DType::f64, 100 + uint64_t(r)); };
  const auto output_grad = [](int r) { return test::randn({4, 2, 16}, DType::f64, 200 + uint64_t(r)); };

  registry.zero_grads();
  moe::MoELayer::Saved saved;
  const Tensor y = layer.forward(input(rank), fwd, saved);
  const Tensor dx = layer.backward(output_grad(rank), saved);

  // The single rank on every rank's tokens, one at a time; gradients kept per rank.
  std::vector<Tensor> ref_grads;
  Tensor ref_y, ref_dx;
  for (int r = 0; r < ep; ++r) {
    ref_registry.zero_grads();
    moe::MoELayer::Saved s;
    const Tensor y_r = ref.forward(input(r), fwd, s);
    const Tensor dx_r = ref.backward(output_grad(r), s);
    if (r == rank) ref_y = y_r, ref_dx = dx_r;
    ref_grads.push_back(ref_registry.grad_buffer().clone());
  }
  expect_close(y, ref_y, "output");
  expect_close(dx, ref_dx, "input gradient");

  for (const auto& p : registry.params()) {
    const Parameter* q = ref_registry.find(p->spec.name);
    ASSERT_NE(q, nullptr) << p->spec.name;
    Tensor expected;
    if (p->spec.expert_parallel) {
      EXPECT_EQ(p->local_shape[0], config.moe.num_moe_experts / ep) << p->spec.name;
      expected = Tensor::zeros(p->local_shape, DType::f64);
      for (const Tensor& g : ref_grads) {
        const Tensor mine = q->view_of(g).slice(p->expert_offset(), p->expert_offset() + p->local_shape[0]);
        for (int64_t i = 0; i < expected.numel(); ++i) expected.set_item(i, expected.item(i) + mine.item(i));
      }
      // The experts' weights are the single rank's rows of this rank's experts.
      expect_close(p->data, q->data.slice(p->expert_offset(), p->expert_offset() + p->local_shape[0]),
                   p->spec.name + " weights");
    } else {
      expected = q->view_of(ref_grads[size_t(rank)]);
    }
    expect_close(p->main_grad, expected, p->spec.name + " gradient");
  }
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
