#!/usr/bin/env python3
"""train_dflash.py OUTDIR: the embedded pair's drafter, `qwen3-pystd-dflash`,
trained against the frozen target `qwen3-pystd` (OUTDIR/models/qwen3-pystd),
then measured.

Owns the drafter's geometry, its training recipe and the pair's acceptance:

- drafter: DRAFT_LAYERS Qwen3 layers at the target's width (256), 4:2
  heads of 64, MLP 768, taps target_layer_ids DRAFT_TAPS (default 1,3,5),
  block 16, mask token `<|mask|>`; the target's embedding / tied LM head,
  frozen.
- data (drafter_data.py): sequences of SEQ tokens; per batch REAL_PER_BATCH
  windows of the standard library's train split, as many of installed
  third-party packages, and the rest drawn from a pool of the target's own
  greedy continuations of 32-token prompts from both (this is what
  speculative decoding conditions on); labels everywhere = the target's
  greedy prediction (argmax of its logits at p-1 labels p), so the drafter
  learns the target's choices.
- step: per sequence ANCHORS random anchors a in [1, SEQ-16]; block rows
  [x_a, mask x 15] at positions a..a+15; one attention mask for all blocks
  of a sequence: a row sees context K/V (taps -> fc -> hidden_norm ->
  k/v, exactly dflash_ref.context_kv) of positions < a and every row of its
  own block, nothing else. Loss: CE of row k against label a+k, weighted
  exp(-(k-1)/5), k = 1..15. With DRAFT_CONSISTENT=1 (the default) a row
  counts only when it has a right answer: label a+k is the target's greedy
  choice after the tokens x[a+1..a+k-1] of the sequence, which is what
  speculative decoding asks of row k only where those tokens are the
  target's own greedy ones (x[p] == label[p]); elsewhere (real text, the
  prompt part of a pool sequence) rows past the first disagreement are
  noise and get weight 0. DRAFT_KL=w mixes in w x the KL divergence from
  the target's distribution at that position (soft labels). AdamW, bf16
  autocast, warmup + cosine over DRAFT_TOTAL_SECONDS of training; one run trains DRAFT_SECONDS of it (or
  DRAFT_STEPS steps), so a long schedule can be split over several runs,
  each resuming (DRAFT_INIT) from the f32 checkpoint the previous one wrote
  to OUTDIR/ckpt (weights and the schedule's clock; the optimizer's moments
  restart under a short warmup).
- the drafter's math is dflash_ref's (DFlashDrafter.context_kv /
  block_hidden over our own parameters), so what is trained is what the
  reference and the fixtures compute.
- saved bf16 in the published layout to OUTDIR/models/qwen3-pystd-dflash/
  (config.json, model.safetensors, README.md), then measured: greedy
  speculative decoding (dflash_ref.spec_generate, block 16, no cap, the
  target = transformers f32 eager), EVAL_NEW new tokens, on the prompt sets
  of the C engine's acceptance test (tests/data/pystd/*_prompts.json, text
  tokenized by the target's tokenizer), and (EVAL_PLAIN=1) against plain
  greedy; tau = mean accepted + 1 per step. Writes
  OUTDIR/models/pystd-pair.json.

Other knobs: DRAFT_BATCH, DRAFT_LR, POOL_SEQS, DRAFT_SEED, DRAFT_WORK (the
folder of streams and pool, default OUTDIR/work), DRAFT_PREP_ONLY=1 (make
streams and pool, then stop: concurrent runs then share them),
DRAFT_INIT_MODEL=FOLDER (start from a drafter in the published layout, e.g.
the shipped one, instead of random weights: its layers and taps are kept;
extra layers start as the identity (o_proj and down_proj zero) and extra
taps with zero fc columns, so the start computes what FOLDER computes),
EVAL_PROMPTS=n (measure on the first n prompts of each set only),
DRAFT_GEN_PROMPT (the pool's prompt length, default 32), DRAFT_GEN_ANCHORS=1
(a pool sequence's anchors only in its generated part, positions >=
DRAFT_GEN_PROMPT, where speculative decoding puts them: the first draft's
anchor is the first generated token).
"""
import json
import math
import os
import shutil
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
import dflash_ref as ref  # noqa: E402
import drafter_data  # noqa: E402
import hf_util  # noqa: E402
import st_io  # noqa: E402

