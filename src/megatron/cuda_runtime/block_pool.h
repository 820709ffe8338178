#pragma once
// BlockPool: the caching allocator's bookkeeping of large blocks (allocator.h), free of CUDA so the
// CPU tests cover it. Addresses are plain integers; the allocator obtains segments from the
// device and hands them to the pool, which cuts them into blocks.
//
// Why split: a large buffer held for the whole run (a model's weights, main gradients, optimizer
// moments) gets its size rounded to 512 bytes instead of a size class (up to 12.5% more: 2.1 GiB
// on llama-3b's five such buffers by the size-class rule), and memory a large tensor frees can
// serve later requests of other sizes that fit in it instead of waiting for one of its own class.
//
// allocate() takes the smallest free block of the stream that fits (lowest address among equals)
// and splits off the rest when at least kMinSplit bytes remain; release() merges a block with its
// free neighbours of the same segment. When nothing fits, the allocator asks the device for a
// segment of segment_bytes(): at least kPreferredSegment, so that blocks freed side by side merge.
// A training step frees its activations and (distributed/ddp.h: released weights) its 80 MiB weight
// parts during the backward while it takes 160 MiB gradient buckets, and the reverse in the step and
// the next forward; with segments of each request's own size, freed blocks stay apart and each kind
// keeps memory of its own (llama-3b on an H100: 8.9 GiB reserved above the peak; the replay in
// test_block_pool). Blocks never move between streams (stream-ordered reuse, as the allocator's
// header explains), so each free block keeps the stream of its segment.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

namespace megatron::cuda {

class BlockPool {
 public:
  using Address = std::uintptr_t;
  using StreamKey = std::uintptr_t;  // the stream a segment belongs to (its handle as an integer)

  // A remainder smaller than this stays with the block handed out (counted in its size), so every
  // free block is at least this large and tiny gaps do not accumulate.
  static constexpr size_t kMinSplit = size_t(1) << 20;

  // Segments are obtained in multiples of kSegmentGranularity (the driver's own granularity for big
  // requests) and of at least kPreferredSegment bytes while the device has room.
  static constexpr size_t kSegmentGranularity = size_t(2) << 20;
  static constexpr size_t kPreferredSegment = size_t(1) << 30;
  // The segment a request of `block` bytes that nothing fits should get: kPreferredSegment, or its
  // own size in granules when larger. fitting_segment_bytes() is the least that serves it, the
  // fallback when the device has no room for the preferred one.
  static size_t segment_bytes(size_t block);
  static size_t fitting_segment_bytes(size_t block);

  struct Segment {
    Address base = 0;
    size_t bytes = 0;
  };

  // Adds a segment of `bytes` at `base`, free, to `stream`'s pool.
  void add_segment(Address base, size_t bytes, StreamKey stream);
  // A block of at least `bytes` from `stream`'s free blocks (best fit), or nothing when none fits
  // (the caller adds a segment and asks again). Returns its address; block_bytes() its size.
  std::optional<Address> allocate(size_t bytes, StreamKey stream);
  // Frees a block allocate() handed out; returns its size. A pointer it did not hand out is an
  // error (the allocator's caller freed foreign memory).
  size_t release(Address block);
  // Whether `block` is a block handed out by this pool, and its size.
  bool holds(Address block) const;
  size_t block_bytes(Address block) const;
  // Removes every segment that is entirely free and returns them, for the device to take back.
  std::vector<Segment> take_free_segments();

  size_t reserved_bytes() const { return reserved_bytes_; }
  size_t free_bytes() const;
  size_t free_blocks() const { return free_.size(); }
  size_t used_blocks() const { return used_blocks_; }

 private:
  struct Block {
    Address segment = 0;  // base of the segment the block lies in
    size_t bytes = 0;
    StreamKey stream = 0;
    bool used = false;
  };
  // Free blocks ordered for best fit: stream, then size, then address.
  using FreeKey = std::tuple<StreamKey, size_t, Address>;

  void insert_free(Address at, const Block& block);
  void erase_free(Address at, const Block& block);

  std::map<Address, Block> blocks_;  // every block, used or free, by address (neighbours adjacent)
  std::set<FreeKey> free_;
  std::map<Address, size_t> segments_;  // base -> bytes
  size_t reserved_bytes_ = 0;
  size_t used_blocks_ = 0;
};

}  // namespace megatron::cuda
