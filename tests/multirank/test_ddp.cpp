// multirank-np: 2 4
// DDP and the distributed optimizer on verifiable inputs: main grads are small integers from
// (seed, rank, parameter, element), so the 1/R pre-scaled sums (R a power of two) are exact and
// compare with ==. Buckets start exactly when their last parameter is reported, accumulation
// communicates only on the last micro-batch, reduce-scatter leaves each rank its shards, the
// parameter all-gather restores the full buffer, and the distributed optimizer updates parameters
// exactly as the replicated AdamW, and an fp16 overflow in one rank's shard skips the step on
// every rank.
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "megatron/distributed/ddp.h"
#include "megatron/distributed/distributed_optimizer.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron::testing {
namespace {

// Registration order: a (40), b (7x9 = 63), c (100), d (5). With a 64-element bucket size and no
// distributed optimizer the layout is d [0,5) c [16,116) | b [128,191) | a [192,232): three
// buckets, completed by the notifications d, c / b / a.
void add_params(ParameterRegistry& reg, DType dtype) {
  reg.add({.name = "a", .global_shape = {40}});
  reg.add({.name = "b", .global_shape = {7, 9}, .embedding_or_output = true});  // at --decoupled-lr's rate
  reg.add({.name = "c", .global_shape = {100}});
  reg.add({.name = "d", .global_shape = {5}, .weight_decay = false});
  reg.allocate(dtype);
  reg.initialize(11);
}

// The rank's gradient of element i of parameter p in micro-batch `micro`.
float grad_value(int rank, const Parameter& p, int64_t i, int micro = 0) {
  return value(100 + p.index * 10 + uint64_t(micro), rank, i);
}

// As a backward writes them: each parameter reported before its gradient is written (DDP gives its
// bucket memory then).
void fill_grads(ParameterRegistry& reg, int rank, int micro = 0) {
  for (const auto& p : reg.params()) {
    reg.before_backward(*p);
    Tensor g = p->main_grad;
    for (int64_t i = 0; i < g.numel(); ++i) g.set_item(i, g.item(i) + grad_value(rank, *p, i, micro));
  }
}

// The DP average of the gradients of `micros` micro-batches, element i of p.
double expected_grad(int ranks, const Parameter& p, int64_t i, int micros = 1) {
  double s = 0;
  for (int r = 0; r < ranks; ++r)
    for (int m = 0; m < micros; ++m) s += grad_value(r, p, i, m);
  return s / ranks;
}

// Backward reports parameters from the last registered to the first.
void report_backward(ParameterRegistry& reg) {
  for (size_t i = reg.params().size(); i-- > 0;) reg.grad_ready(*reg.params()[i]);
}

class Ddp : public ::testing::Test {
 protected:
  void SetUp() override {
    st_ = make_state({});
    n_ = st_.ctx.dp_cp->size();
    r_ = st_.ctx.dp_cp->rank();
  }
  ParallelState st_;
  int n_ = 1, r_ = 0;
};

TEST_F(Ddp, BucketsStartWhenTheirLastParameterIsReady) {
  ParameterRegistry reg;
  add_params(reg, DType::f32);
  DistributedDataParallel ddp(reg, st_.ctx, {.overlap_grad_reduce = true, .bucket_size = 64});
  ASSERT_EQ(ddp.layout().buckets.size(), 3u);
  EXPECT_EQ(ddp.layout().params[1], (Range{128, 191}));
  ddp.zero_grad();
  fill_grads(reg, r_);
  const std::vector<int64_t> started_after = {0, 1, 2, 3};  // after d, c, b, a
  for (size_t k = 0; k < 4; ++k) {
    reg.grad_ready(*reg.params()[3 - k]);
    EXPECT_EQ(ddp.buckets_started(), started_after[k]) << "after reporting " << reg.params()[3 - k]->spec.name;
  }
  ddp.finish_grad_sync();
  for (const auto& p : reg.params())
    for (int64_t i = 0; i < p->main_grad.numel(); ++i)
      ASSERT_EQ(p->main_grad.item(i), expected_grad(n_, *p, i)) << p->spec.name << "[" << i << "]";
}

TEST_F(Ddp, AccumulationCommunicatesOnlyAfterTheLastMicroBatch) {
  for (const bool overlap : {false, true}) {
    ParameterRegistry reg;
    add_params(reg, DType::f32);
    DistributedDataParallel ddp(reg, st_.ctx, {.overlap_grad_reduce = overlap, .bucket_size = 64});
    for (int step = 0; step < 2; ++step) {
      ddp.zero_grad();
      for (int m = 0; m < 3; ++m) {
        ddp.set_last_micro_batch(m == 2);
        fill_grads(reg, r_, m);
        report_backward(reg);
        EXPECT_EQ(ddp.buckets_started(), overlap && m == 2 ? 3 : 0) << "micro-batch " << m;
      }
      ddp.finish_grad_sync();
      EXPECT_EQ(ddp.buckets_started(), int64_t(ddp.layout().buckets.size()));
      for (const auto& p : reg.params())
        for (int64_t i = 0; i < p->main_grad.numel(); ++i)
          ASSERT_EQ(p->main_grad.item(i), expected_grad(n_, *p, i, 3))
              << p->spec.name << "[" << i << "] overlap " << overlap << " step " << step;
    }
  }
}

TEST_F(Ddp, ReportingAParameterTwiceIsAnError) {
  ParameterRegistry reg;
  add_params(reg, DType::f32);
  DistributedDataParallel ddp(reg, st_.ctx, {.overlap_grad_reduce = true, .bucket_size = 1000});
  ddp.zero_grad();
  reg.grad_ready(*reg.params()[3]);
  EXPECT_NE(error_of([&] { reg.grad_ready(*reg.params()[3]); }).find("d was reported ready twice"), std::string::npos);
  ddp.finish_grad_sync();
}

TEST_F(Ddp, ReduceScatterLeavesEachRankItsShardsAndGatherRestoresParameters) {
  ParameterRegistry reg;
  add_params(reg, DType::bf16);
  DistributedDataParallel ddp(reg, st_.ctx,
                              {.overlap_grad_reduce = true, .use_distributed_optimizer = true, .bucket_size = 64});
  for (const BucketLayout& b : ddp.layout().buckets) EXPECT_EQ(b.range.size() % (128 * n_ / std::gcd(128, n_)), 0);
  ddp.zero_grad();
  fill_grads(reg, r_);
  report_backward(reg);
  ddp.finish_grad_sync();
  int64_t owned = 0;
  for (const ShardParamRange& s : ddp.shards().params) {
    const Parameter& p = *reg.params()[s.param];
    for (int64_t i = s.in_param.begin; i < s.in_param.end; ++i)
      ASSERT_EQ(p.main_grad.item(i), expected_grad(n_, p, i)) << p.spec.name << "[" << i << "]";
    owned += s.in_param.size();
  }
  // Every element is owned by exactly one rank.
  Tensor total = Tensor::from_vector({float(owned)}, {1});
  st_.ctx.dp_cp->all_reduce(total, ReduceOp::sum);
  EXPECT_EQ(total.item(0), 40 + 63 + 100 + 5);

  // Each rank writes the values of its shards only (small integers, exact in bf16); the
  // all-gather must assemble them everywhere.
  Tensor(reg.param_buffer()).fill(-100);  // a view: fills the buffer
  for (const ShardParamRange& s : ddp.shards().params)
    for (int64_t i = s.in_param.begin; i < s.in_param.end; ++i)
      reg.params()[s.param]->data.set_item(i, value(7, int(s.param), i));
  ddp.start_param_gather();
  ddp.finish_param_gather();
  for (const auto& p : reg.params())
    for (int64_t i = 0; i < p->data.numel(); ++i)
      ASSERT_EQ(p->data.item(i), value(7, int(p->index), i)) << p->spec.name << "[" << i << "]";
}

// Same gradients, same hyper-parameters: the distributed optimizer's shards reproduce the
// replicated AdamW bit for bit (both apply the same elementwise update). The gradients are
// multiples of 1/R, so even the norm, summed per shard then over ranks, is exact, and clipping
// matches too. "b" steps at a decoupled learning rate (--decoupled-lr), which each shard of it must take.
TEST_F(Ddp, DistributedOptimizerUpdatesLikeReplicatedAdamW) {
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const double clip : {0.0, 1.0}) {
      ParameterRegistry ref_reg, dist_reg;
      add_params(ref_reg, dtype);
      add_params(dist_reg, dtype);
      DistributedDataParallel ref_ddp(ref_reg, st_.ctx, {});
      DistributedDataParallel dist_ddp(dist_reg, st_.ctx, {.use_distributed_optimizer = true});
      AdamWOptimizer ref(ref_reg, st_.ctx, {.clip_grad = clip});
      DistributedOptimizer dist(dist_ddp, st_.ctx, {.clip_grad = clip});
      ref.set_log_num_zeros_in_grad(true);
      dist.set_log_num_zeros_in_grad(true);
      for (int step = 0; step < 3; ++step) {
        for (DistributedDataParallel* ddp : {&ref_ddp, &dist_ddp}) {
          ddp->zero_grad();
          fill_grads(ddp->registry(), r_, step);
          // Zeros on every rank at step + 5 places of "c": the reduced gradient's zeros, which the
          // shards count once (the padding between parameters not among them).
          Tensor c = ddp->registry().params()[2]->main_grad;
          for (int64_t i = 0; i < step + 5; ++i) c.set_item(i * 7, 0.0);
          ddp->finish_grad_sync();
        }
        const StepRates rates{1e-2f, 0.1f, 3e-3f};
        const OptimizerStepResult a = ref.step(rates), b = dist.step(rates);
        double zeros = 0;  // by hand, from the replicated optimizer's reduced gradients
        for (const auto& p : ref_reg.params())
          for (int64_t i = 0; i < p->main_grad.numel(); ++i) zeros += p->main_grad.item(i) == 0.0;
        EXPECT_GE(zeros, step + 5);
        EXPECT_EQ(a.num_zeros_in_grad, std::optional<double>(zeros)) << dtype_name(dtype) << " step " << step;
        EXPECT_EQ(b.num_zeros_in_grad, a.num_zeros_in_grad) << dtype_name(dtype) << " step " << step;
        // The norm of integers over R ranks: sums of squares in fp32 are exact up to 2^24.
        EXPECT_EQ(a.grad_norm, b.grad_norm) << dtype_name(dtype) << " step " << step;
        for (size_t k = 0; k < ref_reg.params().size(); ++k)
          ASSERT_EQ(ref_reg.params()[k]->data.to_vector(), dist_reg.params()[k]->data.to_vector())
              << dtype_name(dtype) << " clip " << clip << " step " << step << " " << ref_reg.params()[k]->spec.name;
      }
    }
}

