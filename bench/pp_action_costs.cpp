// The pipeline schedule's per-action costs measured on one device, fed to the schedule
// simulation (pipeline_parallel/schedule_simulation.h): for a `megatron train` command line with
// --pipeline-model-parallel-size P (and --num-virtual-stages-per-pipeline-rank V), each virtual
// stage's model chunk (the first with the embedding, the last with the output layer and loss) is
// built alone on this device and its forward and backward of one micro-batch are timed; the
// simulation then runs every rank's schedule with those costs and prints the step time and the
// bubble beside the balanced formula (P-1)/(M·V), for M = P, 2P, 4P and 8P micro-batches.
// Point-to-point transfers cost nothing here (one device has no link to measure); bench_pp.sh
// measures the real bubble on P GPUs.
//
// Usage: pp_action_costs [megatron train flags]   e.g.
//   pp_action_costs --model-preset llama-1b --micro-batch-size 4 --bf16 --mock-data --train-iters 1 --lr 1e-4
//                   --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/error.h"
#include "megatron/core/rng.h"
#include "megatron/cuda_runtime/event_timer.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/pipeline_parallel/schedule_simulation.h"
#include "megatron/pipeline_parallel/stage_split.h"
#include "megatron/training/arguments.h"
#include "megatron/training/device.h"

using namespace megatron;
namespace pp = megatron::pipeline_parallel;