TARGET = "qwen3-pystd"
NAME = "qwen3-pystd-dflash"
ENV = os.environ.get
SEED = int(ENV("DRAFT_SEED", "4321"))
SEQ = 256
BATCH = int(ENV("DRAFT_BATCH", "32"))
ANCHORS = 32
BLOCK = 16
DECAY = 5.0
LR = float(ENV("DRAFT_LR", "2e-3"))
WARMUP = 200
N_LAYERS = int(ENV("DRAFT_LAYERS", "5"))
STEPS = int(ENV("DRAFT_STEPS", "1000000"))
SECONDS = float(ENV("DRAFT_SECONDS", "170"))
TOTAL_SECONDS = float(ENV("DRAFT_TOTAL_SECONDS", str(SECONDS)))
GEN_PROMPT = int(ENV("DRAFT_GEN_PROMPT", "32"))
GEN_ANCHORS = ENV("DRAFT_GEN_ANCHORS", "0") == "1"
GEN_SEQS = int(ENV("POOL_SEQS", "16384"))
GEN_BATCH = 2048
CONSISTENT = ENV("DRAFT_CONSISTENT", "1") == "1"
KL_W = float(ENV("DRAFT_KL", "0"))
EVAL_PROMPTS = int(ENV("EVAL_PROMPTS", "0"))
REAL_PER_BATCH = 4  # of BATCH sequences: stdlib windows, as many third-party ones; the rest self-generated
EVAL_NEW = int(ENV("EVAL_NEW", "128"))
EVAL_PLAIN = ENV("EVAL_PLAIN", "1") == "1"
EVAL_SETS = ("heldout", "outside")  # tests/data/pystd/<name>_prompts.json
ROOT = os.path.join(HERE, "..", "..")
# "1,3,5" or "1+3+5" (retrain_drafter.sh splits its knobs at commas)
TAPS = [int(t) for t in ENV("DRAFT_TAPS", "1,3,5").replace("+", ",").split(",")]


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

    def forward(self, x, taps, labels, anchors, tlogits=None):
        """labels [bs, L] (labels[p] = target argmax at p-1), tlogits the
        target's logits [bs, L, V] (for DRAFT_KL). Returns (weighted loss,
        accuracy per block row k = 1..B-1 over the rows that count, how many
        rows counted per k)."""
        bs, nA = anchors.shape
        dev = x.device
        logits = self.block_logits(x, taps, anchors)
        ar = torch.arange(1, BLOCK, device=dev)
        pos = (anchors[:, :, None] + ar).reshape(bs, -1)  # positions a+k
        tgt = labels.gather(1, pos).reshape(bs, nA, BLOCK - 1)
        if CONSISTENT:
            # row k counts iff x[a+1..a+k-1] are the target's greedy tokens
            agree = (x == labels).gather(1, pos).reshape(bs, nA, BLOCK - 1).float()
            valid = torch.cumprod(torch.cat([torch.ones_like(agree[..., :1]), agree[..., :-1]], -1), -1)
        else:
            valid = torch.ones(bs, nA, BLOCK - 1, device=dev)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
        per_row = ce.reshape(bs, nA, BLOCK - 1)
        if KL_W > 0:
            t_logp = F.log_softmax(tlogits.gather(1, (pos - 1)[:, :, None].expand(-1, -1, tlogits.shape[-1])).float(), -1)
            d_logp = F.log_softmax(logits.reshape(bs, -1, logits.shape[-1]), -1)
            kl = F.kl_div(d_logp, t_logp, log_target=True, reduction="none").sum(-1).reshape(bs, nA, BLOCK - 1)
            per_row = (1 - KL_W) * per_row + KL_W * kl
        w = torch.exp(-torch.arange(BLOCK - 1, device=dev, dtype=torch.float32) / DECAY) * valid
        loss = (per_row * w).sum() / w.sum().clamp_min(1.0)
        n = valid.sum(dim=(0, 1))
        acc = ((logits.argmax(-1) == tgt).float() * valid).sum(dim=(0, 1)) / n.clamp_min(1.0)
        return loss, acc, n


class BatchedTaps:
    """Frozen transformers target (bf16) with hooks: ids [bs, L] ->
    (greedy labels [bs, L], taps [bs, L, K*Ht], logits [bs, L, V])."""

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
        return labels, taps, logits


