//! The summary `cargo xtask test` ends with: what ran, passed, failed, was
//! ignored or skipped, and why, read from the output it shows as it runs.
//!
//! # Contract
//!
//! * [`Summary::cargo_line`] takes every line of `cargo test
//!   --no-fail-fast` (stdout and stderr, in the order they came): `Running
//!   .. (target/../deps/NAME-HASH)` and `Doc-tests NAME` start a binary;
//!   `test NAME ... FAILED` and `test NAME ... ignored[, REASON]` name tests;
//!   `test result: ..` gives the binary's counts. A binary that started and
//!   printed no `test result:` line (it crashed, or was killed) is a failure.
//!   `error: could not compile` is a failure too (nothing of it ran).
//! * [`Summary::pytest_line`] takes pytest's `-rfEs` output: `SKIPPED [N]
//!   PLACE: REASON`, `FAILED TEST - ..`, `ERROR TEST ..` lines, and the
//!   closing counts (`3 passed, 1 skipped in 0.5s`), for the latest pytest
//!   run: [`Summary::pytest_start`] starts one under a name (the first line
//!   without one starts `pytest python/tests`). Each run is counted like a
//!   test binary.
//! * [`Summary::render`] is the report, with a `not run:` line for each
//!   part the task chose to leave out (never a failure); its last line is
//!   `xtask test: N passed, N failed, N ignored, N skipped`.
//!   [`Summary::failed`] says whether anything failed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One test binary (or the pytest run) and what it reported.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Binary {
    pub name: String,
    /// The `test result:` (or pytest summary) line was seen.
    pub finished: bool,
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    pub filtered: u64,
    pub failures: Vec<String>,
    /// (test, reason) of each ignored or skipped test.
    pub ignored_tests: Vec<(String, String)>,
}

/// Everything seen so far.
#[derive(Debug, Default)]
pub struct Summary {
    pub binaries: Vec<Binary>,
    /// Failures outside any binary (a crate that did not compile, a build).
    pub errors: Vec<String>,
    /// The pytest runs (`python/tests`, then the Ray tests').
    pub pytest: Vec<Binary>,
    /// What the task chose not to run, and why (not a failure).
    pub not_run: Vec<String>,
}

impl Summary {
    /// One line of `cargo test` output.
    pub fn cargo_line(&mut self, line: &str) {
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix("Running ") {
            // `Running unittests src/lib.rs (target/debug/deps/vk_export-1a2b)`
            let what = rest.split(" (").next().unwrap_or(rest);
            let stem = rest
                .rsplit_once('(')
                .map(|(_, p)| p.trim_end_matches(')'))
                .and_then(|p| p.rsplit('/').next())
                .map(|file| file.rsplit_once('-').map_or(file, |(s, _)| s))
                .unwrap_or(what);
            self.start(format!("{stem} ({what})"));
        } else if let Some(name) = trimmed.strip_prefix("Doc-tests ") {
            self.start(format!("{name} (doc-tests)"));
        } else if let Some(result) = trimmed.strip_prefix("test result: ") {
            if let Some(binary) = self.binaries.last_mut() {
                binary.finished = true;
                for part in result.split(';') {
                    // `ok. 1 passed`, ` 0 failed`, ` 2 filtered out`: the
                    // count is the word before the kind (the last word in
                    // `ok. 1 passed`, or the one before `out`).
                    let words: Vec<&str> = part.split_whitespace().collect();
                    let at = words.iter().position(|w| w.parse::<u64>().is_ok());
                    let (Some(count), Some(kind)) = (
                        at.map(|i| words[i]),
                        at.and_then(|i| words.get(i + 1)).copied(),
                    ) else {
                        continue;
                    };
                    let kind = if kind == "filtered" { "out" } else { kind };
                    let Ok(count) = count.parse::<u64>() else {
                        continue;
                    };
                    match kind {
                        "passed" => binary.passed = count,
                        "failed" => binary.failed = count,
                        "ignored" => binary.ignored = count,
                        "out" => binary.filtered = count,
                        _ => {}
                    }
                }
            }
        } else if let Some(rest) = trimmed.strip_prefix("test ") {
            let Some(binary) = self.binaries.last_mut() else {
                return;
            };
            if let Some(name) = rest.strip_suffix(" ... FAILED") {
                binary.failures.push(name.to_string());
            } else if let Some((name, outcome)) = rest.split_once(" ... ignored") {
                let reason = outcome.trim_start_matches(',').trim();
                let reason = if reason.is_empty() {
                    "no reason given"
                } else {
                    reason
                };
                binary
                    .ignored_tests
                    .push((name.to_string(), reason.to_string()));
            }
        } else if trimmed.starts_with("error: could not compile") {
            self.errors
                .push(trimmed.trim_start_matches("error: ").to_string());
        }
    }

