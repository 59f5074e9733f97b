"""Overlap sweep: layouts x overlap policies x bucket sizes / chunk counts, with per-kernel timing.

Every run uses --profile.timing=kernel and writes a report and a trace; the reports are
collected into one CSV (one row per run x repeat x rank x step, plus a per-kernel CSV and
the chosen step's trace events) and drawn:

  step_time.png               ms/step per policy (median over steps 3+ of all repeats of the
                              mean over ranks; --stat mean), one panel per (model, layout)
  comm_hidden.png             exposed vs hidden communication per step and rank
  kernel_slowdown_<model>.png per-kernel slowdown (beside communication / alone), per policy
  timeline.png                one step of one layout from the trace, per rank and stream,
                              without and with overlap

Communication on one machine is shared memory and nearly free, so every run sets the
test-only GPTC_TEST_COMM_DELAY_US (--comm-delay-us, default 500): each communication op run
on a comm stream sleeps that long first, like a network with that much latency per op.

Run from the repository root with Debian's python3 (needs numpy, h5py, matplotlib):
    /usr/bin/python3 benchmarks/overlap_sweep.py [--models tiny,small]
        [--layouts dp2,tp2,pp2,tp2xdp2] [--steps 8] [--repeats 3] [--comm-delay-us 500]
        [--out benchmarks/figures] [--plot-only]
The default matrix (30 configurations x 3 repeats) takes about 4 minutes on 2 cores.
"""
import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(os.environ.get("GPTC_BUILD", os.path.join(ROOT, "build")), "gptc-train")
MACHINE = "2-core Xeon, CPU backend"

MODELS = {  # n_layer, n_head, d_model, vocab, seq_len (= n_ctx); global batch 8, micro-batch 2
    "tiny": dict(n_layer=4, n_head=4, d_model=128, vocab=256, seq=64),
    "small": dict(n_layer=4, n_head=8, d_model=256, vocab=4096, seq=128),
}
LAYOUTS = {  # name -> (tp, pp, dp)
    "dp2": (1, 1, 2),
    "tp2": (2, 1, 1),
    "pp2": (1, 2, 1),
    "tp2xdp2": (2, 1, 2),
}
# Policies per layout: (label, overrides of the [overlap] keys). The first one is the baseline.
DP_BUCKET = lambda mb: {"dp": "bucket", "dp_bucket_mb": mb}
TP_CHUNKED = lambda k: {"tp": "chunked", "tp_chunks": k}
POLICIES = {
    "dp2": [("none", {}),
            ("dp bucket 0.5MB", DP_BUCKET(0.5)),
            ("dp bucket 2MB", DP_BUCKET(2)),
            ("dp bucket 8MB", DP_BUCKET(8)),
            ("ZeRO-1", {"dp_shard": "optimizer"}),
            ("ZeRO-1 + bucket 2MB", {"dp_shard": "optimizer", **DP_BUCKET(2)})],
    "tp2": [("none", {}),
            ("tp chunked K2", TP_CHUNKED(2)),
            ("tp chunked K4", TP_CHUNKED(4))],
    "pp2": [("none", {}),
            ("pp async", {"pp": "async"})],
    "tp2xdp2": [("none", {}),
                ("dp bucket 2MB", DP_BUCKET(2)),
                ("tp chunked K2", TP_CHUNKED(2)),
                ("dp bucket 2MB + tp chunked K2", {**DP_BUCKET(2), **TP_CHUNKED(2)})],
}
OVERLAP_DEFAULTS = {"dp": "none", "dp_bucket_mb": "", "tp": "none", "tp_chunks": "",
                    "pp": "none", "dp_shard": "none"}
STEP_COLS = ["step", "rank", "iter_ms", "compute_ms", "comm_ms", "exposed_comm_ms"]
KERNEL_COLS = ["name", "kind", "count", "n_isolated", "n_overlapped", "mean_us",
               "isolated_mean_us", "overlapped_mean_us", "slowdown", "slowdown_excl_wait",
               "probe_mean_us", "slowdown_vs_probe"]
STREAMS = {0: "compute", 1: "comm tp", 2: "comm pp", 3: "comm dp"}


def run_id(model, layout, label):
    return f"{model}/{layout}/{label}"


