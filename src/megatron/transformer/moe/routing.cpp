#include "megatron/transformer/moe/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "megatron/core/error.h"

namespace megatron::moe {
namespace {

constexpr double kSigmoidEps = 1e-20;  // Megatron's guard in s / (sum s + eps)

// Indices of the k largest of values[0..n), largest first; ties to the lower index.
std::vector<int64_t> top_indices(const double* values, int64_t n, int64_t k) {
  std::vector<int64_t> order(size_t(n), 0);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [values](int64_t a, int64_t b) { return values[a] > values[b]; });
  order.resize(size_t(k));
  return order;
}

void softmax(const double* x, int64_t n, double* out) {
  const double m = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += out[i] = std::exp(x[i] - m);
  for (int64_t i = 0; i < n; ++i) out[i] /= sum;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Top-k of one token's scores, limited to the best group_topk groups when groups are set.
std::vector<int64_t> choose(const std::vector<double>& scores, const RoutingParams& p) {
  const auto E = int64_t(scores.size());
  if (p.num_groups == 0) return top_indices(scores.data(), E, p.topk);
  const int64_t per_group = E / p.num_groups;
  std::vector<double> group_score(size_t(p.num_groups), 0.0);
  for (int64_t g = 0; g < p.num_groups; ++g)
    for (int64_t i : top_indices(scores.data() + g * per_group, per_group, p.topk / p.group_topk))
      group_score[size_t(g)] += scores[size_t(g * per_group + i)];
  std::vector<double> masked(size_t(E), -std::numeric_limits<double>::infinity());
  for (int64_t g : top_indices(group_score.data(), p.num_groups, p.group_topk))
    std::copy_n(scores.begin() + g * per_group, per_group, masked.begin() + g * per_group);
  return top_indices(masked.data(), E, p.topk);
}

// The scores the load-balancing loss reads: softmax(l), or sigmoid(l) normalised per token.
std::vector<double> balancing_scores(const std::vector<double>& logits, int64_t T, int64_t E, const RoutingParams& p) {
  std::vector<double> P(logits.size());
  for (int64_t t = 0; t < T; ++t) {
    const double* l = logits.data() + t * E;
    double* out = P.data() + t * E;
    if (p.score_function == RouterScoreFunction::softmax) {
      softmax(l, E, out);
      continue;
    }
    double sum = kSigmoidEps;
    for (int64_t e = 0; e < E; ++e) sum += out[e] = sigmoid(l[e]);
    for (int64_t e = 0; e < E; ++e) out[e] /= sum;
  }
  return P;
}

// Sequences in the load-balancing loss's counts: B of the (S,B) tokens (seq_aux_loss), or one
// "sequence" of all tokens (aux_loss).
int64_t balancing_sequences(int64_t T, const RoutingParams& p) {
  return p.load_balancing == LoadBalancingType::seq_aux_loss ? T / p.sequence_length : 1;
}

// d(loss)/dP_te of the load-balancing loss = norm * f_(seq(t),e): E / (k S^2 B) with S the
// tokens of a sequence over all shards (aux_loss: every token, B = 1).
double balancing_norm(const Routing& r, const RoutingParams& p) {
  const bool per_sequence = p.load_balancing == LoadBalancingType::seq_aux_loss;
  const double shards = double(r.all_tokens) / double(r.num_tokens);
  const double S = per_sequence ? double(p.sequence_length) * shards : double(r.all_tokens);
  const double B = double(balancing_sequences(r.num_tokens, p));
  return double(r.num_experts) / (double(p.topk) * S * S * B);
}

// Each expert keeps `capacity` tokens; returns the keep mask (T,E).
std::vector<uint8_t> capacity_mask(const Routing& r, int64_t capacity, TokenDropPolicy policy) {
  const int64_t T = r.num_tokens, E = r.num_experts;
  std::vector<uint8_t> keep(size_t(T * E), 0);
  std::vector<double> key(static_cast<size_t>(T));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t t = 0; t < T; ++t)
      key[size_t(t)] = policy == TokenDropPolicy::probs ? r.probs[size_t(t * E + e)] : r.chosen[size_t(t * E + e)];
    for (int64_t t : top_indices(key.data(), T, capacity)) keep[size_t(t * E + e)] = 1;
  }
  return keep;
}

