#!/usr/bin/env python3
"""Per-kernel cost inside CUDA-graph replays, from kernel_trace.cpp's CSV.

    python3 tools/cuda-harness/graph_timeline.py trace.csv [--top 25]

For every graph with several replays (a decode step's graph is replayed once per step), the k-th
launch of each node belongs to replay k. Within a replay, kernels are ordered by start; a kernel's
"held" time is how far it pushes the end of the chain past every kernel before it
(max(0, end - latest earlier end)), so the held times of a replay add up to its span even where
chained launches overlap. "run" is the kernel's own start-to-end. Both are medians over the
replays, grouped by kernel (name and template arguments) and grid.
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


if __name__ == "__main__":
    main()
