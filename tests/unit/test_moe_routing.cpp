// The router's arithmetic (transformer/moe/routing.h) on cases worked out by hand: top-k with
// softmax, pre-softmax and sigmoid scores, the expert bias and group limits choosing, capacity
// drops under both policies and padding, the load-balancing and z-loss values, the expert-bias
// update; and its backward against central finite differences in f64.
#include <gtest/gtest.h>

#include <cmath>

#include "megatron/core/rng.h"
#include "megatron/transformer/moe/routing.h"

using namespace megatron;
using namespace megatron::moe;

namespace {

// Probabilities are sums and ratios of a few exponentials: 1e-12 is thousands of f64 roundings.
constexpr double kTol = 1e-12;

std::vector<double> row(const Routing& r, int64_t t) {
  return {r.probs.begin() + t * r.num_experts, r.probs.begin() + (t + 1) * r.num_experts};
}

void expect_row(const Routing& r, int64_t t, const std::vector<double>& expected) {
  const std::vector<double> got = row(r, t);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t e = 0; e < got.size(); ++e) EXPECT_NEAR(got[e], expected[e], kTol) << "token " << t << " expert " << e;
}

}  // namespace

TEST(MoERouting, SoftmaxOverTheChosenExperts) {
  // Top-2 of [1, 2, 0, 3] is {3, 1}; probs = softmax(3, 2) = e/(e+1), 1/(e+1).
  const Routing r = route({1, 2, 0, 3}, 1, 4, {.topk = 2}, {});
  const double e = std::exp(1.0);
  expect_row(r, 0, {0, 1 / (e + 1), 0, e / (e + 1)});
  EXPECT_EQ(r.tokens_per_expert, (std::vector<int64_t>{0, 1, 0, 1}));
}

TEST(MoERouting, PreSoftmaxKeepsTheFullSoftmax) {
  const Routing r = route({1, 2, 0, 3}, 1, 4, {.topk = 2, .pre_softmax = true}, {});
  const double z = std::exp(1.0) + std::exp(2.0) + 1.0 + std::exp(3.0);
  expect_row(r, 0, {0, std::exp(2.0) / z, 0, std::exp(3.0) / z});
}

TEST(MoERouting, SigmoidWithExpertBiasAndScaling) {
  // Equal logits: the bias alone chooses {3, 1}; probs are 0.5 / (0.5 + 0.5) = 0.5, times 2.
  const RoutingParams p{.topk = 2, .score_function = RouterScoreFunction::sigmoid, .scaling_factor = 2.0};
  const Routing r = route({0, 0, 0, 0}, 1, 4, p, {0.0, 0.1, 0.0, 0.2});
  expect_row(r, 0, {0, 1.0, 0, 1.0});
  // Without the bias the tie goes to the lower indices.
  expect_row(route({0, 0, 0, 0}, 1, 4, p, {}), 0, {1.0, 1.0, 0, 0});
}

TEST(MoERouting, GroupLimitedRoutingPicksTheBestGroup) {
  // Groups {0,1} and {2,3}; group scores (sum of top 2) 3 + 0 = 3 < 2 + 2 = 4, so expert 0, the
  // single best, is out of reach and the token goes to 2 and 3 with equal probability.
  const Routing r = route({3, 0, 2, 2}, 1, 4, {.topk = 2, .num_groups = 2, .group_topk = 1}, {});
  expect_row(r, 0, {0, 0, 0.5, 0.5});
  // Without the limit: experts 0 and 2 (the tie between 2 and 3 to the lower index).
  EXPECT_EQ(route({3, 0, 2, 2}, 1, 4, {.topk = 2}, {}).tokens_per_expert, (std::vector<int64_t>{1, 0, 1, 0}));
}

