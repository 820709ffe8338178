#!/usr/bin/env python3
"""The Hugging Face bridge's acceptance on the GPU machine (driven by tests/hf/gpu_acceptance.sh,
one family at a time, so that one family's files are gone before the next one's are made).

  prepare WORK FAMILY  transformers builds a randomly initialised model from a config shaped like
                       Llama-3.2-1B (llama), Mistral-7B with two layers (mistral), Qwen2.5-0.5B
                       (qwen2), Qwen3-0.6B (qwen3), GPT-2 (gpt2), Mixtral-8x7B with one layer
                       (mixtral), Qwen1.5-MoE-A2.7B (qwen2_moe) or Qwen3-30B-A3B (qwen3_moe) with
                       two, no download, saves it as WORK/FAMILY/hf with a small
                       byte-level BPE tokenizer, and writes WORK/FAMILY/reference.safetensors: 8
                       prompts (input_ids, I64 8 x 32) and transformers' fp32 logits for them (TF32
                       off), plus a batch (batch_ids, 2 x 65) for the fine-tuning check.
  check WORK FAMILY    after the import, our logits test (test_hf_acceptance), the export and the
                       fine-tuning run: AutoModelForCausalLM and AutoTokenizer load
                       WORK/FAMILY/exported as it is and give the reference logits (the weights went
                       through import and export unchanged: 1e-5); and WORK/FAMILY/finetuned-hf
                       (exported after 50 steps of `megatron train`) gives on the batch the loss our
                       model computed from the same checkpoint (WORK/FAMILY/our_finetuned_loss.txt),
                       within 1e-4 relative. Exits 1 on a failure, naming it.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_checkpoints import make_tokenizer  # noqa: E402

PROMPTS, PROMPT_LEN = 8, 32
TOKENIZER_VOCAB = 320  # prompts draw ids below the tokenizer's size; logits cover every row


def configs():
    llama_3_2_1b = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
    mistral_7b_two_layers = transformers.MistralConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=10000.0,
        sliding_window=16, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    qwen2_5_0_5b = transformers.Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, use_sliding_window=False, bos_token_id=0, eos_token_id=0)
    # Its heads (16 x 128) are twice as wide as its hidden size: --kv-channels is not hidden / heads.
    qwen3_0_6b = transformers.Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
        use_sliding_window=False, bos_token_id=0, eos_token_id=0)
    gpt2 = transformers.GPT2Config(bos_token_id=0, eos_token_id=0)
    # The MoE families with their hub models' layer shapes and fewer layers (fp32 weights and the
    # fine-tuning's Adam state of the whole model fit one GPU): Mixtral-8x7B (one layer),
    # Qwen1.5-MoE-A2.7B (two: the first dense through mlp_only_layers), Qwen3-30B-A3B (two).
    mixtral_8x7b_one_layer = transformers.MixtralConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=1, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=1000000.0,
        num_local_experts=8, num_experts_per_tok=2, sliding_window=None, tie_word_embeddings=False, bos_token_id=0,
        eos_token_id=0)
    qwen1_5_moe_a2_7b_two_layers = transformers.Qwen2MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2, num_attention_heads=16,
        num_key_value_heads=16, max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1000000.0,
        num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
        norm_topk_prob=False, mlp_only_layers=[0], use_sliding_window=False, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0)
    qwen3_30b_a3b_two_layers = transformers.Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, norm_topk_prob=True, use_sliding_window=False, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0)
    # sliding_window 16 < the 32-token prompts, so Mistral's window matters here (4096 would not).
    return {"llama": llama_3_2_1b, "mistral": mistral_7b_two_layers, "qwen2": qwen2_5_0_5b, "qwen3": qwen3_0_6b,
            "gpt2": gpt2, "mixtral": mixtral_8x7b_one_layer, "qwen2_moe": qwen1_5_moe_a2_7b_two_layers,
            "qwen3_moe": qwen3_30b_a3b_two_layers}


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids.cuda()).logits.float().cpu()


def load_model(directory):
    return AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager",
                                                dtype=torch.float32).cuda().eval()


def prepare(work, family):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    index = list(configs()).index(family)
    torch.manual_seed(index)
    # Built on the GPU: initialising a 1B model's weights on the CPU takes longer than the rest.
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(configs()[family], attn_implementation="eager", dtype=torch.float32)
    model.eval()
    d = os.path.join(work, family)
    model.save_pretrained(os.path.join(d, "hf"))
    make_tokenizer().save_pretrained(os.path.join(d, "hf"))
    # The reference logits come from the saved model loaded as check() loads the export: a model
    # built on the GPU computes RoPE's inverse frequencies there, one loaded from disk on the CPU,
    # and the two differ in the last bit (1e-5 in the logits), which is not the export's doing.
    del model
    model = load_model(os.path.join(d, "hf"))
    g = torch.Generator().manual_seed(100 + index)
    ids = torch.randint(1, TOKENIZER_VOCAB, (PROMPTS, PROMPT_LEN), generator=g)
    batch = torch.randint(1, TOKENIZER_VOCAB, (2, 65), generator=g)
    save_file({"input_ids": ids.contiguous(), "logits": logits_of(model, ids).contiguous(),
               "batch_ids": batch.contiguous()}, os.path.join(d, "reference.safetensors"))
    print(family, "prepared", flush=True)


def check(work, family):
    torch.backends.cuda.matmul.allow_tf32 = False
    failures = []
    d = os.path.join(work, family)
    ref = load_file(os.path.join(d, "reference.safetensors"))
    AutoTokenizer.from_pretrained(os.path.join(d, "exported"))
    exported = load_model(os.path.join(d, "exported"))
    error = (logits_of(exported, ref["input_ids"]) - ref["logits"]).abs().max().item()
    print(f"{family}: exported model's logits differ from the original's by {error:.3g} (bound 1e-5)")
    if not error <= 1e-5:
        failures.append(f"{family} export")
    del exported
    tuned = load_model(os.path.join(d, "finetuned-hf"))
    batch = ref["batch_ids"].cuda()
    with torch.no_grad():
        loss = tuned.eval()(batch, labels=batch).loss.item()  # mean over the 2 x 64 next-token predictions
    ours = float(open(os.path.join(d, "our_finetuned_loss.txt")).read())
    print(f"{family}: after 50 fine-tuning steps, transformers' loss {loss:.6f}, ours {ours:.6f} (bound 1e-4 relative)")
    if not abs(loss - ours) <= 1e-4 * abs(ours):
        failures.append(f"{family} fine-tuned loss")
    print(json.dumps({"family": family, "failures": failures}), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("prepare", "check") or sys.argv[3] not in configs():
        sys.exit(f"usage: {sys.argv[0]} prepare|check WORK {'|'.join(configs())}")
    {"prepare": prepare, "check": check}[sys.argv[1]](sys.argv[2], sys.argv[3])
