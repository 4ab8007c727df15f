#!/usr/bin/env python3
"""train_dflash.py OUTDIR: the embedded pair's drafter, `qwen3-pystd-dflash`,
trained against the frozen target `qwen3-pystd` (algorithm page §9), then
measured.

Owns the drafter's geometry, its training recipe and the pair's acceptance:

- drafter: 3 Qwen3 layers at the target's width (256), 4:2 heads of 64,
  MLP 768, taps target_layer_ids [1, 3, 5] (explicit), block 16, mask token
  `<|mask|>`; the target's embedding / tied LM head, frozen.
- data: sequences of SEQ tokens, per batch REAL_PER_BATCH real train-split
  windows and the rest drawn from a pool of the target's own greedy
  continuations of 32-token train prompts (generated once at the start, no
  KV cache; this matches what speculative decoding sees); labels everywhere = the target's greedy
  prediction (argmax of its logits at p-1 labels p), so the drafter learns
  the target's choices.
- step: per sequence ANCHORS random anchors a in [1, SEQ-16]; block rows
  [x_a, mask x 15] at positions a..a+15; one attention mask for all blocks
  of a sequence: a row sees context K/V (taps -> fc -> hidden_norm ->
  k/v, exactly dflash_ref.context_kv) of positions < a and every row of its
  own block, nothing else. Loss: CE of row k against label a+k, weighted
  exp(-(k-1)/5), k = 1..15. AdamW, bf16 autocast, warmup + cosine;
  DRAFT_STEPS steps or DRAFT_SECONDS, whichever first.
- the drafter's math is dflash_ref's (DFlashDrafter.context_kv /
  block_hidden over our own parameters), so what is trained is what the
  reference and the fixtures compute.
- saved bf16 in the published layout to OUTDIR/models/qwen3-pystd-dflash/
  (config.json, model.safetensors, README.md), then measured: greedy
  speculative decoding (dflash_ref.spec_generate, block 16, no cap, the
  target = transformers f32 eager) on EVAL_PROMPTS held-out prompts of 64
  tokens, EVAL_NEW new tokens each, against plain greedy; tau = mean
  accepted + 1 per step. Writes OUTDIR/models/pystd-pair.json.
"""
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
import dflash_ref as ref  # noqa: E402
import hf_util  # noqa: E402
import st_io  # noqa: E402

TARGET = "qwen3-pystd"
NAME = "qwen3-pystd-dflash"
SEED = 4321
SEQ = 256
BATCH = 32
ANCHORS = 32
BLOCK = 16
DECAY = 5.0
LR = 2e-3
WARMUP = 200
N_LAYERS = 3
STEPS = int(os.environ.get("DRAFT_STEPS", "8000"))
SECONDS = float(os.environ.get("DRAFT_SECONDS", "170"))
GEN_PROMPT = 32
GEN_SEQS = 4096
GEN_BATCH = 1024
REAL_PER_BATCH = 8  # of BATCH sequences: real relabelled windows; the rest self-generated
EVAL_PROMPTS = int(os.environ.get("EVAL_PROMPTS", "10"))
EVAL_PROMPT_LEN = 64
EVAL_NEW = int(os.environ.get("EVAL_NEW", "128"))
TAPS = [1, 3, 5]


def drafter_config(tcfg, mask_id):
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": tcfg["hidden_size"],
        "num_hidden_layers": N_LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 768,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": float(ref.rope_theta_of(tcfg)),
        "rope_scaling": None,
        "vocab_size": tcfg["vocab_size"],
        "max_position_embeddings": tcfg["max_position_embeddings"],
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "layer_types": ["full_attention"] * N_LAYERS,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": N_LAYERS,
        "block_size": BLOCK,
        "num_target_layers": tcfg["num_hidden_layers"],
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": TAPS},
        "torch_dtype": "bfloat16",
    }


