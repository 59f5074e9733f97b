#!/usr/bin/env python3
"""Two timing reports (profile.report) side by side: the same model under two overlap
policies, layouts, variants or builds, as Markdown on stdout.

  tools/compare_reports.py A.json B.json [--top N] [--names A_NAME B_NAME]

First the step (the report's "overlap" means over its policy steps, per step and rank):
iter, compute, communication, exposed and hidden communication, the part of the exposed
spent waiting for another rank (where the reports have it), the time with nothing timed in
flight, each parallelism's exposed communication (and its waiting), and the products' rate;
beside the mean iter, the median and the middle half (p25-p75) of the iter times of the
report's "steps" rows that make the means (every rank's, probes and warm-up steps left
out). Under the table a verdict by the medians, B / A, and whether the two middle halves
overlap (then "no clear difference": within the step-to-step spread) or not; and a
warning for a report whose mean is more than 1.5x its median or with a policy step over
3x it, naming the slow steps (a first step's warm-up: rerun with --profile.warmup). A
report without step rows gets none of these; one whose steps were all warm-up or probes a
note saying why its cells are blank.
Then the ops, the N (default 25) whose time per step changed the most first: time per
step, mean per call, the ratio B / A of the means ("calls differ" where the runs call the
op a different number of times a step: chunked TP's pieces are smaller calls), and each
run's slowdown beside communication (the report's overlapped over isolated mean; '*' from
fewer than 10 instances on either side; for a communication op also net of its waits for
other ranks, "excl wait", where the report has it; "(mixes sizes)" over calls of several
sizes, which the report's table splits). A communication op that several parallelisms run
(a tp and a dp all-reduce) is a row per parallelism, as in the report's table. Where both
reports have device kernels (CUPTI), last the kernels behind the ops the same way: each
(op, kernel) pair's time per step and mean, the largest change first.

Only the Python standard library: it runs wherever the reports are."""
import argparse
import json
import math
import signal
import sys


def load(path):
    """the report at path; ValueError naming the file when it is none"""
    try:
        with open(path) as f:
            r = json.load(f)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (a gptc timing report is JSON)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    if not isinstance(r, dict) or "kernels" not in r or "overlap" not in r:
        raise ValueError(f"{path}: not a gptc timing report (no kernels or overlap)")
    return r


FEW = 10  # a slowdown from fewer instances on either side is marked, as the report's table does


def marked(v):
    """v's slowdown to 2 decimals, '*' when either side has fewer than FEW instances
    (reports from before n_isolated had no counts: none)"""
    few = min(v.get("n_isolated", FEW), v.get("n_overlapped", FEW)) < FEW
    return f"{v['slowdown']:.2f}{'*' if few else ''}"


def slowdown(v):
    """v's slowdown as text (marked), and a communication op's net of its waits for other
    ranks beside it, where the report has it; None where there is none"""
    if v.get("slowdown") is None:
        return None
    net = v.get("net_of_wait")
    if isinstance(net, dict) and net.get("slowdown") is not None:
        return f"{marked(v)} ({marked(net)} excl wait)"
    return marked(v)


def mixes_sizes(k, par=None):
    """does kernel k (of parallelism par) run calls of more than one size (its by_size)?"""
    return len([r for r in k.get("by_size") or [] if par is None or r.get("parallelism") == par]) > 1


def ops(report):
    """{row name: (us per step, mean us, slowdown text, calls per step)} over the policy
    steps: a compute op by its name, a communication op by name and parallelism. A slowdown
    over calls of several sizes says so: it measures the sizes as well as the contention
    (the report's table has a row per size)"""
    rows = report["overlap"]["policy_steps"] or 1
    out = {}
    for k in report["kernels"]:
        parts = k.get("by_parallelism") or {}
        # the reductions over every rank: "none" in by_parallelism, [world] in gptc's table
        items = [(f"{k['name']} [{'world' if par == 'none' else par}]", v, par)
                 for par, v in parts.items()] \
            if k["kind"] == "comm" and parts else [(k["name"], k, None)]
        for name, v, par in items:
            slow = slowdown(v)
            if slow and mixes_sizes(k, par):
                slow += " (mixes sizes)"
            out[name] = (v["count"] * v["mean_us"] / rows, v["mean_us"], slow, v["count"] / rows)
    return out


