#include "megatron/cuda_runtime/block_pool.h"

#include <algorithm>
#include <iterator>

#include "megatron/core/error.h"

namespace megatron::cuda {

size_t BlockPool::fitting_segment_bytes(size_t block) {
  return (block + kSegmentGranularity - 1) / kSegmentGranularity * kSegmentGranularity;
}

size_t BlockPool::segment_bytes(size_t block) { return std::max(fitting_segment_bytes(block), kPreferredSegment); }

void BlockPool::insert_free(Address at, const Block& block) { free_.emplace(block.stream, block.bytes, at); }

void BlockPool::erase_free(Address at, const Block& block) { free_.erase({block.stream, block.bytes, at}); }

void BlockPool::add_segment(Address base, size_t bytes, StreamKey stream) {
  MEGATRON_CHECK(bytes > 0 && !segments_.contains(base), "segment at " << base << " of " << bytes << " bytes");
  segments_.emplace(base, bytes);
  reserved_bytes_ += bytes;
  const Block block{base, bytes, stream, false};
  blocks_.emplace(base, block);
  insert_free(base, block);
}

std::optional<BlockPool::Address> BlockPool::allocate(size_t bytes, StreamKey stream) {
  const auto fit = free_.lower_bound({stream, bytes, Address(0)});
  if (fit == free_.end() || std::get<0>(*fit) != stream) return std::nullopt;
  const Address at = std::get<2>(*fit);
  Block& block = blocks_.at(at);
  erase_free(at, block);
  if (block.bytes - bytes >= kMinSplit) {
    const Block rest{block.segment, block.bytes - bytes, stream, false};
    block.bytes = bytes;
    blocks_.emplace(at + bytes, rest);
    insert_free(at + bytes, rest);
  }
  block.used = true;
  ++used_blocks_;
  return at;
}

bool BlockPool::holds(Address block) const {
  const auto it = blocks_.find(block);
  return it != blocks_.end() && it->second.used;
}

size_t BlockPool::block_bytes(Address block) const {
  MEGATRON_CHECK(holds(block), "block " << block << " was not handed out by this pool");
  return blocks_.at(block).bytes;
}

size_t BlockPool::release(Address at) {
  MEGATRON_CHECK(holds(at), "release of block " << at << ", which this pool did not hand out");
  auto it = blocks_.find(at);
  it->second.used = false;
  --used_blocks_;
  const size_t released = it->second.bytes;
  // Merge with the free block after it, then with the free block before it, within the segment.
  const auto next = std::next(it);
  if (next != blocks_.end() && !next->second.used && next->second.segment == it->second.segment) {
    erase_free(next->first, next->second);
    it->second.bytes += next->second.bytes;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    const auto prev = std::prev(it);
    if (!prev->second.used && prev->second.segment == it->second.segment) {
      erase_free(prev->first, prev->second);
      prev->second.bytes += it->second.bytes;
      blocks_.erase(it);
      it = prev;
    }
  }
  insert_free(it->first, it->second);
  return released;
}

std::vector<BlockPool::Segment> BlockPool::take_free_segments() {
  std::vector<Segment> taken;
  for (auto s = segments_.begin(); s != segments_.end();) {
    const Block& block = blocks_.at(s->first);
    if (block.used || block.bytes != s->second) {
      ++s;
      continue;
    }
    erase_free(s->first, block);
    blocks_.erase(s->first);
    reserved_bytes_ -= s->second;
    taken.push_back({s->first, s->second});
    s = segments_.erase(s);
  }
  return taken;
}

size_t BlockPool::free_bytes() const {
  size_t bytes = 0;
  for (const auto& key : free_) bytes += std::get<1>(key);
  return bytes;
}

}  // namespace megatron::cuda
