#include "megatron/parallel/parallel_args.h"

#include "megatron/core/error.h"
#include "megatron/core/logging.h"
#include "megatron/core/strings.h"
#include "megatron/flags/command_line.h"

namespace megatron {

ParallelSizes ParallelArgs::sizes() const {
  ParallelSizes s;
  s.tp = tensor_model_parallel_size;
  s.pp = pipeline_model_parallel_size;
  s.cp = context_parallel_size;
  s.ep = expert_model_parallel_size;
  s.etp = expert_tensor_parallel_size;
  for (const std::string& h : hierarchical_context_parallel_sizes)
    s.hierarchical_cp.push_back(flags::parse_int(h).value_or(0));  // 0: not a number, refused by validate
  return s;
}

std::vector<std::string> validate(const ParallelArgs& a, int64_t world_size) {
  std::vector<std::string> errors;
  const int64_t tp = a.tensor_model_parallel_size;
  if (tp <= 0)
    errors.push_back(concat("--tensor-model-parallel-size ", tp, " must be positive: 1 disables tensor parallelism"));
  if (a.pipeline_model_parallel_size <= 0)
    errors.push_back(concat("--pipeline-model-parallel-size ", a.pipeline_model_parallel_size,
                            " must be positive: 1 disables pipeline parallelism"));
  if (a.context_parallel_size <= 0)
    errors.push_back(concat("--context-parallel-size ", a.context_parallel_size,
                            " must be positive: 1 disables context parallelism"));
  if (a.cp_comm_type != "p2p" && a.cp_comm_type != "a2a" && a.cp_comm_type != "allgather" &&
      a.cp_comm_type != "a2a+p2p")
    errors.push_back(concat("--cp-comm-type ", a.cp_comm_type, ": one of p2p (ring attention), a2a (all-to-all ",
                            "over heads), allgather and a2a+p2p (with --hierarchical-context-parallel-sizes)"));
  if (a.cp_comm_type == "a2a+p2p" && a.hierarchical_context_parallel_sizes.empty())
    errors.push_back(concat(
        "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A P (A x P = ", "--context-parallel-size ",
        a.context_parallel_size, "): the all-to-all runs inside ", "groups of A ranks, the ring across P of them"));
  for (const std::string& h : a.hierarchical_context_parallel_sizes)
    if (!flags::parse_int(h))
      errors.push_back(concat("--hierarchical-context-parallel-sizes: '", h, "' is not an integer; give two sizes ",
                              "A P with A x P = --context-parallel-size"));
  if (!a.hierarchical_context_parallel_sizes.empty())
    for (const std::string& e : validate(a.sizes()))
      if (e.starts_with("--hierarchical-context-parallel-sizes")) errors.push_back(e);
  const int64_t ep = a.expert_model_parallel_size;
  if (ep <= 0)
    errors.push_back(concat("--expert-model-parallel-size ", ep, " must be positive: 1 disables expert parallelism"));
  if (a.expert_tensor_parallel_size < 0)
    errors.push_back(concat("--expert-tensor-parallel-size ", a.expert_tensor_parallel_size,
                            " must be positive; leave it out for Megatron's default, the TP size"));
  const int64_t etp = a.expert_tensor_parallel_size > 0 ? a.expert_tensor_parallel_size : tp;
  // Megatron's rule too: the overlapped collectives are the SP all-gathers and reduce-scatters.
  if (a.tp_comm_overlap && tp > 1 && !a.sequence_parallel) {
    errors.push_back(concat("--tp-comm-overlap needs --sequence-parallel: it overlaps the sequence-parallel ",
                            "all-gathers and reduce-scatters with the GEMMs; add --sequence-parallel or drop ",
                            "--tp-comm-overlap"));
  }
  const int64_t model_parallel = tp * a.context_parallel_size * a.pipeline_model_parallel_size;
  if (world_size <= 0 || (model_parallel > 0 && world_size % model_parallel != 0)) {
    errors.push_back(concat("world size ", world_size, " is not a multiple of TP*CP*PP = ", model_parallel,
                            ": each data-parallel replica needs all TP*CP*PP ranks; launch a multiple of ",
                            model_parallel, " ranks"));
  }
  // Megatron's expert layout: expert TP x EP x PP ranks hold every expert once (the rest are
  // expert-data-parallel replicas). With expert TP = TP: the EP ranks of a data-parallel group
  // split the experts, so EP divides DP = world / (TP x CP x PP).
  const int64_t expert_model_parallel = etp * ep * a.pipeline_model_parallel_size;
  if (etp != tp && world_size > 0 && expert_model_parallel > 0 && world_size % expert_model_parallel != 0) {
    errors.push_back(concat("world size ", world_size, " is not a multiple of expert TP x EP x PP = ", etp, " x ", ep,
                            " x ", a.pipeline_model_parallel_size, " = ", expert_model_parallel,
                            ": each expert-data-parallel replica needs all of them; change ",
                            "--expert-tensor-parallel-size or --expert-model-parallel-size"));
  } else if (etp == tp && world_size > 0 && model_parallel > 0 && world_size % model_parallel == 0 && ep > 0 &&
             world_size % (model_parallel * ep) != 0) {
    errors.push_back(concat("--expert-model-parallel-size ", ep, " does not divide the data-parallel size ",
                            world_size / model_parallel, " (world ", world_size, " / TP*CP*PP ", model_parallel,
                            "): the experts split over EP ranks of each data-parallel group; use an EP that divides ",
                            world_size / model_parallel, ", or launch a multiple of ", model_parallel * ep, " ranks"));
  }
  return errors;
}

ParallelContext model_context(const ParallelContext& groups, const ParallelArgs& args) {
  const int64_t tp = groups.tp_size();
  MEGATRON_CHECK(tp == args.tensor_model_parallel_size, "the context's TP group has "
                                                            << tp << " ranks but the arguments ask for TP "
                                                            << args.tensor_model_parallel_size
                                                            << "; build the groups from the arguments' sizes");
  if (args.sequence_parallel && tp == 1)
    LOG_WARN("--sequence-parallel has no effect with --tensor-model-parallel-size 1");
  if (args.tp_comm_overlap && tp == 1) LOG_WARN("--tp-comm-overlap has no effect with --tensor-model-parallel-size 1");
  if (args.tp_comm_overlap && tp > 2)
    LOG_WARN(
        "--tp-comm-overlap at TP " << tp
                                   << ": its rings take TP-1 point-to-point steps per collective and measured "
                                      "slower than plain collectives at TP 4 (docs/PERFORMANCE.md); it pays at TP 2");
  ParallelContext ctx = groups;
  ctx.sequence_parallel_given = args.sequence_parallel;
  ctx.tp_comm_overlap_given = args.tp_comm_overlap;
  ctx.cp_comm_type = args.cp_comm_type == "a2a"         ? CpCommType::a2a
                     : args.cp_comm_type == "allgather" ? CpCommType::allgather
                     : args.cp_comm_type == "a2a+p2p"   ? CpCommType::a2a_p2p
                                                        : CpCommType::p2p;
  MEGATRON_CHECK(ctx.cp_comm_type != CpCommType::a2a_p2p || (ctx.cp_a2a && ctx.cp_p2p),
                 "--cp-comm-type a2a+p2p: the context has no hierarchical context-parallel groups; build it from "
                 "sizes with --hierarchical-context-parallel-sizes");
  return ctx;
}

}  // namespace megatron
