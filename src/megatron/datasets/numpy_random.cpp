#include "megatron/datasets/numpy_random.h"

#include "megatron/core/error.h"

namespace megatron::datasets {

// ---- MT19937 (numpy's legacy RandomState) ---------------------------------------------------

namespace {
constexpr int kMtSize = 624;
constexpr int kMtShift = 397;
constexpr uint32_t kMtMatrix = 0x9908b0dfu;
}  // namespace

NumpyRandomState::NumpyRandomState(int64_t seed) {
  MEGATRON_CHECK(seed >= 0 && seed <= int64_t(0xffffffffu),
                 "seed " << seed << " is outside [0, 2^32 - 1], the range numpy.random.RandomState accepts (Megatron "
                         << "seeds its datasets with --seed); choose a seed in that range");
  state_[0] = uint32_t(seed);
  for (int i = 1; i < kMtSize; ++i) {
    state_[size_t(i)] = 1812433253u * (state_[size_t(i - 1)] ^ (state_[size_t(i - 1)] >> 30)) + uint32_t(i);
  }
  position_ = kMtSize;  // the first draw twists
}

void NumpyRandomState::twist() {
  // The standard in-place recurrence; element i reads i+1 and i+397 (mod 624), the latter
  // already updated once i+397 wraps, exactly as the reference loops do.
  for (int i = 0; i < kMtSize; ++i) {
    const uint32_t y = (state_[size_t(i)] & 0x80000000u) | (state_[size_t((i + 1) % kMtSize)] & 0x7fffffffu);
    state_[size_t(i)] = state_[size_t((i + kMtShift) % kMtSize)] ^ (y >> 1) ^ ((y & 1u) ? kMtMatrix : 0u);
  }
  position_ = 0;
}

uint32_t NumpyRandomState::next_u32() {
  if (position_ == kMtSize) twist();
  uint32_t y = state_[size_t(position_++)];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t NumpyRandomState::next_u64() {
  const uint64_t high = next_u32();
  return (high << 32) | next_u32();
}

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;  // max with every bit below its top bit set
  for (int shift = 1; shift <= 32; shift *= 2) mask |= mask >> shift;
  uint64_t value = 0;
  if (max <= 0xffffffffu) {
    do value = next_u32() & mask;
    while (value > max);
  } else {
    do value = next_u64() & mask;
    while (value > max);
  }
  return value;
}

// ---- SeedSequence ---------------------------------------------------------------------------

namespace {
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;

// hash_const is advanced by every call, as in numpy.
uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  return value ^ (value >> kXShift);
}

uint32_t mix(uint32_t x, uint32_t y) {
  const uint32_t result = kMixMultL * x - kMixMultR * y;
  return result ^ (result >> kXShift);
}
}  // namespace

NumpySeedSequence::NumpySeedSequence(uint64_t entropy) {
  // A Python int becomes its 32-bit words, least significant first; 0 is one zero word.
  std::vector<uint32_t> words;
  do {
    words.push_back(uint32_t(entropy));
    entropy >>= 32;
  } while (entropy != 0);
  uint32_t hash_const = kInitA;
  // Entropy words into the pool, then hash zeros for the rest of the pool.
  for (size_t i = 0; i < pool_.size(); ++i) pool_[i] = hashmix(i < words.size() ? words[i] : 0u, hash_const);
  // Every word mixes into every other, so late words affect early ones.
  for (size_t src = 0; src < pool_.size(); ++src) {
    for (size_t dst = 0; dst < pool_.size(); ++dst) {
      if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src], hash_const));
    }
  }
  // Entropy beyond the pool size mixes into each pool word.
  for (size_t src = pool_.size(); src < words.size(); ++src) {
    for (size_t dst = 0; dst < pool_.size(); ++dst) pool_[dst] = mix(pool_[dst], hashmix(words[src], hash_const));
  }
}

