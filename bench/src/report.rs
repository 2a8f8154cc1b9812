//! Collects the benchmark's rows, prints them as a table, and writes them
//! as JSON (no serde: the rows are flat).

use std::fmt::Write as _;
use std::time::Duration;

/// One measured figure, with its baseline from the same run where it has one.
pub struct Row {
    pub scenario: &'static str,
    pub case: String,
    pub value: f64,
    pub unit: &'static str,
    /// What `ratio` divides by, and its value.
    pub baseline: Option<(String, f64)>,
    /// The goal, as text, and whether it holds.
    pub goal: Option<(String, bool)>,
}

#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    /// Parts that failed but did not stop the others (an S8 child): the run
    /// reports them and fails at the end.
    pub failures: Vec<String>,
}

impl Report {
    pub fn add(
        &mut self,
        scenario: &'static str,
        case: impl Into<String>,
        value: f64,
        unit: &'static str,
    ) {
        let case = case.into();
        println!("{scenario} | {case} | {}", fmt_value(value, unit));
        self.rows.push(Row {
            scenario,
            case,
            value,
            unit,
            baseline: None,
            goal: None,
        });
    }

    /// Adds a row measured against `baseline` (same unit).
    pub fn add_vs(
        &mut self,
        scenario: &'static str,
        case: impl Into<String>,
        value: f64,
        unit: &'static str,
        baseline: (impl Into<String>, f64),
    ) {
        let case = case.into();
        let baseline: (String, f64) = (baseline.0.into(), baseline.1);
        println!(
            "{scenario} | {case} | {} | {}: {} | {:.2}x",
            fmt_value(value, unit),
            baseline.0,
            fmt_value(baseline.1, unit),
            value / baseline.1
        );
        self.rows.push(Row {
            scenario,
            case,
            value,
            unit,
            baseline: Some(baseline),
            goal: None,
        });
    }

    /// Sets the goal of the last row.
    pub fn goal(&mut self, text: impl Into<String>, holds: bool) {
        if let Some(row) = self.rows.last_mut() {
            row.goal = Some((text.into(), holds));
        }
    }

    /// Records a failed part as a note and as a failure of the run.
    pub fn fail(&mut self, text: impl Into<String>) {
        let text = format!("FAILED: {}", text.into());
        self.note(text.clone());
        self.failures.push(text);
    }

    pub fn note(&mut self, text: impl Into<String>) {
        let text = text.into();
        println!("note: {text}");
        self.notes.push(text);
    }

    pub fn print(&self) {
        println!();
        println!("| scenario | case | value | baseline (same run) | ratio | goal |");
        println!("|---|---|---:|---|---:|---|");
        for r in &self.rows {
            let (baseline, ratio) = match &r.baseline {
                Some((name, b)) => (
                    format!("{name}: {}", fmt_value(*b, r.unit)),
                    format!("{:.2}x", r.value / b),
                ),
                None => (String::new(), String::new()),
            };
            let goal = match &r.goal {
                Some((text, true)) => format!("{text}: met"),
                Some((text, false)) => format!("{text}: **missed**"),
                None => String::new(),
            };
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                r.scenario,
                r.case,
                fmt_value(r.value, r.unit),
                baseline,
                ratio,
                goal
            );
        }
    }

    pub fn json(&self, header: &[(&str, String)]) -> String {
        let mut s = String::from("{\n");
        for (k, v) in header {
            let _ = writeln!(s, "  \"{}\": \"{}\",", esc(k), esc(v));
        }
        s.push_str("  \"notes\": [");
        for (i, n) in self.notes.iter().enumerate() {
            let _ = write!(s, "{}\"{}\"", if i > 0 { ", " } else { "" }, esc(n));
        }
        s.push_str("],\n  \"rows\": [\n");
        for (i, r) in self.rows.iter().enumerate() {
            let _ = write!(
                s,
                "    {{\"scenario\": \"{}\", \"case\": \"{}\", \"value\": {}, \"unit\": \"{}\"",
                r.scenario,
                esc(&r.case),
                num(r.value),
                r.unit
            );
            if let Some((name, b)) = &r.baseline {
                let _ = write!(
                    s,
                    ", \"baseline\": \"{}\", \"baseline_value\": {}, \"ratio\": {}",
                    esc(name),
                    num(*b),
                    num(r.value / b)
                );
            }
            if let Some((text, holds)) = &r.goal {
                let _ = write!(s, ", \"goal\": \"{}\", \"goal_met\": {holds}", esc(text));
            }
            s.push('}');
            s.push_str(if i + 1 < self.rows.len() { ",\n" } else { "\n" });
        }
        s.push_str("  ]\n}\n");
        s
    }
}

fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.6}")
    } else {
        "null".into()
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn fmt_value(v: f64, unit: &str) -> String {
    match unit {
        "us" => format!("{v:.1} µs"),
        "ms" => format!("{v:.3} ms"),
        "GB/s" => format!("{v:.0} GB/s"),
        "%" => format!("{v:.1}%"),
        _ => format!("{v:.3} {unit}"),
    }
}

/// Microseconds.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The `q` quantile (0..=1) of `samples` (sorted here).
pub fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}