// Megatron reduces the overflow flag of the distributed optimizer over the whole world: only the
// last rank's shard holds an inf, yet every rank skips, keeps its parameters and backs its scaler
// off identically; the next clean step updates everywhere again.
TEST_F(Ddp, OverflowInOneRanksShardSkipsTheStepOnEveryRank) {
  ParameterRegistry reg;
  add_params(reg, DType::f16);
  DistributedDataParallel ddp(reg, st_.ctx, {.use_distributed_optimizer = true});
  DistributedOptimizer opt(
      ddp, st_.ctx, {},
      std::make_unique<DynamicGradScaler>(DynamicGradScalerParams{.initial_scale = 1024.0f, .hysteresis = 1}));
  const std::vector<float> initial = reg.param_buffer().to_vector();
  for (const bool overflow : {true, false}) {
    ddp.zero_grad();
    fill_grads(reg, r_);
    ddp.finish_grad_sync();
    if (overflow && r_ == n_ - 1) {
      const Range& shard = ddp.shards().in_buffer.back();
      reg.grad_slice(shard.begin, shard.end).set_item(0, std::numeric_limits<float>::infinity());
    }
    const OptimizerStepResult result = opt.step({1e-2, 0.0});
    EXPECT_EQ(result.skipped, overflow);
    EXPECT_EQ(opt.step_count(), overflow ? 0 : 1);
    EXPECT_EQ(opt.loss_scale(), 512.0f);  // halved by the overflow (hysteresis 1), kept by the clean step
    EXPECT_EQ(reg.param_buffer().to_vector() == initial, overflow) << "overflow " << overflow;
  }
}

