#!/usr/bin/env python3
"""block_stamps.py: where a forward's kernel calls spend their time, block by
block, from the records a stamps build writes (DFLASH_CUDA_STAMPS=FILE; the
record layout is in src/backend/cuda/kernels/common.cuh): for each block,
%globaltimer at entry and end, and clock64 at entry and at up to five phases.

Two tables.

1. GEMM calls, per shape (weight rows, k, split, rows, weights, mode), over
   the calls after the first --skip, medians of:
     blocks    blocks recorded in the call
     entry     first block entry to the release (the median block's end of
               the dependency wait): how early the call's blocks were resident
     x         release to the first activations staged (median block)
     loop      first staging to the end of the chunk loop (median block)
     arrive    loop end to the arrival count's answer (median block; split > 1)
     finish    arrival to the end of the last blocks' epilogue (median of them)
     last_loop release to the latest block's loop end
     end       release to the latest block's end

2. Every stamped call on one timeline (GEMMs and the short kernels that
   stamp: attention, its merge, the split-K RMSNorm, the q/k norm + RoPE),
   ordered by their ends. A call's `ready` is the end of the call before it
   (its input's kernel, when that one is stamped); per kernel and the kernel
   before it, medians over calls after the first --skip of each, in us from
   ready:
     lead      how long before ready its first block entered
     late      when its last block entered (> 0: blocks that waited for a slot)
     p1 .. p5  the median block's phases (the names per kernel are printed)
     end       its latest block's end: what the call adds after its input
               (compare with kernel_trace.py's advance)

Calls are told apart by their kind and shape and by time (a gap of more than
--gap us between block entries of one kind starts a new call; the split-K
norm, which runs twice a layer, by --norm-gap). clock64 counts SM cycles;
they become us at the rate %globaltimer shows over the blocks' own lives
(printed).

Usage: python3 tools/cuda/block_stamps.py STAMPS [--skip N] [--gap US] [--norm-gap US]
"""
import argparse
import array
import collections
import statistics
import sys

WORDS = 11  # common.cuh's STAMP_N
MODES = {0: "store", 1: "swiglu", 2: "argmax", 4: "partials"}
# common.cuh's STAMP_K_* codes: name, detail's meaning, phase names 1..5
KINDS = {
    1: ("attention", "query vectors", ["wait", "queries", "tile 0", "tile 1", "tiles"]),
    2: ("merge", "splits", ["wait", "weights", "sums"]),
    3: ("split norm", "block in cluster", ["cluster", "wait", "sums", "cluster 2"]),
    4: ("q/k norm+rope", "heads", []),
}
NORM_KIND = 3


def name_of(key):
    if key[0] == "gemm":
        n0, k, split, m, n_w, mode = key[1:]
        return "gemm %dx%d%s %s s%d m%d" % (n0, k, "" if n_w == 1 else " x%d" % n_w, MODES.get(mode, str(mode)),
                                            split, m)
    return KINDS.get(key[1], ("kind %d" % key[1], "", []))[0]


def split_calls(rs, gap_us):
    rs = sorted(rs, key=lambda r: r[3])
    calls, cur = [], [rs[0]]
    for r in rs[1:]:
        if (r[3] - cur[-1][3]) / 1e3 > gap_us:
            calls.append(cur)
            cur = []
        cur.append(r)
    calls.append(cur)
    return calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stamps")
    ap.add_argument("--skip", type=int, default=3, help="calls of each shape left out first (default 3)")
    ap.add_argument("--gap", type=float, default=30.0, help="us between block entries that start a new call")
    ap.add_argument("--norm-gap", type=float, default=8.0, help="the same for the split-K norm (default 8)")
    args = ap.parse_args()

    w = array.array("Q")
    with open(args.stamps, "rb") as f:
        w.frombytes(f.read())
    if len(w) % WORDS:
        sys.exit("block_stamps.py: %s: %d words, not whole records of %d" % (args.stamps, len(w), WORDS))
    recs = [w[i:i + WORDS] for i in range(0, len(w), WORDS)]
    if not recs:
        sys.exit("block_stamps.py: %s: no records" % args.stamps)

    # cycles per ns from blocks that lived long enough to measure
    rates = []
    for r in recs:
        last = max(r[5:11])
        if r[5] and r[4] - r[3] > 5000 and last > r[5]:
            rates.append((last - r[5]) / (r[4] - r[3]))
    ghz = statistics.median(rates) if rates else 1.98
    print("%d block records; SM clock %.3f GHz by %%globaltimer over %d blocks" % (len(recs), ghz, len(rates)))

    def at(r, i):  # absolute ns of phase i (0 entry .. 5), or None
        c = r[5 + i]
        return None if c == 0 or r[5] == 0 else r[3] + (c - r[5]) / ghz

    by_key = collections.defaultdict(list)
    for r in recs:
        if r[0]:
            n0, k = r[0] & 0xffffffff, r[0] >> 32
            split, m, n_w, mode = r[1] & 0xff, (r[1] >> 8) & 0xff, (r[1] >> 16) & 0xff, (r[1] >> 24) & 0x7f
            by_key[("gemm", n0, k, split, m, n_w, mode)].append(r)
        else:
            kind = r[1] & 0xff
            # the split norm's blocks of one call differ in their detail (block in cluster)
            detail = 0 if kind == NORM_KIND else (r[1] >> 8) & 0xffffff
            by_key[("kernel", kind, detail)].append(r)

    calls_of = {}
    for key, rs in by_key.items():
        calls_of[key] = split_calls(rs, args.norm_gap if key[:2] == ("kernel", NORM_KIND) else args.gap)

    gemm_table(calls_of, at, args.skip)
    timeline_table(calls_of, at, args.skip)


