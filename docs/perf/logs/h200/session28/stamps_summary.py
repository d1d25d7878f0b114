#!/usr/bin/env python3
"""Summarises moe_stamps CSV (lease6.sh): per-block globaltimer stamps of batch 1's gate_up and
down-with-sum in one layer, in microseconds from the first gate_up block's start."""
import csv, statistics, sys

rows = list(csv.DictReader(open(sys.argv[1])))
gate = [r for r in rows if r["kernel"] == "gate_up"]
down = [r for r in rows if r["kernel"] == "down"]
t0 = min(int(r["s0"]) for r in gate)
us = lambda r, k: (int(r[k]) - t0) / 1000.0

def line(name, values):
    v = sorted(values)
    q = lambda f: v[min(len(v) - 1, int(f * len(v)))]
    print(f"  {name:34} min {v[0]:7.2f}  p10 {q(0.1):7.2f}  med {q(0.5):7.2f}  p90 {q(0.9):7.2f}  max {v[-1]:7.2f}")

print(f"gate_up: {len(gate)} blocks on {len(set(r['sm'] for r in gate))} SMs")
line("start", [us(r, "s0") for r in gate])
line("past its wait (routing done)", [us(r, "s1") for r in gate])
line("chunks done", [us(r, "s2") for r in gate])
line("end", [us(r, "s3") for r in gate])
gate_end = max(us(r, "s3") for r in gate)
print(f"down: {len(down)} blocks on {len(set(r['sm'] for r in down))} SMs")
line("start", [us(r, "s0") for r in down])
line("prologue done (before its wait)", [us(r, "s1") for r in down])
line("past its wait", [us(r, "s2") for r in down])
line("tokens staged", [us(r, "s3") for r in down])
line("chunks done", [us(r, "s4") for r in down])
ends = [us(r, "s5") for r in down if int(r["s5"]) > 0]
if ends:
    line("end (thread 0)", ends)
started_before = sum(1 for r in down if us(r, "s0") < gate_end)
print(f"  down blocks started before gate_up's last end ({gate_end:.2f}): {started_before} of {len(down)}")
line("start - gate_up's last end", [us(r, "s0") - gate_end for r in down])
line("chunks done - past its wait", [us(r, "s4") - us(r, "s2") for r in down])
line("tokens staged - past its wait", [us(r, "s3") - us(r, "s2") for r in down])
line("prologue: done - start", [us(r, "s1") - us(r, "s0") for r in down])
