"""torch_drafter_peer.py: the PyTorch peer of `dflash bench`.

Owns one measurement: a DFlash drafter propose (block forward over
[last token, MASK x (B-1)], LM head, argmax) in PyTorch at the bench's
preset geometries, on random bf16 weights, with the context K/V already
built. It reuses tools/fixtures/dflash_ref.py's math (DFlashDrafter for the
context K/V, qwen3_layer / rms_norm for the block), with two substitutions
that make it the peer rather than the reference:

- rms_norm returns the weight's dtype (Hugging Face Qwen3RMSNorm does), so
  the whole forward runs in bf16 as a deployed drafter does (the reference
  upcasts everything to f32);
- attention is torch's scaled_dot_product_attention (`--attn sdpa`, the
  default where it exists: torch >= 2.0) or the reference's own (`--attn ref`).

RoPE tables, token ids and positions are built once outside the timed
region (they would be host-to-device copies, which a CUDA graph cannot
capture). On CUDA each context length is timed eagerly and replayed as one
torch.cuda.CUDAGraph, with torch.cuda.Event pairs: 3 warm-up calls, then
--reps timed calls, median and min. On the CPU (no graphs) only eager runs;
that path exists to smoke-test this script, with --preset tiny.

The table has the columns of `dflash bench` but its seqs: op, rows, ctx, median_us,
min_us, MB, floor_us, %floor. Floor = bytes that must move / bandwidth
measured here (a large tensor copy, bytes read + written, median of 5):
the drafter's layer weights and final norm, the LM head (V x H, bf16), the
block's embedding rows and the context K/V in bf16 (this peer keeps K/V in
bf16; dflash's pool is f32, so its floor counts twice the K/V bytes).

Usage:
  python3 tools/bench/torch_drafter_peer.py [--preset P] [--ctx LIST]
      [--reps N] [--device cpu|cuda|auto] [--attn sdpa|ref] [--no-graph] [--json]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
import dflash_ref as R  # noqa: E402

WARMUP = 3

# The drafter presets of src/cli/cmd_bench.c (same numbers).
PRESETS = {
    "seed-drafter": dict(layers=8, hidden=2048, heads=32, kv_heads=4, head_dim=128, inter=6144,
                         vocab=151936, block=16, target_layers=40, taps=[1, 10, 19, 28, 37]),
    "qwen3-8b-drafter": dict(layers=5, hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=12288,
                             vocab=151936, block=16, target_layers=36, taps=[1, 9, 17, 25, 33]),
    "tiny": dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, inter=128,
                 vocab=512, block=8, target_layers=4, taps=[1, 2]),
}


# ------------------------------------------------------------ the substitutions


def hf_rms_norm(x, w, eps):
    """Qwen3RMSNorm as transformers computes it: statistics in f32, the
    result in the input's dtype times the weight."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * y.to(x.dtype)


