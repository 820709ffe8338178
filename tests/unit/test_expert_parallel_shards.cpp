// Expert-parallel parameters (ParamSpec::expert_parallel): an EP rank holds a contiguous range of
// experts along dim 0, and every way of naming its elements in the global tensor agrees: the
// initialisation index, the checkpoint slice and the distributed-optimizer boxes.
#include <gtest/gtest.h>

#include "megatron/parameters/parameter_registry.h"

using namespace megatron;

namespace {

// Row-major flat index of `coords` in `shape`.
int64_t flat_index(const Shape& shape, const Shape& coords) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + coords[d];
  return i;
}

}  // namespace

TEST(ExpertParallelShards, RanksHoldContiguousExpertsByGlobalIndex) {
  for (int ep_rank = 0; ep_rank < 2; ++ep_rank) {
    ParameterRegistry registry(0, 1, ep_rank, 2);
    Parameter* p = registry.add({.name = "experts.w", .global_shape = {4, 3, 2}, .expert_parallel = true});
    registry.allocate(DType::f32);
    EXPECT_EQ(p->local_shape, (Shape{2, 3, 2}));
    EXPECT_EQ(p->expert_offset(), 2 * ep_rank);
    // Expert e of this rank is global expert 2*ep_rank + e: 6 elements each.
    for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(p->global_index(i), 12 * ep_rank + i);
    const std::vector<Parameter::Slice> slices = p->global_slices();
    ASSERT_EQ(slices.size(), 1u);
    EXPECT_EQ(slices[0].global_offset, (Shape{2 * ep_rank, 0, 0}));
    // A distributed-optimizer range cutting through experts and rows: every box element names the
    // same global element as global_index.
    for (const Parameter::FlatBox& box : p->global_boxes(5, 11)) {
      int64_t flat = box.flat_begin;
      for (int64_t a = 0; a < box.shape[0]; ++a)
        for (int64_t b = 0; b < box.shape[1]; ++b)
          for (int64_t c = 0; c < box.shape[2]; ++c, ++flat)
            EXPECT_EQ(
                flat_index({4, 3, 2}, {box.global_offset[0] + a, box.global_offset[1] + b, box.global_offset[2] + c}),
                p->global_index(flat));
    }
  }
}

TEST(ExpertParallelShards, ExpertsMustDivideOverEp) {
  ParameterRegistry registry(0, 1, 0, 3);
  EXPECT_THROW(registry.add({.name = "experts.w", .global_shape = {4, 3}, .expert_parallel = true}), Error);
  // A parameter that is not an expert stack is whole on every EP rank.
  Parameter* dense = registry.add({.name = "router.w", .global_shape = {4, 3}});
  EXPECT_EQ(dense->local_shape, (Shape{4, 3}));
}

// Expert tensor parallelism (= TP) cuts each expert as the dense MLP: fc1 (E, 2F, H) by rows of
// dim 1 in [gate; up] blocks, fc2 (E, H, F) by columns of dim 2. On EP 2 x TP 2, the four ranks'
// elements tile the global tensor once, and the initialisation index, the checkpoint slices and
// the distributed-optimizer boxes of every rank name the same global elements.
TEST(ExpertParallelShards, ExpertTensorParallelShardsTileTheGlobalTensor) {
  struct Case {
    ParamSpec spec;
    Shape local;
  };
  const std::vector<Case> cases{
      {{.name = "experts.linear_fc1.weight",
        .global_shape = {4, 8, 3},
        .partition_dim = 1,
        .partition_blocks = 2,
        .expert_parallel = true},
       {2, 4, 3}},
      {{.name = "experts.linear_fc2.weight", .global_shape = {4, 3, 4}, .partition_dim = 2, .expert_parallel = true},
       {2, 3, 2}}};
  for (const Case& c : cases) {
    const Shape& g = c.spec.global_shape;
    std::vector<int> owners(size_t(shape_numel(g)), 0);
    for (int ep_rank = 0; ep_rank < 2; ++ep_rank)
      for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
        ParameterRegistry registry(tp_rank, 2, ep_rank, 2);
        Parameter* p = registry.add(c.spec);
        registry.allocate(DType::f32);
        ASSERT_EQ(p->local_shape, c.local) << c.spec.name;
        const int64_t n = shape_numel(p->local_shape);
        // Each local element holds its own flat index, so slices and boxes can be read back.
        for (int64_t i = 0; i < n; ++i) p->data.set_item(i, float(i));
        for (int64_t i = 0; i < n; ++i) ++owners[size_t(p->global_index(i))];
        for (const Parameter::Slice& slice : p->global_slices()) {
          ASSERT_EQ(slice.local.shape().size(), 3u);
          int64_t k = 0;
          for (int64_t a = 0; a < slice.local.dim(0); ++a)
            for (int64_t b = 0; b < slice.local.dim(1); ++b)
              for (int64_t d = 0; d < slice.local.dim(2); ++d, ++k)
                EXPECT_EQ(p->global_index(int64_t(slice.local.item(k))),
                          flat_index(g, {slice.global_offset[0] + a, slice.global_offset[1] + b,
                                         slice.global_offset[2] + d}))
                    << c.spec.name;
        }
        // Ranges cutting through experts, blocks and rows.
        for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, n}, {5, n - 5}, {7, 8}, {n / 2 + 1, n}})
          for (const Parameter::FlatBox& box : p->global_boxes(begin, end)) {
            int64_t flat = box.flat_begin;
            for (int64_t a = 0; a < box.shape[0]; ++a)
              for (int64_t b = 0; b < box.shape[1]; ++b)
                for (int64_t d = 0; d < box.shape[2]; ++d, ++flat)
                  EXPECT_EQ(flat_index(g, {box.global_offset[0] + a, box.global_offset[1] + b,
                                           box.global_offset[2] + d}),
                            p->global_index(flat))
                      << c.spec.name << " [" << begin << ", " << end << ")";
            EXPECT_LE(flat, end);
          }
      }
    for (size_t i = 0; i < owners.size(); ++i) EXPECT_EQ(owners[i], 1) << c.spec.name << " element " << i;
  }
  // fc1's blocks: TP rank 1 of EP rank 0 holds rows [2, 4) (gate) and [6, 8) (up) of experts 0, 1.
  ParameterRegistry registry(1, 2, 0, 2);
  Parameter* p = registry.add(cases[0].spec);
  EXPECT_EQ(p->global_index(0), flat_index({4, 8, 3}, {0, 2, 0}));
  EXPECT_EQ(p->global_index(2 * 3), flat_index({4, 8, 3}, {0, 6, 0}));
  EXPECT_EQ(p->global_index(4 * 3), flat_index({4, 8, 3}, {1, 2, 0}));
}
