//! `cargo xtask perf-table`: one GPU run's benchmark JSON as the README's
//! performance tables (was `scripts/perf-table.py`, same output).
//!
//! # Contract
//!
//! * `perf-table RUN_PREFIX [--note TEXT] [--update FILE]` reads
//!   `RUN_PREFIX-bench.json` (`bench --json`), `RUN_PREFIX-host_wait.json`
//!   and `RUN_PREFIX-array_copy.json` (the bench package's `host_wait` and
//!   `array_copy` binaries, `--json`), as saved under `docs/gpu-runs/`.
//! * `--array-copy FILE` takes the `array_copy` JSON from FILE instead (a
//!   run that did not run `array_copy`), and the tables say so.
//! * Prints the markdown; with `--update FILE`, replaces what lies between
//!   the `<!-- perf-table:start -->` and `<!-- perf-table:end -->` lines of
//!   FILE instead. Nothing is typed in by hand: every figure comes from
//!   those files.

use serde_json::Value;

const USAGE: &str =
    "usage: cargo xtask perf-table RUN_PREFIX [--note TEXT] [--update FILE] [--array-copy FILE]";

/// `cargo xtask perf-table ..`.
pub fn run(args: &[String]) -> Result<(), String> {
    let prefix = args.first().filter(|a| !a.starts_with("--")).ok_or(USAGE)?;
    let value_of = |flag: &str| -> Result<Option<&String>, String> {
        match args.iter().position(|a| a == flag) {
            Some(i) => args
                .get(i + 1)
                .map(Some)
                .ok_or(format!("{flag} needs a value\n{USAGE}")),
            None => Ok(None),
        }
    };
    let note = value_of("--note")?;
    let update = value_of("--update")?;
    let array_copy = value_of("--array-copy")?;
    let read = |path: &str| -> Result<Value, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))
    };
    let load = |kind: &str| read(&format!("{prefix}-{kind}.json"));
    let copies = match array_copy {
        Some(path) => read(path)?,
        None => load("array_copy")?,
    };
    let from_elsewhere = array_copy.map(|path| {
        format!(
            "S5 (array copies) is from `{path}`, another run: this one did not run `array_copy`."
        )
    });
    let note = match (note, from_elsewhere) {
        (Some(n), Some(e)) => Some(format!("{n} {e}")),
        (n, e) => n.cloned().or(e),
    };
    let text = tables(
        prefix,
        note.as_deref(),
        &load("bench")?,
        &load("host_wait")?,
        &copies,
    );
    match update {
        None => println!("{text}"),
        Some(path) => {
            let doc =
                std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
            let updated = replace_between(&doc, &text)
                .ok_or_else(|| format!("{path}: no perf-table:start / perf-table:end lines"))?;
            std::fs::write(path, updated).map_err(|e| format!("cannot write {path}: {e}"))?;
            println!("updated {path}");
        }
    }
    Ok(())
}

fn replace_between(doc: &str, text: &str) -> Option<String> {
    let (start, end) = ("<!-- perf-table:start -->", "<!-- perf-table:end -->");
    let a = doc.find(start)? + start.len();
    let b = doc.find(end)?;
    (a <= b).then(|| format!("{}\n{text}\n{}", &doc[..a], &doc[b..]))
}

/// `x` with `decimals` decimals and `,` between thousands (Python's `{:,.Nf}`).
fn grouped(x: f64, decimals: usize) -> String {
    let text = format!("{:.*}", decimals, x.abs());
    let (int, frac) = text
        .split_once('.')
        .map_or((text.as_str(), None), |(i, f)| (i, Some(f)));
    let mut out = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if let Some(frac) = frac {
        out.push('.');
        out.push_str(frac);
    }
    if x < 0.0 && out.chars().any(|c| c.is_ascii_digit() && c != '0') {
        out.insert(0, '-');
    }
    out
}

