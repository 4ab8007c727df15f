#!/usr/bin/env python3
"""train_target.py OUTDIR: the embedded pair's target, `qwen3-pystd`.

Owns the target's geometry and training. A transformers Qwen3ForCausalLM
(hidden 256, 6 layers, 4:2 heads of 64, MLP 768, tied embeddings, vocab from
the tokenizer, 2048 positions, rope_theta 1e6) trained from scratch on
512-token windows of the tokenized stdlib train split (tokenizer.py), with
AdamW in bf16 autocast, warmup + cosine LR, for TARGET_STEPS steps or
TARGET_SECONDS of wall time, whichever comes first. Held-out loss is measured
every EVAL_EVERY steps on fixed held-out windows; the weights with the best
held-out loss are kept. Saved in bf16 with save_pretrained to
OUTDIR/models/qwen3-pystd/ with the tokenizer files, a top-level rope_theta
in config.json, README.md and train_stats.json.

Needs CUDA (runs on the GPU machine); seeds fixed.
"""
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
import hf_util  # noqa: E402

NAME = "qwen3-pystd"
SEED = 1234
SEQ = 512
BATCH = 32
LR = 2e-3
WARMUP = 100
STEPS = int(os.environ.get("TARGET_STEPS", "4000"))
SECONDS = float(os.environ.get("TARGET_SECONDS", "90"))
EVAL_EVERY = 250
EVAL_WINDOWS = 64


def model_config(vocab, eot_id):
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 6,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        # no pad_token_id: it would make the eot embedding row a frozen zero
        # (nn.Embedding padding_idx), and tied, its logit too
    }


def windows(stream, starts, length):
    idx = starts[:, None] + torch.arange(length, device=stream.device)[None, :]
    return stream[idx].long()