double logsumexp(const double* l, int64_t n) {
  const double m = *std::max_element(l, l + n);
  double sum = 0.0;
  for (int64_t e = 0; e < n; ++e) sum += std::exp(l[e] - m);
  return m + std::log(sum);
}

// The loads and losses: local sums of this shard's tokens, summed over the shards, so every
// shard holds the values of the whole micro-batch.
void add_loads_and_losses(Routing& r, const std::vector<double>& logits, const RoutingParams& p,
                          const SumOverShards& sum_over_shards) {
  const int64_t T = r.num_tokens, E = r.num_experts;
  const bool balancing = p.load_balancing != LoadBalancingType::none;
  const int64_t B = balancing ? balancing_sequences(T, p) : 0;
  // [tokens | tokens per expert (E) | balancing counts f (B,E) | balancing score sums (B,E) | sum of lse^2]
  std::vector<double> sums(size_t(1 + E + 2 * B * E + 1), 0.0);
  sums[0] = double(T);
  for (int64_t e = 0; e < E; ++e) sums[size_t(1 + e)] = double(r.tokens_per_expert[size_t(e)]);
  double* f = sums.data() + 1 + E;
  double* score_sums = f + B * E;
  if (balancing) {
    const std::vector<double> P = balancing_scores(logits, T, E, p);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t b = t % B;  // tokens t = s*B + b; B = 1 for aux_loss
      for (int64_t e : top_indices(P.data() + t * E, E, p.topk)) f[b * E + e] += 1.0;
      for (int64_t e = 0; e < E; ++e) score_sums[b * E + e] += P[size_t(t * E + e)];
    }
  }
  if (p.z_loss_coeff > 0.0)
    for (int64_t t = 0; t < T; ++t) sums.back() += std::pow(logsumexp(logits.data() + t * E, E), 2);
  if (sum_over_shards) {
    sum_over_shards(sums);
    f = sums.data() + 1 + E;  // the callback may have replaced the vector
    score_sums = f + B * E;
  }

  r.all_tokens = int64_t(sums[0]);
  r.all_tokens_per_expert.assign(size_t(E), 0);
  for (int64_t e = 0; e < E; ++e) r.all_tokens_per_expert[size_t(e)] = int64_t(sums[size_t(1 + e)]);
  if (balancing) {
    r.balancing_counts.assign(f, f + B * E);
    const double norm = balancing_norm(r, p);
    for (int64_t i = 0; i < B * E; ++i) r.load_balancing_loss += norm * f[i] * score_sums[i];
  }
  if (p.z_loss_coeff > 0.0) r.z_loss = sums.back() / double(r.all_tokens);
}

}  // namespace

RoutingParams routing_params(const MoEConfig& m, int64_t sequence_length) {
  return {.topk = m.moe_router_topk,
          .score_function = m.moe_router_score_function,
          .pre_softmax = m.moe_router_pre_softmax,
          .num_groups = m.moe_router_num_groups,
          .group_topk = m.moe_router_group_topk,
          .scaling_factor = m.moe_router_topk_scaling_factor.value_or(1.0),
          .load_balancing = m.moe_router_load_balancing_type,
          .aux_loss_coeff = m.moe_aux_loss_coeff,
          .z_loss_coeff = m.moe_z_loss_coeff.value_or(0.0),
          .capacity_factor = m.moe_expert_capacity_factor.value_or(0.0),
          .drop_policy = m.moe_token_drop_policy,
          .pad_to_capacity = m.moe_pad_expert_input_to_capacity,
          .sequence_length = sequence_length};
}

ops::TopKRouting topk_routing(const RoutingParams& p, int64_t num_tokens) {
  MEGATRON_CHECK(p.capacity_factor == 0.0, "the device routing is dropless; capacity " << p.capacity_factor
                                                                                       << " routes on the host");
  // Only the per-sequence balancing counts by sequence (any number of tokens routes otherwise:
  // generation's prompts, an imported model's logits).
  MEGATRON_CHECK(p.load_balancing != LoadBalancingType::seq_aux_loss || num_tokens % p.sequence_length == 0,
                 num_tokens << " tokens are not whole sequences of " << p.sequence_length);
  // The sequences the load-balancing counts are kept for: B of the (S,B) tokens, or all as one.
  const int64_t B = p.load_balancing == LoadBalancingType::none           ? 0
                    : p.load_balancing == LoadBalancingType::seq_aux_loss ? num_tokens / p.sequence_length
                                                                          : 1;
  return {.topk = p.topk,
          .sigmoid = p.score_function == RouterScoreFunction::sigmoid,
          .pre_softmax = p.pre_softmax,
          .num_groups = p.num_groups,
          .group_topk = p.group_topk,
          .scaling_factor = p.scaling_factor,
          .balancing_sequences = B,
          .z_loss = p.z_loss_coeff > 0.0};
}

