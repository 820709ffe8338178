// What DDP needs from the parameters: flat ranges as boxes of the global tensor (how
// distributed-optimizer shards are checkpointed), moving the flat buffers into the bucket
// layout, the model reporting each gradient as final exactly when it is, and each parameter just
// before the forward reads it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "megatron/core/memory.h"
#include "megatron/core/rng.h"
#include "megatron/distributed/ddp.h"
#include "megatron/models/gpt/gpt_model.h"
#include "megatron/ops/profiler.h"
#include "megatron/parameters/parameter_registry.h"
#include "test_util.h"

using namespace megatron;
using megatron::testing::error_of;

namespace {
using Boxes = std::vector<Parameter::FlatBox>;

bool same(const Boxes& a, const Boxes& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].flat_begin != b[i].flat_begin || a[i].global_offset != b[i].global_offset || a[i].shape != b[i].shape)
      return false;
  return true;
}

std::string str(const Boxes& boxes) {
  std::string s;
  for (const auto& b : boxes)
    s += "{" + std::to_string(b.flat_begin) + " " + shape_str(b.global_offset) + " " + shape_str(b.shape) + "} ";
  return s;
}

// Every element of every box: the local flat index of its position must be the one whose
// global_index() is that global position.
void expect_consistent(const Parameter& p, int64_t begin, int64_t end) {
  const Boxes boxes = p.global_boxes(begin, end);
  int64_t next = begin;
  for (const auto& box : boxes) {
    ASSERT_EQ(box.flat_begin, next) << "boxes are not consecutive: " << str(boxes);
    const int64_t n = shape_numel(box.shape);
    for (int64_t k = 0; k < n; ++k) {
      int64_t global = 0, rest = k;
      Shape coord(box.shape.size());
      for (size_t d = box.shape.size(); d-- > 0;) {
        coord[d] = rest % box.shape[d];
        rest /= box.shape[d];
      }
      for (size_t d = 0; d < coord.size(); ++d)
        global = global * p.spec.global_shape[d] + box.global_offset[d] + coord[d];
      ASSERT_EQ(p.global_index(box.flat_begin + k), global) << p.spec.name << " box " << str({box});
    }
    next += n;
  }
  EXPECT_EQ(next, end);
}

// A 3-layer model (learned positions, tied or untied output layer) and one batch for it.
TransformerConfig tiny_config(bool untied) {
  TransformerConfig c;
  c.num_layers = 3;
  c.hidden_size = 16;
  c.num_attention_heads = c.num_query_groups = 4;
  c.kv_channels = 4;
  c.ffn_hidden_size = 32;
  c.vocab_size = c.padded_vocab_size = 24;
  c.max_position_embeddings = c.seq_length = 6;
  c.untie_embeddings_and_output_weights = untied;
  return c;
}

struct TinyBatch {
  Tensor tokens = Tensor::empty({2, 6}, DType::i32), mask = Tensor::empty({2, 6}, DType::f32);
  TinyBatch() {
    for (int64_t i = 0; i < 12; ++i) {
      tokens.data<int32_t>()[i] = int32_t((7 * i + 3) % 24);
      mask.data<float>()[i] = 1.0f;
    }
  }
};
}  // namespace

// [4,6] elements [3,17): the rest of row 0, row 1, the start of row 2.
TEST(DdpParams, FlatRangeAsBoxes) {
  ParameterRegistry r;
  const Parameter* p = r.add({.name = "w", .global_shape = {4, 6}});
  const Boxes expected = {{3, {0, 3}, {1, 3}}, {6, {1, 0}, {1, 6}}, {12, {2, 0}, {1, 5}}};
  EXPECT_TRUE(same(p->global_boxes(3, 17), expected)) << str(p->global_boxes(3, 17));
  EXPECT_TRUE(same(p->global_boxes(0, 24), {{0, {0, 0}, {4, 6}}}));
  EXPECT_TRUE(same(p->global_boxes(6, 18), {{6, {1, 0}, {2, 6}}}));
  EXPECT_TRUE(p->global_boxes(5, 5).empty());
}

