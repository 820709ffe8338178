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
  std::vector<Role> hierarchical;
  if (!s.hierarchical_cp.empty())
    hierarchical = {{"cp_a2a", &C::cp_a2a, hierarchical_cp_groups(s, 0)},
                    {"cp_p2p", &C::cp_p2p, hierarchical_cp_groups(s, 1)}};
  std::vector<Role> out = {{"world", &C::world, {all}},
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
  out.insert(out.end(), hierarchical.begin(), hierarchical.end());
  return out;
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
                                                Device device, const std::shared_ptr<Watchdog>& watchdog,
                                                std::vector<int> asked = {}) {
  if (device.is_cpu()) return std::make_shared<MpiCommunicator>(name, comm, members, watchdog, std::move(asked));
#ifdef MEGATRON_WITH_CUDA
  auto nccl = make_nccl_communicator(name, comm, members, device, watchdog, std::move(asked));
  MPI_CHECK(MPI_Comm_free(&comm), name);
  return nccl;
#else
  (void)members, (void)watchdog, (void)asked;
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

// The pipeline's one-way channels (comm.h, PipelineChannels). Edge e of a pipeline joins stages e
// and e+1 mod P. Edges of one class share no stage (class e mod 2, the wrap-around edge of an odd
// pipeline a class of its own), so one MPI_Comm_split over the world builds a class's channels of
// every pipeline at once; a stage sits in two edges of different classes. Activations flow along an
// edge from e to e+1, gradients from e+1 to e; the sender is the channel's rank 0.
void build_pipeline_channels(ParallelState& st) {
  const RankGroups pipelines = rank_groups(st.sizes, "pp");
  const int rank = st.process.rank;
  const int index = group_index(pipelines, rank);
  const std::vector<int>& pipeline = pipelines[size_t(index)];
  const int p = int(pipeline.size());
  const int stage = int(std::find(pipeline.begin(), pipeline.end(), rank) - pipeline.begin());
  std::vector<int> asked;
  for (int r : pipeline)
    if (r != rank) asked.push_back(r);
  std::vector<int> others;
  for (int r = 0; r < st.sizes.world; ++r)
    if (r != rank) others.push_back(r);
  const auto edge_class = [p](int e) { return p % 2 == 1 && e == p - 1 ? 2 : e % 2; };
  PipelineChannels& ch = st.ctx.pp_channels;
  for (const bool activations : {true, false}) {
    const std::string name = activations ? "pp_activations" : "pp_grads";
    for (int cls = 0; cls < 3; ++cls) {
      // This stage's edge of the class, if any: its own (to the next stage) or the previous one's.
      int edge = -1;
      for (int e : {stage, (stage + p - 1) % p})
        if (edge_class(e) == cls) edge = e;
      const int from = activations ? edge : (edge + 1) % p, to = activations ? (edge + 1) % p : edge;
      const int color = edge < 0 ? MPI_UNDEFINED : index * p + edge, key = edge >= 0 && stage == from ? 0 : 1;
      const CollectiveRecord rec = st.watchdog->log().begin("world", false, "create_group", 0, DType::f32, name);
      MPI_Comm comm = MPI_COMM_NULL;
      {
        Watchdog::Scope watch(*st.watchdog, rec, st.watchdog->default_timeout(), others);
        MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm), name);
      }
      st.watchdog->log().end(rec);
      if (edge < 0) continue;
      auto channel =
          make_communicator(name, comm, {pipeline[size_t(from)], pipeline[size_t(to)]}, st.device, st.watchdog, asked);
      const bool sends = stage == from;
      // NCCL connects a pair at its first send and receive, the host waiting for the peer to come.
      // Here both ends build the channel together; in the schedule each end reaches its first use
      // at another time, and two channels' first uses could wait on each other.
      const P2POp connect{.kind = sends ? P2POp::Kind::send : P2POp::Kind::recv,
                          .tensor = Tensor::zeros({1}, DType::f32, st.device),
                          .peer = sends ? 1 : 0};
      channel->batch_p2p({&connect, 1});
      (activations ? (sends ? ch.activations_out : ch.activations_in) : (sends ? ch.grads_out : ch.grads_in)) =
          std::move(channel);
    }
  }
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
  if (options.pipeline_channels && st.sizes.pp > 1) build_pipeline_channels(st);
  progress.finish();
  st.ctx.set_timeout(options.timeout_seconds);
  return st;
}

}  // namespace megatron