    fn start(&mut self, name: String) {
        self.binaries.push(Binary {
            name,
            ..Binary::default()
        });
    }

    /// Starts a pytest run named `name` (it should start with `pytest`).
    pub fn pytest_start(&mut self, name: impl Into<String>) {
        self.pytest.push(Binary {
            name: name.into(),
            ..Binary::default()
        });
    }

    /// One line of `pytest -q -rfEs` output, of the latest run.
    pub fn pytest_line(&mut self, line: &str) {
        if self.pytest.is_empty() {
            self.pytest_start("pytest python/tests");
        }
        let Some(run) = self.pytest.last_mut() else {
            return;
        };
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix("SKIPPED ") {
            // `SKIPPED [2] python/tests/test_x.py:12: needs a GPU`
            let rest = rest.split_once("] ").map_or(rest, |(_, r)| r);
            let (place, reason) = rest.split_once(": ").unwrap_or((rest, "no reason given"));
            run.ignored_tests
                .push((place.to_string(), reason.to_string()));
        } else if let Some(rest) = trimmed
            .strip_prefix("FAILED ")
            .or_else(|| trimmed.strip_prefix("ERROR "))
        {
            run.failures.push(rest.to_string());
        } else if let Some(counts) = pytest_counts(trimmed) {
            run.finished = true;
            run.passed = counts.get("passed").copied().unwrap_or(0);
            run.failed = counts.get("failed").copied().unwrap_or(0)
                + counts.get("error").copied().unwrap_or(0)
                + counts.get("errors").copied().unwrap_or(0);
            run.ignored = counts.get("skipped").copied().unwrap_or(0);
            run.filtered = counts.get("deselected").copied().unwrap_or(0);
        }
    }

    /// Whether anything failed, did not finish, or did not build.
    pub fn failed(&self) -> bool {
        !self.errors.is_empty()
            || self
                .binaries
                .iter()
                .chain(&self.pytest)
                .any(|b| !b.finished || b.failed > 0 || !b.failures.is_empty())
    }

