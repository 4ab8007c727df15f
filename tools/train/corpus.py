#!/usr/bin/env python3
"""corpus.py OUTDIR: the training corpus of the embedded pair (Python's stdlib).

Owns which text the small target and drafter learn from, and its split:

- source: the `.py` files of the Python standard library on the machine that
  trains. We look in /usr/lib/python3.X (recursive); when several versions
  are there we take the running interpreter's one, else the one with most
  files. If that finds fewer than 200 files we use the running interpreter's
  stdlib (`sysconfig.get_paths()["stdlib"]`).
- kept: every `.py` file under that root except those under `site-packages`
  or `dist-packages` (third-party code) and files over 1 MB (generated
  tables). Test directories ARE kept: they are ordinary Python code and
  roughly double the corpus. Files that are not valid UTF-8 are skipped.
- split: by the SHA-1 of the path relative to the root: files whose hash mod
  100 is < 5 are held out (~5%); the rest train. Order: sorted paths.

Writes OUTDIR/work/corpus.json (python version, root, file counts, bytes).
Other scripts import `load_corpus()`.
"""
import glob
import hashlib
import json
import os
import sys
import sysconfig

MAX_FILE_BYTES = 1 << 20
HELDOUT_PERCENT = 5


def _py_files(root):
    out = []
    for p in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        parts = p.split(os.sep)
        if "site-packages" in parts or "dist-packages" in parts:
            continue
        if os.path.isfile(p):
            out.append(p)
    return sorted(out)


def find_stdlib():
    """(root, files) of the stdlib to use; see the module docstring."""
    mine = f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}"
    cands = [d for d in sorted(glob.glob("/usr/lib/python3.*")) if os.path.isdir(d)]
    best = None
    if mine in cands:
        best = (mine, _py_files(mine))
    else:
        for d in cands:
            files = _py_files(d)
            if best is None or len(files) > len(best[1]):
                best = (d, files)
    if best is None or len(best[1]) < 200:
        root = sysconfig.get_paths()["stdlib"]
        best = (root, _py_files(root))
    return best


def is_heldout(rel):
    h = int(hashlib.sha1(rel.encode("utf-8")).hexdigest(), 16)
    return h % 100 < HELDOUT_PERCENT


def load_corpus():
    """(train_texts, heldout_texts, info); texts in sorted-path order."""
    root, files = find_stdlib()
    train, held = [], []
    skipped_big = skipped_utf8 = 0
    for p in files:
        if os.path.getsize(p) > MAX_FILE_BYTES:
            skipped_big += 1
            continue
        try:
            with open(p, "rb") as f:
                text = f.read().decode("utf-8")
        except UnicodeDecodeError:
            skipped_utf8 += 1
            continue
        rel = os.path.relpath(p, root)
        (held if is_heldout(rel) else train).append(text)
    info = {
        "python_version": sys.version.split()[0],
        "python_full_version": sys.version,
        "stdlib_root": root,
        "files_found": len(files),
        "files_train": len(train),
        "files_heldout": len(held),
        "skipped_over_1MB": skipped_big,
        "skipped_not_utf8": skipped_utf8,
        "bytes_train": sum(len(t.encode("utf-8")) for t in train),
        "bytes_heldout": sum(len(t.encode("utf-8")) for t in held),
        "heldout_rule": f"sha1(relative path) % 100 < {HELDOUT_PERCENT}",
        "includes_test_dirs": True,
    }
    return train, held, info


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: corpus.py OUTDIR")
    work = os.path.join(sys.argv[1], "work")
    os.makedirs(work, exist_ok=True)
    _, _, info = load_corpus()
    with open(os.path.join(work, "corpus.json"), "w") as f:
        json.dump(info, f, indent=2)
    print("corpus:", json.dumps(info))
    if info["files_train"] < 100:
        raise SystemExit("corpus: too few files found")


if __name__ == "__main__":
    main()
