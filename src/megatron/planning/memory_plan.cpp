#include "megatron/planning/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <sstream>

#include "megatron/core/dtype.h"
#include "megatron/distributed/buffer_layout.h"
#include "megatron/distributed/ddp.h"
#include "megatron/distributed/fully_sharded.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/optimizer/adamw_state.h"
#include "megatron/pipeline_parallel/schedule.h"
#include "megatron/planning/described_group.h"
#include "megatron/training/pipeline_step.h"

namespace megatron::planning {

namespace {

// CUDA's caching allocator (cuda_runtime/allocator.h) rounds requests under 1 MiB up to one of eight
// size classes per power of two (0 to 12.5% of a block), and larger ones to 512 bytes, though a
// block cut from a free one keeps a remainder under 1 MiB. Counted as 6.25% of the step's
// transients, an upper estimate for models whose activations are mostly large: llama-3b's plan
// with it (33 MiB) is within 0.1% of the peak an H100 measured (docs/PERFORMANCE.md, 2026-12-06).
constexpr double kCudaRoundingOfTransients = 0.0625;

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// Megatron FSDP's strategy (--data-parallel-sharding-strategy, with --use-megatron-fsdp).
DataParallelSharding sharding_of(const TrainingArgs& args) {
  return args.use_megatron_fsdp ? parse_data_parallel_sharding(args.data_parallel_sharding_strategy)
                                : DataParallelSharding::no_shard;
}

// The flat buffers of one rank: its chunks built as the run builds them, laid out by DDP.
struct RankBuffers {
  int64_t numel = 0;        // elements of the param and grad buffers
  int64_t state_numel = 0;  // elements the optimizer keeps state for (the shard with the distributed optimizer)
  int64_t registry_numel = 0;  // before DDP's layout: registration order, 16-element alignment
  int64_t fp8_weight_numel = 0;  // elements of the FP8 linear layers' weights (cast once per step, kept)
  // Megatron FSDP: each unit's (bucket's) elements and this rank's shard of them, in buffer order
  // (the backward's: output layer first, embedding last).
  std::vector<int64_t> unit_numel, unit_shard_numel;
  // The distributed optimizer without FSDP: this rank's shard of each model chunk's buckets
  // reduced over a group of several ranks, the elements its gradient reduce-scatters return.
  std::vector<int64_t> chunk_shard_numel;
  // Without FSDP, per model chunk and part of its backward (GPTModel::backward_param_order: the
  // output layer, each layer from the last, the embeddings), the elements of the buckets that part
  // reaches first: the gradients take memory bucket by bucket during a chunk's first backward of a step.
  std::vector<std::vector<int64_t>> chunk_phase_grad_numel;
  // The same by the part that reaches each bucket last: where its weights are released in the
  // chunk's last backward of the step (TrainingArgs::releases_weights_after_backward).
  std::vector<std::vector<int64_t>> chunk_phase_done_numel;
  int64_t largest_bucket_numel = 0;
};

RankBuffers rank_buffers(const TrainingArgs& args, const ParallelContext& ctx,
                         const pipeline_parallel::PipelineSplit& split) {
  // The model's own split of every parameter (the expert TP's of experts too).
  const std::unique_ptr<ParameterRegistry> model_registry = make_model_registry(ctx);
  ParameterRegistry& registry = *model_registry;
  std::vector<std::unique_ptr<GPTModel>> chunks;
  std::vector<int64_t> param_chunks;  // as ModelChunks::param_chunks
  for (int64_t c = 0; c < split.virtual_stages; ++c) {
    chunks.push_back(std::make_unique<GPTModel>(args.model, ctx, Device::cpu(), split.stage(ctx.pp->rank(), c),
                                                &registry));
    param_chunks.resize(registry.params().size(), c);
  }
  RankBuffers b;
  std::set<std::string> fp8_weights;
  for (const auto& chunk : chunks)
    for (const tensor_parallel::Fp8Linear* linear : chunk->fp8_linears())
      fp8_weights.insert(linear->name() + ".weight");
  for (const auto& p : registry.params()) {
    b.registry_numel += (shape_numel(p->local_shape) + kParamAlignment - 1) / kParamAlignment * kParamAlignment;
    if (fp8_weights.count(p->spec.name) != 0) b.fp8_weight_numel += shape_numel(p->local_shape);
  }
  const DataParallelSharding sharding = sharding_of(args);
  const DdpConfig ddp{.overlap_grad_reduce = args.overlap_grad_reduce,
                      .use_distributed_optimizer = args.use_distributed_optimizer,
                      .overlap_param_gather = args.overlap_param_gather,
                      .bucket_size = args.ddp_bucket_size,
                      .param_chunks = param_chunks,
                      .shard_grads = sharding == DataParallelSharding::optim_grads ||
                                     sharding == DataParallelSharding::optim_grads_params,
                      .shard_params = sharding == DataParallelSharding::optim_grads_params};
  const BufferLayout layout = ddp_buffer_layout(registry, ddp, ctx.dp_cp->size(), ctx.expert_dp->size());
  b.numel = layout.numel;
  if (!ddp.shard_grads) {
    std::vector<size_t> phase_of(registry.params().size(), 0);
    for (size_t c = 0; c < chunks.size(); ++c) {
      const std::vector<std::vector<size_t>> order = chunks[c]->backward_param_order();
      for (size_t k = 0; k < order.size(); ++k)
        for (size_t i : order[k]) phase_of[i] = k;
      b.chunk_phase_grad_numel.emplace_back(order.size(), 0);
      b.chunk_phase_done_numel.emplace_back(order.size(), 0);
    }
    for (const BucketLayout& bucket : layout.buckets) {
      size_t first = phase_of[bucket.params.front()], last = first;
      for (size_t i : bucket.params) {
        first = std::min(first, phase_of[i]);
        last = std::max(last, phase_of[i]);
      }
      const size_t chunk = size_t(param_chunks[bucket.params[0]]);
      b.chunk_phase_grad_numel[chunk][first] += bucket.range.size();
      b.chunk_phase_done_numel[chunk][last] += bucket.range.size();
      b.largest_bucket_numel = std::max(b.largest_bucket_numel, bucket.range.size());
    }
  }
  if (!ddp.use_distributed_optimizer) {
    b.state_numel = layout.numel;
    return b;
  }
  const RankShards shards = rank_shards(layout, 0, 0);
  b.state_numel = shards.numel;
  if (!ddp.shard_grads) {
    b.chunk_shard_numel.assign(size_t(split.virtual_stages), 0);
    for (size_t u = 0; u < layout.buckets.size(); ++u) {
      const int64_t group = layout.buckets[u].expert_parallel ? ctx.expert_dp->size() : ctx.dp_cp->size();
      if (group > 1)  // a group of one rank copies nothing (SingleRankCommunicator)
        b.chunk_shard_numel[size_t(param_chunks[layout.buckets[u].params[0]])] += shards.in_shards[u].size();
    }
  }
  if (ddp.shard_grads)
    for (size_t u = 0; u < layout.buckets.size(); ++u) {
      b.unit_numel.push_back(layout.buckets[u].range.size());
      b.unit_shard_numel.push_back(shards.in_shards[u].size());
    }
  return b;
}

// Megatron FSDP's buffers in flight at the step's peak (distributed/fully_sharded.h), the most of
// them while every activation is still held: during the backwards of the units before the last
// decoder layer's, and of that one. Units lie in backward order: 0 the output layer (or the final
// norm when the output layer is tied to the embedding), then the final norm, the layers from the
// last, the embedding last. While unit k's backward runs: its full gradient (and this rank's reduced
// part, allocated as it completes); the two units before it still reducing (full gradient and
// reduced part each: at most two reductions stay in flight), before the first the previous
// micro-batch's last two (a unit's reduction finishes when its next backward opens it); a tied
// output layer's embedding unit, open from the first backward to the last. With sharded parameters:
// unit k gathered with the next one prefetched, and a tied embedding gathered all along.
double fsdp_units_in_flight(const RankBuffers& b, DataParallelSharding sharding, bool tied_output,
                            int64_t micro_batches, double param_element, double grad_element) {
  const std::vector<int64_t>& unit = b.unit_numel;
  if (unit.size() < 3) return 0;  // embedding, a layer, final norm at least; none without FSDP's shards
  const size_t last = unit.size() - 1;
  const size_t last_layer = tied_output ? 1 : 2;
  const auto reducing = [&](size_t u) { return double(unit[u] + b.unit_shard_numel[u]) * grad_element; };
  double most = 0;
  for (size_t k = 0; k <= last_layer && k < last; ++k) {
    double bytes = reducing(k);
    for (size_t back = 1; back <= 2; ++back) {
      if (k >= back) {
        bytes += reducing(k - back);
      } else if (micro_batches > 1) {
        const size_t u = last + k + 1 - back;  // the previous micro-batch's last units
        if (!(tied_output && u == last)) bytes += reducing(u);  // reopened (and finished) by the output layer
      }
    }
    if (tied_output) bytes += double(unit[last]) * grad_element;
    if (sharding == DataParallelSharding::optim_grads_params)
      bytes += double(unit[k] + unit[k + 1] + (tied_output && k + 1 != last ? unit[last] : 0)) * param_element;
    most = std::max(most, bytes);
  }
  return most;
}

StageMemory plan_stage(const TrainingArgs& args, int64_t pp_rank, PlanBackend backend) {
  const ParallelContext ctx = described_context(args.parallel, args.world_size, 0, int(pp_rank));
  const pipeline_parallel::PipelineSplit split = pipeline_parallel::pipeline_split(args.parallel, args.model.num_layers);
  const RankBuffers buffers = rank_buffers(args, ctx, split);
  const DType params = args.model.params_dtype;
  const double state_element = params == DType::f64 ? 8.0 : 4.0;  // fp32 master and moments (f64 runs: f64)
  StageMemory s;
  s.pipeline_rank = pp_rank;
  s.parameters = buffers.numel;
  // Megatron FSDP keeps only this rank's shard of the gradients (optim_grads), and of the weights
  // (optim_grads_params), between uses; the units in flight count as communication buffers.
  const DataParallelSharding sharding = sharding_of(args);
  const bool shard_grads =
      sharding == DataParallelSharding::optim_grads || sharding == DataParallelSharding::optim_grads_params;
  const bool shard_params = sharding == DataParallelSharding::optim_grads_params;
  const double whole_weights = double(buffers.numel) * double(dtype_size(params));
  const double whole_gradients = double(buffers.numel) * state_element;
  s.weights = shard_params ? double(buffers.state_numel) * double(dtype_size(params)) : whole_weights;
  // FP8 layers' weights cast once per optimizer step and kept through it, W and W^T, a byte an
  // element each (tensor_parallel/fp8_linear.h; the blockwise recipe's block scales are left out:
  // 8 bytes a 128 x 128 block). With --fp8-param-gather W is the parameter itself, held as its
  // codes instead of in the compute dtype (distributed/fp8_params.h), and W^T is made per step.
  const double fp8_weights = double(buffers.fp8_weight_numel);
  s.weights += args.model.fp8.fp8_param_gather ? fp8_weights * (2.0 - double(dtype_size(params))) : 2.0 * fp8_weights;
  const double fsdp_gradients = double(buffers.state_numel) * state_element;  // FSDP's shard, held all along
  const bool separate_master = params != DType::f32 && params != DType::f64;
  const double fraction = args.optimizer.optimizer_cpu_offload ? args.optimizer.optimizer_offload_fraction : 0.0;
  const double offloaded = fraction * double(buffers.state_numel);
  const double kept = double(buffers.state_numel) - offloaded;
  // The moments, and the masters where they are kept apart: 2 bytes an element as remainders beside
  // bf16 weights (--use-precision-aware-optimizer), else a whole state element.
  const double master_element =
      separate_master ? (args.optimizer.keeps_param_remainders(params) ? 2.0 : state_element) : 0.0;
  s.optimizer_state = kept * (2.0 * state_element + master_element);
  if (offloaded > 0) {
    // Two staging slots, each up to one pipeline chunk of gradients and of parameters.
    const double slot = std::min(offloaded, double(AdamWStateOptions{}.chunk_elements));
    const double host = offloaded * state_element * 3.0 + 2.0 * slot * (state_element + double(dtype_size(params)));
    (backend == PlanBackend::cpu ? s.optimizer_state : s.host_optimizer) += host;
  }

  const ActivationShape shape{.seq_length = args.model.seq_length / args.parallel.context_parallel_size,
                              .micro_batch = args.micro_batch_size,
                              .tp = args.parallel.tensor_model_parallel_size,
                              .sequence_parallel = ctx.sequence_parallel(),
                              .tp_comm_overlap = ctx.tp_comm_overlap(),
                              .ep = args.parallel.expert_model_parallel_size,
                              .expert_tp = args.parallel.sizes().expert_tp(),
                              .context_parallel = args.parallel.context_parallel_size > 1};
  // Per chunk: what one micro-batch keeps (saved tensors and device inputs), and its backward in the
  // parts of GPTModel::backward_param_order: what each holds on top of the saved while it runs, and
  // frees when done (the backward gives back each part's saved tensors once read).
  std::vector<double> kept_per_chunk;
  struct BackwardPart {
    double working = 0, freed = 0;
  };
  std::vector<std::vector<BackwardPart>> backward_parts;
  for (int64_t c = 0; c < split.virtual_stages; ++c) {
    const pipeline_parallel::StageLayers stage = split.stage(pp_rank, c);
    const ChunkActivations a = chunk_activations(args.model, stage, shape, backend);
    for (size_t i = 0; i < a.layers.size(); ++i)
      s.layer_activations.push_back({stage.first_layer + int64_t(i), a.layers[i].saved});
    // On the CPU the token ids are the loader's own memory (no copy to a device).
    const double inputs =
        double(a.inputs) - (backend == PlanBackend::cpu && stage.embedding ? 4.0 * double(shape.tokens()) : 0.0);
    kept_per_chunk.push_back(double(a.counted()) + inputs);
    std::vector<BackwardPart> parts{{double(a.loss_working), double(a.final_norm_and_loss)}};
    for (size_t i = a.layers.size(); i-- > 0;)
      parts.push_back({double(a.layers[i].backward_working), double(a.layers[i].saved)});
    parts.push_back({0.0, 0.0});  // the embeddings; the rest goes when the backward returns
    backward_parts.push_back(std::move(parts));
  }
  const int64_t micro_batches = args.num_micro_batches();
  const int64_t pp = args.parallel.pipeline_model_parallel_size;
  double all_chunks = 0;
  for (double k : kept_per_chunk) all_chunks += k;
  s.activations_per_micro_batch = all_chunks / double(split.virtual_stages);
  // The schedule this rank runs (one micro-batch after another without a pipeline): each forward
  // keeps its chunk's activations until its backward, which holds its working set on top; the peak
  // is the largest such moment.
  std::vector<pipeline_parallel::Action> actions;
  if (pp > 1) {
    const PipelineStepShape step = pipeline_step_shape(args, false);
    actions = pipeline_parallel::build_schedule({.pipeline_size = pp,
                                                 .virtual_stages = split.virtual_stages,
                                                 .microbatches = micro_batches,
                                                 .microbatch_group_size = step.microbatch_group_size},
                                                pp_rank);
  } else {
    for (int64_t m = 0; m < micro_batches; ++m) {
      actions.push_back({.kind = pipeline_parallel::ActionKind::kForward, .microbatch = m});
      actions.push_back({.kind = pipeline_parallel::ActionKind::kBackward, .microbatch = m});
    }
  }
  // The distributed optimizer's gradient reduce-scatters on the CPU backend: MPI forbids the
  // in-place layout's aliased buffers, so each bucket reduces into a result the size of this rank's
  // shard (mpi_communicator.cpp; NCCL reduces in place), held until finish_grad_sync waits for it
  // after the step's last backward, or until a later bucket's start finds it complete (as the
  // ranks' timing has it: counted held, the most). With --overlap-grad-reduce a chunk's buckets
  // start during the backward of its last micro-batch as it frees that micro-batch's activations
  // layer by layer: counted from that backward's end, when it holds only the input gradient it
  // returns. Without overlap they start after the last backward.
  std::vector<double> reduction_results(size_t(split.virtual_stages), 0.0);
  if (backend == PlanBackend::cpu)
    for (size_t c = 0; c < buffers.chunk_shard_numel.size(); ++c)
      reduction_results[c] = double(buffers.chunk_shard_numel[c]) * state_element;
  // The residual stream's width in one micro-batch: a stage's input gradient, a pipeline message.
  const double stream = double(shape.stream_tokens() * args.model.hidden_size) * double(dtype_size(params));
  std::vector<int64_t> backwards_left(size_t(split.virtual_stages), micro_batches);
  double live = 0, peak = 0, reducing = 0, reducing_at_peak = 0;
  int64_t live_count = 0;
  // The main gradients held: FSDP's shards all along; otherwise each chunk's buckets from its first
  // backward of the step on (ddp.h: given back after the step, taken as the backward reaches them).
  double grads = shard_grads ? fsdp_gradients : 0.0;
  std::vector<bool> grads_taken(size_t(split.virtual_stages), shard_grads);
  // The weights released from each bucket's last backward to its update (ddp.h), bytes.
  const bool releases = args.releases_weights_after_backward();
  const double param_element = double(dtype_size(params));
  double released = 0;
  // A moment of the step: activations held (by `count` forwards), the gradients, the running
  // backward's working set, the reductions' results, the weights released.
  const auto consider = [&](double held, int64_t count, double gradients, double working, double results) {
    if (held + gradients + working + results - released <= peak) return;
    peak = held + gradients + working + results - released;
    s.activations = held;
    s.in_flight = count;
    s.gradients = gradients;
    s.backward_working = working;
    s.weights_released = released;
    reducing_at_peak = results;
  };
  for (const pipeline_parallel::Action& action : actions) {
    const size_t c = size_t(action.chunk);
    if (action.kind == pipeline_parallel::ActionKind::kForward) {
      live += kept_per_chunk[c];
      ++live_count;
    } else if (action.kind == pipeline_parallel::ActionKind::kBackward) {
      // Each part of the backward: the buckets it reaches first (in the chunk's first backward of the
      // step), its working set on top of what is still saved, then its saved tensors freed.
      double held = live;
      const bool last_backward = backwards_left[c] == 1;
      for (size_t k = 0; k < backward_parts[c].size(); ++k) {
        if (!grads_taken[c]) grads += double(buffers.chunk_phase_grad_numel[c][k]) * state_element;
        consider(held, live_count, grads, backward_parts[c][k].working, reducing);
        held -= backward_parts[c][k].freed;
        if (releases && last_backward) released += double(buffers.chunk_phase_done_numel[c][k]) * param_element;
      }
      grads_taken[c] = true;
      // The backward's end: its activations gone, the input gradient it returns held.
      const double after = live - kept_per_chunk[c];
      consider(after, live_count - 1, grads, stream, reducing);
      if (--backwards_left[c] == 0 && args.overlap_grad_reduce && reduction_results[c] > 0) {
        reducing += reduction_results[c];
        consider(after, live_count - 1, grads, stream, reducing);
      }
      live = after;
      --live_count;
    }
  }
  if (!args.overlap_grad_reduce)
    for (double r : reduction_results) reducing += r;
  consider(0.0, 0, grads, 0.0, reducing);
  // The update's first part takes its weights again before any part gives its gradients back
  // (Optimizer::update_parts); counted as the largest bucket's, an upper estimate.
  if (releases) {
    released -= std::min(released, double(buffers.largest_bucket_numel) * param_element);
    consider(0.0, 0, grads, 0.0, reducing);
  }
  // Pipeline stages: the activation sent on and the gradient received.
  s.communication = (pp > 1 ? 2 * stream : 0.0) + reducing_at_peak;
  s.communication += fsdp_units_in_flight(buffers, sharding, !args.model.untie_embeddings_and_output_weights,
                                          micro_batches, double(dtype_size(params)), state_element);
  if (backend == PlanBackend::cpu) {
    // The step's micro-batches and the loader's prefetched ones: tokens, labels and loss mask (i32/f32).
    const double batch = 3.0 * 4.0 * double(args.micro_batch_size * args.model.seq_length);
    s.data_batches = double(micro_batches + 2 * args.data.num_workers + 1) * batch;
  } else {
    s.allocator_slack = kCudaRoundingOfTransients * (s.activations + s.backward_working + s.communication);
  }
  // Before the optimizer: the registry's buffers, then DDP's move (the registry's and DDP's parameter
  // buffers, the gradients dropped), then DDP's buffers, and with FSDP its shards taken from them
  // before they are dropped.
  const double registry_weights = double(buffers.registry_numel) * double(dtype_size(params));
  const double fsdp_shards = (shard_grads ? fsdp_gradients : 0.0) + (shard_params ? s.weights : 0.0);
  // --fp8-param-gather: the distributed optimizer splits the parameter buffer by dtype beside its
  // state, the old buffer and the new parts together (the gradients given back first).
  const double fp8_split = args.model.fp8.fp8_param_gather ? 2.0 * whole_weights + s.optimizer_state : 0.0;
  // Released weights: DDP splits the parameter buffer into its buckets, the old buffer and the new
  // parts together (before the optimizer, the gradients released).
  const double release_split = releases ? 2.0 * whole_weights : 0.0;
  s.set_up_peak =
      std::max({registry_weights + double(buffers.registry_numel) * state_element, registry_weights + whole_weights,
                whole_weights + whole_gradients + fsdp_shards, fp8_split, release_split});
  return s;
}

}  // namespace

double StageMemory::steady_peak() const {
  return weights - weights_released + gradients + optimizer_state + activations + backward_working + data_batches +
         communication + allocator_slack;
}

double StageMemory::peak() const { return std::max(steady_peak(), set_up_peak); }

double MemoryPlan::peak() const {
  double most = 0;
  for (const StageMemory& s : stages) most = std::max(most, s.peak());
  return most;
}

MemoryPlan plan_memory(const TrainingArgs& args, PlanBackend backend) {
  MemoryPlan plan;
  plan.backend = backend;
  plan.world_size = args.world_size;
  for (int64_t p = 0; p < args.parallel.pipeline_model_parallel_size; ++p) plan.stages.push_back(plan_stage(args, p, backend));
  return plan;
}

std::string format_memory_plan(const MemoryPlan& plan) {
  std::ostringstream out;
  char line[512];
  out << "memory per rank (MiB), " << (plan.backend == PlanBackend::cuda ? "CUDA" : "CPU") << " backend, "
      << plan.world_size << " rank(s); peak = the larger of set-up and the sum of the columns from weights to slack "
      << "(act = act/mb x the micro-batches in flight; weights: held then); host: offloaded optimizer state, not on "
         "the device:\n";
  std::snprintf(line, sizeof line, "%-6s %12s %10s %10s %10s %10s %6s %10s %10s %8s %8s %8s %10s %10s %10s\n",
                "stage", "parameters", "weights", "grads", "optimizer", "act/mb", "x", "act", "bwd work", "data", "comm",
                "slack", "set-up", "host", "peak");
  out << line;
  for (const StageMemory& s : plan.stages) {
    std::snprintf(
        line, sizeof line,
        "%-6lld %12lld %10.2f %10.2f %10.2f %10.2f %6lld %10.2f %10.2f %8.2f %8.2f %8.2f %10.2f %10.2f %10.2f\n",
        static_cast<long long>(s.pipeline_rank), static_cast<long long>(s.parameters),
        mib(s.weights - s.weights_released), mib(s.gradients), mib(s.optimizer_state),
        mib(s.activations_per_micro_batch), static_cast<long long>(s.in_flight), mib(s.activations),
        mib(s.backward_working), mib(s.data_batches), mib(s.communication), mib(s.allocator_slack), mib(s.set_up_peak),
        mib(s.host_optimizer), mib(s.peak()));
    out << line;
  }
  for (const StageMemory& s : plan.stages) {
    out << "stage " << s.pipeline_rank << " activations per layer of one micro-batch (MiB):";
    for (const StageMemory::LayerActivations& l : s.layer_activations) {
      std::snprintf(line, sizeof line, " %lld:%.2f", static_cast<long long>(l.layer), mib(double(l.bytes)));
      out << line;
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace megatron::planning