# ----------------------------------------------------------------------------- sweep

def write_tokens(path, vocab, n=200_000):
    with h5py.File(path, "w") as f:
        f["tokens"] = np.random.default_rng(0).integers(0, vocab, n).astype(np.uint16)
        f.attrs["vocab_size"] = np.int64(vocab)


def cpu_busy(seconds=0.5):
    """Fraction of all CPUs busy over `seconds` (from /proc/stat)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 1 - (i1 - i0) / max(t1 - t0, 1)


def wait_for_quiet(a):
    """On a shared machine other work skews timings: wait (up to --max-wait-s) until the CPUs
    are mostly idle. Returns the busy fraction seen just before the run."""
    deadline = time.time() + a.max_wait_s
    while True:
        busy = cpu_busy()
        if busy <= a.idle_busy or time.time() > deadline:
            return busy
        time.sleep(1.0)


def run_one(model, layout, label, overlap, a, work, tokens, rep):
    """Runs one configuration; returns (run columns, step rows, kernel rows, trace events)."""
    m, (tp, pp, dp) = MODELS[model], LAYOUTS[layout]
    ranks = tp * pp * dp
    tag = re.sub(r"[^A-Za-z0-9]+", "_", run_id(model, layout, label))
    report, trace = os.path.join(work, tag + ".report.json"), os.path.join(work, tag + ".trace.json")
    args = [f"--model.n_layer={m['n_layer']}", f"--model.n_head={m['n_head']}",
            f"--model.d_model={m['d_model']}", f"--model.n_ctx={m['seq']}",
            f"--model.vocab_size={m['vocab']}", f"--train.seq_len={m['seq']}",
            "--train.global_batch=8", "--train.micro_batch=2", f"--train.steps={a.steps}",
            f"--data.path={tokens}", f"--parallel.tp={tp}", f"--parallel.pp={pp}",
            f"--parallel.dp={dp}", "--profile.timing=kernel", f"--profile.report={report}",
            f"--profile.trace={trace}"]
    args += [f"--overlap.{k}={v}" for k, v in overlap.items()]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               GPTC_TEST_COMM_DELAY_US=str(a.comm_delay_us),
               OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // ranks)))
    if a.contention_probe:
        args.append(f"--profile.contention_probe={a.contention_probe}")
    launch = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] if ranks > 1 else []
    busy = wait_for_quiet(a) if os.path.exists("/proc/stat") else None
    t0 = time.time()
    p = subprocess.run(launch + [a.train] + args, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.exit(f"run {run_id(model, layout, label)} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    buckets = re.search(r"data parallel: (\d+) buckets", p.stdout)
    with open(report) as f:
        rpt = json.load(f)
    cols = {"model": model, "layout": layout, "tp": tp, "pp": pp, "dp": dp, "ranks": ranks,
            "policy": label, "repeat": rep, **{f"overlap_{k}": overlap.get(k, v) for k, v in OVERLAP_DEFAULTS.items()},
            "comm_delay_us": a.comm_delay_us, "steps": a.steps,
            "dp_buckets": buckets.group(1) if buckets else "",
            "dropped_records": rpt.get("dropped_records", ""), "wall_s": round(wall, 2),
            "cpu_busy_before": None if busy is None else round(busy, 3)}
    # With --contention-probe the report also sums the run up against its serialized steps.
    cols.update(run_columns(rpt.get("overlap", {})))
    steps = [{**cols, **s} for s in rpt["steps"]]
    kernels = [{**cols, **kernel_columns(k)} for k in rpt["kernels"]]
    with open(trace) as f:
        raw = json.load(f)["traceEvents"]
    # the timed records, and each step's span (an async "b" / "e" pair per rank) as one
    # event of cat "step" with a duration, as the timeline below draws them
    events = [e for e in raw if e.get("ph") == "X"]
    begins = {(e["pid"], e["args"]["step"]): e for e in raw if e.get("ph") == "b"}
    for e in raw:
        b = begins.get((e["pid"], e["args"]["step"])) if e.get("ph") == "e" else None
        if b:
            events.append({**b, "ph": "X", "dur": e["ts"] - b["ts"]})
    if not a.keep_traces:  # a few MB each
        os.remove(trace)
    return cols, steps, kernels, events


def run_columns(overlap):
    """the report's run summary as flat CSV columns: run_<key>, and its per-parallelism
    part as run_<dp|tp|pp|none>_<key>, so that no cell holds a nested object"""
    flat = {}
    for key, v in overlap.items():
        if isinstance(v, dict) and key == "by_parallelism":
            for par, figures in v.items():
                flat.update({f"run_{par}_{k}": x for k, x in figures.items()})
        elif not isinstance(v, (dict, list)):
            flat[f"run_{key}"] = v
    return flat


def kernel_columns(k):
    """a report's kernel as flat CSV columns: its nested parts (by parallelism, by size)
    left out, and a communication op's slowdown net of its waits for other ranks kept"""
    flat = {key: v for key, v in k.items() if not isinstance(v, (dict, list))}
    net = k.get("net_of_wait")
    flat["slowdown_excl_wait"] = net.get("slowdown") if isinstance(net, dict) else None
    return flat


