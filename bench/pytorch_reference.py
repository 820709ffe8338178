"""PyTorch reference for `bench/bench_training.sh` and `bench/bench_dp.sh`: the same GPT models and
batch as megatron-cpp, trained the way a strong PyTorch user would, doing the same work: bf16
autocast over fp32 master parameters, torch.compile, SDPA, fused AdamW (weight decay on matrices
only, as Megatron), gradient clipping at 1.0, no host synchronisation inside the loop. Prints one
JSON line with tokens/s, TFLOP/s/GPU (Megatron's formula, causal attention halved), MFU, peak
memory, the optimizer state (fp32 parameters + Adam moments) and the implementation choices.

The choices (CHOICES below; every one keeps the model's maths) default to the fastest fair
combination measured by `bench/reference_variants.sh` (docs/PERFORMANCE.md). `--variant legacy` is
the reference as it was before that search; each choice can also be set on its own, which is how
reference_variants.sh measures what each one is worth.

Under torchrun (WORLD_SIZE > 1) it trains data-parallel: one process per GPU (LOCAL_RANK),
DistributedDataParallel with its default buckets and gradient_as_bucket_view (and no per-step
broadcast of the constant RoPE tables), then torch.compile,
each rank on its own random batches of --micro-batch-size. Only rank 0 prints; its tokens/s,
TFLOP/s and memory are per GPU.

The MoE preset (moe-1b-8x) adds Megatron's MoE layer (class MoE): its experts run as one
torch._grouped_mm by default (`--experts loop`: one matmul per expert; also taken, with a printed
note, where torch has no _grouped_mm). `bench/bench_moe.sh` runs it beside megatron-cpp.

Usage: python3 bench/pytorch_reference.py --preset gpt2-124m --micro-batch-size 32 --iters 20
       python3 bench/pytorch_reference.py --preset llama-1b --micro-batch-size 8 --variant legacy
       torchrun --nproc_per_node 4 bench/pytorch_reference.py --preset llama-1b --micro-batch-size 8
"""
import argparse
import json
import math
import os

import torch
import torch._inductor.config as inductor_config
import torch.nn as nn
import torch.nn.functional as F

# Shapes from ../shared/DESIGN.md (the benchmark presets everyone measures with).
PRESETS = {
    "gpt2-124m": dict(layers=12, hidden=768, heads=12, groups=12, ffn=3072, vocab=50304, seq=1024, llama=False),
    "llama-1b": dict(layers=16, hidden=2048, heads=32, groups=8, ffn=5632, vocab=32000, seq=2048, llama=True),
    "llama-3b": dict(layers=26, hidden=3072, heads=24, groups=8, ffn=8192, vocab=32000, seq=2048, llama=True),
    "llama-8b": dict(layers=32, hidden=4096, heads=32, groups=8, ffn=14336, vocab=128256, seq=2048, llama=True),
    # megatron-cpp's moe-1b-8x: llama-1b attention, every MLP replaced by 8 SwiGLU experts of width 2816,
    # top-2 softmax routing with Megatron's aux loss (coefficient 1e-2), dropless.
    "moe-1b-8x": dict(layers=16, hidden=2048, heads=32, groups=8, ffn=5632, vocab=32000, seq=2048, llama=True,
                      experts=8, topk=2, expert_ffn=2816, aux_loss_coeff=1e-2),
}