CKPT_SHARD_BYTES = 12 << 20  # each returned file of the GPU machine stays well under 16 MB


def lr_at(run_step, clock):
    """Warmup (restarted by every run: fresh optimizer moments) times a
    cosine over the whole DRAFT_TOTAL_SECONDS schedule, floored at 5%."""
    progress = min(1.0, clock / TOTAL_SECONDS)
    return LR * min(1.0, (run_step + 1) / WARMUP) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def save_ckpt(model, folder, state):
    """f32 weights (sharded) + the schedule's clock, for DRAFT_INIT."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    W = {k: v.detach().float().cpu().contiguous() for k, v in model.weights().items()}
    total = sum(v.numel() * 4 for v in W.values())
    st_io.save_sharded(W, folder, max(1, -(-total // CKPT_SHARD_BYTES)))
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump(state, f, indent=2)


def load_ckpt(model, folder):
    with open(os.path.join(folder, "state.json")) as f:
        state = json.load(f)
    W = st_io.load_folder(folder)
    mine = model.weights()
    if set(W) != set(mine):
        raise SystemExit(f"{folder}: checkpoint tensors differ from a {N_LAYERS}-layer drafter's "
                         f"(missing {sorted(set(mine) - set(W))[:3]}, extra {sorted(set(W) - set(mine))[:3]})")
    with torch.no_grad():
        for k, v in mine.items():
            if tuple(W[k].shape) != tuple(v.shape):
                raise SystemExit(f"{folder}: {k} has shape {tuple(W[k].shape)}, expected {tuple(v.shape)}")
            v.copy_(W[k])
    return state


def init_from_model(model, folder):
    """Start from a published-layout drafter: its tensors where they exist,
    extra layers as the identity (zero o_proj / down_proj), extra taps as
    zero fc columns. What the start computes equals what FOLDER computes."""
    with open(os.path.join(folder, "config.json")) as f:
        fcfg = json.load(f)
    W = st_io.load_folder(folder)
    old_taps = ref.drafter_taps(fcfg)
    old_layers = fcfg["num_hidden_layers"]
    if old_layers > N_LAYERS or any(t not in TAPS for t in old_taps):
        raise SystemExit(f"{folder}: {old_layers} layers, taps {old_taps}: cannot grow into "
                         f"{N_LAYERS} layers, taps {TAPS}")
    mine = model.weights()
    H = model.cfg["hidden_size"]
    with torch.no_grad():
        for k, v in mine.items():
            if k == "fc.weight":
                v.zero_()
                for j, t in enumerate(old_taps):
                    i = TAPS.index(t)
                    v[:, i * H:(i + 1) * H].copy_(W[k][:, j * H:(j + 1) * H].float())
            elif k in W:
                if tuple(W[k].shape) != tuple(v.shape):
                    raise SystemExit(f"{folder}: {k} has shape {tuple(W[k].shape)}, expected {tuple(v.shape)}")
                v.copy_(W[k].float())
            elif k.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
                v.zero_()
    extra = sorted(set(W) - set(mine))
    if extra:
        raise SystemExit(f"{folder}: tensors a {N_LAYERS}-layer drafter does not have: {extra[:3]}")
    print(f"train_dflash: started from {folder} ({old_layers} layers, taps {old_taps})")


def eval_sets(tdir):
    """{name: (source, [prompt ids])} of the C acceptance test's prompt files."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
    out = {}
    for name in EVAL_SETS:
        with open(os.path.join(ROOT, "tests", "data", "pystd", f"{name}_prompts.json")) as f:
            j = json.load(f)
        prompts = j["prompts"][:EVAL_PROMPTS] if EVAL_PROMPTS > 0 else j["prompts"]
        out[name] = (j["source"], [tok.encode(p["text"], add_special_tokens=False).ids for p in prompts])
    return out


