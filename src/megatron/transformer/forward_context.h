#pragma once
// Per-forward settings shared by every module: training or inference, and where dropout
// masks come from. A mask is a pure function of (seed, site, step), so backward, a resumed
// run and another backend all regenerate the same mask.
#include <cstdint>
#include <string>

#include "megatron/core/rng.h"
#include "megatron/core/tensor.h"
#include "megatron/transformer/kv_cache.h"

namespace megatron {

struct ForwardContext {
  bool training = true;
  uint64_t seed = 0;
  uint64_t step = 0;  // global micro-batch counter: iteration * micro-batches + micro-batch
  // Document masking (--reset-attention-mask), a token attending only to earlier tokens of its own
  // document, in one of attention's two forms (ops/attention.h), on the model's device: packed
  // documents' cumulative lengths (N+1) i32, the variable-length path, where the sequence is whole;
  // (B,S) i32 segment ids under context parallelism, whose ring and all-to-all pass keys with their
  // documents. Both undefined = plain causal. max_seqlen: the longest packed document (attention's
  // AttentionParams::max_seqlen, which sizes cuDNN's ragged graphs without reading the GPU).
  Tensor cu_seqlens{};
  int64_t max_seqlen = 0;
  Tensor segment_ids{};
  // The gradient of the MoE routers' auxiliary losses (load balancing, z-loss) per unit of loss:
  // the main loss's scale without its division by tokens, i.e. loss scale / micro-batches
  // (Megatron's MoEAuxLossAutoScaler).
  float aux_loss_grad_scale = 1.0f;
  // A forward run again in backward (full recomputation, or the moe module): the same values,
  // but the MoE routers count no expert-bias loads again.
  bool recompute = false;
  // Generation: the positions run now follow kv_cache->length cached ones, which they attend to
  // too (kv_cache.h); null in training and evaluation.
  KvCache* kv_cache = nullptr;

  // Stream id of one random site (a dropout mask, a router's random logits) for this step.
  uint64_t random_stream(const std::string& site) const {
    return stream_id(site) ^ (step * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
  }
  float dropout_p(float configured) const { return training ? configured : 0.0f; }
};

}  // namespace megatron