Routing route(const std::vector<double>& logits, int64_t T, int64_t E, const RoutingParams& p,
              const std::vector<double>& expert_bias, const SumOverShards& sum_over_shards) {
  MEGATRON_CHECK(int64_t(logits.size()) == T * E,
                 "router logits hold " << logits.size() << " values, not " << T << " tokens x " << E << " experts");
  MEGATRON_CHECK(p.load_balancing != LoadBalancingType::seq_aux_loss || T % p.sequence_length == 0,
                 T << " tokens are not whole sequences of " << p.sequence_length);
  Routing r{.num_tokens = T, .num_experts = E};
  r.probs.assign(size_t(T * E), 0.0);
  r.chosen.assign(size_t(T * E), 0);
  std::vector<double> scores(static_cast<size_t>(E)), routing_scores(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const double* l = logits.data() + t * E;
    double* probs = r.probs.data() + t * E;
    std::vector<int64_t> top;
    if (p.score_function == RouterScoreFunction::softmax) {
      if (p.pre_softmax)
        softmax(l, E, scores.data());
      else
        std::copy_n(l, E, scores.begin());
      top = choose(scores, p);
      if (p.pre_softmax) {
        for (int64_t e : top) probs[e] = scores[size_t(e)];
      } else {
        std::vector<double> chosen_logits, chosen_probs(top.size());
        for (int64_t e : top) chosen_logits.push_back(l[e]);
        softmax(chosen_logits.data(), int64_t(top.size()), chosen_probs.data());
        for (size_t j = 0; j < top.size(); ++j) probs[top[j]] = chosen_probs[j];
      }
    } else {
      for (int64_t e = 0; e < E; ++e)
        routing_scores[size_t(e)] =
            (scores[size_t(e)] = sigmoid(l[e])) + (expert_bias.empty() ? 0.0 : expert_bias[size_t(e)]);
      top = choose(routing_scores, p);
      double sum = kSigmoidEps;
      for (int64_t e : top) sum += scores[size_t(e)];
      for (int64_t e : top) probs[e] = p.topk > 1 ? scores[size_t(e)] / sum : scores[size_t(e)];
    }
    for (int64_t e : top) {
      probs[e] *= p.scaling_factor;
      r.chosen[size_t(t * E + e)] = 1;
    }
  }
  r.routed = r.chosen;
  if (p.capacity_factor > 0.0) {
    const auto capacity = std::min<int64_t>(T, int64_t(std::ceil(double(T * p.topk) / double(E) * p.capacity_factor)));
    const std::vector<uint8_t> keep = capacity_mask(r, capacity, p.drop_policy);
    for (size_t i = 0; i < keep.size(); ++i) {
      r.routed[i] = p.pad_to_capacity ? keep[i] : uint8_t(r.chosen[i] & keep[i]);
      if (!r.routed[i]) r.probs[i] = 0.0;
    }
  }
  r.tokens_per_expert.assign(size_t(E), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) r.tokens_per_expert[size_t(e)] += r.routed[size_t(t * E + e)];
  add_loads_and_losses(r, logits, p, sum_over_shards);
  return r;
}