def gemm_table(calls_of, at, skip):
    cols = ["blocks", "entry", "x", "loop", "arrive", "finish", "last_loop", "end"]
    keys = [k for k in calls_of if k[0] == "gemm"]
    if not keys:
        return
    print("\nGEMM calls per shape, medians over calls (us after the release unless named)")
    print("| weights n x k | w | mode | split | rows | calls | " + " | ".join(cols) + " |")
    print("| --- " * (6 + len(cols)) + "|")
    for key in sorted(keys, key=lambda s: calls_of[s][0][0][3]):
        _, n0, k, split, m, n_w, mode = key
        calls = calls_of[key]
        used = calls[skip:] if len(calls) > skip else calls[-1:]
        rows = collections.defaultdict(list)
        for call in used:
            waited = [at(r, 1) for r in call if r[6]]
            if not waited:
                continue
            rel = statistics.median(waited)
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


def timeline_table(calls_of, at, skip):
    if not any(k[0] == "kernel" for k in calls_of):
        return
    timeline = []  # (end ns, key, call index, call)
    for key, calls in calls_of.items():
        for i, call in enumerate(calls):
            timeline.append((max(r[4] for r in call), key, i, call))
    timeline.sort(key=lambda e: e[0])
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    prev_key = None
    for j, (end, key, i, call) in enumerate(timeline):
        if j == 0 or i < skip:
            prev_key = key
            continue
        ready = timeline[j - 1][0]
        row = rows[(key, prev_key)]
        row["blocks"].append(len(call))
        row["lead"].append((ready - min(r[3] for r in call)) / 1e3)
        row["late"].append((max(r[3] for r in call) - ready) / 1e3)
        for p in range(1, 6):
            v = [at(r, p) for r in call if r[5 + p]]
            if v:
                row["p%d" % p].append((statistics.median(v) - ready) / 1e3)
        row["end"].append((end - ready) / 1e3)
        prev_key = key
    cols = ["blocks", "lead", "late", "p1", "p2", "p3", "p4", "p5", "end"]
    print("\nEvery stamped call on one timeline: us from `ready` (the end of the call before), medians over calls")
    for kind, (name, detail, phases) in sorted(KINDS.items()):
        print("  %s: detail = %s; phases %s" % (name, detail,
                                                ", ".join("p%d %s" % (i + 1, p) for i, p in enumerate(phases)) or "none"))
    print("  gemm: phases p1 wait, p2 staged, p3 loop, p4 arrive, p5 finish")
    print("| kernel | after | calls | " + " | ".join(cols) + " |")
    print("| --- " * (3 + len(cols)) + "|")
    for (key, prev), row in sorted(rows.items(), key=lambda e: -len(e[1]["end"])):
        cells = []
        for c in cols:
            v = row.get(c)
            cells.append("-" if not v else ("%d" % statistics.median(v) if c == "blocks" else "%.2f" % statistics.median(v)))
        print("| %s | %s | %d | %s |" % (name_of(key), name_of(prev) if prev else "-", len(row["end"]), " | ".join(cells)))


if __name__ == "__main__":
    main()
