#!/usr/bin/env python3
"""Regenerates the tiny Hugging Face checkpoints under tests/hf/tiny/ and their reference logits.

Run on a machine with torch and transformers (the GPU machine; no network needed):
    python3 tests/hf/make_tiny_checkpoints.py OUT_DIR
then copy OUT_DIR/<family>/ over tests/hf/tiny/<family>/.

Each family (llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, gpt2) gets a randomly initialised
model of hidden size 64 and 2 layers over one tiny byte-level BPE vocabulary, saved with save_pretrained (llama sharded, to
exercise the index), its tokenizer files, and reference.safetensors: `input_ids` (I64, P x T) and
`logits` (F32, P x T x V), computed by transformers in float64 on the CPU so that the reference
carries no rounding of its own at fp32 tolerances. Every parameter (norm weights and biases
included) is drawn at random, so a mapping that swaps, transposes or drops any tensor changes the
logits.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

VOCAB = 320
PROMPTS, PROMPT_LEN = 3, 12
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Megatron trains large language models on many GPUs.",
    "Hugging Face checkpoints hold safetensors, a config and a tokenizer.",
    "Attention is all you need; rotary embeddings rotate pairs of channels.",
] * 8


def make_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


def llama_like(cls_name, **extra):
    cfg_cls = getattr(transformers, cls_name)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                  bos_token_id=0, eos_token_id=0, attention_dropout=0.0)
    common.update(extra)
    return cfg_cls(**common)


def configs():
    llama3_rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    try:
        llama = llama_like("LlamaConfig", rope_parameters=llama3_rope, tie_word_embeddings=False)
    except TypeError:  # transformers v4 names
        rope = dict(llama3_rope)
        theta = rope.pop("rope_theta")
        llama = llama_like("LlamaConfig", rope_theta=theta, rope_scaling=rope, tie_word_embeddings=False)
    return {
        "llama": llama,
        "mistral": llama_like("MistralConfig", sliding_window=4, rope_theta=1000000.0, tie_word_embeddings=False),
        "qwen2": llama_like("Qwen2Config", rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False),
        "qwen3": llama_like("Qwen3Config", rope_theta=1000000.0, head_dim=16, tie_word_embeddings=True,
                            use_sliding_window=False),
        "mixtral": llama_like("MixtralConfig", num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                              rope_theta=1000000.0, tie_word_embeddings=False),
        "qwen2_moe": llama_like("Qwen2MoeConfig", rope_theta=1000000.0, tie_word_embeddings=False, num_experts=4,
                                num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=40,
                                mlp_only_layers=[0], norm_topk_prob=False, use_sliding_window=False),
        "qwen3_moe": llama_like("Qwen3MoeConfig", rope_theta=1000000.0, head_dim=16, tie_word_embeddings=False,
                                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, mlp_only_layers=[0],
                                norm_topk_prob=True, use_sliding_window=False),
        "gpt2": transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                        eos_token_id=0),
    }


def randomise(model, seed):
    # Norm weights around 1, everything else around 0 with a spread that keeps logits O(1).
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            is_norm_weight = p.dim() == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight")
            p.copy_(1.0 + 0.2 * noise if is_norm_weight else 0.1 * noise)


def make_family(out, index, family, cfg, tokenizer):
    torch.manual_seed(index)
    # The MoE families' experts as plain per-expert products: transformers' default grouped_mm
    # takes no float64, which the reference logits are computed in.
    experts = {"experts_implementation": "eager"} if family in ("mixtral", "qwen2_moe", "qwen3_moe") else {}
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32, **experts)
    randomise(model, 1000 + index)
    model.eval()
    d = os.path.join(out, family)
    os.makedirs(d, exist_ok=True)
    shard = {"max_shard_size": "200KB"} if family == "llama" else {}
    model.save_pretrained(d, **shard)
    tokenizer.save_pretrained(d)
    g = torch.Generator().manual_seed(7 + index)
    input_ids = torch.randint(1, VOCAB, (PROMPTS, PROMPT_LEN), generator=g)
    with torch.no_grad():
        logits = model.to(torch.float64)(input_ids).logits
    save_file({"input_ids": input_ids.to(torch.int64).contiguous(),
               "logits": logits.to(torch.float32).contiguous()}, os.path.join(d, "reference.safetensors"))
    print(family, "->", sorted(os.listdir(d)))
    print(json.dumps(json.load(open(os.path.join(d, "config.json"))), indent=1))


def main(out):
    tokenizer = make_tokenizer()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    failed = []
    for index, (family, cfg) in enumerate(configs().items()):
        try:
            make_family(out, index, family, cfg, tokenizer)
        except Exception as e:  # the next family still runs; the exit status reports this one
            print(family, "FAILED:", repr(e), flush=True)
            failed.append(family)
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump(versions, f)
    print(versions)
    if failed:
        sys.exit("failed: " + " ".join(failed))


if __name__ == "__main__":
    main(sys.argv[1])
