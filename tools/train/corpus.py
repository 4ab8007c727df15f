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

`load_third_party()` is the drafter's second source (only the drafter
trains on it; the target never saw it): the `.py` files of the packages
installed in the training interpreter's site-packages / dist-packages
(torch, transformers, numpy, ... on the GPU machine), each package capped at
PACKAGE_BYTES, packages named in the exclusion list (the held-out
third-party prompts' package) left out entirely.
"""
import glob
import hashlib
import json
import os
import site
import sys
import sysconfig

MAX_FILE_BYTES = 1 << 20
HELDOUT_PERCENT = 5
PACKAGE_BYTES = 4 << 20


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


def _read_utf8(p):
    try:
        with open(p, "rb") as f:
            return f.read().decode("utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def load_third_party(exclude, max_bytes):
    """(texts, info): installed third-party packages' sources, see the
    module docstring. `exclude`: top-level package names to leave out."""
    roots = []
    for r in list(site.getsitepackages()) + ["/usr/lib/python3/dist-packages"]:
        if os.path.isdir(r) and os.path.realpath(r) not in [os.path.realpath(x) for x in roots]:
            roots.append(r)
    texts, packages, skipped, total = [], {}, sorted(exclude), 0
    for root in roots:
        for pkg in sorted(os.listdir(root)):
            d = os.path.join(root, pkg)
            if not os.path.isdir(d) or pkg.startswith(("_", ".")) or "." in pkg or pkg in packages:
                continue
            if pkg.lower() in exclude:
                continue
            n = 0
            for p in sorted(glob.glob(os.path.join(d, "**", "*.py"), recursive=True)):
                if n >= PACKAGE_BYTES or total >= max_bytes or os.path.getsize(p) > MAX_FILE_BYTES:
                    continue
                t = _read_utf8(p)
                if t:
                    texts.append(t)
                    n += len(t.encode("utf-8"))
                    total += len(t.encode("utf-8"))
            if n:
                packages[pkg] = n
    info = {"roots": roots, "packages": packages, "excluded": skipped, "files": len(texts), "bytes": total,
            "package_cap_bytes": PACKAGE_BYTES}
    return texts, info


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
