"""PyTorch scaled_dot_product_attention on the shapes of bench/kernels/attention.cu, timed the
same way (median of CUDA-event timings after warm-up), for the side-by-side attention table.
Times the backend PyTorch picks by default and each of its fused backends it can run on the
shape (flash, cuDNN, memory-efficient), so the table says which one the default is.

Run on the GPU machine: python3 bench/kernels/attention_sdpa.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [  # name, B, S, NH, G, HS, causal
    ("gpt2-124m", 16, 1024, 12, 12, 64, True),
    ("llama-1b", 4, 2048, 32, 8, 64, True),
    ("hs128", 4, 2048, 16, 16, 128, True),
    ("hs128-full", 4, 2048, 16, 16, 128, False),
]

BACKENDS = [  # label, backends allowed (None: PyTorch's default choice)
    ("default", None),
    ("flash", [SDPBackend.FLASH_ATTENTION]),
    ("cudnn", [SDPBackend.CUDNN_ATTENTION]),
    ("efficient", [SDPBackend.EFFICIENT_ATTENTION]),
]


def median_ms(fn, warmup=3, iters=15):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def time_shape(B, S, NH, G, HS, causal, backends):
    q = torch.randn(B, NH, S, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, G, S, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, G, S, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(B, NH, S, HS, device="cuda", dtype=torch.bfloat16)

    def run():
        if backends is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=G != NH)
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=G != NH)

    fwd = median_ms(run)
    out = run()
    bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return fwd, bwd


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}\n")
    print("| shape      | B     S  NH  G  HS | mask   | backend   | fwd ms   | TFLOP/s | bwd ms   | TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, B, S, NH, G, HS, causal in SHAPES:
        flops = 4.0 * B * NH * S * S * HS * (0.5 if causal else 1.0)
        mask = "causal" if causal else "full"
        for label, backends in BACKENDS:
            prefix = f"| {name:<10} | {B:2d} {S:5d} {NH:3d} {G:2d} {HS:3d} | {mask:<6} | {label:<9} |"
            try:
                fwd, bwd = time_shape(B, S, NH, G, HS, causal, backends)
            except RuntimeError as e:  # the backend cannot run this shape
                print(f"{prefix} n/a: {str(e).splitlines()[0][:60]} | | | |")
                continue
            print(f"{prefix} {fwd:8.3f} | {flops / fwd * 1e-9:6.1f} | {bwd:8.3f} | {2.5 * flops / bwd * 1e-9:6.1f} |")


if __name__ == "__main__":
    main()