def device(report):
    """{(op, kernel): (us per step, mean us)} of the report's device_kernels"""
    return {(d["op"], d["kernel"]): (d["total_us_per_step"], d["mean_us"])
            for d in report.get("device_kernels") or []}


def by_change(xa, xb):
    """the keys of either {key: (us per step, ...)}, the largest change in time first"""
    return sorted(set(xa) | set(xb), key=lambda n: -abs(change(xa.get(n), xb.get(n))))


def change(x, y):
    """B's time per step less A's, a missing entry counting 0"""
    return (y[0] if y else 0.0) - (x[0] if x else 0.0)


def num(x, spec):
    return "" if x is None else format(x, spec)


def mean_ratio(x, y):
    """B's mean per call over A's, where both ran the op as often a step: a policy that cuts
    an op into pieces (overlap.tp = chunked) has smaller calls, and their ratio would read
    as a speed-up ("calls differ": compare the time per step)"""
    if not x or not y:
        return ""
    if abs(x[3] - y[3]) > 1e-9 * max(x[3], y[3]):
        return "calls differ"
    return num(ratio(x[1], y[1]), ".3f")


def ratio(a, b):
    return b / a if a and b is not None else None


def step_ratio(x, y, spec):
    """the ratio cell of a step row: none for a row of text (a spread)"""
    return "" if spec == "s" else num(ratio(x, y), ".3f")


def policy_iters(report):
    """[(step, iter ms)] of the report's step rows that make its means, every rank's: no
    probe, no warm-up; [] where it has none"""
    out = []
    for s in report.get("steps") or []:
        if s.get("probe") or s.get("warmup"):
            continue
        v = s["iter_ms"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"steps: iter_ms = {v!r} is not a time")
        out.append((s["step"], float(v)))
    return out


def quantile(xs, q):
    """the q-quantile of sorted xs, linear between the nearest two (numpy's default)"""
    i = q * (len(xs) - 1)
    lo = int(i)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def spread(report):
    """the iter ms of the report's policy step rows: {rows, steps (step: the slowest rank's
    time, in the run's order), median, p25, p75, mean}; None where it has none"""
    rows = policy_iters(report)
    if not rows:
        return None
    xs = sorted(t for _, t in rows)
    steps = {}
    for step, t in rows:
        steps[step] = max(t, steps.get(step, t))
    return {"rows": rows, "steps": dict(sorted(steps.items())), "median": quantile(xs, 0.5),
            "p25": quantile(xs, 0.25), "p75": quantile(xs, 0.75), "mean": sum(xs) / len(xs)}


def verdict(sa, sb, na, nb):
    """one line: B / A by median iter, and whether the middle halves of the two runs' step
    rows overlap; None unless both reports have step rows"""
    if not sa or not sb or not sa["median"]:
        return None
    r = sb["median"] / sa["median"]
    apart = not (sa["p25"] <= sb["p75"] and sb["p25"] <= sa["p75"])
    # a winner only where the middle halves are apart: within the spread, no clear difference
    how = (f"{nb} slower" if r > 1 else f"{nb} faster" if r < 1 else "the same") if apart \
        else "no clear difference"
    # medians: one slow step (a warm-up, another job on the machine) moves a mean, not them
    line = (f"{nb} / {na} by median iter: {r:.3f} ({how}); the middle halves (p25-p75) of the "
            f"two runs' steps ")
    if apart:
        line += "do not overlap"
    else:
        line += "overlap: the difference is within the step-to-step spread"
    # the ranks of one step wait for each other: the steps, not the rows, are the samples
    n = (len(sa["steps"]), len(sb["steps"]))
    if min(n) < 5:
        line += f" ({n[0]} and {n[1]} steps: few to judge a spread by)"
    return line


