#include "megatron/training/context_parallel.h"

#include <algorithm>

#include "megatron/context_parallel/load_balance.h"
#include "megatron/core/strings.h"
#include "megatron/flags/command_line.h"

namespace megatron {

void check_context_parallel(const TrainingArgs& a, std::vector<std::string>& errors) {
  const int64_t cp = a.parallel.context_parallel_size, tp = a.parallel.tensor_model_parallel_size;
  if (cp <= 1) return;
  const int64_t S = a.model.seq_length;
  if (S > 0 && S % (2 * cp) != 0)
    errors.push_back(concat("--seq-length ", S, " is not divisible by 2 x --context-parallel-size = ", 2 * cp,
                            ": each CP rank holds two equal chunks of every sequence; use a multiple of ", 2 * cp));
  else if (S > 0 && a.parallel.sequence_parallel && tp > 1 && S % (2 * cp * tp) != 0)
    errors.push_back(concat("--seq-length ", S, " is not divisible by 2 x --context-parallel-size x ",
                            "--tensor-model-parallel-size = ", 2 * cp * tp, " under --sequence-parallel: each CP ",
                            "rank's ", S / cp, " positions split over TP; use a multiple of ", 2 * cp * tp,
                            " or drop --sequence-parallel"));
  const int64_t heads = a.model.num_attention_heads / std::max<int64_t>(tp, 1);
  const int64_t groups = a.model.num_query_groups / std::max<int64_t>(tp, 1);
  if (a.parallel.cp_comm_type == "a2a" && (heads % cp != 0 || groups % cp != 0))
    errors.push_back(concat("--cp-comm-type a2a with --context-parallel-size ", cp, ": each TP rank's ", heads,
                            " attention heads and ", groups, " query groups must divide by CP (the all-to-all ",
                            "splits heads over the CP ranks); use --cp-comm-type p2p or a CP that divides both"));
  const std::vector<std::string>& levels = a.parallel.hierarchical_context_parallel_sizes;
  const int64_t a2a = levels.empty() ? 0 : flags::parse_int(levels.front()).value_or(0);  // 0: refused elsewhere
  if (a.parallel.cp_comm_type == "a2a+p2p" && a2a > 0 && (heads % a2a != 0 || groups % a2a != 0))
    errors.push_back(concat("--cp-comm-type a2a+p2p with --hierarchical-context-parallel-sizes ",
                            flags::join(levels, " "), ": each TP rank's ", heads, " attention heads and ", groups,
                            " query groups must divide ", "by the all-to-all size ", a2a,
                            " (it splits heads over its ranks); use an all-to-all ", "size that divides both"));
  if (a.model.attention_dropout > 0.0f || a.model.hidden_dropout > 0.0f)
    errors.push_back(concat("--attention-dropout ", a.model.attention_dropout, " and --hidden-dropout ",
                            a.model.hidden_dropout, " with --context-parallel-size ", cp,
                            ": dropout under context parallelism is not built yet (its masks must follow the ",
                            "chunks' true positions); add --attention-dropout 0 --hidden-dropout 0"));
  if (a.model.window_size_left >= 0)
    errors.push_back(concat("--window-size with --context-parallel-size ", cp,
                            ": sliding-window ring attention is not built yet; drop --window-size or use CP 1"));
  if (a.parallel.pipeline_model_parallel_size > 1)
    errors.push_back(concat("--context-parallel-size ", cp, " with --pipeline-model-parallel-size ",
                            a.parallel.pipeline_model_parallel_size,
                            ": context and pipeline parallelism together are not built yet; use one of them"));
  if (a.model.moe.enabled())
    errors.push_back(concat("--context-parallel-size ", cp, " with --num-experts ", a.model.moe.num_moe_experts,
                            ": MoE layers under context parallelism are not built yet; use CP 1"));
}

MicroBatch context_parallel_part(const MicroBatch& mb, const Communicator& cp) {
  const int64_t C = cp.size(), r = cp.rank();
  if (C == 1) return mb;
  const auto part = [&](const Tensor& t) {
    return t.defined() ? context_parallel::split_sequence(t.device().is_cpu() ? t : t.to(Device::cpu()), C, r)
                       : Tensor();
  };
  Tensor positions = mb.position_ids;
  if (!positions.defined()) {
    const int64_t B = mb.tokens.dim(0), S = mb.tokens.dim(1);
    positions = Tensor::empty({B, S}, DType::i32);
    for (int64_t i = 0; i < B * S; ++i) positions.data<int32_t>()[i] = int32_t(i % S);
  }
  return {part(mb.tokens), part(mb.labels), part(mb.loss_mask), part(positions), part(mb.segment_ids)};
}

}  // namespace megatron
