#!/usr/bin/env python3
"""gemm_stamps.py: where a tensor-core GEMM call's time goes, block by block,
from the phase records a stamps build writes (DFLASH_CUDA_STAMPS=FILE, see
src/backend/cuda/kernels/gemm.cu): for each block of each unchained call,
%globaltimer at entry and end, and clock64 at entry, after the dependency
wait, when its first activations were staged, after its chunk loop, when it
learned whether it is its row block's last slice, and after the epilogue.

Calls are told apart by their shape (weight rows, k, split, rows, weights,
mode) and by time (a gap of more than --gap us between block entries of one
shape starts a new call). For each shape, over its calls after the first
--skip, medians of:
  blocks    blocks recorded in the call
  entry     first block entry to the release (the median block's end of
            the dependency wait): how early the call's blocks were resident
  x         release to the first activations staged (median block)
  loop      first staging to the end of the chunk loop (median block)
  arrive    loop end to the arrival count's answer (median block; split > 1)
  finish    arrival to the end of the last blocks' epilogue (median of them)
  last_loop release to the latest block's loop end
  end       release to the latest block's end (what the call costs after
            its inputs are ready; compare with kernel_trace.py's advance)
clock64 counts SM cycles; they become us at the rate %globaltimer shows
over the blocks' own lives (printed).

Usage: python3 tools/cuda/gemm_stamps.py STAMPS [--skip N] [--gap US]
"""
import argparse
import array
import collections
import statistics
import sys

WORDS = 11  # gemm.cu's GM_STAMP_N
MODES = {0: "store", 1: "swiglu", 2: "argmax"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stamps")
    ap.add_argument("--skip", type=int, default=3, help="calls of each shape left out first (default 3)")
    ap.add_argument("--gap", type=float, default=30.0, help="us between block entries that start a new call")
    args = ap.parse_args()

    w = array.array("Q")
    with open(args.stamps, "rb") as f:
        w.frombytes(f.read())
    if len(w) % WORDS:
        sys.exit("gemm_stamps.py: %s: %d words, not whole records of %d" % (args.stamps, len(w), WORDS))
    recs = [w[i:i + WORDS] for i in range(0, len(w), WORDS)]
    if not recs:
        sys.exit("gemm_stamps.py: %s: no records" % args.stamps)

    # cycles per ns from blocks that lived long enough to measure
    rates = []
    for r in recs:
        last = max(r[5:11])
        if r[4] - r[3] > 5000 and last > r[5]:
            rates.append((last - r[5]) / (r[4] - r[3]))
    ghz = statistics.median(rates) if rates else 1.98
    print("%d block records; SM clock %.3f GHz by %%globaltimer over %d blocks" % (len(recs), ghz, len(rates)))

    def at(r, i):  # absolute ns of phase i (0 entry .. 5), or None
        c = r[5 + i]
        return None if c == 0 else r[3] + (c - r[5]) / ghz

    by_shape = collections.defaultdict(list)
    for r in recs:
        n0, k = r[0] & 0xffffffff, r[0] >> 32
        split, m, n_w, mode = r[1] & 0xff, (r[1] >> 8) & 0xff, (r[1] >> 16) & 0xff, (r[1] >> 24) & 0x7f
        by_shape[(n0, k, split, m, n_w, mode)].append(r)

    cols = ["blocks", "entry", "x", "loop", "arrive", "finish", "last_loop", "end"]
    print("\nper shape, medians over calls (us after the release unless named)")
    print("| weights n x k | w | mode | split | rows | calls | " + " | ".join(cols) + " |")
    print("| --- " * (6 + len(cols)) + "|")
    for key in sorted(by_shape, key=lambda s: min(r[3] for r in by_shape[s])):
        n0, k, split, m, n_w, mode = key
        rs = sorted(by_shape[key], key=lambda r: r[3])
        calls, cur = [], [rs[0]]
        for r in rs[1:]:
            if (r[3] - cur[-1][3]) / 1e3 > args.gap:
                calls.append(cur)
                cur = []
            cur.append(r)
        calls.append(cur)
        used = calls[args.skip:] if len(calls) > args.skip else calls[-1:]
        rows = collections.defaultdict(list)
        for call in used:
            rel = statistics.median(at(r, 1) for r in call)
            rows["blocks"].append(len(call))
            rows["entry"].append((rel - min(r[3] for r in call)) / 1e3)
            staged = [at(r, 2) - at(r, 1) for r in call if r[7]]
            loop = [at(r, 3) - at(r, 2) for r in call if r[7] and r[8]]
            arrive = [at(r, 4) - at(r, 3) for r in call if r[8] and r[9]]
            finish = [at(r, 5) - at(r, 4) for r in call if r[9] and r[10]]
            for name, v in (("x", staged), ("loop", loop), ("arrive", arrive), ("finish", finish)):
                if v:
                    rows[name].append(statistics.median(v) / 1e3)
            loops = [at(r, 3) for r in call if r[8]]
            if loops:
                rows["last_loop"].append((max(loops) - rel) / 1e3)
            rows["end"].append((max(r[4] for r in call) - rel) / 1e3)
        cells = []
        for c in cols:
            v = rows.get(c)
            cells.append("-" if not v else ("%d" % statistics.median(v) if c == "blocks" else "%.2f" % statistics.median(v)))
        print("| %d x %d | %d | %s | %d | %d | %d | %s |" % (n0, k, n_w, MODES.get(mode, str(mode)), split, m, len(used),
                                                             " | ".join(cells)))


if __name__ == "__main__":
    main()