# How the reference is written; each value computes the same model.
CHOICES = {
    # RMSNorm: fp32 arithmetic written out, or F.rms_norm (one op inductor knows).
    "rms_norm": ("manual", "fused"),
    # RoPE: cos/sin tables built in fp32 inside every forward and applied in fp32, or built once and
    # kept in the compute dtype, as Megatron's rotary embedding applies them.
    "rope": ("fp32-per-step", "cached"),
    # The residual stream: autocast leaves the embedding output, and so every residual add, in fp32;
    # bf16 is what Megatron --bf16 (without --fp32-residual-connection) and megatron-cpp keep.
    "residual": ("fp32", "bf16"),
    # Grouped-query attention: SDPA's enable_gqa, or k and v repeated to every query head first (more
    # memory traffic, but every SDPA backend takes it).
    "gqa": ("native", "expand"),
    # The SDPA backends allowed: PyTorch's choice, or one of them alone (no silent fall-back to math).
    "sdpa": ("auto", "cudnn", "flash", "efficient"),
    "compile_mode": ("default", "max-autotune-no-cudagraphs", "max-autotune"),
    # Inductor's coordinate-descent tuning of its generated kernels' launch parameters.
    "coordinate_descent_tuning": ("off", "on"),
    # cuBLAS may reduce split-K partial sums of bf16 GEMMs in bf16 (PyTorch's default); "off" keeps
    # every accumulation in fp32, as megatron-cpp's cuBLASLt GEMMs (CUBLAS_COMPUTE_32F).
    "reduced_precision_reduction": ("torch-default", "off"),
    # MoE experts: torch._grouped_mm (one grouped GEMM over the expert-sorted tokens, PyTorch >= 2.8 on
    # Hopper; the fastest grouped matmul PyTorch offers) or a loop of one matmul per expert.
    "experts": ("grouped_mm", "loop"),
}

VARIANTS = {
    "legacy": dict(rms_norm="manual", rope="fp32-per-step", residual="fp32", gqa="native", sdpa="auto",
                   compile_mode="default", coordinate_descent_tuning="off",
                   reduced_precision_reduction="torch-default", experts="loop"),
    # Measured on one H100 (2026-11-25, llama-1b mbs 8, PERFORMANCE.md): 84.3k tokens/s legacy,
    # 94.6k with k and v expanded, 95.4k with enable_gqa on cuDNN (the fastest row).
    "tuned": dict(rms_norm="fused", rope="cached", residual="bf16", gqa="native", sdpa="cudnn",
                  compile_mode="default", coordinate_descent_tuning="off", reduced_precision_reduction="off",
                  experts="grouped_mm"),
}


def megatron_flops(p, global_batch):
    """FLOPs per iteration, megatron-compat.md section 5.2 (dense path, or every layer MoE)."""
    h, L, V, n, g, F_ = p["hidden"], p["layers"], p["vocab"], p["heads"], p["groups"], p["ffn"]
    d = h // n
    s = p["seq"]
    e = 3 if p["llama"] else 2
    attn_proj = 6 * (h * (n * d + 2 * g * d) + n * d * h)
    mlp = 6 * h * (p["expert_ffn"] * p["topk"] if "experts" in p else F_) * e
    logits = 6 * h * V
    per_token = L * mlp + L * attn_proj + logits
    return global_batch * s * per_token + global_batch * s * s * L * 6 * n * d


class RMSNorm(nn.Module):
    def __init__(self, dim, fused, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.fused = fused
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        if self.fused:
            return F.rms_norm(x, (x.size(-1),), self.weight.to(x.dtype), self.eps)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(seq, dim, base, device):
    """cos, sin (seq, dim) in fp32: Megatron's rotary embedding, the two halves rotated alike."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """x (B, heads, S, d) rotated by position: x cos + rotate_half(x) sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).type_as(x)