    /// The report.
    pub fn render(&self) -> String {
        let mut out = String::from("\n=== xtask test: summary\n");
        let all: Vec<&Binary> = self.binaries.iter().chain(&self.pytest).collect();
        for b in &all {
            let verdict = if !b.finished {
                "DIED"
            } else if b.failed > 0 || !b.failures.is_empty() {
                "FAIL"
            } else {
                "ok  "
            };
            let _ = write!(
                out,
                "  {verdict} {}: {} passed, {} failed, {} {}",
                b.name,
                b.passed,
                b.failed,
                b.ignored,
                if b.name.starts_with("pytest") {
                    "skipped"
                } else {
                    "ignored"
                }
            );
            if b.filtered > 0 {
                let _ = write!(out, ", {} filtered out", b.filtered);
            }
            if !b.finished {
                out.push_str(" (no result line: it crashed or was killed; see its output above)");
            }
            out.push('\n');
            for failure in &b.failures {
                let _ = writeln!(out, "       failed: {failure}");
            }
        }
        // Why tests were ignored or skipped, one line per reason.
        let mut reasons: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for b in &all {
            for (test, reason) in &b.ignored_tests {
                reasons.entry(reason).or_default().push(test);
            }
        }
        if !reasons.is_empty() {
            out.push_str("  ignored or skipped, by reason:\n");
            for (reason, tests) in &reasons {
                let shown: Vec<&str> = tests.iter().take(3).copied().collect();
                let more = if tests.len() > 3 {
                    format!(", and {} more", tests.len() - 3)
                } else {
                    String::new()
                };
                let _ = writeln!(
                    out,
                    "    {} x {reason}: {}{more}",
                    tests.len(),
                    shown.join(", ")
                );
            }
        }
        for skipped in &self.not_run {
            let _ = writeln!(out, "  not run: {skipped}");
        }
        for error in &self.errors {
            let _ = writeln!(out, "  FAIL {error}");
        }
        let sum = |f: fn(&Binary) -> u64, pytest: bool| -> u64 {
            all.iter()
                .filter(|b| b.name.starts_with("pytest") == pytest)
                .map(|b| f(b))
                .sum()
        };
        let passed = sum(|b| b.passed, false) + sum(|b| b.passed, true);
        let failed = sum(|b| b.failed, false)
            + sum(|b| b.failed, true)
            + all.iter().filter(|b| !b.finished).count() as u64
            + self.errors.len() as u64;
        let _ = writeln!(
            out,
            "xtask test: {passed} passed, {failed} failed, {} ignored, {} skipped ({} test binaries{})",
            sum(|b| b.ignored, false),
            sum(|b| b.ignored, true),
            self.binaries.len(),
            match self.pytest.len() {
                0 => String::new(),
                1 => " and pytest".into(),
                n => format!(" and {n} pytest runs"),
            },
        );
        out
    }
}

