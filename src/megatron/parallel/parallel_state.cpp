#include "megatron/parallel/parallel_state.h"

#include <algorithm>
#include <numeric>

#include "megatron/core/progress.h"
#include "megatron/core/strings.h"
#include "megatron/parallel/mpi_communicator.h"
#include "megatron/parallel/watchdog.h"

#ifdef MEGATRON_WITH_CUDA
#include "megatron/parallel/nccl_communicator.h"
#endif

namespace megatron {

namespace {

// One role of the context and every group of that role (each rank computes the same lists).
// A role that needs its own communicator never shares one with a role of the same groups.
struct Role {
  const char* name;
  std::shared_ptr<Communicator> ParallelContext::*slot;
  RankGroups groups;
  bool own = false;
};

// Megatron's embedding groups: per pipeline group, its first stage and (tied) its last.
RankGroups embedding_groups(const ParallelSizes& s, bool include_last) {
  RankGroups out;
  for (const auto& pp : rank_groups(s, "pp")) {
    std::vector<int> g{pp.front()};
    if (include_last && pp.size() > 1) g.push_back(pp.back());
    out.push_back(g);
  }
  return out;
}

std::vector<Role> roles(const ParallelSizes& s, bool tied) {
  std::vector<int> all(size_t(s.world));
  std::iota(all.begin(), all.end(), 0);
  using C = ParallelContext;
  return {{"world", &C::world, {all}},
          {"tp", &C::tp, rank_groups(s, "tp")},
          {"cp", &C::cp, rank_groups(s, "cp")},
          {"dp", &C::dp, rank_groups(s, "dp")},
          {"pp", &C::pp, rank_groups(s, "pp")},
          {"pp_grad", &C::pp_grad, rank_groups(s, "pp"), true},
          {"dp_cp", &C::dp_cp, rank_groups(s, "dp-cp")},
          {"mp", &C::mp, rank_groups(s, "tp-pp")},
          {"ep", &C::ep, rank_groups(s, "ep", true)},
          {"expert_tp", &C::expert_tp, rank_groups(s, "tp", true)},
          {"expert_dp", &C::expert_dp, rank_groups(s, "dp", true)},
          {"expert_tp_ep", &C::expert_tp_ep, rank_groups(s, "tp-ep", true)},
          {"expert_mp", &C::expert_mp, rank_groups(s, "tp-ep-pp", true)},
          {"embedding", &C::embedding, embedding_groups(s, tied)},
          {"position_embedding", &C::position_embedding, embedding_groups(s, false)}};
}

RankGroups sorted(RankGroups g) {
  std::sort(g.begin(), g.end());
  return g;
}

// The group of `rank` in `groups` and its index, or -1 when the rank is in none.
int group_index(const RankGroups& groups, int rank) {
  for (size_t i = 0; i < groups.size(); ++i)
    if (std::find(groups[i].begin(), groups[i].end(), rank) != groups[i].end()) return int(i);
  return -1;
}

std::shared_ptr<Communicator> make_communicator(const std::string& name, MPI_Comm comm, const std::vector<int>& members,
                                                Device device, const std::shared_ptr<Watchdog>& watchdog) {
  if (device.is_cpu()) return std::make_shared<MpiCommunicator>(name, comm, members, watchdog);
#ifdef MEGATRON_WITH_CUDA
  auto nccl = make_nccl_communicator(name, comm, members, device, watchdog);
  MPI_CHECK(MPI_Comm_free(&comm), name);
  return nccl;
#else
  (void)members, (void)watchdog;
  MPI_Comm_free(&comm);
  MEGATRON_FAIL("device " << device.str() << ": this build has no CUDA backend, so no NCCL communicators; "
                          << "rebuild with the CUDA toolkit or run on the CPU");
#endif
}

ParallelSizes launched_sizes(const ParallelSizes& requested, int world) {
  MEGATRON_CHECK(requested.world == 1 || requested.world == world,
                 "the parallel sizes are for a world of " << requested.world << " ranks but " << world
                                                          << " were launched; launch " << requested.world
                                                          << " processes or leave the world size to the launcher");
  ParallelSizes s = requested;
  s.world = world;
  const std::vector<std::string> errors = validate(s);
  std::string all;
  for (const std::string& e : errors) all += (all.empty() ? "" : "; ") + e;
  MEGATRON_CHECK(errors.empty(), all);
  return s;
}

}  // namespace

ParallelState initialize_parallel(const ParallelSizes& sizes, const ParallelOptions& options) {
  ParallelState st;
  st.mpi = options.mpi;
  st.process = st.mpi ? st.mpi->process() : process_info_from_env();
  MEGATRON_CHECK(st.mpi || !st.process.launched(),
                 "this process was started by " << launcher_name(st.process.launcher)
                                                << " but no MpiRuntime was given; create one before the parallel "
                                                << "state");
  if (!st.process.launched()) st.process.local_rank = 0;
  st.sizes = launched_sizes(sizes, st.process.world_size);
  st.layout = rank_layout(st.sizes, st.process.rank, options.tied_embeddings);
  st.device = options.device;
  if (!st.mpi) {
    st.ctx = ParallelContext::single_process();
    st.ctx.set_timeout(options.timeout_seconds);
    return st;
  }

  WatchdogOptions wopt;
  wopt.timeout_seconds = options.timeout_seconds;
  wopt.log_capacity = options.log_capacity;
  st.watchdog = std::make_shared<Watchdog>(MPI_COMM_WORLD, wopt);
  const int rank = st.process.rank;
  std::vector<int> others;
  for (int r = 0; r < st.sizes.world; ++r)
    if (r != rank) others.push_back(r);

  const std::vector<Role> all = roles(st.sizes, options.tied_embeddings);
  std::vector<Role> built;
  ProgressReporter progress("communicator set-up", int64_t(all.size()), "groups");
  for (const Role& role : all) {
    progress.advance();
    const int index = group_index(role.groups, rank);
    const std::vector<int> members = index >= 0 ? role.groups[size_t(index)] : std::vector<int>{};
    if (role.groups.front().size() == 1) {
      if (index >= 0) st.ctx.*role.slot = std::make_shared<SingleRankCommunicator>(role.name, rank);
      continue;
    }
    // Same groups on every rank as an earlier role: share its communicator.
    auto shares = [&](const Role& a, const Role& b) {
      return !a.own && !b.own && sorted(a.groups) == sorted(b.groups);
    };
    auto same = std::find_if(built.begin(), built.end(), [&](const Role& b) { return shares(b, role); });
    if (same != built.end()) {
      st.ctx.*role.slot = st.ctx.*same->slot;
      continue;
    }
    // The name lists every role that shares the communicator, so the watchdog says which calls.
    std::string name = role.name;
    for (const Role& other : all)
      if (std::string(other.name) != role.name && shares(other, role)) name += concat("/", other.name);
    const CollectiveRecord rec = st.watchdog->log().begin("world", false, "create_group", 0, DType::f32, name);
    MPI_Comm comm = MPI_COMM_NULL;
    {
      Watchdog::Scope watch(*st.watchdog, rec, options.timeout_seconds, others);
      const int position = index >= 0 ? int(std::find(members.begin(), members.end(), rank) - members.begin()) : 0;
      MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, index >= 0 ? index : MPI_UNDEFINED, position, &comm), name);
    }
    st.watchdog->log().end(rec);
    if (index >= 0) st.ctx.*role.slot = make_communicator(name, comm, members, st.device, st.watchdog);
    built.push_back(role);
  }
  progress.finish();
  st.ctx.set_timeout(options.timeout_seconds);
  return st;
}

}  // namespace megatron
