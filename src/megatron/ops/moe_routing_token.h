#pragma once
// One token's routing arithmetic (ops/moe_routing.h), shared by the CPU and CUDA backends so both
// compute the same doubles in the same order, which is also the host routing's order
// (transformer/moe/routing.h): softmax sums ascend over the experts, the top-k is a stable
// descending selection (ties to the lower index), sums over the chosen experts go in top-k order.
// Nothing here allocates: scores are recomputed from the logits where needed (E is small).
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "megatron/core/rng.h"  // MEGATRON_HD
#include "megatron/ops/moe_routing.h"

namespace megatron::ops::moe_routing_detail {

constexpr double kSigmoidEps = 1e-20;  // Megatron's guard in s / (sum s + eps)

// Per token: [token | routed (E) | f (E) | balancing score P (E) | lse^2]; the ops sum these
// over the tokens (of a sequence, for f and P) into the sums of ops/moe_routing.h.
MEGATRON_HD int64_t contribution_size(int64_t E) { return 3 * E + 2; }

// Sums entry j of (E, B) <- contribution column, over the tokens t with t % B == sequence
// (sequence -1: every token).
struct SumSource {
  int64_t column, sequence;
};
MEGATRON_HD SumSource sum_source(int64_t j, int64_t E, int64_t B) {
  if (j <= E) return {j, -1};  // tokens, tokens per expert
  j -= 1 + E;
  if (j < 2 * B * E) {
    const int64_t half = j / (B * E), i = j % (B * E);  // half 0: f, 1: P sums
    return {1 + E * (1 + half) + i % E, i / E};
  }
  return {3 * E + 1, -1};  // lse^2
}

MEGATRON_HD double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The max and the sum of exp(l - max) over a token's E logits.
struct SoftmaxStats {
  double max, sum;
};
template <class T>
MEGATRON_HD SoftmaxStats softmax_stats(const T* l, int64_t E) {
  double m = double(l[0]);
  for (int64_t e = 1; e < E; ++e) m = double(l[e]) > m ? double(l[e]) : m;
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += std::exp(double(l[e]) - m);
  return {m, sum};
}

// The sum of sigmoid(l) over a token's experts plus the guard: the sigmoid balancing scores' norm.
template <class T>
MEGATRON_HD double sigmoid_sum(const T* l, int64_t E) {
  double sum = kSigmoidEps;
  for (int64_t e = 0; e < E; ++e) sum += sigmoid(double(l[e]));
  return sum;
}

// out[0..k): the k largest value(i), i < n, largest first, ties to the lower index: the first k
// of a stable descending sort.
template <class Value>
MEGATRON_HD void select_top(int64_t n, int64_t k, const Value& value, int32_t* out) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    double best_value = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      bool taken = false;
      for (int64_t c = 0; c < j; ++c) taken = taken || out[c] == int32_t(i);
      if (taken) continue;
      const double v = value(i);
      if (best < 0 || v > best_value) best = i, best_value = v;
    }
    out[j] = int32_t(best);
  }
}

// The token's choice: top-k of the routing scores, within the group_topk groups with the largest
// sums of their top (topk / group_topk) scores when groups are set.
template <class Score>
MEGATRON_HD void choose(int64_t E, const TopKRouting& p, const Score& score, int32_t* topk) {
  if (p.num_groups == 0) return select_top(E, p.topk, score, topk);
  const int64_t per_group = E / p.num_groups, per_group_top = p.topk / p.group_topk;
  double group_score[kMaxRoutingGroups];
  int32_t picked[kMaxRoutingTopk];
  for (int64_t g = 0; g < p.num_groups; ++g) {
    select_top(per_group, per_group_top, [&](int64_t i) { return score(g * per_group + i); }, picked);
    group_score[g] = 0.0;
    for (int64_t j = 0; j < per_group_top; ++j) group_score[g] += score(g * per_group + picked[j]);
  }
  int32_t groups[kMaxRoutingGroups];
  select_top(p.num_groups, p.group_topk, [&](int64_t g) { return group_score[g]; }, groups);
  uint64_t allowed = 0;
  for (int64_t j = 0; j < p.group_topk; ++j) allowed |= uint64_t(1) << groups[j];
  const double masked = -std::numeric_limits<double>::infinity();
  select_top(
      E, p.topk, [&](int64_t e) { return (allowed >> (e / per_group)) & 1 ? score(e) : masked; }, topk);
}