def warning(s, name, report):
    """a line naming the steps that pull the report's mean iter far above its median (mean
    over 1.5x the median, or any policy step over 3x it, as the run's own table names
    them); None where none do"""
    if not s:
        return None
    med, steps = s["median"], s["steps"]
    if not (s["mean"] > 1.5 * med or max(steps.values()) > 3 * med):
        return None
    slow = [k for k, t in steps.items() if t > 3 * med] or \
        [k for k, t in steps.items() if t > 1.5 * med]
    lead = []  # the slow steps the run starts with: warm-up
    for k in steps:
        if k not in slow:
            break
        lead.append(k)
    few = "s" if len(slow) > 1 else ""
    more = f" and {len(slow) - 5} more" if len(slow) > 5 else ""
    line = (f"Warning: in {name}, step{few} {', '.join(str(k) for k in slow[:5])}{more} took "
            f"{', '.join(f'{steps[k]:.1f}' for k in slow[:5])} ms against a median of "
            f"{med:.1f} ms (mean {s['mean']:.1f} ms)")
    if not lead:
        return line + (f": slow step{few} in the means (another load on the machine?); read "
                       f"the medians")
    # profile.warmup counts the run's first steps, warm-up and probe steps among them
    n = len({r["step"] for r in report["steps"] if r["step"] <= lead[-1]})
    what = "a warm-up step" if len(lead) == 1 else "warm-up steps"
    if len(lead) < len(slow):
        return line + (f": {what} and later slow ones (another load on the machine?) in the "
                       f"means; rerun with --profile.warmup={n} and read the medians")
    return line + f": {what} in the means; rerun with --profile.warmup={n}"


def empty(report, name):
    """a line for a report with no policy steps (each a warm-up or a contention probe), whose
    cells are blank; None for one that has some"""
    if report["overlap"]["policy_steps"]:
        return None
    if report.get("steps") == []:  # a resume past train.steps
        return f"Note: {name} has no steps (its run had none to run): its cells are blank"
    return (f"Note: {name} has no steps run with its policies (each was a warm-up step or a "
            f"contention probe): its cells are blank; run more steps than --profile.warmup "
            f"and the probes take")


