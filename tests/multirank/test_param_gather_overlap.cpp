// multirank-np: 2 4
// --overlap-param-gather (issue 11, item 4): after the distributed optimizer's update, each
// bucket's parameter all-gather is waited for just before the forward first reads one of its
// parameters, not all at once, and each wait starts the gather of the next bucket the forward
// reads (Megatron's forward pre-hooks). DDP records what its gather did (param_gather_events);
// the tests compare that record with the order in which the forward reads the buckets, worked
// out here from the layout: buckets hold parameters in reverse registration order, and the
// forward reads parameters in registration order, so it reads the last bucket first.
#include <algorithm>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "megatron/distributed/ddp.h"
#include "megatron/distributed/distributed_optimizer.h"
#include "megatron/models/gpt/gpt_model.h"
#include "multirank/dp_training_util.h"
#include "multirank/multirank_util.h"
#include "test_util.h"

namespace megatron {
// gtest prints the events as start(bucket, param) / wait(bucket, param); "-": no parameter.
void PrintTo(const DistributedDataParallel::ParamGatherEvent& e, std::ostream* os) {
  *os << (e.kind == DistributedDataParallel::ParamGatherEvent::Kind::start ? "start(" : "wait(") << e.bucket << ", "
      << (e.param ? std::to_string(*e.param) : "-") << ")";
}
}  // namespace megatron

