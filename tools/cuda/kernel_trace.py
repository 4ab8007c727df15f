#!/usr/bin/env python3
"""kernel_trace.py: summarise a kernel trace (tools/cuda/kernel_trace.c's CSV)
of a program that replays CUDA graphs, e.g. `dflash bench`.

One graph is picked (--graph: its id; default the one with the most kernels
per replay, the last such if several; --graphs N: the N with the most); its replays are the trace's runs of
that many kernels of the graph in start order. Over the replays after the
first --skip (warm-up and capture), per kernel of the replay, medians of:
its duration (end - start; under programmatic dependent launch a kernel
starts while the one before still runs, so this includes its wait), its
gap (start minus the previous kernel's end: negative when it started
early) and its advance (end minus the previous kernel's end: what it
adds to the replay, the time to charge it with). Then the advances added
up by kernel name, and the replay's span (first start to last end).
Then, where the replay repeats a run of kernel names at least three
times in a row (a model's layers), each position of that run: medians
over the repetitions of its duration, gap and advance, and their sum.

Usage: python3 tools/cuda/kernel_trace.py TRACE.csv [--graph ID | --graphs N] [--skip N]
"""
import argparse
import collections
import csv
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--graph", type=int, help="graph id (default: the most kernels per replay)")
    ap.add_argument("--skip", type=int, default=3, help="replays left out first (default 3)")
    ap.add_argument("--graphs", type=int, default=1, help="how many graphs, most kernels first (default 1)")
    args = ap.parse_args()

    by_graph = collections.defaultdict(list)
    with open(args.trace, newline="") as f:
        for row in csv.DictReader(f):
            g = int(row["graph_id"])
            if g:
                by_graph[g].append((int(row["start_ns"]), int(row["end_ns"]), int(row["node_id"]), row["name"]))
    if not by_graph:
        sys.exit("kernel_trace.py: %s: no kernel launched from a graph" % args.trace)

    def per_replay(recs):
        return len({r[2] for r in recs})

    if args.graph is not None:
        if args.graph not in by_graph:
            sys.exit("kernel_trace.py: no graph %d (graphs: %s)" % (args.graph, sorted(by_graph)))
        gids = [args.graph]
    else:
        # most kernels per replay first, the later graph first among equals
        gids = sorted(by_graph, key=lambda g: (-per_replay(by_graph[g]), -by_graph[g][-1][0]))[:args.graphs]
    for i, gid in enumerate(gids):
        if i:
            print()
        summarise(gid, sorted(by_graph[gid]), per_replay(by_graph[gid]), args.skip)


def summarise(gid, recs, n, skip):
    replays = [recs[i:i + n] for i in range(0, len(recs) - n + 1, n)]
    used = replays[skip:] if len(replays) > skip else replays[-1:]
    print("graph %d: %d kernels a replay, %d replays, medians over the last %d (us)" % (gid, n, len(replays), len(used)))

    def med(f):
        return [statistics.median(f(rep, i) for rep in used) for i in range(n)]

    dur = med(lambda rep, i: (rep[i][1] - rep[i][0]) / 1e3)
    gap = med(lambda rep, i: (rep[i][0] - rep[i - 1][1]) / 1e3 if i else 0.0)
    adv = med(lambda rep, i: (rep[i][1] - rep[i - 1][1]) / 1e3 if i else (rep[0][1] - rep[0][0]) / 1e3)
    names = [r[3] for r in used[-1]]
    print("%4s %9s %9s %9s  %s" % ("#", "duration", "gap", "advance", "kernel"))
    for i in range(n):
        print("%4d %9.2f %9.2f %9.2f  %s" % (i, dur[i], gap[i], adv[i], names[i][:80]))

    totals = collections.defaultdict(lambda: [0, 0.0])
    for i in range(n):
        totals[names[i]][0] += 1
        totals[names[i]][1] += adv[i]
    span = statistics.median((rep[-1][1] - rep[0][0]) / 1e3 for rep in used)
    print("\n%9s %6s %6s  %s" % ("advance", "share", "count", "kernel"))
    for name, (count, us) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print("%9.2f %5.1f%% %6d  %s" % (us, 100 * us / span, count, name[:80]))
    print("\nspan %.2f us (first start to last end); advances summed %.2f us, durations summed %.2f us"
          % (span, sum(adv), sum(dur)))
    fold_layers(names, dur, gap, adv)


def find_layers(names):
    """(period, first, repeats) of the run of names repeated most often
    back to back (the most kernels covered; the shorter period among
    equals), or None below three repeats."""
    best = None
    n = len(names)
    for period in range(2, min(64, n // 3) + 1):
        for first in range(period):
            reps = 1
            while first + (reps + 1) * period <= n and \
                    names[first + reps * period:first + (reps + 1) * period] == names[first:first + period]:
                reps += 1
            if reps >= 3 and (best is None or reps * period > best[2] * best[0]):
                best = (period, first, reps)
    return best


def fold_layers(names, dur, gap, adv):
    found = find_layers(names)
    if not found:
        return
    period, first, reps = found
    print("\nkernels %d..%d: %d repeats of %d kernels; per position, medians over the repeats (us)"
          % (first, first + reps * period - 1, reps, period))
    print("%4s %9s %9s %9s  %s" % ("pos", "duration", "gap", "advance", "kernel"))
    total = 0.0
    for j in range(period):
        at = [first + r * period + j for r in range(reps)]
        a = statistics.median(adv[i] for i in at)
        total += a
        print("%4d %9.2f %9.2f %9.2f  %s" % (j, statistics.median(dur[i] for i in at),
                                             statistics.median(gap[i] for i in at), a, names[first + j][:80]))
    print("a repeat: %.2f us (medians' sum)" % total)


if __name__ == "__main__":
    main()