@torch.no_grad()
def heldout_loss(model, held, starts):
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(starts), 16):
        x = windows(held, starts[i:i + 16], SEQ + 1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        tot += float(loss)
        n += x[:, 1:].numel()
    model.train()
    return tot / n


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: train_target.py OUTDIR")
    out = sys.argv[1]
    work = os.path.join(out, "work")
    dst = os.path.join(out, "models", NAME)
    assert torch.cuda.is_available(), "train_target.py needs CUDA"
    dev = torch.device("cuda")
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    with open(os.path.join(work, "tokenizer.json")) as f:
        tstats = json.load(f)
    vocab, eot = tstats["vocab_size"], tstats["eot_id"]
    train = torch.from_numpy(np.load(os.path.join(work, "train.npy")).astype(np.int32)).to(dev)
    held = torch.from_numpy(np.load(os.path.join(work, "heldout.npy")).astype(np.int32)).to(dev)
    print(f"train_target: {train.numel()} train / {held.numel()} held-out tokens, vocab {vocab}; "
          f"up to {STEPS} steps or {SECONDS:.0f}s, batch {BATCH}x{SEQ}")

    cfg = model_config(vocab, eot)
    model = hf_util.new_qwen3(cfg, attn="sdpa").to(dev)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)

    g = torch.Generator(device="cpu").manual_seed(SEED)
    n_eval = min(EVAL_WINDOWS, max(1, (held.numel() - SEQ - 1) // SEQ))
    eval_starts = torch.linspace(0, held.numel() - SEQ - 2, n_eval).long().to(dev)

    best = (float("inf"), None, 0)
    t0 = time.time()
    step = 0
    loss_ema = None
    while step < STEPS and time.time() - t0 < SECONDS:
        # warmup, then cosine to 10% over whichever budget (steps or time) runs out first
        progress = min(1.0, max(step / STEPS, (time.time() - t0) / SECONDS))
        lr = LR * min(1.0, (step + 1) / WARMUP) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        starts = torch.randint(0, train.numel() - SEQ - 1, (BATCH,), generator=g).to(dev)
        x = windows(train, starts, SEQ + 1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        li = float(loss.detach()) if step % 50 == 0 or step == 1 else None
        if li is not None:
            loss_ema = li if loss_ema is None else 0.7 * loss_ema + 0.3 * li
            print(f"  step {step:5d} loss {li:.3f} lr {lr:.2e} {time.time() - t0:6.1f}s", flush=True)
        if step % EVAL_EVERY == 0:
            hl = heldout_loss(model, held, eval_starts)
            print(f"  step {step:5d} held-out loss {hl:.4f}", flush=True)
            if hl < best[0]:
                best = (hl, {k: v.detach().clone() for k, v in model.state_dict().items()}, step)
    hl = heldout_loss(model, held, eval_starts)
    print(f"  step {step:5d} held-out loss {hl:.4f} (final)")
    if hl < best[0]:
        best = (hl, None, step)
    if best[1] is not None:
        model.load_state_dict(best[1])
    train_secs = time.time() - t0
    print(f"train_target: {step} steps in {train_secs:.1f}s; keeping step {best[2]} (held-out loss {best[0]:.4f})")

    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    model = model.to(torch.bfloat16)
    model.save_pretrained(dst)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(work, "tok", f), os.path.join(dst, f))
    with open(os.path.join(dst, "config.json")) as f:
        c = json.load(f)
    c.setdefault("rope_theta", cfg["rope_theta"])
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
    size = sum(os.path.getsize(os.path.join(dst, f)) for f in os.listdir(dst) if f.endswith(".safetensors"))
    stats = {
        "name": NAME, "params": n_params, "safetensors_bytes": size, "steps": step, "kept_step": best[2],
        "train_seconds": round(train_secs, 1), "heldout_loss": round(best[0], 4),
        "heldout_ppl": round(math.exp(best[0]), 3), "batch": BATCH, "seq": SEQ, "lr": LR, "seed": SEED,
        "tokens_seen": step * BATCH * SEQ, "corpus": {k: tstats[k] for k in (
            "python_version", "stdlib_root", "files_train", "files_heldout", "tokens_train", "tokens_heldout")},
        "torch": torch.__version__, "transformers": hf_util.transformers_version(),
        "gpu": torch.cuda.get_device_name(0),
    }
    with open(os.path.join(dst, "train_stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
    with open(os.path.join(dst, "README.md"), "w") as f:
        f.write(f"""# {NAME}

A tiny Qwen3 causal LM (the target of the project's embedded DFlash pair),
trained from scratch by `tools/train/train_target.py` (driver:
`tools/gpu/make-data.sh`) on the GPU machine.

- Architecture: transformers `Qwen3ForCausalLM`, hidden 256, 6 layers,
  4 query / 2 KV heads of dim 64, MLP 768, tied embeddings, vocab {vocab},
  rope_theta 1e6, 2048 positions. {n_params / 1e6:.2f} M parameters,
  {size / 1e6:.1f} MB of bf16 safetensors.
- Tokenizer: byte-level BPE trained on the same corpus with HF `tokenizers`,
  Qwen3's tokenizer.json structure (NFC, Qwen2 split regex, ByteLevel);
  `<|endoftext|>` = {eot} (eos, document separator), `<|mask|>` = {tstats['mask_id']}
  (the drafter's mask token).
- Corpus: the `.py` files of the Python {tstats['python_version']} standard library
  ({tstats['stdlib_root']}), tests included, site/dist-packages excluded;
  {tstats['files_train']} train / {tstats['files_heldout']} held-out files split by
  sha1(relative path) % 100 < 5; {tstats['tokens_train']} / {tstats['tokens_heldout']} tokens.
- Training: {step} AdamW steps (bf16 autocast, batch {BATCH} x {SEQ} tokens, lr {LR},
  warmup {WARMUP}, cosine), {train_secs:.0f} s on {stats['gpu']}; weights kept from step
  {best[2]}, the best held-out loss: **{best[0]:.4f}** nats/token (ppl {math.exp(best[0]):.2f}).
- Seed {SEED}; torch {torch.__version__}, transformers {hf_util.transformers_version()}.
""")
    print(f"train_target: saved {dst} ({size / 1e6:.1f} MB safetensors)")


if __name__ == "__main__":
    main()