// The optimizer state the training log reports: fp32 Adam moments, plus fp32 master weights when
// the parameters are bf16; the whole (padded) buffer when replicated, one of R equal shards of it
// with the distributed optimizer.
TEST_F(Ddp, OptimizerStateIsShardedOverTheGroup) {
  for (const DType dtype : {DType::f32, DType::bf16}) {
    ParameterRegistry ref_reg, dist_reg;
    add_params(ref_reg, dtype);
    add_params(dist_reg, dtype);
    DistributedDataParallel ref_ddp(ref_reg, st_.ctx, {});
    DistributedDataParallel dist_ddp(dist_reg, st_.ctx, {.use_distributed_optimizer = true});
    const AdamWOptimizer ref(ref_reg, st_.ctx, {});
    const DistributedOptimizer dist(dist_ddp, st_.ctx, {});
    const size_t bytes_per_element = dtype == DType::bf16 ? 12 : 8;
    EXPECT_EQ(ref.state_bytes(), bytes_per_element * size_t(ref_reg.param_buffer().numel())) << dtype_name(dtype);
    EXPECT_EQ(dist.state_bytes() * size_t(n_), bytes_per_element * size_t(dist_reg.param_buffer().numel()))
        << dtype_name(dtype);
  }
}

// Expert parallelism (EP 2): the MoE experts' stack sits in buckets of its own, summed over the
// expert-data-parallel group (half the DP group at 4 ranks, one rank at 2) and still scaled 1/DP,
// as Megatron does: each EP rank's expert gradient already sums the tokens of the whole EP group.
// The dense parameter is averaged over DP as before. Reducing the experts over all of DP mixes in
// the other EP rank's experts; scaling them 1/expert-DP doubles them.
TEST(DdpExpertParallel, ExpertGradientsAreSummedOverExpertDataParallelAndScaledByDp) {
  ParallelState st = make_state({.ep = 2});
  const int dp = st.ctx.dp_cp->size(), edp = st.ctx.expert_dp->size(), ep_rank = st.ctx.ep->rank();
  // The gradient rank `rank` of the data-parallel (expert: expert-data-parallel) group adds.
  const auto grad_of = [&](const Parameter& p, int rank, int64_t i) {
    return grad_value(p.spec.expert_parallel ? 100 * ep_rank + rank : rank, p, i);
  };
  for (const bool overlap : {false, true}) {
    ParameterRegistry reg(0, 1, ep_rank, 2);
    reg.add({.name = "dense", .global_shape = {40}});
    reg.add({.name = "experts", .global_shape = {4, 6}, .expert_parallel = true});
    reg.add({.name = "norm", .global_shape = {5}, .weight_decay = false});
    reg.allocate(DType::f32);
    reg.initialize(11);
    DistributedDataParallel ddp(reg, st.ctx, {.overlap_grad_reduce = overlap, .bucket_size = 1000});
    ASSERT_EQ(ddp.layout().buckets.size(), 2u);
    EXPECT_FALSE(ddp.layout().buckets[0].expert_parallel);
    EXPECT_EQ(ddp.layout().buckets[1].params, std::vector<size_t>{1});
    EXPECT_TRUE(ddp.layout().buckets[1].expert_parallel);
    ddp.zero_grad();
    for (const auto& p : reg.params()) {
      const int rank = p->spec.expert_parallel ? st.ctx.expert_dp->rank() : st.ctx.dp_cp->rank();
      reg.before_backward(*p);
      for (int64_t i = 0; i < p->main_grad.numel(); ++i) p->main_grad.set_item(i, grad_of(*p, rank, i));
    }
    report_backward(reg);
    ddp.finish_grad_sync();
    for (const auto& p : reg.params()) {
      const int ranks = p->spec.expert_parallel ? edp : dp;
      for (int64_t i = 0; i < p->main_grad.numel(); ++i) {
        double sum = 0;
        for (int r = 0; r < ranks; ++r) sum += grad_of(*p, r, i);
        ASSERT_EQ(p->main_grad.item(i), sum / dp) << p->spec.name << "[" << i << "] overlap " << overlap;
      }
    }
  }
}