// [2,3,4] elements [5,23): boxes nest through the dimensions.
TEST(DdpParams, FlatRangeAsBoxesIn3D) {
  ParameterRegistry r;
  const Parameter* p = r.add({.name = "t", .global_shape = {2, 3, 4}});
  const Boxes expected = {
      {5, {0, 1, 1}, {1, 1, 3}}, {8, {0, 2, 0}, {1, 1, 4}}, {12, {1, 0, 0}, {1, 2, 4}}, {20, {1, 2, 0}, {1, 1, 3}}};
  EXPECT_TRUE(same(p->global_boxes(5, 23), expected)) << str(p->global_boxes(5, 23));
  expect_consistent(*p, 5, 23);
}

// TP rank 1 of 2. Column-parallel [8,4] keeps rows 4..7; row-parallel [4,8] keeps columns 4..7;
// fused [gate; up] [8,2] in 2 blocks keeps gate rows 2..3 and up rows 6..7.
TEST(DdpParams, BoxesOfATensorParallelShard) {
  ParameterRegistry r(1, 2);
  const Parameter* column = r.add({.name = "c", .global_shape = {8, 4}, .partition_dim = 0});
  EXPECT_TRUE(same(column->global_boxes(2, 10), {{2, {4, 2}, {1, 2}}, {4, {5, 0}, {1, 4}}, {8, {6, 0}, {1, 2}}}))
      << str(column->global_boxes(2, 10));
  const Parameter* row = r.add({.name = "r", .global_shape = {4, 8}, .partition_dim = 1});
  EXPECT_TRUE(same(row->global_boxes(0, 16), {{0, {0, 4}, {4, 4}}}));
  const Parameter* fused = r.add({.name = "f", .global_shape = {8, 2}, .partition_dim = 0, .partition_blocks = 2});
  EXPECT_TRUE(same(fused->global_boxes(1, 7),
                   {{1, {2, 1}, {1, 1}}, {2, {3, 0}, {1, 2}}, {4, {6, 0}, {1, 2}}, {6, {7, 0}, {1, 1}}}))
      << str(fused->global_boxes(1, 7));
  for (const Parameter* p : {column, row, fused}) {
    const int64_t n = shape_numel(p->local_shape);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t e = b; e <= n; ++e) expect_consistent(*p, b, e);
  }
}

TEST(DdpParams, SetLayoutKeepsValuesAndChecksOffsets) {
  ParameterRegistry r;
  r.add({.name = "a", .global_shape = {3, 5}});
  r.add({.name = "b", .global_shape = {7}});
  r.allocate(DType::f32);
  r.initialize(3);
  const std::vector<float> a = r.params()[0]->data.to_vector(), b = r.params()[1]->data.to_vector();
  r.params()[1]->main_grad.fill(2.5);
  r.set_layout({64, 0}, 80);
  EXPECT_EQ(r.param_buffer().numel(), 80);
  EXPECT_EQ(r.params()[0]->buffer_offset, 64);
  EXPECT_EQ(r.params()[0]->data.to_vector(), a);
  EXPECT_EQ(r.params()[1]->data.to_vector(), b);
  EXPECT_EQ(r.grad_buffer().item(6), 2.5);
  EXPECT_EQ(r.param_buffer().item(64), double(a[0]));
  EXPECT_NE(error_of([&] { r.set_layout({8, 0}, 80); }).find("must be a multiple of 16"), std::string::npos);
  EXPECT_NE(error_of([&] { r.set_layout({0, 0}, 80); }).find("overlap"), std::string::npos);
  EXPECT_NE(error_of([&] { r.set_layout({64, 0}, 70); }).find("inside a buffer of 70"), std::string::npos);
}