namespace megatron::testing {
namespace {

using Event = DistributedDataParallel::ParamGatherEvent;
using Kind = Event::Kind;

Event start(size_t bucket, std::optional<size_t> param = std::nullopt) { return {Kind::start, bucket, param}; }
Event wait(size_t bucket, std::optional<size_t> param = std::nullopt) { return {Kind::wait, bucket, param}; }

// Registration order a (40), b (7x9), c (100), d (5). The distributed optimizer's layout with
// 40-element buckets: bucket 0 = {d, c}, bucket 1 = {b}, bucket 2 = {a} (parameters start at
// multiples of 64; a bucket closes once it holds >= 40 elements).
void add_params(ParameterRegistry& reg) {
  reg.add({.name = "a", .global_shape = {40}});
  reg.add({.name = "b", .global_shape = {7, 9}});
  reg.add({.name = "c", .global_shape = {100}});
  reg.add({.name = "d", .global_shape = {5}});
  reg.allocate(DType::f32);
}

// Each rank writes its shards of every parameter as value(7, param, i) and the rest as -100;
// after its bucket's gather, every element holds value(7, param, i).
void write_own_shards(ParameterRegistry& reg, const DistributedDataParallel& ddp) {
  Tensor(reg.param_buffer()).fill(-100);  // a view: fills the buffer
  for (const ShardParamRange& s : ddp.shards().params)
    for (int64_t i = s.in_param.begin; i < s.in_param.end; ++i)
      reg.params()[s.param]->data.set_item(i, value(7, int(s.param), i));
}

bool gathered(const Parameter& p) {
  for (int64_t i = 0; i < p.data.numel(); ++i)
    if (p.data.item(i) != value(7, int(p.index), i)) return false;
  return true;
}

class ParamGatherOverlap : public ::testing::Test {
 protected:
  void SetUp() override { st_ = make_state({}); }
  DdpConfig overlapped() const {
    return {.overlap_grad_reduce = true,
            .use_distributed_optimizer = true,
            .overlap_param_gather = true,
            .bucket_size = 40};
  }
  ParallelState st_;
};

TEST_F(ParamGatherOverlap, EachBucketIsWaitedForWhenTheForwardFirstReadsIt) {
  ParameterRegistry reg;
  add_params(reg);
  DistributedDataParallel ddp(reg, st_.ctx, overlapped());
  ASSERT_EQ(ddp.layout().buckets.size(), 3u);
  ASSERT_EQ(ddp.layout().buckets[0].params, (std::vector<size_t>{3, 2}));
  write_own_shards(reg, ddp);
  ddp.start_param_gather();
  EXPECT_EQ(ddp.param_gather_events(), std::vector<Event>{start(2)});

  const Parameter &a = *reg.params()[0], &b = *reg.params()[1], &c = *reg.params()[2], &d = *reg.params()[3];
  reg.before_forward(a);
  EXPECT_TRUE(gathered(a));
  EXPECT_EQ(ddp.param_gather_events(), (std::vector<Event>{start(2), wait(2, 0), start(1, 0)}));
  reg.before_forward(b);
  EXPECT_TRUE(gathered(b));
  reg.before_forward(c);
  EXPECT_TRUE(gathered(c) && gathered(d));
  reg.before_forward(d);  // its bucket is complete already: nothing to wait for
  const std::vector<Event> expected = {start(2), wait(2, 0), start(1, 0), wait(1, 1), start(0, 1), wait(0, 2)};
  EXPECT_EQ(ddp.param_gather_events(), expected);
  ddp.finish_param_gather();  // nothing left
  EXPECT_EQ(ddp.param_gather_events(), expected);
}

// A forward that reads a bucket out of order starts that bucket's gather itself; whatever the
// forward has not read is started and waited for by finish_param_gather() (evaluation, saving).
TEST_F(ParamGatherOverlap, OutOfOrderReadsAndFinishGatherEveryBucket) {
  ParameterRegistry reg;
  add_params(reg);
  DistributedDataParallel ddp(reg, st_.ctx, overlapped());
  write_own_shards(reg, ddp);
  ddp.start_param_gather();
  reg.before_forward(*reg.params()[3]);  // d, in bucket 0
  reg.before_forward(*reg.params()[0]);  // a, in bucket 2
  ddp.finish_param_gather();
  EXPECT_EQ(ddp.param_gather_events(),
            (std::vector<Event>{start(2), start(0, 3), wait(0, 3), wait(2, 0), start(1, 0), wait(1)}));
  for (const auto& p : reg.params()) EXPECT_TRUE(gathered(*p)) << p->spec.name;
  EXPECT_NE(error_of([&] {
              ddp.start_param_gather();
              ddp.start_param_gather();
            }).find("started again before it was waited for"),
            std::string::npos);
}

// Without --overlap-param-gather every bucket is started at once and waited for by the
// optimizer; the forward's notifications find nothing to wait for.
TEST_F(ParamGatherOverlap, WithoutOverlapEveryBucketIsWaitedForAtOnce) {
  ParameterRegistry reg;
  add_params(reg);
  DdpConfig config = overlapped();
  config.overlap_param_gather = false;
  DistributedDataParallel ddp(reg, st_.ctx, config);
  write_own_shards(reg, ddp);
  ddp.start_param_gather();
  ddp.finish_param_gather();
  reg.before_forward(*reg.params()[0]);
  EXPECT_EQ(ddp.param_gather_events(), (std::vector<Event>{start(2), start(1), start(0), wait(2), wait(1), wait(0)}));
}

// The training loop's protocol on a GPT model (zero_grad; micro-batches; grad sync; the
// distributed optimizer's step starts the gather): in the next step's first micro-batch the
// forward waits for the buckets one by one, each just before the module holding its first
// parameter (in forward order) runs; the later micro-batch waits for nothing. The parameters
// after three steps equal, bit for bit, those of the same run waiting for every bucket at once.
TEST_F(ParamGatherOverlap, GptForwardWaitsForEachBucketInTurn) {
  TransformerConfig c;
  c.num_layers = 3;
  c.hidden_size = 16;
  c.num_attention_heads = c.num_query_groups = 4;
  c.kv_channels = 4;
  c.ffn_hidden_size = 32;
  c.vocab_size = c.padded_vocab_size = 24;
  c.max_position_embeddings = c.seq_length = 6;
  const int rank = st_.ctx.dp_cp->rank();
  std::vector<std::vector<float>> final_params;
  for (const bool overlap : {true, false}) {
    GPTModel model(c, st_.ctx);
    model.parameters().initialize(5);
    DdpConfig config = overlapped();
    config.overlap_param_gather = overlap;
    config.bucket_size = 1000;
    DistributedDataParallel ddp(model.parameters(), st_.ctx, config);
    DistributedOptimizer optimizer(ddp, st_.ctx, {});
    const size_t n = ddp.layout().buckets.size();
    ASSERT_GE(n, 3u) << "the test needs several buckets";
    // The forward's order of waits: the last bucket first, each waited for at its first
    // parameter in registration order, and starting the next.
    std::vector<Event> expected = {start(n - 1)};
    for (size_t k = n; k-- > 0;) {
      const std::vector<size_t>& held = ddp.layout().buckets[k].params;
      const size_t first = *std::min_element(held.begin(), held.end());
      expected.push_back(wait(k, first));
      if (k > 0) expected.push_back(start(k - 1, first));
    }
    for (int step = 0; step < 3; ++step) {
      ddp.zero_grad();
      for (int m = 0; m < 2; ++m) {
        Tensor tokens = Tensor::empty({2, 6}, DType::i32), mask = Tensor::zeros({2, 6}, DType::f32);
        mask.fill(1);
        for (int64_t i = 0; i < 12; ++i) tokens.data<int32_t>()[i] = int32_t((7 * i + 3 * step + 5 * m + rank) % 24);
        ddp.set_last_micro_batch(m == 1);
        model.forward_backward(tokens, tokens, mask, 0.25f,
                               {.training = true, .seed = 1, .step = uint64_t(4 * step + 2 * m + rank)});
        if (overlap && step > 0) {
          EXPECT_EQ(ddp.param_gather_events(), expected) << "step " << step << " micro-batch " << m;
        }
      }
      ddp.finish_grad_sync();
      optimizer.step({1e-2, 0.1});
      if (overlap) {
        EXPECT_EQ(ddp.param_gather_events(), std::vector<Event>{start(n - 1)});
      }
    }
    ddp.finish_param_gather();
    final_params.push_back(model.parameters().param_buffer().to_vector());
  }
  EXPECT_EQ(final_params[0], final_params[1]);
}

// Through `megatron train`'s loop (pretrain): with the waits moved into the forward, the run
// equals the one that waits for every bucket right after the optimizer, bit for bit, including
// the validation at iteration 10 (which waits for everything first) and the steps after it.
TEST_F(ParamGatherOverlap, TrainingLoopMatchesWaitingAtOnceBitForBit) {
  const std::vector<std::string> flags =
      with(tiny_run(12), {"--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "1000"});
  const TrainingSummary at_once = train_on(st_.ctx, flags);
  const TrainingSummary overlapped = train_on(st_.ctx, with(flags, {"--overlap-param-gather"}));
  ASSERT_EQ(at_once.train_losses.size(), 12u);
  ASSERT_EQ(at_once.valid_losses.size(), 1u);
  EXPECT_EQ(overlapped.train_losses, at_once.train_losses);
  EXPECT_EQ(overlapped.grad_norms, at_once.grad_norms);
  EXPECT_EQ(overlapped.valid_losses, at_once.valid_losses);
}

}  // namespace
}  // namespace megatron::testing

int main(int argc, char** argv) { return megatron::testing::multirank_main(argc, argv); }
