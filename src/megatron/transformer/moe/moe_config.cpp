#include "megatron/transformer/moe/moe_config.h"

#include <cctype>
#include <charconv>
#include <optional>

#include "megatron/core/strings.h"

namespace megatron {

namespace {

// Megatron evaluates a --moe-layer-freq holding '[' as a Python expression. This reads the part of
// Python its patterns are written in: lists of 0 and 1, `+` joining lists, `*` repeating one by a
// count on either side, parentheses; e.g. "([0]*3+[1]*58)" or "([1]*3+[0]*1)*3".
class LayerPatternExpression {
 public:
  struct Invalid {
    std::string why;
  };
  explicit LayerPatternExpression(const std::string& text) : text_(text) {}

  std::vector<bool> evaluate() {
    std::vector<bool> pattern = sum();
    skip_spaces();
    if (pos_ != text_.size()) fail("unexpected '" + text_.substr(pos_, 1) + "'");
    return pattern;
  }

 private:
  // No pattern is longer than this many layers; a count beyond it is a typo, not a model.
  static constexpr int64_t kLongest = int64_t(1) << 20;

  [[noreturn]] void fail(const std::string& what) const {
    throw Invalid{concat(what, " at character ", pos_ + 1, " of the expression")};
  }
  void skip_spaces() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool take(char c) {
    skip_spaces();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool at_digit() {
    skip_spaces();
    return pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]));
  }
  int64_t number() {
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(text_.data() + pos_, text_.data() + text_.size(), value);
    if (ec != std::errc()) fail("a number out of range");
    pos_ = size_t(end - text_.data());
    return value;
  }
  std::vector<bool> sum() {  // product ('+' product)*
    std::vector<bool> pattern = product();
    while (take('+')) {
      const std::vector<bool> more = product();
      pattern.insert(pattern.end(), more.begin(), more.end());
      if (int64_t(pattern.size()) > kLongest) fail(concat("a pattern longer than ", kLongest, " layers"));
    }
    return pattern;
  }
  std::vector<bool> product() {  // factors joined by '*': one list, any counts
    std::optional<std::vector<bool>> list;
    int64_t times = 1;
    do {
      if (at_digit()) {
        const int64_t count = number();
        if (times > 0 && count > kLongest / times)
          fail(concat("a count above ", kLongest));  // checked before it can overflow
        times *= count;
      } else {
        if (list) fail("a list multiplied by a list");
        list = atom();
      }
    } while (take('*'));
    if (!list) fail("a count with no list to repeat");
    if (int64_t(list->size()) * times > kLongest) fail(concat("a pattern longer than ", kLongest, " layers"));
    std::vector<bool> repeated;
    for (int64_t i = 0; i < times; ++i) repeated.insert(repeated.end(), list->begin(), list->end());
    return repeated;
  }
  std::vector<bool> atom() {  // '(' sum ')' | '[' 0 or 1 (',' 0 or 1)* ','? ']'
    if (take('(')) {
      std::vector<bool> inner = sum();
      if (!take(')')) fail("a '(' without its ')'");
      return inner;
    }
    if (!take('[')) fail("neither a list, a count nor '('");
    std::vector<bool> list;
    while (!take(']')) {
      if (!at_digit()) fail("a list entry that is not 0 or 1");
      const int64_t entry = number();
      if (entry != 0 && entry != 1) fail(concat("list entry ", entry, ", not 0 or 1"));
      list.push_back(entry == 1);
      if (take(',')) continue;
      skip_spaces();
      if (pos_ == text_.size() || text_[pos_] != ']') fail("a list without its ']'");
    }
    return list;
  }

