// The split of layers over pipeline stages (pipeline_parallel/stage_split.h) against results worked
// out by hand from Megatron's get_num_layers_to_build / get_transformer_layer_offset formulas, and
// the errors for splits that cannot be made.
#include <gtest/gtest.h>

#include "megatron/core/error.h"
#include "megatron/pipeline_parallel/stage_split.h"

using namespace megatron;
using namespace megatron::pipeline_parallel;

namespace {

ParallelArgs pp(int64_t size) {
  ParallelArgs a;
  a.pipeline_model_parallel_size = size;
  return a;
}

std::string first_error(const ParallelArgs& a, int64_t num_layers) {
  const auto errors = validate_pipeline_split(a, num_layers);
  return errors.empty() ? std::string() : errors.front();
}

}  // namespace

TEST(StageSplit, EvenSplit) {
  const PipelineSplit s = pipeline_split(pp(4), 8);
  EXPECT_EQ(s.layers_per_stage, (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(s.stage(0, 0), (StageLayers{.first_layer = 0, .num_layers = 2, .embedding = true}));
  EXPECT_EQ(s.stage(2, 0), (StageLayers{.first_layer = 4, .num_layers = 2}));
  EXPECT_EQ(s.stage(3, 0), (StageLayers{.first_layer = 6, .num_layers = 2, .loss = true}));
  // One rank holds everything.
  EXPECT_EQ(pipeline_split(pp(1), 5).stage(0, 0), (StageLayers{0, 5, true, true}));
}

TEST(StageSplit, VirtualStages) {
  // megatron-compat.md §7.3: chunk v of rank p holds [v·L/V + p·L/(P·V), + L/(P·V)).
  ParallelArgs a = pp(2);
  a.num_virtual_stages_per_pipeline_rank = 2;
  const PipelineSplit s = pipeline_split(a, 8);
  EXPECT_EQ(s.virtual_stages, 2);
  EXPECT_EQ(s.stage(1, 0), (StageLayers{.first_layer = 2, .num_layers = 2}));
  EXPECT_EQ(s.stage(0, 1), (StageLayers{.first_layer = 4, .num_layers = 2}));
  EXPECT_EQ(s.stage(1, 1), (StageLayers{.first_layer = 6, .num_layers = 2, .loss = true}));
  // V = (L/P) / layers per virtual stage: 4 / 1.
  ParallelArgs b = pp(2);
  b.num_layers_per_virtual_pipeline_stage = 1;
  EXPECT_EQ(pipeline_split(b, 8).virtual_stages, 4);
  EXPECT_EQ(pipeline_split(b, 8).stage(1, 3), (StageLayers{.first_layer = 7, .num_layers = 1, .loss = true}));
}

TEST(StageSplit, EmbeddingAndLossCountedAsLayers) {
  // L=6, P=4: 8 "layers" = 2 per rank; rank 0 builds 1 (the embedding is the other), rank 3 builds
  // 1. Megatron's offset: rank r starts at 2r - 1 for r > 0.
  ParallelArgs a = pp(4);
  a.account_for_embedding_in_pipeline_split = a.account_for_loss_in_pipeline_split = true;
  const PipelineSplit s = pipeline_split(a, 6);
  EXPECT_EQ(s.layers_per_stage, (std::vector<int64_t>{1, 2, 2, 1}));
  EXPECT_EQ(s.stage(1, 0).first_layer, 1);
  EXPECT_EQ(s.stage(3, 0).first_layer, 5);
  // With two chunks per rank (L=14, P=2, V=2: 16 / 2 / 2 = 4 per chunk): Megatron's offset of
  // chunk v, rank p is v·8 + p·4 - 1 past the first stage.
  a = pp(2);
  a.account_for_embedding_in_pipeline_split = a.account_for_loss_in_pipeline_split = true;
  a.num_virtual_stages_per_pipeline_rank = 2;
  const PipelineSplit v = pipeline_split(a, 14);
  EXPECT_EQ(v.layers_per_stage, (std::vector<int64_t>{3, 4, 4, 3}));
  EXPECT_EQ(v.stage(1, 0).first_layer, 3);
  EXPECT_EQ(v.stage(0, 1).first_layer, 7);
  EXPECT_EQ(v.stage(1, 1).first_layer, 11);
}

TEST(StageSplit, UnevenFirstAndLast) {
  // L=10, P=4, first 1, last 3: the middle ranks share 6, 3 each; Megatron's offset of rank r > 0
  // is (r-1)·3 + 1.
  ParallelArgs a = pp(4);
  a.decoder_first_pipeline_num_layers = 1;
  a.decoder_last_pipeline_num_layers = 3;
  const PipelineSplit s = pipeline_split(a, 10);
  EXPECT_EQ(s.layers_per_stage, (std::vector<int64_t>{1, 3, 3, 3}));
  EXPECT_EQ(s.stage(2, 0).first_layer, 4);
  // Only the last given: L=7, P=3, last 1: 3, 3, 1.
  ParallelArgs b = pp(3);
  b.decoder_last_pipeline_num_layers = 1;
  EXPECT_EQ(pipeline_split(b, 7).layers_per_stage, (std::vector<int64_t>{3, 3, 1}));
  // With V=2 (L=12, P=3, first 2, last 2: per chunk 1, 4, 1): Megatron's interleaved uneven offset
  // of rank 1 chunk 1 is v·(1+4+1) + 1 + (r-1)·4 = 7.
  ParallelArgs c = pp(3);
  c.decoder_first_pipeline_num_layers = c.decoder_last_pipeline_num_layers = 2;
  c.num_virtual_stages_per_pipeline_rank = 2;
  const PipelineSplit v = pipeline_split(c, 12);
  EXPECT_EQ(v.layers_per_stage, (std::vector<int64_t>{1, 4, 1, 1, 4, 1}));
  EXPECT_EQ(v.stage(1, 1), (StageLayers{.first_layer = 7, .num_layers = 4}));
}

TEST(StageSplit, Layout) {
  // Megatron's design note, case 1: PP=3, VPP=2, 7 layers:
  // rank 0 [[E], [4,5]], rank 1 [[0,1], [6]], rank 2 [[2,3], [L]].
  ParallelArgs a = pp(3);
  a.pipeline_model_parallel_layout = "E|(tt|)*3,t|L";
  const PipelineSplit s = pipeline_split(a, 7);
  EXPECT_EQ(s.virtual_stages, 2);
  EXPECT_EQ(s.layers_per_stage, (std::vector<int64_t>{0, 2, 2, 2, 1, 0}));
  EXPECT_EQ(s.stage(0, 0), (StageLayers{.first_layer = 0, .num_layers = 0, .embedding = true}));
  EXPECT_EQ(s.stage(0, 1), (StageLayers{.first_layer = 4, .num_layers = 2}));
  EXPECT_EQ(s.stage(1, 1), (StageLayers{.first_layer = 6, .num_layers = 1}));
  EXPECT_EQ(s.stage(2, 1), (StageLayers{.first_layer = 7, .num_layers = 0, .loss = true}));
  // Case 2: PP=3, VPP=3, 6 layers, an empty stage on rank 1.
  a.pipeline_model_parallel_layout = "E|t|t|t|t||t|t|L";
  EXPECT_EQ(pipeline_split(a, 6).layers_per_stage, (std::vector<int64_t>{0, 1, 1, 1, 1, 0, 1, 1, 0}));
  // Embedding and layers in one stage, repeats inside repeats.
  ParallelArgs b = pp(2);
  b.pipeline_model_parallel_layout = "Et*2|((t)*2)*2L";
  EXPECT_EQ(pipeline_split(b, 6).layers_per_stage, (std::vector<int64_t>{2, 4}));
}

TEST(StageSplit, ImpossibleSplitsAreNamed) {
  EXPECT_NE(first_error(pp(2), 7).find("--num-layers 7 does not divide over --pipeline-model-parallel-size 2"),
            std::string::npos);
  ParallelArgs a = pp(4);
  a.decoder_first_pipeline_num_layers = 1;
  a.account_for_loss_in_pipeline_split = true;
  EXPECT_NE(first_error(a, 9).find("Megatron does not combine"), std::string::npos);
  a.account_for_loss_in_pipeline_split = false;
  EXPECT_NE(first_error(a, 9).find("leave 8 of --num-layers 9 for 3 other pipeline ranks"), std::string::npos);
  ParallelArgs v = pp(2);
  v.num_virtual_stages_per_pipeline_rank = 3;
  EXPECT_NE(first_error(v, 8).find("4 layers do not divide into 3 model chunks"), std::string::npos);
  v.num_layers_per_virtual_pipeline_stage = 1;
  EXPECT_NE(first_error(v, 8).find("both given"), std::string::npos);
  ParallelArgs w = pp(2);
  w.num_layers_per_virtual_pipeline_stage = 3;
  EXPECT_NE(first_error(w, 8).find("does not divide the 4 layers of each pipeline rank"), std::string::npos);
  // The embedding may leave its stage without layers: 8 counted / 4 ranks / 2 chunks = 1, then 0.
  ParallelArgs e = pp(4);
  e.account_for_embedding_in_pipeline_split = true;
  e.num_virtual_stages_per_pipeline_rank = 2;
  EXPECT_EQ(pipeline_split(e, 7).stage(0, 0), (StageLayers{.first_layer = 0, .num_layers = 0, .embedding = true}));
  ParallelArgs l = pp(2);
  l.pipeline_model_parallel_layout = "E|tt|t|L";
  EXPECT_NE(first_error(l, 4).find("places 3 transformer layers"), std::string::npos);
  l.pipeline_model_parallel_layout = "tE|ttt|t|L";
  EXPECT_NE(first_error(l, 4).find("'E' must appear once, first"), std::string::npos);
  l.pipeline_model_parallel_layout = "Et|tt|tL";
  EXPECT_NE(first_error(l, 4).find("3 stages, not a multiple"), std::string::npos);
  l.pipeline_model_parallel_layout = "Et*3|(tt|)*29,m|L";
  EXPECT_NE(first_error(l, 61).find("no MTP layers"), std::string::npos);
  l.pipeline_model_parallel_layout = "E(tt|tt|L";
  EXPECT_NE(first_error(l, 4).find("never closed"), std::string::npos);
  l.pipeline_model_parallel_layout = "Ett|tt|L";
  l.decoder_first_pipeline_num_layers = 2;
  EXPECT_NE(first_error(l, 4).find("replaces"), std::string::npos);
  EXPECT_THROW(pipeline_split(pp(2), 7), Error);
}