// The distributed optimizer under EP 2 shards the expert buckets over expert DP (each rank updates
// 1/expert-DP of its EP rank's experts) and updates exactly as the replicated AdamW; both count
// every expert once in the gradient norm (its square summed over EP), which the clipping uses and
// which equals the norm of the global gradient worked out here from every rank's values. Integers
// over powers of two: the fp32 sums are exact, so == holds.
TEST(DdpExpertParallel, DistributedOptimizerShardsExpertsAndTheNormCountsEachExpertOnce) {
  ParallelState st = make_state({.ep = 2});
  const int dp = st.ctx.dp_cp->size(), edp = st.ctx.expert_dp->size(), ep_rank = st.ctx.ep->rank();
  const auto add = [&](ParameterRegistry& reg) {
    reg.add({.name = "dense", .global_shape = {40}});
    reg.add({.name = "experts", .global_shape = {4, 6}, .expert_parallel = true});
    reg.allocate(DType::f32);
    reg.initialize(11);
  };
  // Rank `rank` of the (expert-)data-parallel group's gradient, at EP rank `ep`.
  const auto grad_of = [](const Parameter& p, int ep, int rank, int64_t i, int step) {
    return grad_value(p.spec.expert_parallel ? 100 * ep + rank : rank, p, i, step);
  };
  const auto fill = [&](ParameterRegistry& reg, int step) {
    for (const auto& p : reg.params()) {
      const int rank = p->spec.expert_parallel ? st.ctx.expert_dp->rank() : st.ctx.dp_cp->rank();
      reg.before_backward(*p);
      for (int64_t i = 0; i < p->main_grad.numel(); ++i) p->main_grad.set_item(i, grad_of(*p, ep_rank, rank, i, step));
    }
  };
  ParameterRegistry ref_reg(0, 1, ep_rank, 2), dist_reg(0, 1, ep_rank, 2);
  add(ref_reg);
  add(dist_reg);
  DistributedDataParallel ref_ddp(ref_reg, st.ctx, {});
  DistributedDataParallel dist_ddp(dist_reg, st.ctx, {.use_distributed_optimizer = true});
  // The expert bucket (last) splits into expert-DP shards, the dense one into DP shards.
  ASSERT_TRUE(dist_ddp.layout().buckets.back().expert_parallel);
  EXPECT_EQ(dist_ddp.shards().in_buffer.back().size() * edp, dist_ddp.layout().buckets.back().range.size());
  EXPECT_EQ(dist_ddp.shards().in_buffer.front().size() * dp, dist_ddp.layout().buckets.front().range.size());
  AdamWOptimizer ref(ref_reg, st.ctx, {.clip_grad = 1.0});
  DistributedOptimizer dist(dist_ddp, st.ctx, {.clip_grad = 1.0});
  for (int step = 0; step < 2; ++step) {
    for (DistributedDataParallel* ddp : {&ref_ddp, &dist_ddp}) {
      ddp->zero_grad();
      fill(ddp->registry(), step);
      ddp->finish_grad_sync();
    }
    double norm2 = 0;  // the global gradient: dense averaged over DP; each EP rank's experts
    for (const auto& p : ref_reg.params())
      for (int ep = 0; ep < (p->spec.expert_parallel ? 2 : 1); ++ep)
        for (int64_t i = 0; i < p->main_grad.numel(); ++i) {
          double sum = 0;
          for (int r = 0; r < (p->spec.expert_parallel ? edp : dp); ++r) sum += grad_of(*p, ep, r, i, step);
          norm2 += (sum / dp) * (sum / dp);
        }
    const OptimizerStepResult a = ref.step({1e-2, 0.1}), b = dist.step({1e-2, 0.1});
    ASSERT_TRUE(a.grad_norm.has_value());
    EXPECT_DOUBLE_EQ(*a.grad_norm, std::sqrt(norm2)) << "step " << step;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
    for (size_t k = 0; k < ref_reg.params().size(); ++k)
      ASSERT_EQ(ref_reg.params()[k]->data.to_vector(), dist_reg.params()[k]->data.to_vector())
          << "step " << step << " " << ref_reg.params()[k]->spec.name;
  }
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