std::vector<uint32_t> NumpySeedSequence::generate_state_u32(int64_t n_words) const {
  MEGATRON_CHECK(n_words >= 0, "SeedSequence.generate_state: word count " << n_words << " must be non-negative");
  std::vector<uint32_t> state(static_cast<size_t>(n_words));
  uint32_t hash_const = kInitB;
  for (size_t i = 0; i < state.size(); ++i) {
    uint32_t value = pool_[i % pool_.size()];
    value ^= hash_const;
    hash_const *= kMultB;
    value *= hash_const;
    state[i] = value ^ (value >> kXShift);
  }
  return state;
}

std::vector<uint64_t> NumpySeedSequence::generate_state_u64(int64_t n_words) const {
  const std::vector<uint32_t> words = generate_state_u32(2 * n_words);
  std::vector<uint64_t> state(static_cast<size_t>(n_words));
  for (size_t i = 0; i < state.size(); ++i) state[i] = uint64_t(words[2 * i]) | (uint64_t(words[2 * i + 1]) << 32);
  return state;
}

// ---- PCG64 and Generator --------------------------------------------------------------------

namespace {
using u128 = unsigned __int128;
constexpr u128 kPcgMultiplier = (u128(0x2360ed051fc65da4ull) << 64) | 0x4385df649fccf645ull;
}  // namespace

NumpyGenerator::NumpyGenerator(uint64_t seed) {
  // PCG64(SeedSequence(seed)): four u64 words; the first two are the initial state (high word
  // first), the last two the stream; then PCG's srandom: inc = 2*stream + 1, step, add the
  // state, step.
  const std::vector<uint64_t> words = NumpySeedSequence(seed).generate_state_u64(4);
  const u128 initial_state = (u128(words[0]) << 64) | words[1];
  const u128 stream = (u128(words[2]) << 64) | words[3];
  increment_ = (stream << 1) | 1u;
  state_ = 0;
  state_ = state_ * kPcgMultiplier + increment_;
  state_ += initial_state;
  state_ = state_ * kPcgMultiplier + increment_;
}

uint64_t NumpyGenerator::next_u64() {
  state_ = state_ * kPcgMultiplier + increment_;
  const uint64_t xored = uint64_t(state_ >> 64) ^ uint64_t(state_);
  const unsigned rotation = unsigned(state_ >> 122);
  return (xored >> rotation) | (xored << ((64u - rotation) & 63u));
}

uint32_t NumpyGenerator::next_u32() {
  if (has_u32_) {
    has_u32_ = false;
    return buffered_u32_;
  }
  const uint64_t next = next_u64();
  has_u32_ = true;
  buffered_u32_ = uint32_t(next >> 32);
  return uint32_t(next);
}

std::vector<int32_t> NumpyGenerator::integers_i32(int32_t low, int32_t high, int64_t size) {
  MEGATRON_CHECK(low < high, "integers(" << low << ", " << high << "): low must be below high (high is exclusive)");
  MEGATRON_CHECK(size >= 0, "integers: size " << size << " must be non-negative");
  // numpy works on the closed range [low, high - 1]: rng = high - 1 - low, offset = low.
  const auto range = uint32_t(int64_t(high) - 1 - int64_t(low));
  const auto offset = uint32_t(low);
  std::vector<int32_t> out(static_cast<size_t>(size));
  for (int32_t& value : out) {
    uint32_t draw = 0;
    if (range == 0) {
      draw = 0;  // a single value: numpy draws nothing
    } else if (range == 0xffffffffu) {
      draw = next_u32();  // the whole 32-bit range: Lemire's method cannot express it
    } else {
      // Lemire (arXiv:1805.10941): the high word of u32 * (range + 1), rejecting the low words
      // below 2^32 mod (range + 1) so every value is equally likely.
      const uint32_t range_excl = range + 1;
      uint64_t m = uint64_t(next_u32()) * range_excl;
      auto leftover = uint32_t(m);
      if (leftover < range_excl) {
        const uint32_t threshold = (0xffffffffu - range) % range_excl;
        while (leftover < threshold) {
          m = uint64_t(next_u32()) * range_excl;
          leftover = uint32_t(m);
        }
      }
      draw = uint32_t(m >> 32);
    }
    value = int32_t(offset + draw);
  }
  return out;
}

}  // namespace megatron::datasets