// GradsOnMove::drop (DDP's move, before any backward): the values move, the gradients restart at zero,
// and the move never holds two gradient buffers: the allocator's peak grows by one parameter buffer.
TEST(DdpParams, SetLayoutDroppingGradsHoldsOneGradBuffer) {
  ParameterRegistry r;
  r.add({.name = "a", .global_shape = {300, 50}});
  r.add({.name = "b", .global_shape = {700}});
  r.allocate(DType::f32);
  r.initialize(3);
  const std::vector<float> a = r.params()[0]->data.to_vector();
  r.params()[0]->main_grad.fill(1.5);
  const size_t before = memory_stats(Device::cpu()).current_bytes;
  reset_peak_memory(DeviceType::cpu);
  r.set_layout({800, 0}, 16000, ParameterRegistry::GradsOnMove::drop);
  EXPECT_EQ(r.params()[0]->data.to_vector(), a);
  EXPECT_EQ(r.grad_buffer().numel(), 16000);
  EXPECT_EQ(r.params()[0]->main_grad.to_vector(), std::vector<float>(15000, 0.0f));
  // Old buffers: 15008 + 704 elements each (16-element alignment), new ones 16000. Keeping the
  // gradients would peak at both layouts' four buffers; dropping them, at the larger of the old and
  // new parameters together (the old gradients gone) and the new layout's two buffers.
  const size_t old_buffer = (15008 + 704) * 4, new_buffer = 16000 * 4, others = before - 2 * old_buffer;
  EXPECT_EQ(memory_stats(Device::cpu()).peak_bytes, others + std::max(old_buffer + new_buffer, 2 * new_buffer));
}

// split_grads (DDP's buckets): one part per range, the main grads pointing into them, the parts
// released until first acquired (zeroed then), never the flat buffer and the parts at once; a
// parameter straddling two parts and a slice crossing a part's end are errors; a released part's
// memory is given back and comes back lazily zeroed.
TEST(DdpParams, SplitGradsMakesOnePartPerRange) {
  ParameterRegistry r;
  r.add({.name = "a", .global_shape = {300, 50}});
  r.add({.name = "b", .global_shape = {700}, .first_grad_overwrites = true});
  r.add({.name = "c", .global_shape = {40}});
  r.allocate(DType::f32);  // a at 0, b at 15008, c at 15712; 15760 elements
  EXPECT_NE(error_of([&] { r.split_grads({15100, 15760}); }).find("b straddles gradient parts"), std::string::npos);
  r.params()[0]->main_grad.fill(1.5);
  const size_t before = memory_stats(Device::cpu()).current_bytes;
  reset_peak_memory(DeviceType::cpu);
  r.split_grads({15008, 15760});
  EXPECT_EQ(memory_stats(Device::cpu()).peak_bytes, before) << "the flat buffer went before the parts came";
  EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, before - 15760 * 4) << "the parts take memory when acquired";
  ASSERT_EQ(r.grad_parts(), 2u);
  EXPECT_FALSE(r.grads_held(0));
  EXPECT_FALSE(r.grads_held(1));
  EXPECT_NE(error_of([&] { r.params()[0]->main_grad.to_vector(); }).find("released"), std::string::npos);
  EXPECT_EQ(r.grad_part_of(*r.params()[2]), 1u);
  r.acquire_grads(0);
  r.acquire_grads(1);
  EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, before);
  EXPECT_EQ(r.params()[0]->main_grad.to_vector(), std::vector<float>(15000, 0.0f));
  r.params()[2]->main_grad.fill(2.0);
  EXPECT_EQ(r.grad_slice(15712, 15752).to_vector(), std::vector<float>(40, 2.0f));
  EXPECT_NE(error_of([&] { r.grad_slice(15000, 15010); }).find("crosses the end of gradient part 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { r.grad_buffer(); }).find("split into 2 parts"), std::string::npos);

  r.release_grads(1);
  EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, before - (15760 - 15008) * 4);
  EXPECT_TRUE(r.grads_held(0));
  EXPECT_FALSE(r.grads_held(1));
  r.acquire_grads(1);
  EXPECT_TRUE(r.params()[1]->grad_overwrite_pending) << "b's first gradient overwrites";
  EXPECT_EQ(r.params()[2]->main_grad.to_vector(), std::vector<float>(40, 0.0f)) << "c zeroed";
}