fn fmt(value: &Value, unit: &str) -> String {
    let Some(v) = value.as_f64() else {
        return "n/a".into();
    };
    match unit {
        "us" => format!("{} µs", grouped(v, 1)),
        "ms" => format!("{} ms", grouped(v, 3)),
        "GB/s" => format!("{} GB/s", grouped(v, 0)),
        _ => format!("{v:.3} {unit}"),
    }
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// A JSON value as Python's `str()` would print it in an f-string.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "?".into(),
        other => other.to_string(),
    }
}

fn bench_tables(bench: &Value) -> Vec<String> {
    let scenarios = [
        (
            "S1",
            "S1: one-time costs (first call / median of later calls)",
        ),
        (
            "S2",
            "S2: hand-off latency (Vulkan signal -> CUDA wait -> trivial kernel -> host sees it)",
        ),
        (
            "S3",
            "S3: frame throughput (Vulkan produces, CUDA copies the frame to linear memory)",
        ),
        ("S4", "S4: a kernel reading a 4K RGBA8 frame, by layout"),
        ("S6", "S6: semaphore operations per frame"),
        (
            "S7",
            "S7: the S3 hand-off with the producer in another process",
        ),
        (
            "S8",
            "S8: the graphics-engine switch (each leg against the CUDA-only floor, per queue family, CUDA_DEVICE_MAX_CONNECTIONS unset and =1)",
        ),
        (
            "S9",
            "S9: the frame ring against the CUDA-only peer (a CUDA IPC ring: cudaMalloc slots, interprocess events), 1 and 4 receivers, without and with MPS",
        ),
        (
            "Drift",
            "Drift: per-cycle cost, last 10% of the cycles against the first 10%",
        ),
    ];
    let empty = Vec::new();
    let rows = bench["rows"].as_array().unwrap_or(&empty);
    let mut out = Vec::new();
    for (key, title) in scenarios {
        let rows: Vec<&Value> = rows.iter().filter(|r| r["scenario"] == key).collect();
        if rows.is_empty() {
            continue;
        }
        out.push(format!("**{title}**\n"));
        out.push("| case | value | baseline (same run) | ratio | goal |".into());
        out.push("|---|---:|---|---:|---|".into());
        for r in rows {
            let unit = r["unit"].as_str().unwrap_or_default();
            let (mut base, mut ratio, mut goal) = (String::new(), String::new(), String::new());
            if r.get("baseline").is_some() {
                base = format!(
                    "{}: {}",
                    show(&r["baseline"]),
                    fmt(&r["baseline_value"], unit)
                );
                ratio = format!("{:.2}x", f(&r["ratio"]));
            }
            if r.get("goal").is_some() {
                let met = r["goal_met"].as_bool().unwrap_or(false);
                goal = format!(
                    "{}: {}",
                    show(&r["goal"]),
                    if met { "met" } else { "**missed**" }
                );
            }
            out.push(format!(
                "| {} | {} | {base} | {ratio} | {goal} |",
                show(&r["case"]),
                fmt(&r["value"], unit)
            ));
        }
        out.push(String::new());
    }
    out
}