/// pytest's closing counts (`1 failed, 3 passed, 2 skipped in 0.51s`, maybe
/// inside `=` rules), or `None` for any other line.
fn pytest_counts(line: &str) -> Option<BTreeMap<String, u64>> {
    let line = line.trim_matches(|c| c == '=' || c == ' ');
    let (counts, time) = line.rsplit_once(" in ")?;
    if !time.trim_end().ends_with('s') {
        return None;
    }
    let mut found = BTreeMap::new();
    for part in counts.split(", ") {
        let (n, kind) = part.trim().split_once(' ')?;
        found.insert(kind.to_string(), n.parse().ok()?);
    }
    (!found.is_empty()).then_some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARGO: &str = "\
     Running unittests src/lib.rs (target/debug/deps/vk_export-0123abcd)
running 2 tests
test record::tests::a ... ok
test record::tests::b ... ignored, needs a GPU
test result: ok. 1 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s
     Running tests/wire.rs (target/debug/deps/wire-feedbeef)
running 3 tests
test decode_rejects_short ... FAILED
test child_entry ... ignored, entry point of a child process of wire.rs
test encode ... ok
test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.02s
     Running tests/gpu.rs (target/debug/deps/gpu-00ff00ff)
running 1 test
     Running tests/vulkan.rs (target/debug/deps/vulkan-12341234)
test result: ok. 4 passed; 0 failed; 0 ignored; 0 measured; 2 filtered out; finished in 1.00s
   Doc-tests cuda_interop
test result: ok. 7 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 2.0s
error: could not compile `cuda-interop-bench` (bin \"bench\" test) due to 1 previous error
";

    fn of_cargo() -> Summary {
        let mut s = Summary::default();
        CARGO.lines().for_each(|l| s.cargo_line(l));
        s
    }

    #[test]
    fn every_binary_is_counted_and_a_silent_one_is_a_failure() {
        let s = of_cargo();
        let names: Vec<&str> = s.binaries.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "vk_export (unittests src/lib.rs)",
                "wire (tests/wire.rs)",
                "gpu (tests/gpu.rs)",
                "vulkan (tests/vulkan.rs)",
                "cuda_interop (doc-tests)"
            ]
        );
        assert_eq!(s.binaries[1].failures, ["decode_rejects_short"]);
        assert!(!s.binaries[2].finished);
        assert_eq!(s.binaries[3].filtered, 2);
        assert_eq!(s.errors.len(), 1);
        assert!(s.failed());
    }

    #[test]
    fn the_report_gives_reasons_and_ends_with_the_totals() {
        let mut s = of_cargo();
        for line in [
            "..s.F",
            "SKIPPED [1] python/tests/test_frames.py:40: no GPU here",
            "FAILED python/tests/test_frames.py::test_ring - AssertionError",
            "1 failed, 3 passed, 1 skipped in 0.51s",
        ] {
            s.pytest_line(line);
        }
        let text = s.render();
        assert!(text.contains("  DIED gpu (tests/gpu.rs)"), "{text}");
        assert!(text.contains("failed: decode_rejects_short"), "{text}");
        assert!(text.contains("1 x needs a GPU: record::tests::b"), "{text}");
        assert!(
            text.contains("1 x no GPU here: python/tests/test_frames.py:40"),
            "{text}"
        );
        assert!(
            text.contains("FAIL pytest python/tests: 3 passed, 1 failed, 1 skipped"),
            "{text}"
        );
        // passed: 1 + 1 + 0 + 4 + 7 + 3; failed: wire 1, pytest 1, gpu died, bench did not build.
        assert!(
            text.ends_with("xtask test: 16 passed, 4 failed, 2 ignored, 1 skipped (5 test binaries and pytest)\n"),
            "{text}"
        );
    }

    #[test]
    fn a_clean_run_has_not_failed() {
        let mut s = Summary::default();
        s.cargo_line("     Running tests/wire.rs (target/debug/deps/wire-feedbeef)");
        s.cargo_line("test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.02s");
        s.pytest_line("========== 5 passed in 1.02s ==========");
        assert!(!s.failed(), "{}", s.render());
        assert!(s.render().ends_with(
            "xtask test: 8 passed, 0 failed, 0 ignored, 0 skipped (1 test binaries and pytest)\n"
        ));
    }

    #[test]
    fn what_was_left_out_is_said_and_is_no_failure() {
        let mut s = Summary::default();
        s.cargo_line("     Running tests/wire.rs (target/debug/deps/wire-feedbeef)");
        s.cargo_line("test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.02s");
        s.not_run
            .push("pytest python/tests: -p names only Rust packages (x)".into());
        assert!(!s.failed());
        let text = s.render();
        assert!(
            text.contains("\n  not run: pytest python/tests: -p names only Rust packages (x)\n"),
            "{text}"
        );
        assert!(text.ends_with("(1 test binaries)\n"), "{text}");
    }

    #[test]
    fn each_pytest_run_is_counted_under_its_name() {
        let mut s = Summary::default();
        s.pytest_line("5 passed in 1.02s");
        s.pytest_start("pytest python/tests/test_ray.py (Ray 2.60.0, xtask-ray)");
        s.pytest_line("SKIPPED [1] python/tests/test_ray.py:9: no frame_server");
        s.pytest_line("3 passed, 1 skipped in 20.1s");
        assert!(!s.failed());
        let text = s.render();
        assert!(
            text.contains("  ok   pytest python/tests: 5 passed, 0 failed, 0 skipped\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "  ok   pytest python/tests/test_ray.py (Ray 2.60.0, xtask-ray): 3 passed, 0 failed, 1 skipped\n"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("xtask test: 8 passed, 0 failed, 0 ignored, 1 skipped (0 test binaries and 2 pytest runs)\n"),
            "{text}"
        );
        // A run that started and never summarised (it died) is a failure.
        s.pytest_start("pytest python/tests/test_ray.py (again)");
        s.pytest_line("Fatal Python error: Segmentation fault");
        assert!(s.failed());
    }

    #[test]
    fn pytest_that_never_summarised_has_failed() {
        let mut s = Summary::default();
        s.pytest_line("ImportError: no module cuda_interop");
        assert!(s.failed());
    }
}