// The forward of one token: probs (E) and topk (k) of ops/moe_routing.h's moe_route, and its
// contributions (contribution_size(E)) to the sums.
template <class T>
MEGATRON_HD void route_token(const T* l, const T* bias, int64_t E, const TopKRouting& p, T* probs, int32_t* topk,
                             double* contribution) {
  const SoftmaxStats all = softmax_stats(l, E);
  const auto softmax_of = [&](int64_t e) { return std::exp(double(l[e]) - all.max) / all.sum; };
  if (!p.sigmoid && p.pre_softmax) {
    choose(E, p, softmax_of, topk);
  } else if (!p.sigmoid) {
    choose(E, p, [&](int64_t e) { return double(l[e]); }, topk);
  } else {
    choose(E, p, [&](int64_t e) { return sigmoid(double(l[e])) + (bias ? double(bias[e]) : 0.0); }, topk);
  }
  for (int64_t e = 0; e < E; ++e) probs[e] = T(0);
  double chosen_max = double(l[topk[0]]), chosen_sum = p.sigmoid ? kSigmoidEps : 0.0;
  for (int64_t j = 1; j < p.topk; ++j) chosen_max = double(l[topk[j]]) > chosen_max ? double(l[topk[j]]) : chosen_max;
  for (int64_t j = 0; j < p.topk; ++j)
    chosen_sum += p.sigmoid ? sigmoid(double(l[topk[j]])) : std::exp(double(l[topk[j]]) - chosen_max);
  for (int64_t j = 0; j < p.topk; ++j) {
    const int32_t e = topk[j];
    double prob;
    if (p.sigmoid)
      prob = p.topk > 1 ? sigmoid(double(l[e])) / chosen_sum : sigmoid(double(l[e]));
    else if (p.pre_softmax)
      prob = softmax_of(e);
    else
      prob = std::exp(double(l[e]) - chosen_max) / chosen_sum;
    probs[e] = T(prob * p.scaling_factor);
  }

  for (int64_t i = 0; i < contribution_size(E); ++i) contribution[i] = 0.0;
  contribution[0] = 1.0;
  for (int64_t j = 0; j < p.topk; ++j) contribution[1 + topk[j]] = 1.0;
  if (p.balancing_sequences > 0) {
    double* f = contribution + 1 + E;
    double* P = f + E;
    const double sigmoid_norm = p.sigmoid ? sigmoid_sum(l, E) : 1.0;
    for (int64_t e = 0; e < E; ++e) P[e] = p.sigmoid ? sigmoid(double(l[e])) / sigmoid_norm : softmax_of(e);
    int32_t top[kMaxRoutingTopk];
    select_top(E, p.topk, [&](int64_t e) { return P[e]; }, top);
    for (int64_t j = 0; j < p.topk; ++j) f[top[j]] = 1.0;
  }
  if (p.z_loss) {
    const double lse = all.max + std::log(all.sum);
    contribution[3 * E + 1] = lse * lse;
  }
}

// The load-balancing loss's gradient per unit of P_te: norm * f_(seq(t),e), norm = E / (k S^2 B)
// with S = every shard's tokens of a sequence (all_tokens / B).
MEGATRON_HD double balancing_norm(double all_tokens, int64_t E, const TopKRouting& p) {
  const double B = double(p.balancing_sequences), S = all_tokens / B;
  return double(E) / (double(p.topk) * S * S * B);
}