def sdpa_attention(q, k, v, mask, scale):
    """R.attention's contract (q [N, Hq, D], k/v [M, Hkv, D], mask None or
    bool [N, M]) through F.scaled_dot_product_attention."""
    hq, hkv = q.shape[-2], k.shape[-2]
    if hq != hkv:
        # Query head h reads kv head h // (hq / hkv). expand + reshape rather
        # than repeat_interleave, which may build its repeats tensor on the
        # host: not something a CUDA graph can capture.
        m, dim = k.shape[-3], k.shape[-1]
        k = k.unsqueeze(-2).expand(m, hkv, hq // hkv, dim).reshape(m, hq, dim)
        v = v.unsqueeze(-2).expand(m, hkv, hq // hkv, dim).reshape(m, hq, dim)
    qh, kh, vh = (t.transpose(-3, -2).unsqueeze(0) for t in (q, k, v))  # [1, H, N|M, D]
    # The default scale of sdpa is D^-0.5, which is what the drafter uses.
    assert abs(scale - q.shape[-1] ** -0.5) < 1e-12
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    out = out.squeeze(0).transpose(-3, -2)  # [N, Hq, D]
    return out.reshape(*out.shape[:-2], out.shape[-2] * out.shape[-1])


# ------------------------------------------------------------ the drafter


def random_drafter(p, device, dtype, seed=0):
    """A DFlashDrafter (dflash_ref) with random weights: projections of std
    0.02, norms near 1, a shared V x H embedding / LM head."""
    gen = torch.Generator(device=device).manual_seed(seed)
    H, D, L = p["hidden"], p["head_dim"], p["layers"]
    QD, KD, I = p["heads"] * D, p["kv_heads"] * D, p["inter"]

    def mat(rows, cols):
        return (torch.randn(rows, cols, generator=gen, device=device, dtype=torch.float32) * 0.02).to(dtype)

    def norm(n):
        return (1 + 0.1 * (2 * torch.rand(n, generator=gen, device=device) - 1)).to(dtype)

    W = {"fc.weight": mat(H, len(p["taps"]) * H), "hidden_norm.weight": norm(H), "norm.weight": norm(H)}
    for l in range(L):
        q = f"layers.{l}."
        W[q + "input_layernorm.weight"] = norm(H)
        W[q + "post_attention_layernorm.weight"] = norm(H)
        W[q + "self_attn.q_norm.weight"] = norm(D)
        W[q + "self_attn.k_norm.weight"] = norm(D)
        W[q + "self_attn.q_proj.weight"] = mat(QD, H)
        W[q + "self_attn.k_proj.weight"] = mat(KD, H)
        W[q + "self_attn.v_proj.weight"] = mat(KD, H)
        W[q + "self_attn.o_proj.weight"] = mat(H, QD)
        W[q + "mlp.gate_proj.weight"] = mat(I, H)
        W[q + "mlp.up_proj.weight"] = mat(I, H)
        W[q + "mlp.down_proj.weight"] = mat(H, I)
    embed = mat(p["vocab"], H)
    cfg = {
        "architectures": ["DFlashDraftModel"], "hidden_size": H, "num_hidden_layers": L,
        "num_attention_heads": p["heads"], "num_key_value_heads": p["kv_heads"], "head_dim": D,
        "intermediate_size": I, "vocab_size": p["vocab"], "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "block_size": p["block"], "num_target_layers": p["target_layers"],
        "dflash_config": {"mask_token_id": p["vocab"] - 1, "target_layer_ids": p["taps"]},
    }
    return R.DFlashDrafter(cfg, W, embed, embed)


def weight_bytes(d):
    """Bytes one propose must read: every layer tensor, the final norm, the LM head."""
    n = sum(t.numel() * t.element_size() for k, t in d.W.items() if k.startswith("layers."))
    n += d.W["norm.weight"].numel() * d.W["norm.weight"].element_size()
    return n + d.lm_head.numel() * d.lm_head.element_size()


class Propose:
    """One propose at context length ctx, everything but the block's own
    work prepared: context K/V (bf16), ids, positions, RoPE tables."""

    def __init__(self, d, ctx, dtype, seed=1):
        dev = d.embed.device
        g = d.g
        gen = torch.Generator(device=dev).manual_seed(seed)
        taps = torch.randn(ctx, len(d.tap_ids) * g.hidden, generator=gen, device=dev).to(dtype)
        with torch.no_grad():
            kv = d.context_kv(taps, torch.arange(ctx, device=dev))
        self.ctx = [(k.to(dtype), v.to(dtype)) for k, v in kv]
        self.kv_bytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.ctx)
        B = d.block_size
        self.B = B
        self.ids = torch.tensor([1] + [d.mask_id] * (B - 1), device=dev)
        cos, sin = R.rope_tables(torch.arange(ctx, ctx + B, device=dev), g.head_dim, g.theta)
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)  # HF casts the tables to the activations' dtype
        self.d = d

    @torch.no_grad()
    def __call__(self):
        """DFlashDrafter.block_forward's body (block_hidden + LM head) with
        the RoPE tables hoisted, then the drafts' argmax."""
        d, g = self.d, self.d.g
        h = d.embed[self.ids]
        for l in range(g.n_layers):
            ck, cv = self.ctx[l]
            h = R.qwen3_layer(d.W, d.lp(l), g, h, self.cos, self.sin, None, ck, cv)
        hn = R.rms_norm(h, d.W["norm.weight"], g.eps)
        return torch.argmax(hn[1:] @ d.lm_head.t(), dim=-1)


# ------------------------------------------------------------ timing


class Clock:
    def __init__(self, cuda):
        self.cuda = cuda

    def time_us(self, fn, reps):
        """WARMUP calls, then reps timed calls: (median, min) in us."""
        for _ in range(WARMUP):
            fn()
        out = []
        for _ in range(reps):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b) * 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(out), min(out)


def bandwidth(device, clock):
    """Bytes per second of a large copy (read + written), median of 5."""
    n = (2 << 30) // 4 if device == "cuda" else (256 << 20) // 4
    src = torch.rand(n, device=device)  # random: never time zeros
    dst = torch.empty_like(src)
    med, _ = clock.time_us(lambda: dst.copy_(src), 5)
    nbytes = src.numel() * src.element_size()
    del src, dst
    return 2 * nbytes / (med * 1e-6), nbytes


