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