class Drafter(nn.Module):
    """The drafter's trainable tensors under their published names ('.' is
    stored as '__' because ParameterDict keys cannot hold dots)."""

    def __init__(self, cfg, embed):
        super().__init__()
        self.cfg = cfg
        g = ref.Geometry(cfg)
        H, D, I = g.hidden, g.head_dim, g.inter
        gen = torch.Generator().manual_seed(SEED)

        def normal(*shape):
            return torch.randn(*shape, generator=gen) * 0.02

        k_taps = len(cfg["dflash_config"]["target_layer_ids"])
        W = {"fc.weight": normal(H, k_taps * H), "hidden_norm.weight": torch.ones(H), "norm.weight": torch.ones(H)}
        for l in range(g.n_layers):
            p = f"layers.{l}."
            W[p + "input_layernorm.weight"] = torch.ones(H)
            W[p + "post_attention_layernorm.weight"] = torch.ones(H)
            W[p + "self_attn.q_proj.weight"] = normal(g.hq * D, H)
            W[p + "self_attn.k_proj.weight"] = normal(g.hkv * D, H)
            W[p + "self_attn.v_proj.weight"] = normal(g.hkv * D, H)
            W[p + "self_attn.o_proj.weight"] = normal(H, g.hq * D) / math.sqrt(2 * g.n_layers)
            W[p + "self_attn.q_norm.weight"] = torch.ones(D)
            W[p + "self_attn.k_norm.weight"] = torch.ones(D)
            W[p + "mlp.gate_proj.weight"] = normal(I, H)
            W[p + "mlp.up_proj.weight"] = normal(I, H)
            W[p + "mlp.down_proj.weight"] = normal(H, I) / math.sqrt(2 * g.n_layers)
        self.p = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(v) for k, v in W.items()})
        self.register_buffer("embed", embed, persistent=False)

    def weights(self):
        return {k.replace("__", "."): v for k, v in self.p.items()}

    def ref(self):
        """A dflash_ref.DFlashDrafter view over the live parameters."""
        return ref.DFlashDrafter(self.cfg, self.weights(), self.embed, self.embed)

    def block_logits(self, x, taps, anchors):
        """All blocks of a batch in one pass. x [bs, L] tokens, taps
        [bs, L, K*Ht], anchors [bs, nA] -> logits [bs, nA, B-1, V] of rows
        1..B-1 (row k predicts position a+k)."""
        d = self.ref()
        bs, L = x.shape
        nA = anchors.shape[1]
        dev = x.device
        ar = torch.arange(BLOCK, device=dev)
        ctx_pos = torch.arange(L, device=dev).expand(bs, L)
        ctx = d.context_kv(taps, ctx_pos)  # per layer [bs, L, Hkv, D]
        blk_pos = (anchors[:, :, None] + ar).reshape(bs, nA * BLOCK)
        ids = torch.full((bs, nA, BLOCK), d.mask_id, dtype=torch.long, device=dev)
        ids[:, :, 0] = x.gather(1, anchors)
        h = self.embed[ids.reshape(bs, -1)].float()
        # one mask for all blocks: context keys before the anchor + own block
        ctx_ok = (torch.arange(L, device=dev)[None, None, :] < anchors[:, :, None])  # [bs, nA, L]
        ctx_ok = ctx_ok[:, :, None, :].expand(bs, nA, BLOCK, L).reshape(bs, nA * BLOCK, L)
        blk_id = torch.arange(nA, device=dev).repeat_interleave(BLOCK)
        blk_ok = (blk_id[:, None] == blk_id[None, :]).expand(bs, -1, -1)
        mask = torch.cat([ctx_ok, blk_ok], dim=-1)
        hn = d.block_hidden(h, blk_pos, ctx, [mask] * d.g.n_layers)
        hn = hn.reshape(bs, nA, BLOCK, -1)[:, :, 1:]  # rows 1..B-1
        return torch.matmul(hn.to(self.embed.dtype), self.embed.t()).float()

    def forward(self, x, taps, labels, anchors):
        """labels [bs, L] (labels[p] = target argmax at p-1). Returns
        (weighted loss, accuracy per block row k = 1..B-1)."""
        bs, nA = anchors.shape
        dev = x.device
        logits = self.block_logits(x, taps, anchors)
        ar = torch.arange(1, BLOCK, device=dev)
        tgt = labels.gather(1, (anchors[:, :, None] + ar).reshape(bs, -1)).reshape(bs, nA, BLOCK - 1)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
        ce = ce.reshape(bs, nA, BLOCK - 1)
        w = torch.exp(-torch.arange(BLOCK - 1, device=dev, dtype=torch.float32) / DECAY)
        loss = (ce * w).sum() / (w.sum() * bs * nA)
        acc = (logits.argmax(-1) == tgt).float().mean(dim=(0, 1))
        return loss, acc