namespace {

constexpr int kWarmup = 2, kTimed = 5;

// (B,S) i32 ids below `vocab`, from a fixed seed.
Tensor random_ids(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  Tensor t = Tensor::empty({B, S}, DType::i32);
  HostRng rng(seed);
  for (int64_t i = 0; i < B * S; ++i) t.data<int32_t>()[i] = int32_t(rng.uniform_int(uint64_t(vocab)));
  return t;
}

// An activation or its gradient between stages, (S,B,H), small values.
Tensor random_activation(int64_t S, int64_t B, int64_t H, DType dtype, Device device, uint64_t seed) {
  std::vector<float> v(size_t(S * B * H));
  HostRng rng(seed);
  for (float& x : v) x = float(rng.uniform() - 0.5);
  return Tensor::from_vector(v, {S, B, H}, dtype).to(device);
}

// Times `work` in milliseconds: CUDA events around it on a GPU, the wall clock on the CPU.
template <class Work>
double time_ms(Device device, Work&& work) {
  if (!device.is_cuda()) {
    const auto t0 = std::chrono::steady_clock::now();
    work();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  const int64_t start = cuda::event_timer_record();
  work();
  const int64_t end = cuda::event_timer_record();
  cuda::event_timer_synchronize();
  const double ms = cuda::event_timer_elapsed_ms(start, end);
  cuda::event_timer_reset();
  return ms;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct StageCosts {
  double forward_ms = 0, backward_ms = 0;
};

// One virtual stage's chunk built alone on `device`: the median forward and backward of one
// micro-batch over kTimed runs after kWarmup.
StageCosts measure_stage(const TrainingArgs& args, const pp::StageLayers& stage, Device device) {
  const TransformerConfig& c = args.model;
  const ParallelContext ctx = ParallelContext::single_process();
  GPTModel chunk(c, ctx, device, stage);
  chunk.parameters().initialize(uint64_t(args.seed));
  const int64_t B = args.micro_batch_size, S = c.seq_length, H = c.hidden_size;
  MicroBatch mb;
  mb.tokens = random_ids(B, S, c.vocab_size, 1);
  mb.labels = random_ids(B, S, c.vocab_size, 2);
  mb.loss_mask = Tensor::from_vector(std::vector<float>(size_t(B * S), 1.0f), {B, S});
  const Tensor input = stage.embedding ? Tensor() : random_activation(S, B, H, c.params_dtype, device, 3);
  const Tensor output_grad = stage.loss ? Tensor() : random_activation(S, B, H, c.params_dtype, device, 4);
  std::vector<double> forward, backward;
  for (int run = 0; run < kWarmup + kTimed; ++run) {
    GPTModel::Saved saved;
    LossSums sums;
    const ForwardContext fwd{.training = true, .seed = uint64_t(args.seed), .step = uint64_t(run)};
    const double f = time_ms(device, [&] { chunk.stage_forward(mb, input, fwd, saved, &sums); });
    const double b = time_ms(device, [&] { chunk.stage_backward(output_grad, 1.0f / float(B * S), saved); });
    if (run < kWarmup) continue;
    forward.push_back(f);
    backward.push_back(b);
  }
  return {median(forward), median(backward)};
}

// --pipeline-model-parallel-size from the command line (either form), which the arguments'
// world size must match before they can be parsed.
int64_t pipeline_size_of(const std::vector<std::string>& flags) {
  const std::string name = "--pipeline-model-parallel-size";
  std::optional<int64_t> size;
  for (size_t i = 0; i < flags.size(); ++i) {
    if (flags[i] == name && i + 1 < flags.size()) size = std::stoll(flags[i + 1]);
    if (flags[i].rfind(name + "=", 0) == 0) size = std::stoll(flags[i].substr(name.size() + 1));
  }
  MEGATRON_CHECK(size, "pp_action_costs: give " << name << " P (P > 1) on the command line");
  return *size;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> flags(argv + 1, argv + argc);
    // The arguments as one pipeline's P ranks would read them (DP = 1).
    const TrainingArgs args = parse_training_args(flags, pipeline_size_of(flags));
    MEGATRON_CHECK(args.parallel.tensor_model_parallel_size == 1 && args.parallel.context_parallel_size == 1,
                   "pp_action_costs times whole layers on one device: leave TP and CP at 1");
    const Device device = select_device(args.device, 0);
    const pp::PipelineSplit split = pp::pipeline_split(args.parallel, args.model.num_layers);
    const int64_t P = split.pipeline_size, V = split.virtual_stages;

    pp::ActionCosts costs;
    std::printf("| virtual stage | rank | chunk | layers | embedding | loss | forward ms | backward ms |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    for (int64_t s = 0; s < P * V; ++s) {
      const pp::StageLayers stage = split.stage(s % P, s / P);
      const StageCosts c = measure_stage(args, stage, device);
      costs.forward_by_stage.push_back(c.forward_ms);
      costs.backward_by_stage.push_back(c.backward_ms);
      std::printf("| %lld | %lld | %lld | %lld | %s | %s | %.3f | %.3f |\n", static_cast<long long>(s),
                  static_cast<long long>(s % P), static_cast<long long>(s / P),
                  static_cast<long long>(stage.num_layers), stage.embedding ? "yes" : "", stage.loss ? "yes" : "",
                  c.forward_ms, c.backward_ms);
    }
    // Bubble: idle over busy time on the busiest rank (the schedule's cost); idle of all ranks adds
    // the stages' imbalance, what a run on P GPUs loses against data parallelism.
    std::printf(
        "\n| P | V | micro-batches M | simulated step ms | bubble (busiest rank) | idle (all ranks) | (P-1)/(M V) |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    for (int64_t m : {P, 2 * P, 4 * P, 8 * P}) {
      const pp::ScheduleShape shape{.pipeline_size = P, .virtual_stages = V, .microbatches = m};
      const pp::SimulatedPipeline run = pp::simulate(shape, costs);
      double busy = 0;
      for (double b : run.busy) busy += b;
      const double idle = 1.0 - busy / (double(P) * run.makespan());
      std::printf("| %lld | %lld | %lld | %.2f | %.1f%% | %.1f%% | %.1f%% |\n", static_cast<long long>(P),
                  static_cast<long long>(V), static_cast<long long>(m), run.makespan(), 100 * run.bubble_fraction(),
                  100 * idle, 100.0 * double(P - 1) / double(m * V));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pp_action_costs: %s\n", e.what());
    return 2;
  }
}
