#include "megatron/parallel/rank_layout.h"

#include <algorithm>
#include <sstream>

#include "megatron/core/error.h"
#include "megatron/core/strings.h"

namespace megatron {

namespace {

struct Axis {
  std::string name;
  int64_t size;
};

// The axes of one generator in layout order (leftmost fastest).
std::vector<Axis> generator_axes(const ParallelSizes& s, bool expert) {
  const int64_t tp = expert ? s.expert_tp() : s.tp;
  const int64_t cp = expert ? 1 : s.cp;
  const int64_t ep = expert ? s.ep : 1;
  const int64_t dp = expert ? s.expert_dp() : s.dp();
  if (s.tp_pp_dp_order) return {{"tp", tp}, {"cp", cp}, {"ep", ep}, {"pp", s.pp}, {"dp", dp}};
  return {{"tp", tp}, {"cp", cp}, {"ep", ep}, {"dp", dp}, {"pp", s.pp}};
}

std::vector<std::string> split_axes(const std::string& axes) {
  std::vector<std::string> out;
  std::stringstream ss(axes);
  for (std::string a; std::getline(ss, a, '-');) out.push_back(a);
  return out;
}

// Calls fn(coords) for every coordinate tuple over `sizes`, first index fastest.
template <class Fn>
void for_each_coordinate(const std::vector<int64_t>& sizes, Fn&& fn) {
  std::vector<int64_t> c(sizes.size(), 0);
  int64_t total = 1;
  for (int64_t n : sizes) total *= n;
  for (int64_t k = 0; k < total; ++k) {
    fn(c);
    for (size_t i = 0; i < c.size() && ++c[i] == sizes[i]; ++i) c[i] = 0;
  }
}

std::vector<int> group_containing(const RankGroups& groups, int rank) {
  for (const auto& g : groups)
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  MEGATRON_FAIL("rank " << rank << " is in no group");
}

int index_in(const std::vector<int>& group, int rank) {
  return int(std::find(group.begin(), group.end(), rank) - group.begin());
}

}  // namespace

std::vector<std::string> validate(const ParallelSizes& s) {
  std::vector<std::string> errors;
  for (const auto& [name, v] : {std::pair{"world size", s.world},
                                {"--tensor-model-parallel-size", s.tp},
                                {"--context-parallel-size", s.cp},
                                {"--pipeline-model-parallel-size", s.pp},
                                {"--expert-model-parallel-size", s.ep}})
    if (v < 1) errors.push_back(concat(name, " ", v, " must be at least 1"));
  if (!errors.empty()) return errors;
  if (!s.hierarchical_cp.empty()) {
    int64_t product = 1;
    std::string given;
    for (int64_t h : s.hierarchical_cp) {
      product *= h;
      given += concat(given.empty() ? "" : " ", h);
    }
    const bool positive =
        std::all_of(s.hierarchical_cp.begin(), s.hierarchical_cp.end(), [](int64_t h) { return h >= 1; });
    if (s.hierarchical_cp.size() != 2 || !positive || product != s.cp)
      errors.push_back(concat("--hierarchical-context-parallel-sizes ", given, " with --context-parallel-size ", s.cp,
                              ": two positive sizes whose product is CP (the all-to-all group inside, the ring ",
                              "across); give two sizes A P with A x P = ", s.cp));
  }
  if (!errors.empty()) return errors;
  const int64_t model = s.tp * s.cp * s.pp;
  if (s.world % model != 0)
    errors.push_back(concat("world size ", s.world, " is not divisible by TP x CP x PP = ", s.tp, " x ", s.cp, " x ",
                            s.pp, " = ", model, "; launch a multiple of ", model, " ranks or change the sizes"));
  const int64_t expert = s.expert_tp() * s.ep * s.pp;
  if (s.world % expert != 0)
    errors.push_back(concat("world size ", s.world, " is not divisible by expert TP x EP x PP = ", s.expert_tp(), " x ",
                            s.ep, " x ", s.pp, " = ", expert, "; change --expert-model-parallel-size"));
  return errors;
}

RankGroups rank_groups(const ParallelSizes& s, const std::string& axes, bool expert) {
  const std::vector<std::string> errors = validate(s);
  MEGATRON_CHECK(errors.empty(), errors.front());
  const std::vector<Axis> all = generator_axes(s, expert);
  const std::vector<std::string> wanted = split_axes(axes);
  std::vector<int64_t> stride(all.size(), 1);
  for (size_t i = 1; i < all.size(); ++i) stride[i] = stride[i - 1] * all[i - 1].size;

  std::vector<size_t> inside, outside;  // axis indices varying within / across groups, layout order
  for (const std::string& w : wanted) {
    const auto it = std::find_if(all.begin(), all.end(), [&](const Axis& a) { return a.name == w; });
    MEGATRON_CHECK(it != all.end(), "unknown parallel axis '" << w << "' in '" << axes << "'");
  }
  for (size_t i = 0; i < all.size(); ++i)
    (std::find(wanted.begin(), wanted.end(), all[i].name) != wanted.end() ? inside : outside).push_back(i);

  auto sizes_of = [&](const std::vector<size_t>& idx) {
    std::vector<int64_t> v;
    for (size_t i : idx) v.push_back(all[i].size);
    return v;
  };
  RankGroups groups;
  for_each_coordinate(sizes_of(outside), [&](const std::vector<int64_t>& fixed) {
    int64_t base = 0;
    for (size_t k = 0; k < outside.size(); ++k) base += fixed[k] * stride[outside[k]];
    std::vector<int> group;
    for_each_coordinate(sizes_of(inside), [&](const std::vector<int64_t>& var) {
      int64_t r = base;
      for (size_t k = 0; k < inside.size(); ++k) r += var[k] * stride[inside[k]];
      group.push_back(int(r));
    });
    groups.push_back(std::move(group));
  });
  return groups;
}

RankGroups hierarchical_cp_groups(const ParallelSizes& s, size_t level) {
  MEGATRON_CHECK(level < s.hierarchical_cp.size(),
                 "hierarchical context-parallel level " << level << " of " << s.hierarchical_cp.size() << " given");
  int64_t inner = 1;  // the sizes of the levels below this one
  for (size_t i = 0; i < level; ++i) inner *= s.hierarchical_cp[i];
  const int64_t size = s.hierarchical_cp[level], span = inner * size;
  RankGroups groups;
  for (const std::vector<int>& cp : rank_groups(s, "cp"))
    for (int64_t block = 0; block < s.cp / span; ++block)
      for (int64_t j = 0; j < inner; ++j) {
        std::vector<int> group;
        for (int64_t i = 0; i < size; ++i) group.push_back(cp[size_t(block * span + j + i * inner)]);
        groups.push_back(std::move(group));
      }
  return groups;
}

RankLayout rank_layout(const ParallelSizes& s, int rank, bool tied_embeddings) {
  MEGATRON_CHECK(rank >= 0 && rank < s.world, "rank " << rank << " is outside world size " << s.world);
  RankLayout l;
  l.rank = rank;
  l.tp = group_containing(rank_groups(s, "tp"), rank);
  l.cp = group_containing(rank_groups(s, "cp"), rank);
  l.dp = group_containing(rank_groups(s, "dp"), rank);
  l.pp = group_containing(rank_groups(s, "pp"), rank);
  l.dp_cp = group_containing(rank_groups(s, "dp-cp"), rank);
  l.model_parallel = group_containing(rank_groups(s, "tp-pp"), rank);
  l.ep = group_containing(rank_groups(s, "ep", true), rank);
  l.expert_tp = group_containing(rank_groups(s, "tp", true), rank);
  l.expert_dp = group_containing(rank_groups(s, "dp", true), rank);
  l.expert_tp_ep = group_containing(rank_groups(s, "tp-ep", true), rank);
  l.expert_mp = group_containing(rank_groups(s, "tp-ep-pp", true), rank);
  MEGATRON_CHECK(l.pp == group_containing(rank_groups(s, "pp", true), rank),
                 "dense and expert layouts disagree on the pipeline group of rank " << rank);
  l.tp_rank = index_in(l.tp, rank);
  l.cp_rank = index_in(l.cp, rank);
  l.dp_rank = index_in(l.dp, rank);
  l.pp_rank = index_in(l.pp, rank);
  l.ep_rank = index_in(l.ep, rank);
  l.position_embedding = {l.pp.front()};
  l.embedding = {l.pp.front()};
  if (tied_embeddings && l.pp.size() > 1) l.embedding.push_back(l.pp.back());
  return l;
}

}  // namespace megatron