def measure(tgt, drafter, prompts, label):
    """Greedy speculative decoding over `prompts`: (tau, per-prompt rows,
    same, near-tie divergences, hard mismatches)."""
    taus, rows, same, ties = [], [], 0, 0
    for i, prompt in enumerate(prompts):
        r = ref.spec_generate(tgt, drafter, prompt, EVAL_NEW, BLOCK, 0)
        taus.extend(r["taus"])
        status = "not compared"
        if EVAL_PLAIN:
            greedy, margins = ref.greedy_generate(tgt, prompt, EVAL_NEW)
            if r["out"] == greedy:
                same += 1
                status = "same"
            else:
                j = next(k for k in range(EVAL_NEW) if r["out"][k] != greedy[k])
                if margins[j] < 1e-3:  # a near-tie flipped by rounding between different-length forwards
                    ties += 1
                    status = f"diverged at {j} on a near-tie (margin {margins[j]:.1e})"
                else:
                    status = f"DIFFERS at {j} (margin {margins[j]:.2e})"
        tau_p = sum(r["taus"]) / len(r["taus"])
        rows.append({"prompt": i, "tokens": len(prompt), "tau": round(tau_p, 3), "steps": len(r["taus"]),
                     "status": status})
    tau = sum(taus) / len(taus)
    hard = (len(prompts) - same - ties) if EVAL_PLAIN else 0
    print(f"train_dflash: {label}: tau {tau:.3f} over {len(taus)} steps of {len(prompts)} prompts"
          + (f"; spec == greedy on {same}/{len(prompts)} ({ties} near-tie divergences)" if EVAL_PLAIN else ""),
          flush=True)
    return tau, rows, same, ties, hard


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: train_dflash.py OUTDIR")
    if GEN_ANCHORS and SEQ - BLOCK + 1 - GEN_PROMPT < ANCHORS:
        raise SystemExit(f"DRAFT_GEN_PROMPT={GEN_PROMPT}: a {SEQ}-token pool sequence leaves fewer than "
                         f"{ANCHORS} anchors in its generated part (at most {SEQ - BLOCK + 1 - ANCHORS})")
    if ENV("DRAFT_INIT") and ENV("DRAFT_INIT_MODEL"):
        raise SystemExit("DRAFT_INIT (resume a checkpoint) and DRAFT_INIT_MODEL (start from a drafter) "
                         "exclude each other")
    out = sys.argv[1]
    work = ENV("DRAFT_WORK", os.path.join(out, "work"))
    tdir = os.path.join(out, "models", TARGET)
    dst = os.path.join(out, "models", NAME)
    ckpt_out = os.path.join(out, "ckpt")
    assert torch.cuda.is_available(), "train_dflash.py needs CUDA"
    dev = torch.device("cuda")
    torch.manual_seed(SEED)
    tcfg = ref.load_config(tdir)
    train_np, _, third_np, mask_id = drafter_data.streams(work, tdir)
    train = torch.from_numpy(train_np).to(dev)
    third = torch.from_numpy(third_np).to(dev)

    target = hf_util.load_qwen3(tdir, device=dev, dtype=torch.bfloat16, attn="sdpa")
    for p in target.parameters():
        p.requires_grad_(False)
    pool = drafter_data.pool(work, target, [train, third], GEN_SEQS, GEN_PROMPT, SEQ, GEN_BATCH, SEED)
    pool = pool.to(dev)
    if ENV("DRAFT_PREP_ONLY", "0") == "1":
        print("train_dflash: streams and pool ready (DRAFT_PREP_ONLY=1)")
        return
    bt = BatchedTaps(target, TAPS)
    cfg = drafter_config(tcfg, mask_id)
    embed = target.get_input_embeddings().weight.detach()
    model = Drafter(cfg, embed).to(dev)
    clock, step_total, runs = 0.0, 0, []
    init_model = ENV("DRAFT_INIT_MODEL")
    if ENV("DRAFT_INIT"):
        state = load_ckpt(model, ENV("DRAFT_INIT"))
        clock, step_total, runs = state["clock"], state["steps"], state["runs"]
        init_model = state.get("init_model")
        print(f"train_dflash: resumed from {ENV('DRAFT_INIT')} at step {step_total}, {clock:.0f}s of the schedule")
    elif ENV("DRAFT_INIT_MODEL"):
        init_from_model(model, ENV("DRAFT_INIT_MODEL"))
    else:
        with torch.no_grad():  # start the final norm at the target's: the LM head is the target's
            model.p["norm__weight"].copy_(target.model.norm.weight.float())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"train_dflash: drafter {N_LAYERS} layers, {n_params / 1e6:.2f} M params, taps {TAPS}, mask id {mask_id}, "
          f"{SECONDS:.0f}s of a {TOTAL_SECONDS:.0f}s schedule (lr {LR}), batch {BATCH} x {SEQ} tokens x {ANCHORS} anchors, "
          f"consistent rows only {CONSISTENT}, KL weight {KL_W}, pool {GEN_SEQS} x {GEN_PROMPT}-token prompts"
          f"{' (anchors in the generated part)' if GEN_ANCHORS else ''}")

    # each run draws from its own stream (seed + run index): a resumed run does not replay the first
    g = torch.Generator(device="cpu").manual_seed(SEED + 1000 * len(runs))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    t0 = time.time()
    step = 0
    while step < STEPS and time.time() - t0 < SECONDS and clock + time.time() - t0 < TOTAL_SECONDS:
        lr = lr_at(step, clock + time.time() - t0)
        for grp in opt.param_groups:
            grp["lr"] = lr
        real = torch.cat([drafter_data.windows(train, REAL_PER_BATCH, SEQ, g),
                          drafter_data.windows(third, REAL_PER_BATCH, SEQ, g)])
        gen = pool[torch.randint(0, pool.shape[0], (BATCH - 2 * REAL_PER_BATCH,), generator=g).to(dev)]
        x = torch.cat([real, gen])
        labels, taps, tlogits = bt(x)
        lo = [1] * (2 * REAL_PER_BATCH) + [GEN_PROMPT if GEN_ANCHORS else 1] * (BATCH - 2 * REAL_PER_BATCH)
        anchors = torch.stack([torch.randperm(SEQ - BLOCK + 1 - a, generator=g)[:ANCHORS] + a for a in lo]).to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, acc, counted = model(x, taps, labels, anchors, tlogits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 200 == 0 or step == 1:
            a = acc.tolist()
            # expected accepted drafts if per-position accuracies were independent
            run, exp_acc = 1.0, 0.0
            for v in a:
                run *= v
                exp_acc += run
            c = counted.tolist()
            print(f"  step {step_total + step:6d} loss {float(loss.detach()):.3f} acc@1 {a[0]:.3f} acc@4 {a[3]:.3f} "
                  f"acc@8 {a[7]:.3f} ~tau {1 + exp_acc:.2f} (rows @1 {c[0]:.0f} @8 {c[7]:.0f}) lr {lr:.2e} "
                  f"{clock + time.time() - t0:6.1f}s", flush=True)
    train_secs = time.time() - t0
    clock += train_secs
    step_total += step
    runs.append({"steps": step, "seconds": round(train_secs, 1), "seed": SEED + 1000 * len(runs), "lr": LR,
                 "schedule_seconds": TOTAL_SECONDS, "consistent_rows_only": CONSISTENT, "kl_weight": KL_W,
                 "pool_seqs": GEN_SEQS, "pool_prompt_tokens": GEN_PROMPT, "pool_anchors_generated_only": GEN_ANCHORS})
    print(f"train_dflash: {step} steps in {train_secs:.1f}s ({step_total} steps, {clock:.0f}s of the schedule)")
    save_ckpt(model, ckpt_out, {"clock": clock, "steps": step_total, "runs": runs, "layers": N_LAYERS,
                                "init_model": init_model})

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

    # measure: greedy speculative decoding (vs plain greedy), f32 eager target
    hf_util.deterministic()
    t1 = time.time()
    tf32 = hf_util.load_qwen3(tdir, device=dev, dtype=torch.float32, attn="eager")
    tgt = ref.HFTarget(tf32)
    drafter = ref.DFlashDrafter.from_folder(dst, tgt.embed, tgt.lm_head, device=dev)
    results, hard_fail = {}, 0
    for name, (source, prompts) in eval_sets(tdir).items():
        tau, rows, same, ties, hard = measure(tgt, drafter, prompts, name)
        hard_fail += hard
        results[name] = {"source": source, "prompts": len(prompts), "tau": round(tau, 3),
                         "spec_equals_greedy": same if EVAL_PLAIN else None, "near_tie_divergences": ties,
                         "hard_mismatches": hard, "per_prompt": rows}
    print(f"train_dflash: measured in {time.time() - t1:.1f}s")

    with open(os.path.join(tdir, "train_stats.json")) as f:
        tstat = json.load(f)
    pair = {
        "target": TARGET, "drafter": NAME, "eval_new_tokens": EVAL_NEW, "block_size": BLOCK, "ctx_cap": 0,
        "sets": results, "drafter_layers": N_LAYERS, "drafter_params": n_params,
        "drafter_safetensors_bytes": size, "drafter_steps": step_total, "drafter_train_seconds": round(clock, 1),
        "runs": runs, "taps": TAPS, "mask_id": mask_id, "batch": BATCH, "lr": LR, "pool_seqs": GEN_SEQS,
        "consistent_rows_only": CONSISTENT, "kl_weight": KL_W, "init_model": init_model,
        "pool_prompt_tokens": GEN_PROMPT, "pool_anchors_generated_only": GEN_ANCHORS,
        "target_heldout_loss": tstat["heldout_loss"], "target_safetensors_bytes": tstat["safetensors_bytes"],
        "safetensors_lib_reread": lib,
    }
    third_info = {}
    if os.path.exists(os.path.join(work, "third.json")):
        with open(os.path.join(work, "third.json")) as f:
            third_info = json.load(f)
    pair["third_party"] = third_info
    with open(os.path.join(out, "models", "pystd-pair.json"), "w") as f:
        json.dump(pair, f, indent=2)
    n_pkgs = len(third_info.get("packages", {}))
    run_list = " + ".join(f"{r['seconds']:.0f} s" for r in runs)
    measured = "\n".join(
        f"  - {n}: tau **{r['tau']:.2f}** over {r['prompts']} prompts ({r['source']})"
        + (f"; speculative output equal to plain greedy on {r['spec_equals_greedy']}/{r['prompts']}"
           if EVAL_PLAIN else "")
        for n, r in results.items())
    with open(os.path.join(dst, "README.md"), "w") as f:
        f.write(f"""# {NAME}

The DFlash drafter of the project's embedded pair, for the target `{TARGET}`
(models/{TARGET}), trained by `tools/train/train_dflash.py` (drivers:
`tools/gpu/make-data.sh`, `tools/train/retrain_drafter.sh`) on the GPU machine.

- Layout: the published DFlash one (config.json with `dflash_config`,
  model.safetensors in bf16, no `model.` prefix, no embedding / LM head: it
  uses the target's tied embedding). {N_LAYERS} layers, hidden 256, 4:2 heads of 64,
  MLP 768, taps target_layer_ids {TAPS} (of {tcfg['num_hidden_layers']} target
  layers), block {BLOCK}, mask token `<|mask|>` = {mask_id}. {n_params / 1e6:.2f} M
  parameters, {size / 1e6:.1f} MB.
- Training: frozen target; each step {BATCH} sequences of {SEQ} tokens
  ({REAL_PER_BATCH} windows of the standard library's train split, {REAL_PER_BATCH} of
  third-party packages installed on the GPU machine ({n_pkgs} packages, Django
  excluded), the rest from a pool of {GEN_SEQS} target greedy continuations of
  {GEN_PROMPT}-token prompts from both), labels = the target's greedy predictions;
  {ANCHORS} random anchors per sequence{' (in a pool sequence: in its generated part)' if GEN_ANCHORS else ''},
  each a block [token, mask x 15] that sees context features of positions
  before its anchor and its own block, under one attention mask; CE
  weighted exp(-(k-1)/{DECAY:g}){', KL weight ' + format(KL_W, 'g') if KL_W else ''}{', rows counted only where the sequence is the target greedy path' if CONSISTENT else ''}.
  Started from {init_model or 'random weights'}. AdamW lr {LR},
  bf16 autocast, cosine over {TOTAL_SECONDS:.0f} s; {step_total} steps in
  {len(runs)} run(s) of {run_list}.
- Measured by the Python reference (greedy, block 16, no context cap,
  target in f32, {EVAL_NEW} new tokens), on the C engine's acceptance-test prompts:
{measured}
- Seed {SEED}; torch {torch.__version__}, transformers {hf_util.transformers_version()}.
""")
    print(f"train_dflash: saved {dst} ({size / 1e6:.1f} MB); pair stats in models/pystd-pair.json")
    if hard_fail:
        raise SystemExit(f"train_dflash: speculative output differs from greedy on {hard_fail} prompt(s)")


if __name__ == "__main__":
    main()
