#!/usr/bin/env python3
"""Where a steady step's time goes, from a gptc trace (profile.trace): for each op name,
its time per step and per call over the steps after the first few (--skip, default 1),
on one rank (--rank, default 0), as a Markdown table, the largest first.

The timing report's per-kernel means include the first step, which on a GPU holds lazy
module loading and each GEMM's first call (about 4x a later step on an H200): the table
here leaves such steps out. An op's time is its record's duration (its kernels, start of
the first to end of the last), so ops that overlap (communication beside compute) both
count, and the ops of a step may sum to more or less than its wall time. TFLOP/s and
GB/s are the op's work (the events' args, engine/timing.h: timing_work) over its time:
how near each op runs to the card's peak or to its memory bandwidth.

Usage: steady_ops.py TRACE.json [--rank R] [--skip N]"""
import argparse
import collections
import json
import sys


def steady_table(trace, rank=0, skip=1):
    """(markdown text, {name: ms per step}) over the steps of rank after the first skip"""
    events = trace["traceEvents"]
    spans = {}  # step -> [start us, end us] of its step span
    for e in events:
        if e.get("cat") == "step" and e.get("pid") == rank:
            s = e["args"]["step"]
            spans.setdefault(s, [None, None])[0 if e["ph"] == "b" else 1] = e["ts"]
    steps = sorted(spans)[skip:]
    if not steps:
        raise ValueError(f"rank {rank} has {len(spans)} step(s) in the trace, "
                         f"none past the first {skip}")
    keep = set(steps)
    total = collections.defaultdict(float)  # name -> us over the kept steps
    calls = collections.Counter()
    flops = collections.defaultdict(float)  # name -> its work over the kept steps
    nbytes = collections.defaultdict(float)
    kinds = {}
    for e in events:
        if e.get("ph") != "X" or e.get("pid") != rank or e["args"]["step"] not in keep:
            continue
        total[e["name"]] += e["dur"]
        calls[e["name"]] += 1
        flops[e["name"]] += e["args"].get("flops", 0)
        nbytes[e["name"]] += e["args"].get("bytes", 0)
        kinds[e["name"]] = e.get("cat", "")
    n = len(steps)
    wall_ms = sum(spans[s][1] - spans[s][0] for s in steps) / n / 1e3
    per_step = {k: v / n / 1e3 for k, v in total.items()}
    lines = [f"rank {rank}, steps {steps[0]} to {steps[-1]} ({n}; the first {skip} left out): "
             f"{wall_ms:.2f} ms a step, its ops summing to {sum(per_step.values()):.2f} ms",
             "", "| op | kind | ms/step | % of step | calls/step | us/call | TFLOP/s | GB/s |",
             "|---|---|---|---|---|---|---|---|"]
    for name in sorted(per_step, key=per_step.get, reverse=True):
        ms = per_step[name]
        us = total[name]
        tf = f"{flops[name] / us / 1e6:.1f}" if flops[name] and us else ""
        gb = f"{nbytes[name] / us / 1e3:.0f}" if nbytes[name] and us else ""
        lines.append(f"| {name} | {kinds[name]} | {ms:.3f} | {100 * ms / wall_ms:.1f} | "
                     f"{calls[name] / n:g} | {1e3 * ms * n / calls[name]:.1f} | {tf} | {gb} |")
    return "\n".join(lines) + "\n", per_step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--skip", type=int, default=1)
    a = ap.parse_args()
    try:
        with open(a.trace) as f:
            trace = json.load(f)
        text, _ = steady_table(trace, a.rank, a.skip)
    except (OSError, ValueError, KeyError) as e:
        print(f"steady_ops: {a.trace}: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