def write_csv(path, rows, first):
    keys = list(first)
    for r in rows:  # fields the report gains later (e.g. "probe") are kept, after the known ones
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})


def sweep(a):
    run_keys = ["model", "layout", "tp", "pp", "dp", "ranks", "policy", "repeat"] + \
               [f"overlap_{k}" for k in OVERLAP_DEFAULTS] + \
               ["comm_delay_us", "steps", "dp_buckets", "dropped_records", "wall_s", "cpu_busy_before"]
    work = tempfile.mkdtemp(prefix="gptc_overlap_")
    # Run a copy of the binary, so that a rebuild during the sweep cannot mix two versions.
    a.train = os.path.join(work, "gptc-train")
    shutil.copy2(TRAIN, a.train)
    print(f"binary: {TRAIN} (modified {time.ctime(os.path.getmtime(TRAIN))})", flush=True)
    step_rows, kernel_rows, timeline = [], [], {}
    tl_model, tl_layout = timeline_choice(a)
    for model in a.models:
        write_tokens(os.path.join(work, f"tokens_{model}.h5"), MODELS[model]["vocab"])
    # Repeats go round the whole matrix, so that drift in the machine's load spreads over all runs.
    matrix = [(rep, model, layout, label, overlap) for rep in range(a.repeats) for model in a.models
              for layout in a.layouts for label, overlap in POLICIES[layout]]
    for rep, model, layout, label, overlap in matrix:
        tokens = os.path.join(work, f"tokens_{model}.h5")
        cols, steps, kernels, events = run_one(model, layout, label, overlap, a, work, tokens, rep)
        step_rows += steps
        kernel_rows += kernels
        mean = np.mean([s["iter_ms"] for s in steps if s["step"] > 2 and not s.get("probe")]
                       or [np.nan])
        print(f"[{rep + 1}/{a.repeats}] {run_id(model, layout, label):45s} {mean:8.1f} ms/step"
              f"  ({cols['wall_s']:.1f} s)", flush=True)
        if rep == 0 and (model, layout) == (tl_model, tl_layout) and \
                label in (POLICIES[layout][0][0], POLICIES[layout][-1][0]):
            timeline[run_id(model, layout, label)] = [
                {"cat": e["cat"], "name": e["name"], "pid": e["pid"], "tid": e["tid"],
                 "ts": round(e["ts"], 1), "dur": round(e["dur"], 1),
                 "phase": e.get("args", {}).get("phase")}
                for e in events if e.get("args", {}).get("step") == a.timeline_step]
    os.makedirs(a.out, exist_ok=True)
    write_csv(os.path.join(a.out, "overlap_sweep.csv"), step_rows, run_keys + STEP_COLS)
    write_csv(os.path.join(a.out, "overlap_sweep_kernels.csv"), kernel_rows, run_keys + KERNEL_COLS)
    with open(os.path.join(a.out, "overlap_sweep_timeline.json"), "w") as f:
        json.dump({"step": a.timeline_step, "comm_delay_us": a.comm_delay_us, "runs": timeline}, f)
    print(f"raw reports{' and traces' if a.keep_traces else ''}: {work}")


# ----------------------------------------------------------------------------- plots