// split_params (--fp8-param-gather): parts in the compute dtype keep their values, FP8 parts start
// as zero codes and hold exactly the FP8 parameters; slices cross no part's end.
TEST(DdpParams, SplitParamsKeepsComputeValuesAndGivesFp8ParametersCodes) {
  ParameterRegistry r;
  r.add({.name = "a", .global_shape = {30, 5}});
  Parameter* b = r.add({.name = "b", .global_shape = {70}});
  r.add({.name = "c", .global_shape = {40}});
  ops::Fp8TensorScaling scaling;
  b->fp8 = Parameter::Fp8Weight{{}, &scaling};
  r.allocate(DType::bf16);  // a at 0, b at 160, c at 240; 288 elements
  r.initialize(3);
  const std::vector<float> a = r.params()[0]->data.to_vector(), c = r.params()[2]->data.to_vector();
  EXPECT_NE(error_of([&] {
              r.split_params({160, 288}, {DType::bf16, DType::e4m3});
            }).find("c would be held in e4m3: only FP8 parameters"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              r.split_params({160, 288}, {DType::bf16, DType::bf16});
            }).find("b is an FP8 parameter but its part is bf16"),
            std::string::npos);
  r.split_params({160, 240, 288}, {DType::bf16, DType::e4m3, DType::bf16});
  ASSERT_EQ(r.param_buffers().size(), 3u);
  EXPECT_EQ(r.param_buffers()[1].nbytes(), 80u) << "a byte an element";
  EXPECT_TRUE(b->held_in_fp8());
  EXPECT_EQ(b->data.shape(), (Shape{70}));
  EXPECT_EQ(r.params()[0]->data.to_vector(), a);
  EXPECT_EQ(r.params()[2]->data.to_vector(), c);
  EXPECT_EQ(r.param_slice(240, 280).to_vector(), c);
  EXPECT_EQ(r.param_slice(160, 230).dtype(), DType::e4m3);
  EXPECT_NE(
      error_of([&] { r.param_slice(150, 170); }).find("param_slice(150, 170) crosses the end of parameter part 0"),
      std::string::npos);
  EXPECT_NE(error_of([&] { r.param_buffer(); }).find("split into 3 parts"), std::string::npos);
  EXPECT_EQ(r.num_local_elements(), 288);
}

