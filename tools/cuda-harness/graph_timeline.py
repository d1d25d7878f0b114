#!/usr/bin/env python3
"""Per-kernel cost inside CUDA-graph replays, from kernel_trace.cpp's CSV.

    python3 tools/cuda-harness/graph_timeline.py trace.csv [--top 25] [--chain FIRST:LAST]

For every graph with several replays (a decode step's graph is replayed once per step), the k-th
launch of each node belongs to replay k. Within a replay, kernels are ordered by start; a kernel's
"held" time is how far it pushes the end of the chain past every kernel before it
(max(0, end - latest earlier end)), so the held times of a replay add up to its span even where
chained launches overlap. "run" is the kernel's own start-to-end. Both are medians over the
replays, grouped by kernel (name and template arguments) and grid.

--chain FIRST:LAST also lists launches FIRST..LAST-1 of the replay in start order (e.g. one
layer's): start and end relative to launch FIRST, each a median over the replays, and how far
each end lies past the previous launch's end, so overlaps and gaps between neighbours show.
"""
import argparse
import collections
import csv
import functools
import shutil
import statistics
import subprocess


@functools.lru_cache(maxsize=None)
def demangle(name):
    if not name.startswith("_Z") or shutil.which("c++filt") is None:
        return name
    return subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip() or name


def short_name(name):
    name = demangle(name)
    for prefix in ("void ", "anvil::cuda::", "(anonymous namespace)::", "<unnamed>::", "unnamed>::", "moe::", "attn::"):
        name = name.replace(prefix, "")
    if ">(" in name:
        name = name[: name.index(">(") + 1]
    elif "(" in name:
        name = name[: name.index("(")]
    return name[:60]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--chain", help="FIRST:LAST, launches of one replay in start order")
    args = parser.parse_args()
    graphs = collections.defaultdict(list)
    with open(args.csv) as f:
        for row in csv.DictReader(f):
            if row["graph"] != "0":
                graphs[row["graph"]].append(row)
    for graph, rows in sorted(graphs.items(), key=lambda kv: int(kv[0])):
        seen = collections.Counter()
        replays = collections.defaultdict(list)
        for row in sorted(rows, key=lambda r: int(r["start_ns"])):
            replays[seen[row["node"]]].append(row)
            seen[row["node"]] += 1
        nodes = len(seen)
        full = [r for r in replays.values() if len(r) == nodes]
        if len(full) < 3:
            continue
        full = full[1:]  # the first replay uploads the graph
        spans, held, run, count = [], collections.defaultdict(list), collections.defaultdict(list), collections.Counter()
        for replay in full:
            replay.sort(key=lambda r: int(r["start_ns"]))
            first = int(replay[0]["start_ns"])
            frontier = first
            per_key_held, per_key_run = collections.Counter(), collections.Counter()
            for r in replay:
                start, end = int(r["start_ns"]), int(r["end_ns"])
                key = (short_name(r["name"]), r["grid"])
                per_key_held[key] += max(0, end - frontier)
                per_key_run[key] += end - start
                frontier = max(frontier, end)
            spans.append(frontier - first)
            for key in per_key_run:
                held[key].append(per_key_held[key])
                run[key].append(per_key_run[key])
        for r in full[0]:
            count[(short_name(r["name"]), r["grid"])] += 1
        span = statistics.median(spans)
        print(f"\n== graph {graph}: {nodes} kernels, {len(full)} replays, median span {span / 1e3:.1f} us ==")
        print(f"{'held us':>9} {'run us':>9} {'x':>4}  kernel  [grid]")
        total = 0.0
        for key in sorted(held, key=lambda k: -statistics.median(held[k]))[: args.top]:
            h, u = statistics.median(held[key]) / 1e3, statistics.median(run[key]) / 1e3
            total += h
            print(f"{h:9.1f} {u:9.1f} {count[key]:4d}  {key[0]}  [{key[1]}]")
        print(f"{total:9.1f}           (these rows)")
        if args.chain:
            first, last = (int(v) for v in args.chain.split(":"))
            last = min(last, nodes)
            print(f"{'#':>4} {'start':>8} {'end':>8} {'run':>7} {'past prev':>9}  kernel  [grid]")
            def at(replay, i, field):  # us after launch `first` of the same replay
                return (int(replay[i][field]) - int(replay[first]["start_ns"])) / 1e3
            for i in range(first, last):
                start = statistics.median(at(r, i, "start_ns") for r in full)
                end = statistics.median(at(r, i, "end_ns") for r in full)
                past = statistics.median(at(r, i, "end_ns") - at(r, i - 1, "end_ns") for r in full) if i > 0 else end
                print(f"{i:4d} {start:8.2f} {end:8.2f} {end - start:7.2f} {past:9.2f}  "
                      f"{short_name(full[0][i]['name'])}  [{full[0][i]['grid']}]")


if __name__ == "__main__":
    main()
