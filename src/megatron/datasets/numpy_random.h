#pragma once
// Bit-exact ports of the numpy random streams Megatron's datasets consume, so our samples and
// their order equal Megatron-LM's for the same seed (megatron-compat.md sections 2.3 and 3).
//
// - NumpyRandomState: numpy.random.RandomState(seed), the legacy MT19937 generator. GPTDataset
//   shuffles its document and shuffle indices with it.
// - NumpyGenerator: numpy.random.default_rng(seed), i.e. SeedSequence(seed) feeding PCG64 (the
//   XSL-RR 128/64 variant), with Generator.integers for int32. Mock data draws its document
//   lengths with it.
// Only the parts those callers use are here; each follows numpy's C code path exactly,
// including which raw words are drawn and in what order.
#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace megatron::datasets {

class NumpyRandomState {
 public:
  // numpy's integer seeding: MT19937 init_genrand(seed). numpy rejects seeds outside
  // [0, 2^32 - 1], and so do we.
  explicit NumpyRandomState(int64_t seed);

  uint32_t next_u32();  // one tempered MT19937 output
  uint64_t next_u64();  // two outputs, the first one high: (u32 << 32) | u32
  // numpy's legacy random_interval: uniform in [0, max] by drawing (u32 or u64, depending on
  // whether max fits 32 bits) masked to max's bit width until the value is <= max.
  uint64_t random_interval(uint64_t max);

  // RandomState.shuffle of a 1-D array: for i = n-1 down to 1, swap values[i] with
  // values[random_interval(i)]. on_progress(done) is called every 2^20 swaps (long shuffles
  // report progress through it).
  template <class T, class OnProgress>
  void shuffle(std::span<T> values, OnProgress&& on_progress) {
    // The partners j come from the stream alone, not from the values: each is drawn kLookahead
    // swaps early and its element prefetched, so the random reads of a shuffle larger than the
    // caches overlap instead of each waiting on memory. The stream is drawn in the same order.
    constexpr int64_t kLookahead = 16;
    const int64_t n = int64_t(values.size());
    std::array<int64_t, kLookahead> partners{};
    const auto draw = [&](int64_t i) {
      const auto j = int64_t(random_interval(uint64_t(i)));
      __builtin_prefetch(values.data() + j, 1);
      partners[size_t(i % kLookahead)] = j;
    };
    for (int64_t i = n - 1; i >= 1 && i >= n - kLookahead; --i) draw(i);
    for (int64_t i = n - 1; i >= 1; --i) {
      const int64_t j = partners[size_t(i % kLookahead)];
      if (i - kLookahead >= 1) draw(i - kLookahead);  // slot i % kLookahead read: its next owner
      std::swap(values[size_t(i)], values[size_t(j)]);
      if (((n - i) & ((int64_t(1) << 20) - 1)) == 0) on_progress(n - i);
    }
  }
  template <class T>
  void shuffle(std::span<T> values) {
    shuffle(values, [](int64_t) {});
  }

 private:
  void twist();
  std::array<uint32_t, 624> state_{};
  int position_ = 624;
};

// numpy.random.SeedSequence(entropy) for a non-negative integer entropy with no spawn key:
// the entropy's 32-bit words are hashed into a pool of 4 words (Melissa O'Neill's seed_seq_fe
// mixing, as numpy does it), from which generate_state draws words.
class NumpySeedSequence {
 public:
  explicit NumpySeedSequence(uint64_t entropy);
  std::vector<uint32_t> generate_state_u32(int64_t n_words) const;
  // Pairs of u32 words read as little-endian u64, as numpy's generate_state(n, np.uint64).
  std::vector<uint64_t> generate_state_u64(int64_t n_words) const;
  const std::array<uint32_t, 4>& pool() const { return pool_; }

 private:
  std::array<uint32_t, 4> pool_{};
};

// numpy.random.default_rng(seed): PCG64 seeded from SeedSequence(seed), wrapped in a Generator.
class NumpyGenerator {
 public:
  explicit NumpyGenerator(uint64_t seed);

  uint64_t next_u64();  // PCG64: advance the 128-bit LCG, then output XSL-RR of the new state
  // Half of a u64 per call: the low half of a fresh draw first, its high half on the next call
  // (numpy's buffered next_uint32 for PCG64).
  uint32_t next_u32();
  // Generator.integers(low, high, size, dtype=np.int32): values in [low, high), each
  // low + Lemire's bounded draw over (high - low) values with 32-bit words.
  std::vector<int32_t> integers_i32(int32_t low, int32_t high, int64_t size);

 private:
  using u128 = unsigned __int128;
  u128 state_ = 0;
  u128 increment_ = 0;
  bool has_u32_ = false;
  uint32_t buffered_u32_ = 0;
};

}  // namespace megatron::datasets