// The backward of one token: dl (E) of ops/moe_routing.h's moe_route_backward. f: the token's
// sequence's row of the balancing counts f (E), or null without an aux-loss gradient.
template <class T>
MEGATRON_HD void route_token_backward(const T* l, const T* dprobs, const int32_t* topk, const double* f, double norm,
                                      int64_t E, const TopKRouting& p, double aux_loss_weight, double z_loss_weight,
                                      double all_tokens, T* dl) {
  const auto chosen = [&](int64_t e) {
    bool in = false;
    for (int64_t j = 0; j < p.topk; ++j) in = in || topk[j] == int32_t(e);
    return in;
  };
  const auto g = [&](int64_t e) { return chosen(e) ? p.scaling_factor * double(dprobs[e]) : 0.0; };
  const SoftmaxStats all = softmax_stats(l, E);
  const auto softmax_of = [&](int64_t e) { return std::exp(double(l[e]) - all.max) / all.sum; };
  // The probabilities' part. softmax: dl = q (g - <q, g>), q the softmax over all experts
  // (pre-softmax) or over the chosen ones. sigmoid (k > 1): probs = s / S, S = eps + sum of the
  // chosen s: ds_e = g_e / S - <g, s> / S^2, dl = ds s (1 - s).
  double chosen_max = -std::numeric_limits<double>::infinity(), chosen_sum = 0.0;
  for (int64_t e = 0; e < E; ++e)
    if (chosen(e)) chosen_max = double(l[e]) > chosen_max ? double(l[e]) : chosen_max;
  const auto q = [&](int64_t e) {
    if (p.pre_softmax) return softmax_of(e);
    return chosen(e) ? std::exp(double(l[e]) - chosen_max) / chosen_sum : 0.0;
  };
  double qg = 0.0, S = kSigmoidEps, gs = 0.0;
  if (!p.sigmoid) {
    for (int64_t e = 0; e < E; ++e) chosen_sum += chosen(e) ? std::exp(double(l[e]) - chosen_max) : 0.0;
    for (int64_t e = 0; e < E; ++e) qg += q(e) * g(e);
  } else {
    for (int64_t e = 0; e < E; ++e) {
      if (!chosen(e)) continue;
      const double s = sigmoid(double(l[e]));
      S += s;
      gs += g(e) * s;
    }
  }
  // The load-balancing loss's part: P = softmax(l) (sigmoid: s / sum of all s), c = norm f:
  // dP gives P (c - <P, c>) (softmax) or (c - <P, c>) / S_all s (1 - s) (sigmoid).
  const bool aux = f != nullptr && aux_loss_weight != 0.0;
  const double sigmoid_all = p.sigmoid ? sigmoid_sum(l, E) : 1.0;
  const auto P = [&](int64_t e) { return p.sigmoid ? sigmoid(double(l[e])) / sigmoid_all : softmax_of(e); };
  double Pc = 0.0;
  if (aux)
    for (int64_t e = 0; e < E; ++e) Pc += P(e) * (norm * f[e]);
  const double lse = all.max + std::log(all.sum);

  for (int64_t e = 0; e < E; ++e) {
    double d = 0.0;
    if (!p.sigmoid) {
      d = q(e) * (g(e) - qg);
    } else if (chosen(e)) {
      const double s = sigmoid(double(l[e]));
      const double ds = p.topk > 1 ? g(e) / S - gs / (S * S) : g(e);
      d = ds * s * (1.0 - s);
    }
    if (aux) {
      const double c = norm * f[e];
      if (!p.sigmoid) {
        d += aux_loss_weight * P(e) * (c - Pc);
      } else {
        const double s = sigmoid(double(l[e]));
        d += aux_loss_weight * (c - Pc) / sigmoid_all * s * (1.0 - s);
      }
    }
    // d/dl of sum_t lse_t^2 / (every shard's tokens) = 2 lse softmax(l) / tokens.
    if (z_loss_weight > 0.0) d += z_loss_weight * 2.0 * lse * softmax_of(e) / all_tokens;
    dl[e] = T(d);
  }
}

// Runs fn with the logits' element type (check_logits has allowed f32 and f64 only), for both
// backends' host-side dispatch.
template <class Fn>
void dispatch_router(DType dtype, Fn&& fn) {
  if (dtype == DType::f64) {
    fn(std::type_identity<double>{});
  } else {
    fn(std::type_identity<float>{});
  }
}

}  // namespace megatron::ops::moe_routing_detail