fn wait_table(waits: &Value) -> Vec<String> {
    let name = |method: &str| {
        match method {
        "spin" => "Spin (query loop)".to_string(),
        "cu_event_synchronize_raw" => {
            "cuEventSynchronize, blocking-sync event (raw, unbounded: not offered)".into()
        }
        "block" => "HostWait::Block (cuLaunchHostFunc + eventfd + poll)".into(),
        "adaptive_default" => "HostWait::ADAPTIVE (default: spin 50 µs, then block)".into(),
        "adaptive_spin_10us" => "HostWait::Adaptive, spin 10 µs, then block".into(),
        "adaptive_spin_20us" => "HostWait::Adaptive, spin 20 µs, then block".into(),
        "sleep" => "run 62's cut: HostWait::Sleep, cuEventSynchronize behind a word the stream or a watchdog writes (withdrawn: not bounded)".into(),
        "adaptive_default_skips" => "HostWait::ADAPTIVE (default: spin 50 µs, then block; no spin after a wait over 100 µs, 1 in 8 spins)".into(),
        "adaptive_spin_10us_skips" => "HostWait::Adaptive, spin 10 µs, then block (no spin after a wait over 20 µs, 1 in 8 spins)".into(),
        "adaptive_spin_20us_skips" => "HostWait::Adaptive, spin 20 µs, then block (no spin after a wait over 40 µs, 1 in 8 spins)".into(),
        "adaptive_default_sleeps" => "HostWait::ADAPTIVE, run 62's cut: spin 50 µs, then sleep in the driver; no spin after a wait over 100 µs".into(),
        "adaptive_spin_10us_sleeps" => "HostWait::Adaptive, run 62's cut: spin 10 µs, then sleep in the driver".into(),
        "adaptive_spin_20us_sleeps" => "HostWait::Adaptive, run 62's cut: spin 20 µs, then sleep in the driver".into(),
        "adaptive_default_paced" => "HostWait::ADAPTIVE (default: spin 50 µs, then block; after waits of up to 4 ms, sleep to half a spin before the shortest of the last four, then watch until a spin past the longest)".into(),
        "adaptive_spin_10us_paced" => "HostWait::Adaptive, spin 10 µs (paced after waits of up to 800 µs)".into(),
        "adaptive_spin_20us_paced" => "HostWait::Adaptive, spin 20 µs (paced after waits of up to 1.6 ms)".into(),
        "helper_thread_event_synchronize" => {
            "helper thread in cuEventSynchronize, caller waits on a channel with a timeout (bounded for the caller only)".into()
        }
        "poll_old" => "HostWait::Poll (spin, yield, sleep up to 1 ms)".into(),
        "vulkan_counter_poll" => "Vulkan counter poll (WaitStrategy::ADAPTIVE)".into(),
        other => other.to_string(),
    }
    };
    let iterations = waits.get("iterations").map_or("?".to_string(), show);
    let mut out = vec![
        format!(
            "**Host waits for GPU work** (latency after the kernel ends, CPU time while waiting; \
             {iterations} waits per cell)\n"
        ),
        "| GPU work | method | p50 | p99 | CPU (% of a core) | p50 / spin |".into(),
        "|---:|---|---:|---:|---:|---:|".into(),
    ];
    for r in waits["rows"].as_array().into_iter().flatten() {
        let work_us = f(&r["work_us"]);
        let work = if let Some(pattern) = r["work"].as_str() {
            pattern.to_string()
        } else if work_us >= 1000.0 {
            format!("{} ms", general(work_us / 1000.0))
        } else {
            format!("{} µs", show(&r["work_us"]))
        };
        out.push(format!(
            "| {work} | {} | {:.1} µs | {:.1} µs | {:.1}% | {:.2}x |",
            name(r["method"].as_str().unwrap_or_default()),
            f(&r["p50_us"]),
            f(&r["p99_us"]),
            f(&r["cpu_percent"]),
            f(&r["p50_over_spin"])
        ));
    }
    out.push(String::new());
    out
}

