// The tensor-parallel split of every parameter, without communication: a GPTModel built as TP
// rank r of T (a stand-in communicator that only reports rank and size) initialises exactly the
// slice of the TP=1 model that Megatron's layout gives rank r. Expected slices are written out
// here from the layout rules (reference/megatron-compat.md §10.6), not from Parameter's own
// slicing: fused QKV rows are group-major, so rank r holds query groups [r G/T, (r+1) G/T) with
// their q, k and v rows; fused SwiGLU fc1 holds gate rows and up rows of the same F/T block;
// row-parallel weights hold a block of columns; the vocabulary a block of rows; everything else
// is whole (and a TP duplicate on ranks > 0). Initialisation is a function of (seed, name,
// global index), so the values compare bitwise.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "megatron/models/gpt/gpt_model.h"
#include "megatron/training/arguments.h"
#include "test_util.h"

using namespace megatron;

namespace {

// Rank `rank` of a group of `size`; any collective is a test failure.
class RankStandIn final : public Communicator {
 public:
  RankStandIn(int rank, int size) : rank_(rank), size_(size), ranks_(size_t(size)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "tp"; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  void set_timeout(double) override {}
  double timeout() const override { return 1; }
  CommHandlePtr all_reduce_coalesced_async(std::span<Tensor>, ReduceOp) override { return fail(); }
  CommHandlePtr all_gather_coalesced_async(std::span<Tensor>, std::span<const Tensor>) override { return fail(); }
  CommHandlePtr reduce_scatter_coalesced_async(std::span<Tensor>, std::span<const Tensor>, ReduceOp) override {
    return fail();
  }
  CommHandlePtr broadcast_async(Tensor&, int) override { return fail(); }
  CommHandlePtr all_to_all_async(Tensor&, const Tensor&) override { return fail(); }
  CommHandlePtr all_to_all_v_async(Tensor&, std::span<const int64_t>, const Tensor&,
                                   std::span<const int64_t>) override {
    return fail();
  }
  CommHandlePtr batch_p2p_async(std::span<const P2POp>) override { return fail(); }
  CommHandlePtr barrier_async() override { return fail(); }

 private:
  static CommHandlePtr fail() { MEGATRON_FAIL("building and initialising a model must not communicate"); }
  int rank_, size_;
  std::vector<int> ranks_;
};

TransformerConfig config_of(const std::vector<std::string>& model_flags, int tp) {
  std::vector<std::string> argv = {"--num-layers",
                                   "2",
                                   "--micro-batch-size",
                                   "2",
                                   "--train-iters",
                                   "10",
                                   "--lr",
                                   "1e-3",
                                   "--mock-data",
                                   "--tokenizer-type",
                                   "NullTokenizer",
                                   "--vocab-size",
                                   "100"};
  argv.insert(argv.end(), model_flags.begin(), model_flags.end());
  argv.insert(argv.end(), {"--tensor-model-parallel-size", std::to_string(tp), "--make-vocab-size-divisible-by", "32"});
  return parse_training_args(argv, tp).model;
}

const std::vector<std::string> kGpt = {"--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16"};
const std::vector<std::string> kLlama = {"--hidden-size",
                                         "32",
                                         "--num-attention-heads",
                                         "8",
                                         "--seq-length",
                                         "16",
                                         "--group-query-attention",
                                         "--num-query-groups",
                                         "4",
                                         "--swiglu",
                                         "--normalization",
                                         "RMSNorm",
                                         "--position-embedding-type",
                                         "rope",
                                         "--untie-embeddings-and-output-weights",
                                         "--ffn-hidden-size",
                                         "64",
                                         "--disable-bias-linear"};

// Rows [begin, end) of a 2-D (or 1-D) tensor, as a copy.
Tensor rows(const Tensor& t, int64_t begin, int64_t end) { return t.slice(begin, end).clone(); }

// Columns [begin, end) of a 2-D tensor.
Tensor columns(const Tensor& t, int64_t begin, int64_t end) {
  Tensor out = Tensor::empty({t.dim(0), end - begin}, t.dtype());
  for (int64_t i = 0; i < t.dim(0); ++i)
    for (int64_t j = begin; j < end; ++j) out.set_item(i * (end - begin) + j - begin, t.item(i * t.dim(1) + j));
  return out;
}

Tensor concat_rows(const Tensor& a, const Tensor& b) {
  Shape shape = a.shape();
  shape[0] += b.dim(0);
  Tensor out = Tensor::empty(shape, a.dtype());
  out.slice(0, a.dim(0)).copy_from(a);
  out.slice(a.dim(0), shape[0]).copy_from(b);
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What rank r of T holds of the full tensor `full` of parameter `name`.
Tensor expected_shard(const std::string& name, const Tensor& full, const TransformerConfig& c, int r, int T) {
  const auto block = [&](int64_t n) { return std::pair{r * n / T, (r + 1) * n / T}; };
  if (ends_with(name, "linear_qkv.weight") || ends_with(name, "linear_qkv.bias")) {
    const int64_t group_rows = (c.num_attention_heads / c.num_query_groups + 2) * c.kv_channels;
    const auto [g0, g1] = block(c.num_query_groups);
    return rows(full, g0 * group_rows, g1 * group_rows);  // whole groups: q heads, k, v
  }
  if (ends_with(name, "linear_fc1.weight") || ends_with(name, "linear_fc1.bias")) {
    const int64_t F = c.ffn_hidden_size;
    const auto [f0, f1] = block(F);
    if (!c.swiglu) return rows(full, f0, f1);
    return concat_rows(rows(full, f0, f1), rows(full, F + f0, F + f1));  // [gate_r; up_r]
  }
  if (ends_with(name, "linear_proj.weight") || ends_with(name, "linear_fc2.weight")) {
    const auto [k0, k1] = block(full.dim(1));
    return columns(full, k0, k1);
  }
  if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight") {
    const auto [v0, v1] = block(c.padded_vocab_size);
    return rows(full, v0, v1);
  }
  return full.clone();  // replicated: norms, row-parallel biases, position embeddings
}

void expect_shards_of_full_model(const std::vector<std::string>& flags, int T) {
  const TransformerConfig full_config = config_of(flags, 1);
  GPTModel full(full_config, ParallelContext::single_process());
  full.parameters().initialize(7);
  const TransformerConfig config = config_of(flags, T);
  ASSERT_EQ(config.padded_vocab_size, full_config.padded_vocab_size);
  for (int r = 0; r < T; ++r) {
    ParallelContext ctx = ParallelContext::single_process();
    ctx.tp = std::make_shared<RankStandIn>(r, T);
    GPTModel shard(config, ctx);
    shard.parameters().initialize(7);
    ASSERT_EQ(shard.parameters().params().size(), full.parameters().params().size());
    for (const auto& p : shard.parameters().params()) {
      const std::string& name = p->spec.name;
      const Parameter* whole = full.parameters().find(name);
      ASSERT_NE(whole, nullptr) << name;
      const Tensor expected = expected_shard(name, whole->data, config, r, T);
      ASSERT_EQ(p->data.shape(), expected.shape()) << name << " rank " << r << " of " << T;
      for (int64_t i = 0; i < expected.numel(); ++i)
        ASSERT_EQ(p->data.item(i), expected.item(i)) << name << " element " << i << ", rank " << r << " of " << T;
      EXPECT_EQ(p->is_duplicate(), r > 0 && p->spec.partition_dim < 0) << name;
    }
  }
}

}  // namespace

TEST(TensorParallelShards, GptStyleRanksHoldTheirSlicesOfTheFullModel) {
  for (const int T : {2, 4}) expect_shards_of_full_model(kGpt, T);
}

TEST(TensorParallelShards, LlamaStyleRanksHoldWholeQueryGroupsAndMatchingGateUpHalves) {
  for (const int T : {2, 4}) expect_shards_of_full_model(kLlama, T);
}

// Megatron-Core requires whole query groups per rank; building one with fewer groups than ranks
// fails while the model is built, naming the values and the fix.
TEST(TensorParallelShards, FewerQueryGroupsThanRanksIsRejected) {
  const TransformerConfig config = config_of(kLlama, 2);
  ParallelContext ctx = ParallelContext::single_process();
  ctx.tp = std::make_shared<RankStandIn>(0, 8);
  const std::string error = megatron::testing::error_of([&] { GPTModel model(config, ctx); });
  EXPECT_NE(error.find("--num-query-groups 4 is not divisible by --tensor-model-parallel-size 8"), std::string::npos)
      << error;
  EXPECT_NE(error.find("use a TP that divides 4, or more query groups"), std::string::npos) << error;
}

// The registry cuts every shard from the TP rank and size it was built with; a layer given a
// registry of another TP layout than its context's TP group fails while it is built.
TEST(TensorParallelShards, LayersRejectARegistryOfAnotherTpLayout) {
  ParallelContext ctx = ParallelContext::single_process();
  ctx.tp = std::make_shared<RankStandIn>(1, 2);
  ParameterRegistry whole;  // TP rank 0 of 1
  const std::string rule = "the parameter registry holds TP rank 0 of 1 but the context's TP group is rank 1 of 2";
  using megatron::testing::error_of;
  EXPECT_NE(error_of([&] { tensor_parallel::ColumnParallelLinear(whole, ctx, "fc1", 8, 8, {}); }).find(rule),
            std::string::npos);
  EXPECT_NE(error_of([&] { tensor_parallel::RowParallelLinear(whole, ctx, "fc2", 8, 8, {}); }).find(rule),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { tensor_parallel::VocabParallelEmbedding(whole, ctx, "emb", 8, 4, 0.02f, false); }).find(rule),
      std::string::npos);
  ParameterRegistry shard(1, 2);
  const tensor_parallel::ColumnParallelLinear fc1(shard, ctx, "fc1", 6, 8, {});
  EXPECT_EQ(shard.find("fc1.weight")->local_shape, (Shape{4, 6}));
  EXPECT_EQ(shard.find("fc1.weight")->tp_rank, 1);
  EXPECT_NE(error_of([] { ParameterRegistry bad(2, 2); }).find("TP rank 2 of 2 ranks"), std::string::npos);
}