TEST(MoERouting, CapacityDropsByProbabilityOrPosition) {
  // Top-1 with pre-softmax of two experts: t0..t2 choose expert 0 with p = sigmoid(2), sigmoid(1),
  // sigmoid(3); t3 chooses expert 1 with sigmoid(1). Capacity ceil(4 * 1 / 2 * 1.0) = 2.
  const std::vector<double> logits{2, 0, 1, 0, 3, 0, 0, 1};
  const auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  RoutingParams p{.topk = 1, .pre_softmax = true, .capacity_factor = 1.0};
  const Routing by_probs = route(logits, 4, 2, p, {});
  expect_row(by_probs, 0, {sig(2), 0});
  expect_row(by_probs, 1, {0, 0});  // the lowest probability of expert 0 is dropped
  expect_row(by_probs, 2, {sig(3), 0});
  expect_row(by_probs, 3, {0, sig(1)});
  EXPECT_EQ(by_probs.tokens_per_expert, (std::vector<int64_t>{2, 1}));

  p.drop_policy = TokenDropPolicy::position;
  const Routing by_position = route(logits, 4, 2, p, {});
  expect_row(by_position, 1, {sig(1), 0});
  expect_row(by_position, 2, {0, 0});  // the latest token of expert 0 is dropped
  EXPECT_EQ(by_position.tokens_per_expert, (std::vector<int64_t>{2, 1}));

  // Padding: expert 1 is filled up to 2 tokens with the earliest non-routed one (t0, prob 0).
  p.drop_policy = TokenDropPolicy::probs;
  p.pad_to_capacity = true;
  const Routing padded = route(logits, 4, 2, p, {});
  EXPECT_EQ(padded.tokens_per_expert, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(padded.routed[0 * 2 + 1], 1);
  expect_row(padded, 0, {sig(2), 0});
}

TEST(MoERouting, LoadBalancingAndZLossValues) {
  // Tokens t = s*B + b with S = 2, B = 2. P = softmax(l): t0 [.75 .25], t1 [.25 .75], t2 [.75 .25],
  // t3 [.5 .5]; top-1 of P: experts 0, 1, 0, 0 (the tie to 0).
  const double l3 = std::log(3.0);
  const std::vector<double> logits{l3, 0, 0, l3, l3, 0, 0, 0};
  RoutingParams p{.topk = 1, .aux_loss_coeff = 0.1, .z_loss_coeff = 0.01, .sequence_length = 2};
  // aux_loss: f = [3, 1], sum_t P = [2.25, 1.75]: 2 / (1 * 16) * (3 * 2.25 + 1 * 1.75) = 1.0625.
  const Routing micro_batch = route(logits, 4, 2, p, {});
  EXPECT_NEAR(micro_batch.load_balancing_loss, 1.0625, kTol);
  // z: logsumexp = ln 4, ln 4, ln 4, ln 2: mean of squares.
  const double l4 = std::log(4.0), l2 = std::log(2.0);
  EXPECT_NEAR(micro_batch.z_loss, (3 * l4 * l4 + l2 * l2) / 4, kTol);
  EXPECT_NEAR(micro_batch.weighted_losses(p), 0.1 * 1.0625 + 0.01 * micro_batch.z_loss, kTol);
  // seq_aux_loss: sequence b=0 (t0, t2): f = [2, 0], sum P = [1.5, .5] -> 3; b=1 (t1, t3): f = [1, 1],
  // sum P = [.75, 1.25] -> 2; 2 / (1 * 4 * 2) * (3 + 2) = 1.25.
  p.load_balancing = LoadBalancingType::seq_aux_loss;
  EXPECT_NEAR(route(logits, 4, 2, p, {}).load_balancing_loss, 1.25, kTol);
  p.load_balancing = LoadBalancingType::none;
  EXPECT_EQ(route(logits, 4, 2, p, {}).load_balancing_loss, 0.0);
}

TEST(MoERouting, ExpertBiasMovesTowardsBalance) {
  std::vector<double> bias{0.0, 0.5, -0.5};
  update_expert_bias(bias, {5, 1, 3}, 1e-3);  // mean 3: over, under, even
  EXPECT_DOUBLE_EQ(bias[0], -1e-3);
  EXPECT_DOUBLE_EQ(bias[1], 0.5 + 1e-3);
  EXPECT_DOUBLE_EQ(bias[2], -0.5);
}

namespace {

// Objective L = sum(R * probs) + scale * weighted losses at fixed choice; its gradient by
// route_backward against central differences (h = 1e-6: truncation ~1e-12, roundoff ~1e-10 for
// O(1) values; 1e-7 absolute leaves a wide margin while a wrong term is off by ~1e-2).
void check_backward(RoutingParams p, const std::vector<double>& bias) {
  const int64_t T = 6, E = 8;
  p.sequence_length = 3;
  HostRng rng(17);
  std::vector<double> logits(size_t(T * E)), R(size_t(T * E));
  for (double& v : logits) v = 2.0 * rng.uniform() - 1.0;
  for (double& v : R) v = 2.0 * rng.uniform() - 1.0;
  const double scale = 0.7;
  const Routing base = route(logits, T, E, p, bias);
  auto objective = [&](const std::vector<double>& l) {
    const Routing r = route(l, T, E, p, bias);
    EXPECT_EQ(r.chosen, base.chosen) << "the step changed the choice; pick other inputs";
    double sum = scale * r.weighted_losses(p);
    for (size_t i = 0; i < R.size(); ++i) sum += R[i] * r.probs[i];
    return sum;
  };
  const std::vector<double> grad = route_backward(R, logits, base, p, scale);
  const double h = 1e-6;
  for (size_t i = 0; i < logits.size(); ++i) {
    std::vector<double> up = logits, down = logits;
    up[i] += h;
    down[i] -= h;
    EXPECT_NEAR(grad[i], (objective(up) - objective(down)) / (2 * h), 1e-7) << "logit " << i;
  }
}

}  // namespace

TEST(MoERouting, BackwardMatchesFiniteDifferences) {
  check_backward({.topk = 2, .aux_loss_coeff = 0.3, .z_loss_coeff = 0.05}, {});
  check_backward({.topk = 3,
                  .pre_softmax = true,
                  .scaling_factor = 1.5,
                  .load_balancing = LoadBalancingType::seq_aux_loss,
                  .aux_loss_coeff = 0.2},
                 {});
  check_backward({.topk = 2,
                  .score_function = RouterScoreFunction::sigmoid,
                  .num_groups = 4,
                  .group_topk = 2,
                  .aux_loss_coeff = 0.4,
                  .z_loss_coeff = 0.02},
                 {0.1, -0.2, 0.0, 0.3, 0.05, -0.1, 0.2, 0.0});
  check_backward({.topk = 1, .score_function = RouterScoreFunction::sigmoid}, {});
  // Capacity: dropped tokens carry no gradient through their probabilities.
  check_backward({.topk = 2, .pre_softmax = true, .capacity_factor = 0.5}, {});
}

namespace {

// Under sequence parallelism the (S,B) tokens are split into shards of S/2 positions (contiguous
// token rows), each routed alone with its sums added over the shards. Every shard's loss values
// and loads must be the whole micro-batch's, and each shard's logit gradient the whole's on its
// rows. Simulated in one process: shard 1's sums are taken first, then each shard is routed with
// the other's sums added. Tolerance 1e-12: the same f64 sums grouped by shard.
void check_sharded(RoutingParams p) {
  const int64_t S = 4, B = 3, E = 8, T = S * B, half = T / 2;
  HostRng rng(23);
  std::vector<double> logits(size_t(T * E)), R(size_t(T * E));
  for (double& v : logits) v = 2.0 * rng.uniform() - 1.0;
  for (double& v : R) v = 2.0 * rng.uniform() - 1.0;
  p.sequence_length = S;
  const Routing whole = route(logits, T, E, p, {});
  const std::vector<double> dwhole = route_backward(R, logits, whole, p, 0.7);

  p.sequence_length = S / 2;
  const auto part = [&](const std::vector<double>& v, int k) {
    return std::vector<double>(v.begin() + k * half * E, v.begin() + (k + 1) * half * E);
  };
  std::vector<double> own_sums[2];
  const auto route_shard = [&](int k) {
    // A new vector, as a callback that reads an all-reduce's result back would give.
    return route(part(logits, k), half, E, p, {}, [&](std::vector<double>& sums) {
      own_sums[k] = sums;
      std::vector<double> total = sums;
      if (!own_sums[1 - k].empty())
        for (size_t i = 0; i < total.size(); ++i) total[i] += own_sums[1 - k][i];
      sums = std::move(total);
    });
  };
  route_shard(1);
  for (int k : {0, 1}) {
    const Routing shard = route_shard(k);
    EXPECT_NEAR(shard.load_balancing_loss, whole.load_balancing_loss, kTol) << "shard " << k;
    EXPECT_NEAR(shard.z_loss, whole.z_loss, kTol) << "shard " << k;
    EXPECT_EQ(shard.all_tokens, T);
    EXPECT_EQ(shard.all_tokens_per_expert, whole.tokens_per_expert) << "shard " << k;
    EXPECT_EQ(shard.chosen, std::vector<uint8_t>(whole.chosen.begin() + k * half * E,
                                                 whole.chosen.begin() + (k + 1) * half * E));
    const std::vector<double> dshard = route_backward(part(R, k), part(logits, k), shard, p, 0.7);
    const std::vector<double> expected = part(dwhole, k);
    for (size_t i = 0; i < dshard.size(); ++i)
      EXPECT_NEAR(dshard[i], expected[i], kTol) << "shard " << k << " logit " << i;
  }
}

}  // namespace

TEST(MoERouting, SequenceShardsSumToTheWholeMicroBatch) {
  check_sharded({.topk = 2, .aux_loss_coeff = 0.3, .z_loss_coeff = 0.05});
  check_sharded({.topk = 2, .load_balancing = LoadBalancingType::seq_aux_loss, .aux_loss_coeff = 0.2});
  check_sharded({.topk = 3,
                 .score_function = RouterScoreFunction::sigmoid,
                 .aux_loss_coeff = 0.4,
                 .z_loss_coeff = 0.02});
}