/// Python's `{:g}` for the plain values used here (no exponent).
fn general(x: f64) -> String {
    let text = format!("{x:.6}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn copy_table(copies: &Value) -> Vec<String> {
    let mut out = vec![
        "**S5: array <-> pitched linear copies** (CUDA events, same run; % of a D2D copy of the same bytes)\n".to_string(),
        "| size | format | method | time | bandwidth | of D2D | x cuMemcpy2D |".into(),
        "|---|---|---|---:|---:|---:|---:|".into(),
    ];
    for r in copies["rows"].as_array().into_iter().flatten() {
        out.push(format!(
            "| {} | {} | {} | {:.1} µs | {} GB/s | {:.0}% | {:.2}x |",
            show(&r["size"]),
            show(&r["format"]),
            show(&r["method"]),
            f(&r["us"]),
            grouped(f(&r["gb_per_s"]), 0),
            100.0 * f(&r["of_d2d"]),
            f(&r["over_memcpy2d"])
        ));
    }
    out.push(String::new());
    out
}

fn tables(
    prefix: &str,
    note: Option<&str>,
    bench: &Value,
    waits: &Value,
    copies: &Value,
) -> String {
    let get = |k: &str| bench.get(k).map_or("?".to_string(), show);
    let validation = if bench["validation"] == "true" {
        "on"
    } else {
        "off"
    };
    let mut lines = vec![
        format!(
            "On the {}: bench from commit `{}`, {}, validation layer {validation}. \
             Raw files: `{prefix}-*.json` (and `.txt`, as printed).",
            get("gpu"),
            get("commit"),
            get("cuda_driver")
        ),
        String::new(),
    ];
    if let Some(note) = note {
        lines.extend([note.to_string(), String::new()]);
    }
    lines.extend(bench_tables(bench));
    lines.extend(copy_table(copies));
    lines.extend(wait_table(waits));
    if let Some(notes) = bench["notes"].as_array().filter(|n| !n.is_empty()) {
        lines.extend(notes.iter().map(|n| format!("* {}", show(n))));
        lines.push(String::new());
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_printed_as_the_python_script_printed_them() {
        assert_eq!(grouped(1234567.891, 1), "1,234,567.9");
        assert_eq!(grouped(999.96, 0), "1,000");
        assert_eq!(grouped(12.0, 3), "12.000");
        assert_eq!(fmt(&Value::Null, "us"), "n/a");
        assert_eq!(fmt(&serde_json::json!(1.23456), "x"), "1.235 x");
        assert_eq!(general(2.0), "2");
        assert_eq!(general(0.5), "0.5");
    }

    #[test]
    fn the_tables_hold_every_row() {
        let bench = serde_json::json!({
            "gpu": "H200", "commit": "abc", "cuda_driver": "CUDA 13.0", "validation": "false",
            "rows": [
                {"scenario": "S2", "case": "hand-off", "value": 12.34, "unit": "us",
                 "baseline": "CUDA only", "baseline_value": 10.0, "ratio": 1.234,
                 "goal": "<= 2x", "goal_met": true},
                {"scenario": "S3", "case": "4K", "value": 1500.5, "unit": "GB/s"}
            ],
            "notes": ["one note"]
        });
        let waits = serde_json::json!({"iterations": 300, "rows": [
            {"work_us": 2000, "method": "spin", "p50_us": 9.04, "p99_us": 12.0,
             "cpu_percent": 98.0, "p50_over_spin": 1.0},
            {"work_us": 2000, "work": "2ms/200µs", "method": "spin", "p50_us": 8.7,
             "p99_us": 16.1, "cpu_percent": 100.6, "p50_over_spin": 1.0}]});
        let copies = serde_json::json!({"rows": [
            {"size": "4K", "format": "RGBA8", "method": "kernel", "us": 40.0,
             "gb_per_s": 1650.2, "of_d2d": 0.91, "over_memcpy2d": 1.5}]});
        let text = tables("docs/gpu-runs/14", Some("A note."), &bench, &waits, &copies);
        assert!(text
            .starts_with("On the H200: bench from commit `abc`, CUDA 13.0, validation layer off."));
        assert!(
            text.contains("| hand-off | 12.3 µs | CUDA only: 10.0 µs | 1.23x | <= 2x: met |"),
            "{text}"
        );
        assert!(
            text.contains("| 4K | 1,500 GB/s |  |  |  |")
                || text.contains("| 4K | 1,501 GB/s |  |  |  |"),
            "{text}"
        );
        assert!(
            text.contains("| 2 ms | Spin (query loop) | 9.0 µs | 12.0 µs | 98.0% | 1.00x |"),
            "{text}"
        );
        assert!(
            text.contains("| 2ms/200µs | Spin (query loop) | 8.7 µs | 16.1 µs | 100.6% | 1.00x |"),
            "{text}"
        );
        assert!(
            text.contains("| 4K | RGBA8 | kernel | 40.0 µs | 1,650 GB/s | 91% | 1.50x |"),
            "{text}"
        );
        assert!(text.ends_with("* one note\n"), "{text:?}");
        let doc = "a\n<!-- perf-table:start -->\nold\n<!-- perf-table:end -->\nb\n";
        assert_eq!(
            replace_between(doc, "new").unwrap(),
            "a\n<!-- perf-table:start -->\nnew\n<!-- perf-table:end -->\nb\n"
        );
    }
}