class MoE(nn.Module):
    """Megatron's MoE layer: an fp32 router, softmax over each token's top-k logits, the load-balancing
    loss (full softmax, top-k counts), the tokens sorted by expert, SwiGLU experts, and the outputs
    summed back weighted by their probabilities."""

    def __init__(self, p, c):
        super().__init__()
        h, E, F_ = p["hidden"], p["experts"], p["expert_ffn"]
        self.E, self.k, self.coeff, self.F = E, p["topk"], p["aux_loss_coeff"], F_
        self.grouped = c["experts"] == "grouped_mm"
        self.force_load_balancing = p.get("force_load_balancing", False)
        self.router = nn.Linear(h, E, bias=False)
        # (E, out, in) stacks, as megatron-cpp's experts; used transposed: (E, in, out) column-major,
        # the layout torch._grouped_mm reads without a copy.
        self.w1 = nn.Parameter(torch.empty(E, 2 * F_, h))
        self.w2 = nn.Parameter(torch.empty(E, h, F_))
        self.record_load = False  # set outside the compiled steps: keep the tokens per expert (load)
        self.load = None

    def experts(self, x, w, counts, offsets):
        if self.grouped:
            return torch._grouped_mm(x, w.transpose(-2, -1).to(x.dtype), offs=offsets)
        return torch.cat([xe @ w[e].to(x.dtype).t() for e, xe in enumerate(x.split(counts))])

    def forward(self, x):
        B, S, H = x.shape
        t = x.reshape(-1, H)
        logits = F.linear(t.float(), self.router.weight.float())  # the router in fp32
        if self.force_load_balancing:  # Megatron's RandomSTE: N(0,1) logits, gradient straight through
            logits = logits + (torch.randn_like(logits) - logits).detach()
        top_logits, top_idx = logits.topk(self.k, dim=-1)
        probs = top_logits.softmax(dim=-1)
        scores = logits.softmax(dim=-1)
        counts_all = torch.zeros_like(scores).scatter(1, scores.topk(self.k, dim=-1).indices, 1.0).sum(0)
        T = t.shape[0]
        aux = self.coeff * self.E / (self.k * T * T) * (scores.sum(0) * counts_all).sum()
        flat = top_idx.reshape(-1)
        order = flat.argsort(stable=True)
        tokens = t[order // self.k]
        counts_t = F.one_hot(flat, self.E).sum(0)  # static shape: no graph break under torch.compile
        offsets = counts_t.cumsum(0).to(torch.int32)
        counts = None if self.grouped else counts_t.tolist()
        if self.record_load:
            self.load = counts_t.detach()
        h1 = self.experts(tokens, self.w1, counts, offsets)
        gate, up = h1.chunk(2, dim=-1)
        y = self.experts(F.silu(gate) * up, self.w2, counts, offsets)
        y = y * probs.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
        out = torch.zeros_like(t).index_add_(0, order // self.k, y.to(t.dtype))
        return out.view(B, S, H), aux


class Block(nn.Module):
    def __init__(self, p, c):
        super().__init__()
        h, self.n, self.g = p["hidden"], p["heads"], p["groups"]
        self.d = h // self.n
        self.llama = p["llama"]
        self.expand_kv = c["gqa"] == "expand" and self.g != self.n
        bias = not self.llama
        norm = (lambda: RMSNorm(h, c["rms_norm"] == "fused")) if self.llama else (lambda: nn.LayerNorm(h))
        self.norm1, self.norm2 = norm(), norm()
        self.qkv = nn.Linear(h, (self.n + 2 * self.g) * self.d, bias=bias)  # one fused QKV projection
        self.proj = nn.Linear(self.n * self.d, h, bias=bias)
        self.moe = MoE(p, c) if "experts" in p else None
        if self.moe is None:
            self.fc1 = nn.Linear(h, p["ffn"] * (2 if self.llama else 1), bias=bias)  # [gate; up] fused for SwiGLU
            self.fc2 = nn.Linear(p["ffn"], h, bias=bias)

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([self.n * self.d, self.g * self.d, self.g * self.d], dim=-1)
        q = q.view(B, S, self.n, self.d).transpose(1, 2)
        k = k.view(B, S, self.g, self.d).transpose(1, 2)
        v = v.view(B, S, self.g, self.d).transpose(1, 2)
        if self.llama:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.expand_kv:  # query head i reads group i // (n / g), as enable_gqa
            k = k.repeat_interleave(self.n // self.g, dim=1)
            v = v.repeat_interleave(self.n // self.g, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.g != self.n and not self.expand_kv)
        x = x + self.proj(a.transpose(1, 2).reshape(B, S, -1))
        if self.moe is not None:
            m, aux = self.moe(self.norm2(x))
            return x + m, aux
        m = self.fc1(self.norm2(x))
        if self.llama:
            gate, up = m.chunk(2, dim=-1)
            m = F.silu(gate) * up
        else:
            m = F.gelu(m, approximate="tanh")
        return x + self.fc2(m), 0.0


class GPT(nn.Module):
    def __init__(self, p, c):
        super().__init__()
        self.p = p
        self.rope = c["rope"]
        self.residual_dtype = torch.bfloat16 if c["residual"] == "bf16" else None
        self.wte = nn.Embedding(p["vocab"], p["hidden"])
        self.wpe = None if p["llama"] else nn.Embedding(p["seq"], p["hidden"])
        self.blocks = nn.ModuleList(Block(p, c) for _ in range(p["layers"]))
        self.norm = RMSNorm(p["hidden"], c["rms_norm"] == "fused") if p["llama"] else nn.LayerNorm(p["hidden"])
        self.head = nn.Linear(p["hidden"], p["vocab"], bias=False)
        if not p["llama"]:
            self.head.weight = self.wte.weight  # tied, as GPT-2
        for name, w in self.named_parameters():
            if w.dim() >= 2:
                std = 0.02 / math.sqrt(2 * p["layers"]) if name.endswith(("proj.weight", "fc2.weight", "w2")) else 0.02
                nn.init.normal_(w, std=std)
        if p["llama"] and self.rope == "cached":
            cos, sin = rope_tables(p["seq"], p["hidden"] // p["heads"], 10000.0, "cpu")
            self.register_buffer("cos", cos.to(torch.bfloat16), persistent=False)
            self.register_buffer("sin", sin.to(torch.bfloat16), persistent=False)

    def forward(self, tokens, labels):
        B, S = tokens.shape
        x = self.wte(tokens)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(S, device=tokens.device))
        if self.residual_dtype is not None:
            x = x.to(self.residual_dtype)
        cos = sin = None
        if self.p["llama"]:
            if self.rope == "cached":
                cos, sin = self.cos[:S], self.sin[:S]
            else:
                cos, sin = rope_tables(S, self.p["hidden"] // self.p["heads"], 10000.0, tokens.device)
        aux = 0.0
        for b in self.blocks:
            x, block_aux = b(x, cos, sin)
            aux = aux + block_aux
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.reshape(-1)) + aux


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--micro-batch-size", type=int, required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--moe-router-force-load-balancing", action="store_true",
                    help="MoE presets: route on random N(0,1) logits (Megatron's benchmark aid), a balanced load")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="tuned",
                    help="the choices' defaults: tuned (the reference) or legacy (before the variant search)")
    for key, values in CHOICES.items():
        ap.add_argument("--" + key.replace("_", "-"), choices=values, default=None,
                        help=f"overrides the variant's {key}")
    a = ap.parse_args()
    if a.moe_router_force_load_balancing and "experts" not in PRESETS[a.preset]:
        ap.error(f"--moe-router-force-load-balancing needs a MoE preset; {a.preset} has no experts (use moe-1b-8x)")
    choices = dict(VARIANTS[a.variant])
    for key in CHOICES:
        value = getattr(a, key)
        if value is not None:
            choices[key] = value
    if "experts" in PRESETS[a.preset] and choices["experts"] == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        # The JSON line's choices then say "loop": the numbers are those of the per-expert loop.
        print(f"note: torch {torch.__version__} has no torch._grouped_mm (PyTorch >= 2.8); the experts run as a "
              "per-expert loop of matmuls instead", flush=True)
        choices["experts"] = "loop"
    return a, choices


def configure_backends(c):
    """Global settings the compiled graphs are traced with. fp32 GEMMs stay fp32 (no TF32: PyTorch's
    default, and megatron-cpp's)."""
    if c["reduced_precision_reduction"] == "off":
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    if c["sdpa"] != "auto":
        torch.backends.cuda.enable_cudnn_sdp(c["sdpa"] == "cudnn")
        torch.backends.cuda.enable_flash_sdp(c["sdpa"] == "flash")
        torch.backends.cuda.enable_mem_efficient_sdp(c["sdpa"] == "efficient")
        torch.backends.cuda.enable_math_sdp(False)  # a backend that cannot take the inputs fails loudly
    if c["coordinate_descent_tuning"] == "on":
        inductor_config.coordinate_descent_tuning = True


def expert_load(model, batch):
    """[min, max] tokens per expert over every MoE layer for the trained model on the last step's batch,
    as megatron-cpp logs "tokens per expert (min/max)": one forward outside the compiled graph."""
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    for m in moes:
        m.record_load = True
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        getattr(model, "module", model)(batch[:, :-1], batch[:, 1:])
    loads = torch.stack([m.load for m in moes])
    for m in moes:
        m.record_load = False
    return [int(loads.min()), int(loads.max())]


def main():
    a, c = parse_args()
    p = dict(PRESETS[a.preset], force_load_balancing=a.moe_router_force_load_balancing)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    if world > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.distributed.init_process_group("nccl")
        rank = torch.distributed.get_rank()
    configure_backends(c)
    torch.manual_seed(1234)
    dev = torch.device("cuda", torch.cuda.current_device()) if world > 1 else torch.device("cuda")
    model = GPT(p, c).to(dev)  # fp32 master parameters
    if world > 1:
        # broadcast_buffers off: the only buffers are the RoPE tables, constants on every rank.
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index], gradient_as_bucket_view=True,
                                                          broadcast_buffers=False)
    # Megatron's (and megatron-cpp's) default weight decay, on matrices only: not on biases and norms.
    decay = [w for w in model.parameters() if w.dim() >= 2]
    no_decay = [w for w in model.parameters() if w.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, fused=True)
    cudagraphs = not a.no_compile and c["compile_mode"] == "max-autotune"
    if a.no_compile:
        step_model = model
    else:
        mode = None if c["compile_mode"] == "default" else c["compile_mode"]
        # fullgraph: a graph break would cost speed, so there must be none (DDP's graphs are split at
        # its buckets by design).
        # The expert loop reads the token counts on the host: a graph break by design.
        expert_loop = "experts" in p and c["experts"] == "loop"
        step_model = torch.compile(model, fullgraph=world == 1 and not expert_loop, mode=mode)
    B, S, V = a.micro_batch_size, p["seq"], p["vocab"]
    gen = torch.Generator(device=dev).manual_seed(rank)
    # A fresh batch of uniform random tokens every step, as bench_moe.sh gives megatron-cpp: the
    # MoE routing (and so the experts' GEMM shapes) depends on what the model has seen.
    data = [torch.randint(0, V, (B, S + 1), device=dev, generator=gen) for _ in range(a.warmup + a.iters)]

    def step(i):
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs are done with
        batch = data[i % len(data)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(a.warmup):
        step(i)
    torch.cuda.synchronize()
    if world > 1:
        torch.distributed.barrier(device_ids=[dev.index])  # every rank compiled and warmed up: time them together
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(a.warmup, a.warmup + a.iters):
        loss = step(i)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / a.iters
    tflops = megatron_flops(p, B) / (ms * 1e-3) / 1e12
    # This rank's optimizer state: the fp32 parameters (the master copy under autocast) and the
    # Adam moments.
    state_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    for s in opt.state.values():
        state_bytes += sum(s[k].numel() * s[k].element_size() for k in ("exp_avg", "exp_avg_sq"))
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    peak_reserved_gib = torch.cuda.max_memory_reserved() / 2**30
    load = expert_load(model, data[-1]) if "experts" in p else None
    if rank == 0:
        print(json.dumps({
            "engine": "pytorch" + ("" if a.no_compile else "+compile") + ("+ddp" if world > 1 else ""),
            "preset": a.preset, "micro_batch_size": B, "gpus": world,
            "ms_per_iteration": round(ms, 2), "tokens_per_second": round(B * S / (ms * 1e-3)),
            "tflops_per_gpu": round(tflops, 1), "mfu_percent": round(100 * tflops / 989.0, 1),
            "peak_memory_gib": round(peak_gib, 2), "peak_reserved_gib": round(peak_reserved_gib, 2),
            "loss": round(loss.item(), 4), **({"tokens_per_expert_min_max": load} if load else {}),
            "optimizer_state_mib": round(state_bytes / 2**20, 1), "torch": torch.__version__,
            "variant": a.variant, "choices": c, "moe_router_force_load_balancing": a.moe_router_force_load_balancing,
        }), flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
