#pragma once
// Keys and values of the positions a generation has already run, so each new token runs the model
// on itself alone (inference/generate.h). Each attention module keeps its rank's query groups
// under its own name: k and v (capacity,B,G_local,d), after RoPE, positions [0, length) filled.
// A forward given the cache (ForwardContext::kv_cache) runs positions [length, length + S),
// appends their keys and values, and the model then advances `length` by S.
#include <cstdint>
#include <map>
#include <string>

#include "megatron/core/error.h"
#include "megatron/core/tensor.h"

namespace megatron {

struct KvCache {
  struct Entry {
    Tensor k, v;
  };
  int64_t capacity = 0;  // positions the cache holds at most
  int64_t length = 0;    // positions held
  std::map<std::string, Entry> entries;

  explicit KvCache(int64_t capacity_) : capacity(capacity_) {}

  // The entry of the attention module `name`, allocated on first use for keys and values shaped
  // like `k` (S,B,G,d) beyond the sequence dimension.
  Entry& entry(const std::string& name, const Tensor& k) {
    auto it = entries.find(name);
    if (it == entries.end()) {
      const Shape shape{capacity, k.dim(1), k.dim(2), k.dim(3)};
      it = entries
               .emplace(name,
                        Entry{Tensor::empty(shape, k.dtype(), k.device()), Tensor::empty(shape, k.dtype(), k.device())})
               .first;
    }
    MEGATRON_CHECK(length + k.dim(0) <= capacity, "the key/value cache holds " << capacity << " positions; " << length
                                                                               << " + " << k.dim(0) << " do not fit");
    return it->second;
  }
};

}  // namespace megatron