def graphed(fn):
    """Capture fn as one CUDA graph (after warm-up on a side stream, as
    torch.cuda.graphs asks); returns the replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(WARMUP):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


# ------------------------------------------------------------ main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="seed-drafter", choices=sorted(PRESETS))
    ap.add_argument("--ctx", default="1024,4096", help="context lengths, comma-separated")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default="auto", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--attn", default=None, choices=["sdpa", "ref"],
                    help="attention: sdpa (default where torch has it) or the reference's")
    ap.add_argument("--no-graph", action="store_true", help="eager only on CUDA")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    device = a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_drafter_peer: --device cuda but torch sees no GPU")
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    attn = a.attn or ("sdpa" if has_sdpa else "ref")
    if attn == "sdpa" and not has_sdpa:
        sys.exit(f"torch_drafter_peer: torch {torch.__version__} has no scaled_dot_product_attention; use --attn ref")
    ctxs = sorted({int(x) for x in a.ctx.replace(" ", "").split(",") if x})
    if not ctxs or ctxs[0] < 1:
        sys.exit("torch_drafter_peer: --ctx needs lengths >= 1")

    R.rms_norm = hf_rms_norm  # module globals: qwen3_layer and DFlashDrafter look them up per call
    if attn == "sdpa":
        R.attention = sdpa_attention
    dtype = torch.bfloat16
    p = PRESETS[a.preset]
    clock = Clock(device == "cuda")
    bw, bw_bytes = bandwidth(device, clock)
    desc = torch.cuda.get_device_name() if device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"torch_drafter_peer: building {a.preset} on {device}", file=sys.stderr)
    d = random_drafter(p, device, dtype)
    wbytes = weight_bytes(d)
    embed_rows = p["block"] * p["hidden"] * 2

    rows = []
    for ctx in ctxs:
        step = Propose(d, ctx, dtype)
        modes = [("eager", step)]
        if device == "cuda" and not a.no_graph:
            try:
                modes.append(("graph", graphed(step)))
            except RuntimeError as e:  # e.g. an op of --attn ref that syncs with the host
                print(f"torch_drafter_peer: ctx {ctx}: CUDA graph capture failed, eager only: {e}", file=sys.stderr)
        for mode, fn in modes:
            med, mn = clock.time_us(fn, a.reps)
            nbytes = wbytes + embed_rows + step.kv_bytes
            rows.append(dict(op=f"propose/{mode}", rows=step.B, ctx=ctx, median_us=med, min_us=mn, bytes=nbytes,
                             floor_us=nbytes / bw * 1e6))
        del step, modes
        if device == "cuda":
            torch.cuda.empty_cache()
    for r in rows:
        r["floor_pct"] = 100 * r["floor_us"] / r["median_us"]

    if a.json:
        print(json.dumps(dict(preset=a.preset, device=desc, torch=torch.__version__, attn=attn,
                              bandwidth_gbs=bw / 1e9, bandwidth_bytes=bw_bytes, reps=a.reps, warmup=WARMUP,
                              rows=rows)))
        return
    print(f"torch_drafter_peer: preset {a.preset}: drafter {p['layers']} layers, H {p['hidden']}, I {p['inter']}, "
          f"{p['heads']}:{p['kv_heads']} x {p['head_dim']}, block {p['block']}, vocab {p['vocab']}; "
          f"random bf16 weights; torch {torch.__version__}, attention {attn}")
    print(f"device: {desc}")
    print(f"bandwidth: {bw / 1e9:.1f} GB/s (tensor copy of {bw_bytes / (1 << 20):.0f} MiB, bytes read + written, "
          f"median of 5)")
    print(f"timing: median and min of {a.reps} calls after {WARMUP} warm-up; floor = bytes moved / bandwidth\n"
          f"        (weights once + LM head + context K/V in bf16)\n")
    print(f"{'op':<14} {'rows':>5} {'ctx':>7} {'median_us':>12} {'min_us':>12} {'MB':>10} {'floor_us':>12} "
          f"{'%floor':>8}")
    for r in rows:
        print(f"{r['op']:<14} {r['rows']:>5} {r['ctx']:>7} {r['median_us']:>12.1f} {r['min_us']:>12.1f} "
              f"{r['bytes'] / 1e6:>10.1f} {r['floor_us']:>12.1f} {r['floor_pct']:>7.1f}%")


if __name__ == "__main__":
    main()