def read_csv(path):
    def conv(v):
        if v in ("", "None"):
            return None
        for t in (int, float):
            try:
                return t(v)
            except ValueError:
                pass
        return {"True": True, "False": False, "true": True, "false": False}.get(v, v)
    with open(path) as f:
        return [{k: conv(v) for k, v in r.items()} for r in csv.DictReader(f)]


def runs_in_order(rows):
    """[(model, layout, [policy labels])] in sweep order."""
    out = {}
    for r in rows:
        out.setdefault((r["model"], r["layout"]), [])
        if r["policy"] not in out[(r["model"], r["layout"])]:
            out[(r["model"], r["layout"])].append(r["policy"])
    return [(m, l, p) for (m, l), p in out.items()]


def measured(rows, model, layout, policy):
    """Step rows after the first 2 steps of every repeat (probe steps, if the report marks
    any, left out)."""
    return [r for r in rows if r["model"] == model and r["layout"] == layout
            and r["policy"] == policy and r["step"] > 2 and not r.get("probe")]


def per_step(rows, key):
    """Values of key (a column name or a function of a row) per (repeat, step), mean over ranks."""
    d = {}
    for r in rows:
        d.setdefault((r["repeat"], r["step"]), []).append(key(r) if callable(key) else r[key])
    return [np.mean(v) for v in d.values()]


def center(v, stat):
    """nan for no values (CSVs of a sweep whose every measured step was a probe): no bar"""
    if len(v) == 0:
        return float("nan")
    return float(np.median(v) if stat == "median" else np.mean(v))


def spread(v, stat):
    """(below, above) the center: the interquartile range for the median, +-std for the mean."""
    if len(v) == 0:
        return float("nan"), float("nan")
    if stat == "median":
        q1, q2, q3 = np.percentile(v, [25, 50, 75])
        return q2 - q1, q3 - q2
    return np.std(v), np.std(v)


def panel_grid(plt, models, layouts, height=3.6):
    fig, axes = plt.subplots(len(models), len(layouts), squeeze=False,
                             figsize=(4.2 * len(layouts) + 0.5, height * len(models) + 1.2))
    return fig, axes


def policy_colors(labels):
    import matplotlib.pyplot as plt
    cmap = plt.get_cmap("tab10")
    return ["0.6" if lab == "none" else cmap(i % 10) for i, lab in enumerate(labels)]


def policy_panels(plt, rows):
    """One panel per (model, layout): the figure, its axes, and (ax, model, layout,
    policies) for every run group."""
    groups = runs_in_order(rows)
    models = list(dict.fromkeys(g[0] for g in groups))
    layouts = list(dict.fromkeys(g[1] for g in groups))
    fig, axes = panel_grid(plt, models, layouts)
    panels = [(axes[models.index(m)][layouts.index(l)], m, l, p) for m, l, p in groups]
    return fig, axes, panels


def plot_step_time(plt, rows, a, subtitle):
    fig, axes, panels = policy_panels(plt, rows)
    for ax, model, layout, policies in panels:
        vals = [per_step(measured(rows, model, layout, p), "iter_ms") for p in policies]
        c = [center(v, a.stat) for v in vals]
        err = np.array([spread(v, a.stat) for v in vals]).T
        x = np.arange(len(policies))
        bars = ax.bar(x, c, yerr=err, capsize=3, color=policy_colors(policies))
        ax.bar_label(bars, labels=[f"{m:.0f}" for m in c], padding=2, fontsize=8)
        ax.set_xticks(x, policies, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("step time (ms)")
        ax.set_ylim(0, max(c + err[1]) * 1.18)
        ax.set_title(f"{model} model, {layout}", fontsize=10)
    for ax in axes.flat:
        if not ax.has_data():
            ax.set_visible(False)
    what = ("median, error bar = interquartile range," if a.stat == "median" else
            "mean, error bar = std,")
    fig.suptitle(f"Step time per overlap policy (each step's time is the mean over ranks; bar = {what} "
                 "over steps 3+ of all repeats)\n"
                 + subtitle, fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "step_time.png"), dpi=110)
    plt.close(fig)