class BatchedTaps:
    """Frozen transformers target (bf16) with hooks: ids [bs, L] ->
    (greedy labels [bs, L], taps [bs, L, K*Ht])."""

    def __init__(self, model, tap_ids):
        self.model = model
        self.tap_ids = tap_ids
        self.outs = {}
        for i, layer in enumerate(model.model.layers):
            layer.register_forward_hook(self._hook(i))

    def _hook(self, i):
        def fn(mod, inp, out):
            self.outs[i] = (out[0] if isinstance(out, (tuple, list)) else out).detach()

        return fn

    @torch.no_grad()
    def __call__(self, x):
        self.outs.clear()
        logits = self.model(input_ids=x).logits
        labels = torch.zeros_like(x)
        labels[:, 1:] = logits[:, :-1].argmax(-1)
        taps = torch.cat([self.outs[i] for i in self.tap_ids], dim=-1)
        return labels, taps

    @torch.no_grad()
    def greedy_extend(self, x, n):
        """Greedy continuation by full forwards (no KV cache API needed)."""
        for _ in range(n):
            hid = self.model.model(input_ids=x).last_hidden_state[:, -1]
            nxt = self.model.lm_head(hid).argmax(-1)
            x = torch.cat([x, nxt[:, None]], dim=1)
        return x


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: train_dflash.py OUTDIR")
    out = sys.argv[1]
    work = os.path.join(out, "work")
    tdir = os.path.join(out, "models", TARGET)
    dst = os.path.join(out, "models", NAME)
    assert torch.cuda.is_available(), "train_dflash.py needs CUDA"
    dev = torch.device("cuda")
    torch.manual_seed(SEED)
    with open(os.path.join(work, "tokenizer.json")) as f:
        tstats = json.load(f)
    mask_id = tstats["mask_id"]
    tcfg = ref.load_config(tdir)
    train = torch.from_numpy(np.load(os.path.join(work, "train.npy")).astype(np.int64)).to(dev)
    held = np.load(os.path.join(work, "heldout.npy")).astype(np.int64)

    target = hf_util.load_qwen3(tdir, device=dev, dtype=torch.bfloat16, attn="sdpa")
    for p in target.parameters():
        p.requires_grad_(False)
    bt = BatchedTaps(target, TAPS)
    cfg = drafter_config(tcfg, mask_id)
    embed = target.get_input_embeddings().weight.detach()
    model = Drafter(cfg, embed).to(dev)
    with torch.no_grad():  # start the final norm at the target's: the LM head is the target's
        model.p["norm__weight"].copy_(target.model.norm.weight.float())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"train_dflash: drafter {n_params / 1e6:.2f} M params, taps {TAPS}, mask id {mask_id}, "
          f"up to {STEPS} steps or {SECONDS:.0f}s, batch {BATCH} x {SEQ} tokens x {ANCHORS} anchors")

    # self-distillation pool: the target's greedy continuations of train prompts
    t0 = time.time()
    g = torch.Generator(device="cpu").manual_seed(SEED)
    pool = []
    for _ in range(GEN_SEQS // GEN_BATCH):
        starts = torch.randint(0, train.numel() - GEN_PROMPT, (GEN_BATCH,), generator=g).to(dev)
        x = train[starts[:, None] + torch.arange(GEN_PROMPT, device=dev)]
        pool.append(bt.greedy_extend(x, SEQ - GEN_PROMPT))
    pool = torch.cat(pool)
    print(f"train_dflash: generated {pool.shape[0]} greedy sequences of {SEQ} tokens in {time.time() - t0:.1f}s")

    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    t0 = time.time()
    step = 0
    while step < STEPS and time.time() - t0 < SECONDS:
        progress = min(1.0, max(step / STEPS, (time.time() - t0) / SECONDS))
        lr = LR * min(1.0, (step + 1) / WARMUP) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        starts = torch.randint(0, train.numel() - SEQ, (REAL_PER_BATCH,), generator=g).to(dev)
        real = train[starts[:, None] + torch.arange(SEQ, device=dev)]
        gen = pool[torch.randint(0, pool.shape[0], (BATCH - REAL_PER_BATCH,), generator=g).to(dev)]
        x = torch.cat([real, gen])
        labels, taps = bt(x)
        anchors = torch.stack([torch.randperm(SEQ - BLOCK, generator=g)[:ANCHORS] + 1 for _ in range(BATCH)]).to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, acc = model(x, taps, labels, anchors)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0 or step == 1:
            a = acc.tolist()
            # expected accepted drafts if per-position accuracies were independent
            run, exp_acc = 1.0, 0.0
            for v in a:
                run *= v
                exp_acc += run
            print(f"  step {step:5d} loss {float(loss.detach()):.3f} acc@1 {a[0]:.3f} acc@4 {a[3]:.3f} acc@8 {a[7]:.3f} "
                  f"~tau {1 + exp_acc:.2f} lr {lr:.2e} {time.time() - t0:6.1f}s", flush=True)
    train_secs = time.time() - t0
    print(f"train_dflash: {step} steps in {train_secs:.1f}s")

    # save in the published layout (bf16, no `model.` prefix)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    W = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.weights().items()}
    st_io.save_file(W, os.path.join(dst, "model.safetensors"), {"format": "pt"})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    lib = st_io.crosscheck_with_library(os.path.join(dst, "model.safetensors"))
    size = os.path.getsize(os.path.join(dst, "model.safetensors"))
    del bt, target, model
    torch.cuda.empty_cache()

    # measure: greedy speculative decoding vs plain greedy, f32 eager target
    hf_util.deterministic()
    t1 = time.time()
    tf32 = hf_util.load_qwen3(tdir, device=dev, dtype=torch.float32, attn="eager")
    tgt = ref.HFTarget(tf32)
    drafter = ref.DFlashDrafter.from_folder(dst, tgt.embed, tgt.lm_head, device=dev)
    starts = np.linspace(0, held.size - EVAL_PROMPT_LEN - 1, EVAL_PROMPTS).astype(np.int64)
    taus, same, tie_div, per_prompt = [], 0, 0, []
    for i, s0 in enumerate(starts):
        prompt = held[s0:s0 + EVAL_PROMPT_LEN].tolist()
        greedy, margins = ref.greedy_generate(tgt, prompt, EVAL_NEW)
        r = ref.spec_generate(tgt, drafter, prompt, EVAL_NEW, BLOCK, 0)
        taus.extend(r["taus"])
        if r["out"] == greedy:
            same += 1
            status = "same"
        else:
            j = next(k for k in range(EVAL_NEW) if r["out"][k] != greedy[k])
            if margins[j] < 1e-3:  # a near-tie flipped by rounding between different-length forwards
                tie_div += 1
                status = f"diverged at {j} on a near-tie (margin {margins[j]:.1e})"
            else:
                status = f"DIFFERS at {j} (margin {margins[j]:.2e})"
        tau_p = sum(r["taus"]) / len(r["taus"])
        per_prompt.append({"start": int(s0), "tau": round(tau_p, 3), "steps": len(r["taus"]), "status": status})
        print(f"  prompt {i}: tau {tau_p:.2f} over {len(r['taus'])} steps, spec vs greedy: {status}", flush=True)
    tau = sum(taus) / len(taus)
    hard_fail = EVAL_PROMPTS - same - tie_div
    print(f"train_dflash: tau {tau:.3f} (mean accepted+1 per step, {len(taus)} steps, {EVAL_PROMPTS} prompts x "
          f"{EVAL_NEW} tokens); spec == greedy on {same}/{EVAL_PROMPTS} ({tie_div} near-tie divergences); "
          f"{time.time() - t1:.1f}s")

    with open(os.path.join(tdir, "train_stats.json")) as f:
        tstat = json.load(f)
    pair = {
        "target": TARGET, "drafter": NAME, "tau": round(tau, 3), "eval_prompts": EVAL_PROMPTS,
        "eval_prompt_len": EVAL_PROMPT_LEN, "eval_new_tokens": EVAL_NEW, "block_size": BLOCK, "ctx_cap": 0,
        "spec_equals_greedy": same, "near_tie_divergences": tie_div, "hard_mismatches": hard_fail,
        "per_prompt": per_prompt, "drafter_params": n_params, "drafter_safetensors_bytes": size,
        "drafter_steps": step, "drafter_train_seconds": round(train_secs, 1), "taps": TAPS, "mask_id": mask_id,
        "target_heldout_loss": tstat["heldout_loss"], "target_safetensors_bytes": tstat["safetensors_bytes"],
        "safetensors_lib_reread": lib, "seed": SEED,
    }
    with open(os.path.join(out, "models", "pystd-pair.json"), "w") as f:
        json.dump(pair, f, indent=2)
    with open(os.path.join(dst, "README.md"), "w") as f:
        f.write(f"""# {NAME}

The DFlash drafter of the project's embedded pair, for the target `{TARGET}`
(models/{TARGET}), trained by `tools/train/train_dflash.py` (driver:
`tools/gpu/make-data.sh`) on the GPU machine.

- Layout: the published DFlash one (config.json with `dflash_config`,
  model.safetensors in bf16, no `model.` prefix, no embedding / LM head: it
  uses the target's tied embedding). {N_LAYERS} layers, hidden 256, 4:2 heads of 64,
  MLP 768, taps target_layer_ids {TAPS} (of {tcfg['num_hidden_layers']} target
  layers), block {BLOCK}, mask token `<|mask|>` = {mask_id}. {n_params / 1e6:.2f} M
  parameters, {size / 1e6:.1f} MB.
- Training (algorithm page §9): frozen target; each step {BATCH} sequences of
  {SEQ} tokens ({REAL_PER_BATCH} real stdlib train windows, the rest from a pool of
  {GEN_SEQS} target greedy continuations of 32-token train prompts), labels = the target's greedy
  predictions; {ANCHORS} random anchors per sequence, each a block [token, mask
  x 15] that sees context features of positions before its anchor and its
  own block, under one attention mask; CE weighted exp(-(k-1)/{DECAY:g}).
  AdamW lr {LR}, bf16 autocast, {step} steps, {train_secs:.0f} s.
- Measured (greedy, block 16, no context cap, target in f32): tau =
  **{tau:.2f}** mean accepted+1 per step over {EVAL_PROMPTS} held-out prompts of
  {EVAL_PROMPT_LEN} tokens x {EVAL_NEW} new tokens; speculative output equal to
  plain greedy on {same}/{EVAL_PROMPTS} prompts ({tie_div} near-tie divergences).
- Seed {SEED}; torch {torch.__version__}, transformers {hf_util.transformers_version()}.
""")
    print(f"train_dflash: saved {dst} ({size / 1e6:.1f} MB); pair stats in models/pystd-pair.json")
    if hard_fail:
        raise SystemExit(f"train_dflash: speculative output differs from greedy on {hard_fail} prompt(s)")


if __name__ == "__main__":
    main()
