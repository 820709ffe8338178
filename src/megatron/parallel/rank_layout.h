#pragma once
// Megatron's rank layout (parallel_state.py, reference §7) as pure functions: which global
// ranks form each process group, for any world size and parallel sizes. No communication here;
// parallel_state builds communicators from these lists.
//
// Ranks are laid out along the order "tp-cp-ep-dp-pp" (or "tp-cp-ep-pp-dp" with
// --use-tp-pp-dp-mapping), leftmost axis fastest. Dense groups use (tp, cp, ep=1, dp, pp);
// expert groups use (etp, cp=1, ep, expert-dp, pp), and both give the same pp groups.
#include <cstdint>
#include <string>
#include <vector>

namespace megatron {

struct ParallelSizes {
  int64_t world = 1;
  int64_t tp = 1;   // tensor (and sequence) parallel
  int64_t cp = 1;   // context parallel
  int64_t pp = 1;   // pipeline parallel
  int64_t ep = 1;   // expert parallel
  int64_t etp = 0;  // expert tensor parallel; 0 = same as tp
  bool tp_pp_dp_order = false;
  // --hierarchical-context-parallel-sizes: the CP group split into levels (product = cp), e.g.
  // {a2a, p2p} for --cp-comm-type a2a+p2p; empty: none.
  std::vector<int64_t> hierarchical_cp{};

  int64_t dp() const { return world / (tp * cp * pp); }
  int64_t expert_tp() const { return etp > 0 ? etp : tp; }
  int64_t expert_dp() const { return world / (expert_tp() * ep * pp); }
};

// Every rule the sizes break, one message each (value, rule, fix). Empty when valid.
std::vector<std::string> validate(const ParallelSizes& sizes);

using RankGroups = std::vector<std::vector<int>>;

// All groups of one kind. `axes` names the axes that vary inside a group, joined by '-'
// ("tp", "dp-cp", "tp-pp", ...); expert=true uses the expert generator.
RankGroups rank_groups(const ParallelSizes& sizes, const std::string& axes, bool expert = false);

// Megatron's hierarchical context-parallel groups of one level (create_hierarchical_parallel_groups):
// within every CP group, level 0 takes runs of hierarchical_cp[0] consecutive members, level 1
// every hierarchical_cp[0]-th member (members j, j + h0, j + 2·h0, ...). Needs hierarchical_cp.
RankGroups hierarchical_cp_groups(const ParallelSizes& sizes, size_t level);

// The groups one rank belongs to.
struct RankLayout {
  int rank = 0;
  std::vector<int> tp, cp, dp, pp, dp_cp, model_parallel;  // dense
  std::vector<int> ep, expert_tp, expert_dp, expert_tp_ep, expert_mp;  // expert
  std::vector<int> embedding, position_embedding;          // first/last pipeline stages
  int tp_rank = 0, cp_rank = 0, dp_rank = 0, pp_rank = 0, ep_rank = 0;
};

// tied_embeddings: the output layer shares the word embedding, so the last stage joins the
// embedding group (Megatron drops it when untied).
RankLayout rank_layout(const ParallelSizes& sizes, int rank, bool tied_embeddings = true);

}  // namespace megatron