std::vector<double> route_backward(const std::vector<double>& dprobs, const std::vector<double>& logits,
                                   const Routing& r, const RoutingParams& p, double aux_scale) {
  const int64_t T = r.num_tokens, E = r.num_experts;
  std::vector<double> dlogits(size_t(T * E), 0.0);
  std::vector<double> q(static_cast<size_t>(E)), g(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const double* l = logits.data() + t * E;
    double* dl = dlogits.data() + t * E;
    // g: the gradient of the unscaled probs, on the chosen experts whose tokens were kept.
    for (int64_t e = 0; e < E; ++e) {
      const size_t i = size_t(t * E + e);
      g[size_t(e)] = r.chosen[i] && r.routed[i] ? p.scaling_factor * dprobs[i] : 0.0;
    }
    if (p.score_function == RouterScoreFunction::softmax) {
      // q = softmax over all experts (pre-softmax) or over the chosen ones; dl = q (g - <q, g>).
      if (p.pre_softmax) {
        softmax(l, E, q.data());
      } else {
        double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
        for (int64_t e = 0; e < E; ++e)
          if (r.chosen[size_t(t * E + e)]) m = std::max(m, l[e]);
        for (int64_t e = 0; e < E; ++e) sum += q[size_t(e)] = r.chosen[size_t(t * E + e)] ? std::exp(l[e] - m) : 0.0;
        for (double& v : q) v /= sum;
      }
      double qg = 0.0;
      for (int64_t e = 0; e < E; ++e) qg += q[size_t(e)] * g[size_t(e)];
      for (int64_t e = 0; e < E; ++e) dl[e] = q[size_t(e)] * (g[size_t(e)] - qg);
    } else {
      // probs = s / S (k > 1), S = sum of chosen s + eps: ds_e = g_e / S - <g, s> / S^2.
      double S = kSigmoidEps, gs = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        if (!r.chosen[size_t(t * E + e)]) continue;
        q[size_t(e)] = sigmoid(l[e]);
        S += q[size_t(e)];
        gs += g[size_t(e)] * q[size_t(e)];
      }
      for (int64_t e = 0; e < E; ++e) {
        if (!r.chosen[size_t(t * E + e)]) continue;
        const double s = q[size_t(e)];
        const double ds = p.topk > 1 ? g[size_t(e)] / S - gs / (S * S) : g[size_t(e)];
        dl[e] = ds * s * (1.0 - s);
      }
    }
  }
  if (p.load_balancing != LoadBalancingType::none && p.aux_loss_coeff > 0.0) {
    const std::vector<double> P = balancing_scores(logits, T, E, p);
    const int64_t B = balancing_sequences(T, p);
    const double norm = balancing_norm(r, p);
    const double w = aux_scale * p.aux_loss_coeff;
    std::vector<double> c(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
      const double* Pt = P.data() + t * E;
      for (int64_t e = 0; e < E; ++e) c[size_t(e)] = norm * r.balancing_counts[size_t((t % B) * E + e)];
      double* dl = dlogits.data() + t * E;
      double Pc = 0.0;
      for (int64_t e = 0; e < E; ++e) Pc += Pt[e] * c[size_t(e)];
      if (p.score_function == RouterScoreFunction::softmax) {
        for (int64_t e = 0; e < E; ++e) dl[e] += w * Pt[e] * (c[size_t(e)] - Pc);
        continue;
      }
      // P = s / S over all experts: dP/ds_e gives ds_e = (c_e - <P, c>) / S, then s(1-s).
      double S = kSigmoidEps;
      for (int64_t e = 0; e < E; ++e) S += sigmoid(logits[size_t(t * E + e)]);
      for (int64_t e = 0; e < E; ++e) {
        const double s = sigmoid(logits[size_t(t * E + e)]);
        dl[e] += w * (c[size_t(e)] - Pc) / S * s * (1.0 - s);
      }
    }
  }
  if (p.z_loss_coeff > 0.0) {
    // d/dl_te of sum_t lse_t^2 / (tokens of all shards) = 2 lse_t softmax(l_t)_e / tokens.
    for (int64_t t = 0; t < T; ++t) {
      const double* l = logits.data() + t * E;
      softmax(l, E, q.data());
      const double lse = logsumexp(l, E);
      for (int64_t e = 0; e < E; ++e)
        dlogits[size_t(t * E + e)] +=
            aux_scale * p.z_loss_coeff * 2.0 * lse * q[size_t(e)] / double(r.all_tokens);
    }
  }
  return dlogits;
}

void update_expert_bias(std::vector<double>& bias, const std::vector<double>& tokens, double rate) {
  const double mean = std::accumulate(tokens.begin(), tokens.end(), 0.0) / double(tokens.size());
  for (size_t e = 0; e < bias.size(); ++e) {
    const double offset = mean - tokens[e];
    bias[e] += rate * double((offset > 0) - (offset < 0));
  }
}

}  // namespace megatron::moe
