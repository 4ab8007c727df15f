"""torch_target_peer.py: the PyTorch peers of `dflash bench`'s target rows
and of its skinny GEMMs.

Owns two measurements on random bf16 weights:

1. A Qwen3 target forward of 1 row (decode) and 16 rows (verify) at a given
   context, at the Qwen3-8B geometry by default: merged q/k/v and gate/up
   weights, bf16 static KV cache, q/k RMSNorm, RoPE, scaled_dot_product_attention
   over the cache (a boolean mask hides positions not written yet), the LM
   head for every row. The whole forward is captured as one CUDA graph and
   replayed (the KV write goes to the same positions every replay, so the
   state does not grow). This is a plain PyTorch implementation, not a
   serving engine: engines with their own kernels get closer to the floor.
2. The vendor skinny GEMM (cuBLAS through torch.matmul, bf16; fp8 weights
   through torch._scaled_mm where the build has it) at the shapes of the
   drafters and the 8B target, 1 / 16 / 64 rows, each matrix alone with
   the L2 flushed before every sample.

Timing: CUDA events, 3 warm-up calls, then --reps calls, median and min.
Floor = bytes that must move / bandwidth of a large tensor copy measured
here (bytes read + written). Columns as `dflash bench`.

Usage (on the GPU machine):
  python3 tools/bench/torch_target_peer.py [--ctx LIST] [--reps N] [--layers L]
      [--no-gemm] [--no-target]
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_drafter_peer import WARMUP, graphed  # noqa: E402  (same warm-up and graph capture)
GEOM = dict(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=12288, vocab=151936,
            theta=1e6, eps=1e-6)


def time_us(fn, reps, flush=None):
    for _ in range(WARMUP):
        fn()
    out = []
    for _ in range(reps):
        if flush is not None:
            flush()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out), min(out)


def bandwidth():
    n = (2 << 30) // 4
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    med, _ = time_us(lambda: dst.copy_(src), 5)
    del src, dst
    return 2 * n * 4 / (med * 1e-6)


def rms(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Target:
    """Random Qwen3 weights at the geometry g with L layers."""

    def __init__(self, g, L, gen):
        H, D, I, V = g["hidden"], g["head_dim"], g["inter"], g["vocab"]
        QD, KD = g["heads"] * D, g["kv_heads"] * D

        def mat(r, c):
            return (torch.randn(r, c, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)

        def norm(n):
            return (1 + 0.1 * (2 * torch.rand(n, generator=gen, device="cuda") - 1)).to(torch.bfloat16)

        self.g, self.L = g, L
        self.embed, self.lm_head, self.norm = mat(V, H), mat(V, H), norm(H)
        self.layers = [dict(qkv=mat(QD + 2 * KD, H), o=mat(H, QD), gu=mat(2 * I, H), down=mat(H, I),
                            n1=norm(H), n2=norm(H), qn=norm(D), kn=norm(D)) for _ in range(L)]
        self.bytes = sum(t.numel() * 2 for lw in self.layers for t in lw.values())
        self.bytes += self.lm_head.numel() * 2 + self.norm.numel() * 2


class Forward:
    """n rows at positions ctx..ctx+n-1 over a static cache of ctx + n."""

    def __init__(self, t, ctx, n, gen):
        g = t.g
        D, KVH, H = g["head_dim"], g["kv_heads"], g["heads"]
        self.t, self.n, self.ctx = t, n, ctx
        m = ctx + n
        self.k = [torch.randn(m, KVH, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(t.L)]
        self.v = [torch.randn(m, KVH, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(t.L)]
        self.kv_bytes = 2 * t.L * m * KVH * D * 2
        self.ids = torch.randint(0, g["vocab"], (n,), generator=gen, device="cuda")
        self.pos = torch.arange(ctx, ctx + n, device="cuda")
        inv = 1.0 / (g["theta"] ** (torch.arange(0, D, 2, device="cuda").float() / D))
        ang = self.pos.float()[:, None] * inv[None, :]
        self.cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :].to(torch.bfloat16)
        self.sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :].to(torch.bfloat16)
        # row i sees keys 0..ctx+i
        self.mask = (torch.arange(m, device="cuda")[None, :] <= self.pos[:, None])[None, None]
        self.H, self.KVH, self.D = H, KVH, D

    def rope(self, x):
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], -1)
        return x * self.cos + rot * self.sin

    @torch.no_grad()
    def __call__(self):
        t, g, n = self.t, self.t.g, self.n
        H, KVH, D = self.H, self.KVH, self.D
        x = t.embed[self.ids]
        for li, w in enumerate(t.layers):
            h = rms(x, w["n1"], g["eps"])
            qkv = h @ w["qkv"].t()
            q = qkv[:, : H * D].view(n, H, D)
            k = qkv[:, H * D:(H + KVH) * D].view(n, KVH, D)
            v = qkv[:, (H + KVH) * D:].view(n, KVH, D)
            q = self.rope(rms(q, w["qn"], g["eps"]))
            k = self.rope(rms(k, w["kn"], g["eps"]))
            self.k[li][self.ctx:] = k
            self.v[li][self.ctx:] = v
            a = F.scaled_dot_product_attention(q.transpose(0, 1)[None], self.k[li].transpose(0, 1)[None],
                                               self.v[li].transpose(0, 1)[None], attn_mask=self.mask,
                                               enable_gqa=True)
            x = x + a[0].transpose(0, 1).reshape(n, H * D) @ w["o"].t()
            h = rms(x, w["n2"], g["eps"])
            gu = h @ w["gu"].t()
            gate, up = gu.chunk(2, -1)
            x = x + (F.silu(gate) * up) @ w["down"].t()
        return rms(x, t.norm, g["eps"]) @ t.lm_head.t()


def gemm_rows(bw, reps):
    shapes = [("seed q/k/v", 5120, 2048), ("seed o", 2048, 4096), ("seed gate+up", 12288, 2048),
              ("seed down", 2048, 6144), ("8b q/k/v", 6144, 4096), ("8b o", 4096, 4096),
              ("8b gate+up", 24576, 4096), ("8b down", 4096, 12288), ("lm head 2048", 151936, 2048),
              ("lm head 4096", 151936, 4096)]
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def flush():
        flush_buf.add_(1)

    has_fp8 = hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")
    out = []
    for name, N, K in shapes:
        w = (torch.randn(N, K, device="cuda") * 0.02).to(torch.bfloat16)
        wf8 = w.to(torch.float8_e4m3fn) if has_fp8 else None
        one = torch.ones((), device="cuda")
        for M in (1, 16, 64):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            med, mn = time_us(lambda: x @ w.t(), reps, flush)
            nbytes = N * K * 2
            out.append((f"{name} bf16", M, N, K, med, mn, nbytes))
            if has_fp8:
                # _scaled_mm wants M a multiple of 16 and fp8 activations
                mp = max(16, (M + 15) // 16 * 16)
                xf8 = torch.randn(mp, K, device="cuda").to(torch.float8_e4m3fn)
                try:
                    fn = lambda: torch._scaled_mm(xf8, wf8.t(), scale_a=one, scale_b=one,  # noqa: E731
                                                  out_dtype=torch.bfloat16)
                    med, mn = time_us(fn, reps, flush)
                    out.append((f"{name} fp8", M, N, K, med, mn, N * K))
                except RuntimeError as e:
                    print(f"torch_target_peer: _scaled_mm {name}: {e}", file=sys.stderr)
                    has_fp8 = False
        del w, wf8
    print(f"\ncuBLAS skinny GEMM through torch (each matrix alone, L2 flushed; floor = weight bytes / "
          f"{bw / 1e9:.0f} GB/s)")
    print(f"{'matrix':<22} {'rows':>5} {'N':>7} {'K':>6} {'median_us':>10} {'min_us':>9} {'MB':>8} {'%floor':>7}")
    for name, M, N, K, med, mn, nbytes in out:
        fl = nbytes / bw * 1e6
        print(f"{name:<22} {M:>5} {N:>7} {K:>6} {med:>10.1f} {mn:>9.1f} {nbytes / 1e6:>8.1f} {100 * fl / med:>6.1f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctx", default="1,1024,4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=GEOM["layers"], help="target layers (36: Qwen3-8B)")
    ap.add_argument("--no-gemm", action="store_true")
    ap.add_argument("--no-target", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_target_peer: needs a GPU (torch sees none)")
    bw = bandwidth()
    print(f"torch_target_peer: {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"copy bandwidth {bw / 1e9:.1f} GB/s (2 GiB tensor copy, read + written, median of 5)")
    if not a.no_target:
        gen = torch.Generator(device="cuda").manual_seed(0)
        g = dict(GEOM)
        t = Target(g, a.layers, gen)
        print(f"target: {a.layers} layers, H {g['hidden']}, I {g['inter']}, {g['heads']}:{g['kv_heads']} x "
              f"{g['head_dim']}, vocab {g['vocab']}, untied LM head; bf16 weights and KV; one CUDA graph per call")
        print(f"{'op':<14} {'rows':>5} {'ctx':>7} {'median_us':>12} {'min_us':>12} {'MB':>10} {'floor_us':>12} "
              f"{'%floor':>8}")
        for ctx in sorted({int(c) for c in a.ctx.split(",") if c}):
            for name, n in (("verify/graph", 16), ("decode/graph", 1)):
                f = Forward(t, ctx, n, gen)
                fn = graphed(f)
                med, mn = time_us(fn, a.reps)
                nbytes = t.bytes + f.kv_bytes + n * g["hidden"] * 2
                fl = nbytes / bw * 1e6
                print(f"{name:<14} {n:>5} {ctx:>7} {med:>12.1f} {mn:>12.1f} {nbytes / 1e6:>10.1f} {fl:>12.1f} "
                      f"{100 * fl / med:>7.1f}%")
                del f, fn
                torch.cuda.empty_cache()
        del t
        torch.cuda.empty_cache()
    if not a.no_gemm:
        gemm_rows(bw, a.reps)


if __name__ == "__main__":
    main()
