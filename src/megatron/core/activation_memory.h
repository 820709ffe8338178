#pragma once
// Activation memory: the bytes a forward pass keeps alive for its backward. Each module's Saved
// struct adds its tensors; a buffer held by several of them (a view saved twice) counts once.
#include <cstddef>
#include <unordered_set>

#include "megatron/core/tensor.h"

namespace megatron {

class ActivationMemory {
 public:
  // Undefined tensors count nothing; a tensor whose first byte was already counted counts once.
  void add(const Tensor& t) {
    if (t.defined() && seen_.insert(t.raw()).second) bytes_ += t.nbytes();
  }
  size_t bytes() const { return bytes_; }

 private:
  std::unordered_set<const void*> seen_;
  size_t bytes_ = 0;
};

}  // namespace megatron
