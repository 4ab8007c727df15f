#!/usr/bin/env python3
"""tokenizer.py OUTDIR: the byte-level BPE of the embedded pair, and the
tokenized corpus.

Owns the tokenizer's shape, which mirrors Qwen3's tokenizer.json so the
project's C tokenizer reads it with the same code path:
  normalizer NFC;
  pre_tokenizer Sequence[Split(Qwen2 regex, Isolated), ByteLevel(
      add_prefix_space=False, use_regex=False)];
  post_processor ByteLevel(trim_offsets=False); decoder ByteLevel;
  model BPE (byte_fallback false, no unk token), trained with HF `tokenizers`
  on the train split to VOCAB - 2 entries (256 byte symbols + merges);
  then two special added tokens AFTER the BPE vocabulary, as in Qwen3:
  `<|endoftext|>` (id VOCAB-2; eos, document separator) and `<|mask|>`
  (id VOCAB-1; the DFlash mask token).

Writes OUTDIR/work/tok/{tokenizer.json, tokenizer_config.json,
generation_config.json} and the token streams OUTDIR/work/{train,heldout}.npy
(uint16; documents joined with <|endoftext|>), plus OUTDIR/work/tokenizer.json
stats. Exits non-zero if the written file lacks the expected structure or a
held-out round trip fails.
"""
import json
import os
import sys
import time
import unicodedata

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

VOCAB = 4096
EOT = "<|endoftext|>"
MASK = "<|mask|>"
MODEL_MAX_LENGTH = 2048
BPE_TRAIN_BYTES = 24 << 20  # cap on text fed to the BPE trainer (time bound)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


def build_tokenizer(train_texts):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    try:
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    except TypeError:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 2,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts, n = [], 0
    for t in train_texts:
        if n > BPE_TRAIN_BYTES:
            break
        texts.append(t)
        n += len(t)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.add_special_tokens([
        AddedToken(EOT, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True),
        AddedToken(MASK, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True),
    ])
    return tok, n


def check_structure(path):
    """The saved tokenizer.json has the Qwen3 structure the C loader expects."""
    with open(path) as f:
        j = json.load(f)
    assert j["normalizer"]["type"] == "NFC", j["normalizer"]
    pt = j["pre_tokenizer"]
    assert pt["type"] == "Sequence" and len(pt["pretokenizers"]) == 2, pt
    sp, bl = pt["pretokenizers"]
    assert sp["type"] == "Split" and sp["pattern"].get("Regex") == QWEN2_PATTERN, sp
    assert sp["behavior"] == "Isolated" and sp.get("invert") is False, sp
    assert bl["type"] == "ByteLevel" and bl["add_prefix_space"] is False and bl["use_regex"] is False, bl
    assert j["decoder"]["type"] == "ByteLevel", j["decoder"]
    m = j["model"]
    assert m["type"] == "BPE" and m.get("byte_fallback", False) is False and m.get("unk_token") is None, \
        {k: v for k, v in m.items() if k not in ("vocab", "merges")}
    added = {a["content"]: a for a in j["added_tokens"]}
    for t in (EOT, MASK):
        assert added[t]["special"] is True, added[t]
    return {"bpe_vocab": len(m["vocab"]), "merges": len(m["merges"]),
            "added": {a["content"]: a["id"] for a in j["added_tokens"]}}


def write_configs(tokdir, eot_id, mask_id):
    added = {
        str(eot_id): {"content": EOT, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True},
        str(mask_id): {"content": MASK, "lstrip": False, "normalized": False, "rstrip": False,
                       "single_word": False, "special": True},
    }
    with open(os.path.join(tokdir, "tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "Qwen2Tokenizer",
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": added,
            "bos_token": None,
            "eos_token": EOT,
            "pad_token": EOT,
            "unk_token": None,
            "model_max_length": MODEL_MAX_LENGTH,
            "clean_up_tokenization_spaces": False,
            "errors": "replace",
            "split_special_tokens": False,
        }, f, indent=2)
    with open(os.path.join(tokdir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": None, "eos_token_id": eot_id, "pad_token_id": eot_id, "do_sample": False},
                  f, indent=2)


def encode_stream(tok, texts, eot_id):
    """All documents, each followed by <|endoftext|>, as one uint16 array."""
    out = []
    for i in range(0, len(texts), 256):
        for e in tok.encode_batch(texts[i:i + 256], add_special_tokens=False):
            out.extend(e.ids)
            out.append(eot_id)
    return np.asarray(out, dtype=np.uint16)


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: tokenizer.py OUTDIR")
    work = os.path.join(sys.argv[1], "work")
    tokdir = os.path.join(work, "tok")
    os.makedirs(tokdir, exist_ok=True)
    t0 = time.time()
    train, held, info = corpus.load_corpus()
    print(f"tokenizer: corpus {info['files_train']} train / {info['files_heldout']} held-out files "
          f"({info['bytes_train'] / 1e6:.1f} MB / {info['bytes_heldout'] / 1e6:.2f} MB) from {info['stdlib_root']}")
    tok, nbytes = build_tokenizer(train)
    path = os.path.join(tokdir, "tokenizer.json")
    tok.save(path)
    st = check_structure(path)
    eot_id, mask_id = tok.token_to_id(EOT), tok.token_to_id(MASK)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    assert vocab <= VOCAB and mask_id == vocab - 1 and eot_id == vocab - 2, (vocab, eot_id, mask_id)
    write_configs(tokdir, eot_id, mask_id)
    print(f"tokenizer: trained on {nbytes / 1e6:.1f} MB in {time.time() - t0:.1f}s: {st['bpe_vocab']} BPE entries, "
          f"{st['merges']} merges, added {st['added']}, vocab {vocab}")

    # round trip on held-out text: decode(encode(x)) == NFC(x)
    from tokenizers import Tokenizer

    tok2 = Tokenizer.from_file(path)
    bad = 0
    for t in held[:20]:
        ids = tok2.encode(t, add_special_tokens=False).ids
        if tok2.decode(ids, skip_special_tokens=False) != unicodedata.normalize("NFC", t):
            bad += 1
    assert bad == 0, f"{bad} held-out files do not round-trip"

    t1 = time.time()
    tr = encode_stream(tok2, train, eot_id)
    he = encode_stream(tok2, held, eot_id)
    np.save(os.path.join(work, "train.npy"), tr)
    np.save(os.path.join(work, "heldout.npy"), he)
    stats = dict(info, vocab_size=vocab, eot_id=eot_id, mask_id=mask_id, bpe_vocab=st["bpe_vocab"],
                 merges=st["merges"], tokens_train=int(tr.size), tokens_heldout=int(he.size),
                 bytes_per_token=round(info["bytes_train"] / max(1, tr.size), 3), bpe_train_bytes=nbytes)
    with open(os.path.join(work, "tokenizer.json"), "w") as f:
        json.dump(stats, f, indent=2)
    print(f"tokenizer: encoded {tr.size} train / {he.size} held-out tokens "
          f"({stats['bytes_per_token']} bytes/token) in {time.time() - t1:.1f}s")


if __name__ == "__main__":
    main()