def plot_comm_hidden(plt, rows, a, subtitle):
    fig, axes, panels = policy_panels(plt, rows)
    for ax, model, layout, policies in panels:
        exposed, hidden = [], []
        for p in policies:
            rs = measured(rows, model, layout, p)
            exposed.append(center(per_step(rs, "exposed_comm_ms"), a.stat))
            hidden.append(center(per_step(rs, lambda r: r["comm_ms"] - r["exposed_comm_ms"]), a.stat))
        x = np.arange(len(policies))
        ax.bar(x, exposed, color="tab:red", label="exposed comm")
        ax.bar(x, hidden, bottom=exposed, color="tab:green", label="hidden comm (behind compute)")
        for xi, e, h in zip(x, exposed, hidden):
            ax.text(xi, e + h, f"{100 * h / max(e + h, 1e-9):.0f}%", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, policies, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("communication per step and rank (ms)")
        ax.set_ylim(0, max(e + h for e, h in zip(exposed, hidden)) * 1.18)
        ax.set_title(f"{model} model, {layout}", fontsize=10)
    for ax in axes.flat:
        if not ax.has_data():
            ax.set_visible(False)
    axes.flat[0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"Exposed vs hidden communication per policy (per step and rank: mean over ranks, "
                 f"then {a.stat} over steps 3+ of all repeats; label = % hidden)\n" + subtitle, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(os.path.join(a.out, "comm_hidden.png"), dpi=110)
    plt.close(fig)


def plot_kernel_slowdown(plt, krows, a, subtitle):
    import matplotlib.ticker
    """One figure per model; a panel per layout; one group of bars per policy, a bar per kernel
    with a non-null slowdown (mean over repeats). A report with 'slowdown_vs_probe' adds it as
    black dots."""
    agg = {}  # (model, layout, policy, name) -> kind, [slowdown], [slowdown_vs_probe]
    for k in krows:
        if k["slowdown"] is None:
            continue
        e = agg.setdefault((k["model"], k["layout"], k["policy"], k["name"]), (k["kind"], [], []))
        e[1].append(k["slowdown"])
        if k.get("slowdown_vs_probe") is not None:
            e[2].append(k["slowdown_vs_probe"])
    kind = {key[3]: v[0] for key, v in agg.items()}
    compute = sorted(n for n in kind if kind[n] != "comm")
    comm = sorted(n for n in kind if kind[n] == "comm")
    names = compute + comm
    palette = list(plt.get_cmap("tab20").colors) + list(plt.get_cmap("tab20b").colors)
    color = {n: palette[i % len(palette)] for i, n in enumerate(compute)}
    color.update({n: plt.get_cmap("Dark2")(i % 8) for i, n in enumerate(comm)})
    style = lambda n: dict(facecolor=color[n], hatch="//" if kind[n] == "comm" else None,
                           edgecolor="black" if kind[n] == "comm" else color[n], linewidth=0.5)
    groups = runs_in_order(krows)
    for model in dict.fromkeys(g[0] for g in groups):
        mg = [g for g in groups if g[0] == model]
        fig, axes = plt.subplots(len(mg), 1, squeeze=False, figsize=(15, 3.3 * len(mg) + 1.0))
        probe_seen = False
        for ax, (_, layout, policies) in zip(axes[:, 0], mg):
            x0, ticks, ticklabels, vals = 0.0, [], [], [1.0]
            for p in policies:
                ks = [n for n in names if (model, layout, p, n) in agg]
                if not ks:
                    continue
                for i, n in enumerate(ks):
                    _, sd, sp = agg[(model, layout, p, n)]
                    v = np.mean(sd)
                    vals.append(v)
                    ax.bar(x0 + i, v - 1, bottom=1, width=0.85, **style(n))  # up or down from 1
                    if sp:
                        probe_seen = True
                        ax.plot(x0 + i, np.mean(sp), "k.", markersize=7)
                ticks.append(x0 + (len(ks) - 1) / 2)
                ticklabels.append(p)
                x0 += len(ks) + 1.5
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.set_yscale("log")  # ratios: 2x slower and 2x faster are equally far from 1
            ax.set_ylim(min(vals) / 1.3, max(vals) * 1.3)
            fine = [0.8, 1.25] if max(vals) / min(vals) < 4 else []
            ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(
                sorted([0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100] + fine)))
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.grid(axis="y", color="0.9")
            ax.set_axisbelow(True)
            ax.set_xticks(ticks, ticklabels, fontsize=9)
            ax.set_ylabel("slowdown\n(overlapped / isolated)")
            ax.set_title(f"{model} model, {layout}" + ("" if ticks else ": no kernel ran both ways"),
                         fontsize=10)
        handles = [plt.Rectangle((0, 0), 1, 1, **style(n)) for n in names]
        labels = list(names)
        if probe_seen:
            handles.append(plt.Line2D([], [], color="k", marker=".", ls="none"))
            labels.append("slowdown vs contention probe")
        fig.legend(handles, labels, loc="center right", fontsize=8,
                   title="kernel (hatched = comm op)")
        fig.suptitle(f"Per-kernel slowdown beside communication, {model} model: mean time while the "
                     "other kind was in flight / mean time alone\n(kernels that ran both ways; "
                     "mean over repeats; log scale, dashed = no slowdown)\n" + subtitle, fontsize=11)
        fig.tight_layout(rect=(0, 0, 0.86, 0.98))
        fig.savefig(os.path.join(a.out, f"kernel_slowdown_{model}.png"), dpi=100)
        plt.close(fig)


def plot_timeline(plt, tl, rows, a, subtitle):
    runs = {k: v for k, v in tl["runs"].items() if v}
    if not runs:
        return
    step = tl["step"]
    phase_color = {"fwd": "#6baed6", "bwd": "#2171b5", "opt": "#6a51a3"}
    comm_color = "tab:orange"
    fig, axes = plt.subplots(len(runs), 1, squeeze=False, sharex=True,
                             figsize=(15, 1.0 + sum(0.55 * len({(e["pid"], e["tid"]) for e in ev
                                                                if e["cat"] != "step"}) + 0.8
                                                    for ev in runs.values())),
                             gridspec_kw={"height_ratios": [len({(e["pid"], e["tid"]) for e in ev
                                                                 if e["cat"] != "step"})
                                                            for ev in runs.values()]})
    for ax, (rid, ev) in zip(axes[:, 0], runs.items()):
        spans = [e for e in ev if e["cat"] == "step"]
        t0 = min(e["ts"] for e in spans) if spans else min(e["ts"] for e in ev)
        lanes = sorted({(e["pid"], e["tid"]) for e in ev if e["cat"] != "step"})
        ypos = {lane: len(lanes) - 1 - i for i, lane in enumerate(lanes)}
        for s in spans:  # each rank's step span, behind its lanes
            ys = [ypos[l] for l in lanes if l[0] == s["pid"]]
            if ys:
                ax.axhspan(min(ys) - 0.45, max(ys) + 0.45, xmin=0, xmax=1, color="0.95", zorder=0)
                ax.plot([(s["ts"] - t0) / 1e3, (s["ts"] + s["dur"] - t0) / 1e3], [max(ys) + 0.45] * 2,
                        color="0.3", lw=2, zorder=1)
        for lane in lanes:
            for key, col in [("comm", comm_color)] + [(ph, c) for ph, c in phase_color.items()]:
                bars = [((e["ts"] - t0) / 1e3, max(e["dur"] / 1e3, 0.02)) for e in ev
                        if (e["pid"], e["tid"]) == lane and e["cat"] != "step"
                        and (e["cat"] == "comm" if key == "comm" else
                             e["cat"] == "compute" and e.get("phase") == key)]
                if bars:
                    ax.broken_barh(bars, (ypos[lane] - 0.35, 0.7), facecolors=col, zorder=2)
        ax.set_yticks([ypos[l] for l in lanes], [f"rank {p} {STREAMS.get(t, t)}" for p, t in lanes],
                      fontsize=8)
        model, layout, policy = rid.split("/", 2)
        it = [r["iter_ms"] for r in rows if r["model"] == model and r["layout"] == layout
              and r["policy"] == policy and r["step"] == step]
        ax.set_title(f"{model} model, {layout}, overlap: {policy} — step {step}"
                     + (f", {np.mean(it):.0f} ms (mean over ranks)" if it else ""), fontsize=10)
        ax.set_ylim(-0.6, len(lanes) - 0.4)
    axes[-1, 0].set_xlabel(f"time since the first rank started step {step} (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in phase_color.values()] + \
              [plt.Rectangle((0, 0), 1, 1, color=comm_color), plt.Line2D([], [], color="0.3", lw=2)]
    fig.legend(handles, [f"compute {p}" for p in phase_color] + ["communication", "rank's step span"],
               loc="upper right", fontsize=8, ncol=6)
    fig.suptitle(f"Timeline of step {step} per rank and stream (from the Chrome trace)\n" + subtitle,
                 fontsize=11, x=0.4)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(os.path.join(a.out, "timeline.png"), dpi=100)
    plt.close(fig)


def plot(a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = read_csv(os.path.join(a.out, "overlap_sweep.csv"))
    krows = read_csv(os.path.join(a.out, "overlap_sweep_kernels.csv"))
    with open(os.path.join(a.out, "overlap_sweep_timeline.json")) as f:
        tl = json.load(f)
    delay = rows[0]["comm_delay_us"]
    subtitle = (f"{MACHINE}; every comm-stream op delayed by {delay} us "
                f"(GPTC_TEST_COMM_DELAY_US, simulated network latency); {rows[0]['steps']} steps per run")
    plot_step_time(plt, rows, a, subtitle)
    plot_comm_hidden(plt, rows, a, subtitle)
    plot_kernel_slowdown(plt, krows, a, subtitle)
    plot_timeline(plt, tl, rows, a, subtitle)
    print(f"figures in {a.out}")


def timeline_choice(a):
    model = a.timeline_model or a.models[-1]
    layout = a.timeline_layout if a.timeline_layout in a.layouts else a.layouts[-1]
    return model, layout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,small", help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--layouts", default="dp2,tp2,pp2,tp2xdp2", help=f"comma list of {', '.join(LAYOUTS)}")
    ap.add_argument("--steps", type=int, default=8, help="steps per run (the first 2 are not measured)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each configuration")
    ap.add_argument("--comm-delay-us", type=int, default=500,
                    help="GPTC_TEST_COMM_DELAY_US for every run: sleep before each comm-stream op")
    ap.add_argument("--timeline-model", default=None, help="model of the timeline (default: last model)")
    ap.add_argument("--timeline-layout", default="tp2xdp2",
                    help="layout of the timeline: its first (none) and last policy are drawn")
    ap.add_argument("--timeline-step", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "figures"))
    ap.add_argument("--idle-busy", type=float, default=0.15,
                    help="start a run only when at most this fraction of the CPUs is busy ...")
    ap.add_argument("--max-wait-s", type=float, default=20, help="... or after waiting this long")
    ap.add_argument("--stat", choices=["median", "mean"], default="median",
                    help="statistic over steps and repeats in the bar charts (median: robust to "
                         "other load on a shared machine)")
    ap.add_argument("--contention-probe", type=int, default=0,
                    help="pass profile.contention_probe=N (every N-th step serialized; those "
                         "steps are left out of the bars, kernels get slowdown_vs_probe)")
    ap.add_argument("--keep-traces", action="store_true", help="keep every run's trace.json")
    ap.add_argument("--plot-only", action="store_true", help="redraw from the CSVs in --out")
    a = ap.parse_args()
    a.models, a.layouts = a.models.split(","), a.layouts.split(",")
    for m in a.models:
        if m not in MODELS:
            ap.error(f"unknown model {m}")
    for l in a.layouts:
        if l not in LAYOUTS:
            ap.error(f"unknown layout {l}")
    if a.steps < 3 or a.timeline_step > a.steps:
        ap.error("need --steps >= 3 and --timeline-step <= --steps")
    # gptc serializes every step s with s % N == 0; the bars leave those out
    if a.contention_probe > 0 and all(s % a.contention_probe == 0 for s in range(3, a.steps + 1)):
        ap.error(f"--contention-probe {a.contention_probe} makes every measured step (3..{a.steps}) "
                 f"a probe step, which the bars leave out: use a larger N or more --steps")
    try:  # the plots at the end need it: say so before a sweep of minutes, not after
        import matplotlib  # noqa: F401
    except ImportError:
        ap.error("needs matplotlib for its figures (Debian: apt-get install python3-matplotlib, "
                 "then run it with /usr/bin/python3)")
    if not a.plot_only:
        t0 = time.time()
        sweep(a)
        print(f"sweep took {time.time() - t0:.0f} s")
    plot(a)


if __name__ == "__main__":
    main()