def step_rows(a, b, sa=None, sb=None):
    """(label, A, B, format) of the step's figures; with spread()s, the iter's median and
    middle half (format "s": text, no ratio)"""
    oa, ob = a["overlap"], b["overlap"]
    rows = [(label, oa.get(key), ob.get(key), ".3f") for label, key in (
        ("iter ms", "iter_ms"), ("compute ms", "compute_ms"), ("comm ms", "comm_ms"),
        ("exposed comm ms", "exposed_comm_ms"), ("hidden comm ms", "hidden_comm_ms"),
        ("nothing timed in flight ms", "idle_ms"))]
    if sa or sb:
        rows[1:1] = [("iter ms median", sa and sa["median"], sb and sb["median"], ".3f"),
                     ("iter ms p25-p75", sa and f"{sa['p25']:.3f}-{sa['p75']:.3f}",
                      sb and f"{sb['p25']:.3f}-{sb['p75']:.3f}", "s")]
    # waits for other ranks: reports of one rank, or from before gptc matched them, have none
    if oa.get("comm_wait_ms") is not None or ob.get("comm_wait_ms") is not None:
        rows.append(("exposed comm waiting for a rank ms", oa.get("comm_wait_ms"),
                     ob.get("comm_wait_ms"), ".3f"))
    for par in ("dp", "tp", "pp"):
        pa = oa.get("by_parallelism", {}).get(par, {})
        pb = ob.get("by_parallelism", {}).get(par, {})
        if pa.get("comm_ms") or pb.get("comm_ms"):
            rows.append((f"{par} exposed comm ms", pa.get("exposed_comm_ms"),
                         pb.get("exposed_comm_ms"), ".3f"))
            if pa.get("comm_wait_ms") is not None or pb.get("comm_wait_ms") is not None:
                rows.append((f"{par} of it waiting for a rank ms", pa.get("comm_wait_ms"),
                             pb.get("comm_wait_ms"), ".3f"))
    rows.append(("products TFLOP/s over the step", oa.get("tflops"), ob.get("tflops"), ".4g"))
    return rows


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head: end quietly, as other tools do
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--top", type=int, default=25, help="op rows (default 25)")
    ap.add_argument("--names", nargs=2, metavar=("A_NAME", "B_NAME"), default=("A", "B"))
    args = ap.parse_args()
    if args.top < 0:  # a negative slice would drop rows from the end
        ap.error(f"--top {args.top}: give a count of rows, 0 or more")
    na, nb = args.names
    try:
        a, b = load(args.a), load(args.b)
    except ValueError as e:
        print(f"compare_reports: {e}", file=sys.stderr)
        return 1
    # every figure first, so that a report with a field of the wrong type fails in one line
    # before any of the tables is printed
    try:
        sa, sb = spread(a), spread(b)
        steps, oa, ob, da, db = step_rows(a, b, sa, sb), ops(a), ops(b), device(a), device(b)
        notes = [x for x in (empty(a, na), empty(b, nb), verdict(sa, sb, na, nb),
                             warning(sa, na, a), warning(sb, nb, b)) if x]
        names = by_change(oa, ob)
        pairs = by_change(da, db) if da and db else []
        for label, x, y, spec in steps:
            num(x, spec), num(y, spec), step_ratio(x, y, spec)
        for r in list(oa.values()) + list(ob.values()):
            num(r[0], ".1f"), num(r[1], ".2f")
        for r in (a, b):
            # counts: a fraction or a negative one scaled every "per step" figure
            for key, v in (("ranks", r["ranks"]), ("overlap.policy_steps", r["overlap"]["policy_steps"])):
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"{key} = {v!r} is not a count")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        print(f"compare_reports: {args.a} or {args.b}: not a gptc timing report as this tool "
              f"reads it ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    print(f"{na}: {args.a} ({a['ranks']} rank(s), {a['overlap']['policy_steps']} step row(s))  ")
    print(f"{nb}: {args.b} ({b['ranks']} rank(s), {b['overlap']['policy_steps']} step row(s))\n")
    print(f"| per step and rank | {na} | {nb} | {nb} / {na} |\n|---|---|---|---|")
    for label, x, y, spec in steps:
        print(f"| {label} | {num(x, spec)} | {num(y, spec)} | {step_ratio(x, y, spec)} |")
    for line in notes:
        print(f"\n{line}")
    print(f"\nOps, the largest change in time per step first ({min(args.top, len(names))} of "
          f"{len(names)}):\n")
    print(f"| op | {na} us/step | {nb} us/step | change us/step | {na} mean us | {nb} mean us | "
          f"{nb} / {na} | {na} slowdown | {nb} slowdown |\n|---|---|---|---|---|---|---|---|---|")
    for n in names[:args.top]:
        x, y = oa.get(n), ob.get(n)
        print(f"| {n} | {num(x and x[0], '.1f')} | {num(y and y[0], '.1f')} | "
              f"{change(x, y):+.1f} | "
              f"{num(x and x[1], '.2f')} | {num(y and y[1], '.2f')} | "
              f"{mean_ratio(x, y)} | {(x and x[2]) or ''} | "
              f"{(y and y[2]) or ''} |")
    if pairs:
        print(f"\nDevice kernels behind the ops (CUPTI), the largest change in time per step "
              f"first ({min(args.top, len(pairs))} of {len(pairs)}):\n")
        print(f"| op | kernel | {na} us/step | {nb} us/step | change us/step | {na} mean us | "
              f"{nb} mean us |\n|---|---|---|---|---|---|---|")
        for op, kernel in pairs[:args.top]:
            x, y = da.get((op, kernel)), db.get((op, kernel))
            print(f"| {op} | `{kernel}` | {num(x and x[0], '.1f')} | {num(y and y[0], '.1f')} | "
                  f"{change(x, y):+.1f} | {num(x and x[1], '.2f')} | {num(y and y[1], '.2f')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
