#pragma once
// Random numbers that are the same on every platform, backend and parallel layout.
//
// CounterRng is Philox4x32-10 (Salmon et al., SC'11): a pure function of (seed, stream,
// element index). Parameter initialisation draws element i of a parameter's *global* tensor
// from counter i, so a TP shard generates exactly the values the full tensor would hold there,
// with no full-tensor materialisation. Dropout draws its mask the same way, so backward
// regenerates it instead of storing it and the CUDA kernels can reproduce the CPU mask.
//
// HostRng is a sequential generator (std::mt19937_64, whose output the standard fixes) with
// our own bounded-integer routine, for host-side shuffles and sampling.
#include <cmath>
#include <cstdint>
#include <random>
#include <string_view>

#include "megatron/core/host_device.h"

namespace megatron {

struct Philox4x32 {
  uint32_t x[4];
};

MEGATRON_HD Philox4x32 philox4x32_10(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  uint32_t c0 = uint32_t(counter_lo), c1 = uint32_t(counter_lo >> 32);
  uint32_t c2 = uint32_t(counter_hi), c3 = uint32_t(counter_hi >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = uint32_t(p1);
    c2 = n2;
    c3 = uint32_t(p0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform in (0, 1]: never 0, so log() in Box-Muller is finite.
MEGATRON_HD float uniform_from_bits(uint32_t bits) { return (float(bits >> 8) + 1.0f) * (1.0f / 16777216.0f); }

// Element-indexed random numbers: value(i) depends only on (seed, stream, i).
struct CounterRng {
  uint64_t seed = 0;
  uint64_t stream = 0;  // separates independent uses (one parameter, one dropout site, ...)

  MEGATRON_HD float uniform(uint64_t index) const { return uniform_from_bits(philox4x32_10(seed, stream, index).x[0]); }
  // Standard normal by Box-Muller on the first two words of block `index`.
  MEGATRON_HD float normal(uint64_t index) const {
    const Philox4x32 r = philox4x32_10(seed, stream, index);
    const float u1 = uniform_from_bits(r.x[0]);
    const float u2 = uniform_from_bits(r.x[1]);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
  }
};

// 64-bit FNV-1a: turns a parameter name into a stream id, so init does not depend on the
// order in which parameters are created.
constexpr uint64_t stream_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= uint8_t(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

class HostRng {
 public:
  explicit HostRng(uint64_t seed) : engine_(seed) {}
  uint64_t next_u64() { return engine_(); }
  // Uniform integer in [0, n) by rejection (no modulo bias, no std::distribution).
  uint64_t uniform_int(uint64_t n);
  // Uniform double in [0, 1) with 53 random bits.
  double uniform() { return double(engine_() >> 11) * (1.0 / 9007199254740992.0); }
  template <class It>
  void shuffle(It first, It last) {
    for (auto n = last - first; n > 1; --n) std::swap(first[n - 1], first[uniform_int(uint64_t(n))]);
  }
  // The engine state as text and back, for checkpoints.
  std::string state() const;
  void set_state(const std::string& state);

 private:
  std::mt19937_64 engine_;
};

}  // namespace megatron
