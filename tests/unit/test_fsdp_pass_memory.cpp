// Megatron FSDP frees each gathered bucket and full gradient when its use is over, as the CPU
// allocator counts every byte in use (fsdp_pass_memory.h): one forward and backward of 16 layers
// holds kFsdpBucketsAtPeak buckets above the shards at most, not one per layer. The GPU form over
// NCCL, where the host runs ahead of the device: tests/gpu/test_nccl_comm.cpp.
#include <gtest/gtest.h>

#include "unit/fsdp_pass_memory.h"

using namespace megatron;
using megatron::testing::FsdpPassMemory;
using megatron::testing::kFsdpBucketsAtPeak;

TEST(FsdpPassMemory, HoldsAFewBucketsNotOnePerLayer) {
  const auto group = ParallelContext::single_process().dp_cp;
  const FsdpPassMemory m = megatron::testing::fsdp_pass_memory(Device::cpu(), group, 16, 1 << 18, [] {});
  // Exact: every tensor here is a multiple of the CPU allocator's 64 bytes.
  EXPECT_EQ(m.peak_above_start, kFsdpBucketsAtPeak * m.bucket_bytes);
}