  const std::string& text_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<bool> moe_layer_pattern(const std::string& freq, int64_t num_layers, std::string* error) {
  const auto fail = [&](const std::string& why) {
    *error = why;
    return std::vector<bool>{};
  };
  if (freq.find('[') != std::string::npos) {
    std::vector<bool> pattern;
    try {
      pattern = LayerPatternExpression(freq).evaluate();
    } catch (const LayerPatternExpression::Invalid& invalid) {
      return fail(invalid.why);
    }
    if (int64_t(pattern.size()) != num_layers)
      return fail(concat("the list has ", pattern.size(), " entries for ", num_layers, " layers"));
    return pattern;
  }
  int64_t every = 0;
  const auto [end, ec] = std::from_chars(freq.data(), freq.data() + freq.size(), every);
  if (ec != std::errc() || end != freq.data() + freq.size() || every <= 0)
    return fail("it is neither a positive integer nor a list expression like [1,0,1,0] or ([0]*1+[1]*3)");
  std::vector<bool> pattern(size_t(std::max<int64_t>(num_layers, 0)));
  for (int64_t i = 0; i < num_layers; ++i) pattern[size_t(i)] = i % every == 0;
  return pattern;
}

void derive_moe_fields(MoEConfig& moe, int64_t ffn_hidden_size) {
  if (moe.moe_ffn_hidden_size == 0) moe.moe_ffn_hidden_size = ffn_hidden_size;
}

namespace {

void check_router(const MoEConfig& m, std::vector<std::string>& errors) {
  const int64_t E = m.num_moe_experts;
  if (m.moe_router_topk < 1 || m.moe_router_topk > E)
    errors.push_back(concat("--moe-router-topk ", m.moe_router_topk, " must lie in [1, --num-experts ", E,
                            "]: each token picks that many distinct experts; lower it or add experts"));
  if ((m.moe_router_num_groups > 0) != (m.moe_router_group_topk > 0)) {
    errors.push_back(concat("--moe-router-num-groups ", m.moe_router_num_groups, " and --moe-router-group-topk ",
                            m.moe_router_group_topk, " go together: give both for group-limited routing, or neither"));
  } else if (m.moe_router_num_groups > 0) {
    const int64_t G = m.moe_router_num_groups, g = m.moe_router_group_topk;
    if (E % G != 0)
      errors.push_back(concat("--moe-router-num-groups ", G, " does not divide --num-experts ", E,
                              ": every group holds the same number of experts; choose a divisor of ", E));
    if (g > G)
      errors.push_back(concat("--moe-router-group-topk ", g, " exceeds --moe-router-num-groups ", G,
                              ": choose at most ", G, " groups per token"));
    if (m.moe_router_topk % g != 0 || (E % G == 0 && m.moe_router_topk / g > E / G))
      errors.push_back(concat("--moe-router-topk ", m.moe_router_topk, " with --moe-router-group-topk ", g,
                              ": each chosen group contributes topk/group_topk experts, so topk must be a multiple ",
                              "of group_topk and topk/group_topk at most the experts per group"));
  }
  if (m.moe_router_topk_scaling_factor && !(*m.moe_router_topk_scaling_factor > 0.0))
    errors.push_back(concat("--moe-router-topk-scaling-factor ", *m.moe_router_topk_scaling_factor,
                            " must be positive: use e.g. 2.5, or leave it unset"));
  if (m.moe_router_pre_softmax && m.moe_router_score_function != RouterScoreFunction::softmax)
    errors.push_back("--moe-router-pre-softmax applies to --moe-router-score-function softmax only: drop it");
}

void check_balancing(const MoEConfig& m, std::vector<std::string>& errors) {
  if (!(m.moe_aux_loss_coeff >= 0.0))
    errors.push_back(concat("--moe-aux-loss-coeff ", m.moe_aux_loss_coeff, " must be >= 0: use e.g. 1e-2"));
  if (m.moe_z_loss_coeff && !(*m.moe_z_loss_coeff >= 0.0))
    errors.push_back(concat("--moe-z-loss-coeff ", *m.moe_z_loss_coeff, " must be >= 0: use e.g. 1e-3"));
  if (m.moe_router_enable_expert_bias && m.moe_router_score_function != RouterScoreFunction::sigmoid)
    errors.push_back(
        "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (as Megatron): add it, or drop "
        "the expert bias");
  if (!(m.moe_router_bias_update_rate >= 0.0))
    errors.push_back(
        concat("--moe-router-bias-update-rate ", m.moe_router_bias_update_rate, " must be >= 0: use e.g. 1e-3"));
}

void check_capacity(const MoEConfig& m, std::vector<std::string>& errors) {
  if (m.moe_expert_capacity_factor && !(*m.moe_expert_capacity_factor > 0.0))
    errors.push_back(concat("--moe-expert-capacity-factor ", *m.moe_expert_capacity_factor,
                            " must be positive: use e.g. 1.0, or leave it unset for dropless routing"));
  if (m.moe_pad_expert_input_to_capacity && !m.moe_expert_capacity_factor)
    errors.push_back(
        "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor: give a capacity, or drop the padding");
}

}  // namespace

std::vector<std::string> validate_moe(const MoEConfig& m, int64_t num_layers, bool add_bias_linear) {
  std::vector<std::string> errors;
  if (m.num_moe_experts < 0)
    errors.push_back(concat("--num-experts ", m.num_moe_experts, " must be positive, or unset for a dense model"));
  if (!m.enabled()) return errors;
  std::string why;
  if (moe_layer_pattern(m.moe_layer_freq, num_layers, &why).empty() && num_layers > 0)
    errors.push_back(
        concat("--moe-layer-freq '", m.moe_layer_freq, "' cannot be used: ", why,
               "; give N for every N-th layer, or one 0/1 per layer as a list or Megatron's list expression, e.g. "
               "[1,0,1,0] or ([0]*1+[1]*3)"));
  if (m.moe_ffn_hidden_size <= 0)
    errors.push_back(concat("--moe-ffn-hidden-size ", m.moe_ffn_hidden_size,
                            " must be positive: leave it unset to use --ffn-hidden-size"));
  if (m.moe_shared_expert_intermediate_size < 0)
    errors.push_back(concat("--moe-shared-expert-intermediate-size ", m.moe_shared_expert_intermediate_size,
                            " must be positive, or unset for no shared expert"));
  if (m.moe_shared_expert_gate && m.moe_shared_expert_intermediate_size <= 0)
    errors.push_back(
        "--moe-shared-expert-gate gates the shared expert, and there is none: give "
        "--moe-shared-expert-intermediate-size, or drop the flag");
  if (add_bias_linear) errors.push_back("--num-experts: the experts have no biases; add --disable-bias-linear");
  check_router(m, errors);
  check_balancing(m, errors);
  check_capacity(m, errors);
  return errors;
}

}  // namespace megatron
