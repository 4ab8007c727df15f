"""drafter_data.py: the token streams and the self-distillation pool the
embedded pair's drafter trains on (imported by train_dflash.py).

Owns:
- the streams WORK/{train,heldout}.npy (the standard library split of
  corpus.py) and WORK/third.npy (installed third-party packages,
  corpus.load_third_party), tokenized with the target's own tokenizer.json.
  When make-data.sh trained the target in the same run, train.npy and
  heldout.npy already exist (tokenizer.py wrote them) and are used as they
  are; when only the drafter is retrained against the shipped target, they
  are made here from the same corpus rule, so the drafter sees the text the
  target was trained on.
- the pool: greedy continuations by the (frozen, bf16) target of short
  prompts drawn from the streams. In speculative decoding most of what the
  drafter conditions on is the target's own output, so most training
  sequences are such continuations. Generated with the target's KV cache,
  cached in WORK/pool-<n>-<seq>-<seed>.pt so concurrent runs share one.
"""
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import tokenizer as tokmod  # noqa: E402

# the held-out third-party prompts (tests/data/pystd/outside_prompts.json)
# come from this package; the drafter never trains on it
EXCLUDE_PACKAGES = {"django"}
THIRD_PARTY_BYTES = 48 << 20


def _tokenizer(tdir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
    eot, mask = tok.token_to_id(tokmod.EOT), tok.token_to_id(tokmod.MASK)
    if eot is None or mask is None:
        raise SystemExit(f"{tdir}/tokenizer.json: no {tokmod.EOT} or {tokmod.MASK} token")
    return tok, eot, mask


def streams(work, tdir):
    """(train, heldout, third, mask_id): uint16 numpy token streams."""
    os.makedirs(work, exist_ok=True)
    tok, eot, mask = _tokenizer(tdir)
    t0 = time.time()
    tr_p, he_p = os.path.join(work, "train.npy"), os.path.join(work, "heldout.npy")
    if not (os.path.exists(tr_p) and os.path.exists(he_p)):
        train, held, info = corpus.load_corpus()
        np.save(tr_p, tokmod.encode_stream(tok, train, eot))
        np.save(he_p, tokmod.encode_stream(tok, held, eot))
        print(f"drafter_data: stdlib {info['files_train']}/{info['files_heldout']} files from "
              f"{info['stdlib_root']} tokenized")
    th_p = os.path.join(work, "third.npy")
    if not os.path.exists(th_p):
        texts, info = corpus.load_third_party(EXCLUDE_PACKAGES, THIRD_PARTY_BYTES)
        np.save(th_p, tokmod.encode_stream(tok, texts, eot))
        with open(os.path.join(work, "third.json"), "w") as f:
            json.dump(info, f, indent=2)
        print(f"drafter_data: third-party {info['files']} files, {info['bytes'] / 1e6:.1f} MB from "
              f"{len(info['packages'])} packages (excluded {info['excluded']})")
    out = [np.load(p).astype(np.int64) for p in (tr_p, he_p, th_p)]
    print(f"drafter_data: tokens train {out[0].size}, held-out {out[1].size}, third-party {out[2].size} "
          f"({time.time() - t0:.1f}s)")
    return out[0], out[1], out[2], mask


def windows(stream, n, length, gen):
    """n random windows of `length` tokens of a device tensor stream."""
    starts = torch.randint(0, stream.numel() - length, (n,), generator=gen).to(stream.device)
    return stream[starts[:, None] + torch.arange(length, device=stream.device)]


@torch.no_grad()
def greedy_extend(model, x, n):
    """x [bs, P] -> [bs, P+n]: the model's greedy continuation (KV cache)."""
    out = model(input_ids=x, use_cache=True)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    toks = [x, nxt]
    for _ in range(n - 1):
        out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        toks.append(nxt)
    return torch.cat(toks, dim=1)


def pool(work, model, sources, n, prompt_len, seq, batch, seed):
    """[n, seq] greedy continuations of prompt_len-token windows, drawn
    evenly from the device streams in `sources`; cached in WORK."""
    path = os.path.join(work, f"pool-{n}-{prompt_len}-{seq}-{seed}.pt")
    if os.path.exists(path):
        return torch.load(path).to(sources[0].device)
    t0 = time.time()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    parts = []
    for i in range(n // batch):
        x = windows(sources[i % len(sources)], batch, prompt_len, gen)
        parts.append(greedy_extend(model, x, seq - prompt_len))
    p = torch.cat(parts)
    torch.save(p.cpu(), path + ".tmp")
    os.replace(path + ".tmp", path)
    print(f"drafter_data: pool of {p.shape[0]} greedy sequences of {seq} tokens in {time.time() - t0:.1f}s")
    return p
