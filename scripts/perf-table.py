#!/usr/bin/env python3
"""Turns one GPU run's benchmark JSON into the README's performance tables.

    python3 scripts/perf-table.py RUN_PREFIX [--note TEXT] [--update README.md]

RUN_PREFIX names the run's files: RUN_PREFIX-bench.json (bench --json),
RUN_PREFIX-host_wait.json (examples/host_wait.rs) and
RUN_PREFIX-array_copy.json (examples/array_copy.rs), as saved under
docs/gpu-runs/. Prints the markdown; with --update, replaces what lies between
the `<!-- perf-table:start -->` and `<!-- perf-table:end -->` lines of the file.
Nothing is typed in by hand: every figure comes from those files.
"""

import json
import sys


def fmt(value, unit):
    if value is None:
        return "n/a"
    if unit == "us":
        return f"{value:,.1f} µs"
    if unit == "ms":
        return f"{value:,.3f} ms"
    if unit == "GB/s":
        return f"{value:,.0f} GB/s"
    return f"{value:.3f} {unit}"


def bench_tables(bench):
    out = []
    scenarios = {
        "S1": "S1: one-time costs (first call / median of later calls)",
        "S2": "S2: hand-off latency (Vulkan signal -> CUDA wait -> trivial kernel -> host sees it)",
        "S3": "S3: frame throughput (Vulkan produces, CUDA copies the frame to linear memory)",
        "S4": "S4: a kernel reading a 4K RGBA8 frame, by layout",
        "S6": "S6: semaphore operations per frame",
        "S7": "S7: the S3 hand-off with the producer in another process",
    }
    for key, title in scenarios.items():
        rows = [r for r in bench["rows"] if r["scenario"] == key]
        if not rows:
            continue
        out.append(f"**{title}**\n")
        out.append("| case | value | baseline (same run) | ratio | goal |")
        out.append("|---|---:|---|---:|---|")
        for r in rows:
            base = ""
            ratio = ""
            if "baseline" in r:
                base = f"{r['baseline']}: {fmt(r['baseline_value'], r['unit'])}"
                ratio = f"{r['ratio']:.2f}x"
            goal = ""
            if "goal" in r:
                goal = f"{r['goal']}: " + ("met" if r["goal_met"] else "**missed**")
            out.append(f"| {r['case']} | {fmt(r['value'], r['unit'])} | {base} | {ratio} | {goal} |")
        out.append("")
    return out


def wait_table(waits):
    names = {
        "spin": "Spin (query loop)",
        "cu_event_synchronize_raw": "cuEventSynchronize, blocking-sync event (raw, unbounded: not offered)",
        "block": "HostWait::Block (cuLaunchHostFunc + eventfd + poll)",
        "adaptive_default": "HostWait::ADAPTIVE (default: spin 50 µs, then block)",
        "poll_old": "HostWait::Poll (spin, yield, sleep up to 1 ms)",
        "vulkan_counter_poll": "Vulkan counter poll (WaitStrategy::ADAPTIVE)",
    }
    out = [
        "**Host waits for GPU work** (latency after the kernel ends, CPU time while waiting; "
        f"{waits.get('iterations', '?')} waits per cell)\n",
        "| GPU work | method | p50 | p99 | CPU (% of a core) | p50 / spin |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in waits["rows"]:
        work = r["work_us"]
        work = f"{work / 1000:g} ms" if work >= 1000 else f"{work} µs"
        out.append(
            f"| {work} | {names.get(r['method'], r['method'])} | {r['p50_us']:.1f} µs | "
            f"{r['p99_us']:.1f} µs | {r['cpu_percent']:.1f}% | {r['p50_over_spin']:.2f}x |"
        )
    out.append("")
    return out


def copy_table(copies):
    out = [
        "**S5: array <-> pitched linear copies** (CUDA events, same run; % of a D2D copy of the same bytes)\n",
        "| size | format | method | time | bandwidth | of D2D | x cuMemcpy2D |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in copies["rows"]:
        out.append(
            f"| {r['size']} | {r['format']} | {r['method']} | {r['us']:.1f} µs | {r['gb_per_s']:,.0f} GB/s | "
            f"{100 * r['of_d2d']:.0f}% | {r['over_memcpy2d']:.2f}x |"
        )
    out.append("")
    return out


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    prefix = args[0]
    bench = json.load(open(f"{prefix}-bench.json"))
    waits = json.load(open(f"{prefix}-host_wait.json"))
    copies = json.load(open(f"{prefix}-array_copy.json"))
    lines = [
        f"On the {bench.get('gpu', '?')}: bench from commit `{bench.get('commit', '?')}`, "
        f"{bench.get('cuda_driver', '?')}, validation layer {'on' if bench.get('validation') == 'true' else 'off'}. "
        f"Raw files: `{prefix}-*.json` (and `.txt`, as printed).",
        "",
    ]
    if "--note" in args:
        lines += [args[args.index("--note") + 1], ""]
    lines += bench_tables(bench)
    lines += copy_table(copies)
    lines += wait_table(waits)
    if bench.get("notes"):
        lines += [f"* {n}" for n in bench["notes"]] + [""]
    text = "\n".join(lines)
    if "--update" in args:
        path = args[args.index("--update") + 1]
        doc = open(path).read()
        start, end = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
        a, b = doc.index(start) + len(start), doc.index(end)
        open(path, "w").write(doc[:a] + "\n" + text + "\n" + doc[b:])
        print(f"updated {path}")
    else:
        print(text)


if __name__ == "__main__":
    main()