// Each parameter is reported once per backward, in backward order, and its gradient does not
// change after it is reported: what lets DDP start reducing it.
TEST(DdpParams, ModelReportsEachGradientOnceWhenFinal) {
  for (const bool untied : {false, true}) {
    const ParallelContext ctx = ParallelContext::single_process();
    GPTModel model(tiny_config(untied), ctx);
    ParameterRegistry& reg = model.parameters();
    reg.initialize(5);
    std::vector<std::string> order;
    std::map<std::string, Tensor> at_report;
    reg.set_grad_ready_hook([&](const Parameter& p) {
      order.push_back(p.spec.name);
      at_report[p.spec.name] = p.main_grad.clone();
    });
    const TinyBatch batch;
    reg.zero_grads();
    model.forward_backward(batch.tokens, batch.tokens, batch.mask, 0.1f, {.training = true, .seed = 1, .step = 0});
    ASSERT_EQ(order.size(), reg.params().size());
    for (const auto& p : reg.params()) {
      ASSERT_EQ(at_report.count(p->spec.name), 1u) << p->spec.name << " was not reported";
      EXPECT_EQ(at_report[p->spec.name].to_vector(), p->main_grad.to_vector()) << p->spec.name << " changed after";
    }
    // A tied output layer is the word embedding: reported with the embeddings, last.
    EXPECT_EQ(order.front().substr(0, 17), untied ? "output_layer.weig" : "decoder.layers.2.");
    EXPECT_EQ(order.back(), "embedding.position_embeddings.weight");
    // Layers from the last to the first.
    const auto first_of = [&](const std::string& prefix) {
      return std::find_if(order.begin(), order.end(), [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
    };
    EXPECT_LT(first_of("decoder.layers.2."), first_of("decoder.layers.1."));
    EXPECT_LT(first_of("decoder.layers.1."), first_of("decoder.layers.0."));
  }
}

// The training step's gradients (DDP over buckets): zero_grad() gives every bucket's memory back;
// the backward takes a bucket's memory when it first reaches one of its parameters, zeroed except
// the linear layers' weight gradients, which their first gradient of the step overwrites. Two
// micro-batches, in two steps (the second on memory the first step's gradients left behind), give
// bit for bit the gradients of a model without DDP whose flat buffer was zeroed; the buckets of the
// first layers take no memory until the backward reaches them; and a step whose backward reaches
// no parameter still reduces zeros.
TEST(DdpParams, BucketGradientsTakeMemoryFromTheBackwardToTheStepAndEqualZeroedOnes) {
  for (const bool untied : {false, true}) {
    const ParallelContext ctx = ParallelContext::single_process();
    const TinyBatch batch;
    const auto two_micro_batches = [&](GPTModel& m) {
      for (const uint64_t step : {0, 1})
        m.forward_backward(batch.tokens, batch.tokens, batch.mask, 0.1f, {.training = true, .seed = 1, .step = step});
    };
    GPTModel reference(tiny_config(untied), ctx);
    reference.parameters().initialize(5);
    reference.parameters().zero_grads();
    two_micro_batches(reference);

    GPTModel model(tiny_config(untied), ctx);
    ParameterRegistry& reg = model.parameters();
    DistributedDataParallel ddp(reg, ctx, {.bucket_size = 1000});
    reg.initialize(5);
    const size_t buckets = ddp.layout().buckets.size();
    ASSERT_GE(buckets, 4u) << "buckets of about 1000 elements without overlap";
    ASSERT_EQ(reg.grad_parts(), buckets);
    int64_t grad_bytes = 0;
    for (const Tensor& part : reg.grad_buffers()) grad_bytes += int64_t(part.nbytes());

    // Which buckets hold memory when the backward reports the first gradient final.
    std::vector<bool> held_at_first_report;
    reg.set_grad_ready_hook([&](const Parameter&) {
      if (!held_at_first_report.empty()) return;
      for (size_t b = 0; b < buckets; ++b) held_at_first_report.push_back(reg.grads_held(b));
    });
    for (size_t b = 0; b < buckets; ++b) EXPECT_FALSE(reg.grads_held(b)) << "bucket " << b << " held before a backward";
    for (int step = 0; step < 2; ++step) {
      const size_t before = memory_stats(Device::cpu()).current_bytes;
      ddp.zero_grad();
      const size_t held = step == 0 ? 0 : size_t(grad_bytes);  // the set-up took none
      EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, before - held) << "all given back";
      for (size_t b = 0; b < buckets; ++b) EXPECT_FALSE(reg.grads_held(b)) << b;
      EXPECT_NE(error_of([&] { reg.params()[0]->main_grad.item(0); }).find("memory was released"), std::string::npos);
      held_at_first_report.clear();
      two_micro_batches(model);
      ddp.finish_grad_sync();
      ASSERT_EQ(held_at_first_report.size(), buckets);
      EXPECT_TRUE(held_at_first_report[reg.grad_part_of(*reg.find("decoder.layers.2.mlp.linear_fc2.weight"))]);
      EXPECT_FALSE(held_at_first_report[reg.grad_part_of(*reg.find("decoder.layers.0.mlp.linear_fc1.weight"))])
          << "the first layer's bucket, before the backward reached it";
      for (size_t i = 0; i < reg.params().size(); ++i)
        EXPECT_EQ(reg.params()[i]->main_grad.to_vector(), reference.parameters().params()[i]->main_grad.to_vector())
            << reg.params()[i]->spec.name << " in step " << step;
    }

    // Acquired, a bucket marks its linear layers' weight gradients instead of zeroing them.
    ddp.zero_grad();
    for (size_t b = 0; b < buckets; ++b) reg.acquire_grads(b);
    int marked = 0;
    for (const auto& p : reg.params()) {
      const std::string& name = p->spec.name;
      const bool linear_weight =
          (name.find(".linear_") != std::string::npos && name.ends_with(".weight")) || name == "output_layer.weight";
      EXPECT_EQ(p->grad_overwrite_pending, linear_weight) << name;
      marked += p->grad_overwrite_pending;
    }
    EXPECT_EQ(marked, 4 * 3 + (untied ? 1 : 0));  // QKV, projection, fc1 and fc2 of 3 layers (+ output)

    ddp.zero_grad();
    ddp.finish_grad_sync();  // no backward: the buckets are acquired and reduce zeros
    for (const auto& p : reg.params()) {
      const std::vector<float> g = p->main_grad.to_vector();
      EXPECT_EQ(g, std::vector<float>(g.size(), 0.0f)) << p->spec.name;
      EXPECT_FALSE(p->grad_overwrite_pending) << p->spec.name;
    }
  }
}

// The module (embeddings, one decoder layer with the final norm after the last, output layer)
// that reads a parameter in the forward.
std::string module_of(const std::string& name, int64_t num_layers) {
  if (name.rfind("decoder.final_layernorm.", 0) == 0) return "decoder.layers." + std::to_string(num_layers - 1);
  const size_t dot = name.find('.', name.rfind("decoder.layers.", 0) == 0 ? 15 : 0);
  return name.substr(0, dot);
}

// Each parameter is reported once per forward, in forward order (the order of registration; a
// tied word embedding again before the output layer, which reads it: Megatron FSDP gathers it
// again there), after the previous module's ops and before any op reads it, and reported done
// (after_forward) as often: the parameters start as NaN and
// get their values only when reported, as a parameter all-gather would give them, yet the loss
// equals, bit for bit, the loss of the model holding its values from the start.
TEST(DdpParams, ModelReportsEachParameterJustBeforeTheForwardReadsIt) {
  for (const bool untied : {false, true}) {
    const ParallelContext ctx = ParallelContext::single_process();
    const TransformerConfig config = tiny_config(untied);
    GPTModel model(config, ctx);
    ParameterRegistry& reg = model.parameters();
    reg.initialize(5);
    const TinyBatch batch;
    const LossSums expected = model.evaluate(batch.tokens, batch.tokens, batch.mask);
    const Tensor values = reg.param_buffer().clone();
    Tensor params = reg.param_buffer();  // a view: filling it fills the buffer
    params.fill(std::numeric_limits<double>::quiet_NaN());

    ops::OpProfiler& profiler = ops::OpProfiler::instance();
    std::vector<std::string> order;
    std::vector<int64_t> ops_before;  // ops run since the previous report
    reg.set_before_forward_hook([&](const Parameter& p) {
      int64_t calls = 0;
      for (const ops::OpTiming& t : profiler.stop().ops) calls += t.calls;
      order.push_back(p.spec.name);
      ops_before.push_back(calls);
      reg.params()[p.index]->data.copy_from(p.view_of(values));
      profiler.start();
    });
    std::vector<std::string> done;
    reg.set_after_forward_hook([&](const Parameter& p) { done.push_back(p.spec.name); });
    profiler.start();
    const LossSums got = model.evaluate(batch.tokens, batch.tokens, batch.mask);
    profiler.stop();
    EXPECT_EQ(got.loss_sum, expected.loss_sum) << "untied " << untied;

    std::vector<std::string> registered;
    for (const auto& p : reg.params()) registered.push_back(p->spec.name);
    if (!untied) registered.push_back("embedding.word_embeddings.weight");
    ASSERT_EQ(order, registered) << "untied " << untied;
    EXPECT_EQ(done, registered) << "untied " << untied;
    // A module's parameters are reported together, and its predecessor's ops ran before.
    for (size_t i = 1; i < order.size(); ++i) {
      const bool new_module = module_of(order[i], config.num_layers) != module_of(order[i - 1], config.num_layers);
      EXPECT_EQ(ops_before[i] > 0, new_module) << order[i] << ": " << ops_before[i] << " ops since " << order[i - 1];
    }
  }
}
