//! `cargo xtask msrv`: the stated minimum Rust version is true.
//!
//! # Contract
//!
//! * Reads `cargo metadata --locked`: for each workspace package, the
//!   highest `rust-version` among the registry packages its build and its
//!   tests need (normal, build and dev dependencies, and theirs, as
//!   locked), and fails, naming package and dependency, where that is above
//!   the package's own `rust-version`, or where a package states none.
//! * Then, when the stated toolchain of the workspace is installed
//!   (`rustup toolchain list`), runs `cargo +VERSION check --locked
//!   --workspace --all-targets` (the Python module with its test hooks)
//!   into `msrv/` of the target directory, so that the code itself is checked too; when it is
//!   not installed, it says so and fails, naming the command that installs
//!   it (`rustup toolchain install VERSION --profile minimal`), unless
//!   `--deps-only` was given (then only the first check ran, and it says so).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

use crate::fresh::{cargo, run};

fn version(text: &str) -> Vec<u64> {
    text.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

pub fn run_msrv(args: &[String]) -> Result<(), String> {
    let deps_only = match args {
        [] => false,
        [a] if a == "--deps-only" => true,
        _ => return Err("usage: cargo xtask msrv [--deps-only]".into()),
    };
    eprintln!("xtask msrv: reading cargo metadata --locked");
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--locked"])
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata --locked failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let packages: BTreeMap<&str, &Value> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let nodes: BTreeMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    // A dependency edge counts for `root` with any kind, below it only as a
    // normal or build dependency (a dependency's dev-dependencies are not built).
    let edges = |id: &str, root: bool| -> Vec<String> {
        nodes[id]["deps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| root || matches!(k["kind"].as_str(), None | Some("build")))
            })
            .filter_map(|d| d["pkg"].as_str().map(str::to_string))
            .collect()
    };
    let mut problems = Vec::new();
    let mut workspace_version = None;
    for member in &members {
        let package = packages[member];
        let name = package["name"].as_str().unwrap_or("?");
        let Some(stated) = package["rust_version"].as_str() else {
            problems.push(format!("{name} states no rust-version"));
            continue;
        };
        if workspace_version.is_none() || version(stated) > version(workspace_version.unwrap()) {
            workspace_version = Some(stated);
        }
        let mut seen = BTreeSet::new();
        let mut stack = edges(member, true);
        let mut needed: Option<(Vec<u64>, String)> = None;
        while let Some(id) = stack.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            // Another workspace package is checked on its own; what it
            // depends on is this one's too.
            let dep = packages[id.as_str()];
            if members.contains(id.as_str()) {
                stack.extend(edges(&id, false));
                continue;
            }
            if let Some(v) = dep["rust_version"].as_str() {
                let label = format!(
                    "{} {} (rust-version {v})",
                    dep["name"].as_str().unwrap_or("?"),
                    dep["version"].as_str().unwrap_or("?")
                );
                if needed.as_ref().is_none_or(|(n, _)| version(v) > *n) {
                    needed = Some((version(v), label));
                }
            }
            stack.extend(edges(&id, false));
        }
        match needed {
            Some((v, label)) if v > version(stated) => problems.push(format!(
                "{name} states rust-version {stated}, but its locked dependency {label} needs more"
            )),
            Some((_, label)) => {
                println!("{name}: rust-version {stated}; the most demanding dependency: {label}")
            }
            None => println!("{name}: rust-version {stated}; no dependency states one"),
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    let stated = workspace_version.ok_or("no workspace package")?;
    if deps_only {
        println!("msrv: the locked dependencies fit; the code was not compiled with {stated} (--deps-only)");
        return Ok(());
    }
    let toolchains = Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let wanted = if version(stated).len() == 2 {
        format!("{stated}.0")
    } else {
        stated.to_string()
    };
    // The oldest release of that version: 1.90 means 1.90.0.
    if !toolchains
        .lines()
        .any(|l| l.starts_with(&format!("{wanted}-")))
    {
        return Err(format!(
            "the dependencies fit rust-version {stated}, but the toolchain {wanted} is not \
             installed, so the code was not compiled with it: rustup toolchain install {wanted} \
             --profile minimal (or pass --deps-only)"
        ));
    }
    let root = crate::workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .map(|t| if t.is_absolute() { t } else { root.join(t) })
        .unwrap_or_else(|| root.join("target"))
        .join("msrv");
    let mut check = cargo();
    check
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env("CARGO_TARGET_DIR", &target)
        .args([
            &format!("+{wanted}"),
            "check",
            "--locked",
            "--workspace",
            "--all-targets",
            "--features",
            "cuda-interop-py/test-hooks",
        ]);
    // `cargo +VERSION` needs rustup's proxy, not the cargo running xtask.
    let mut proxied = Command::new("cargo");
    proxied.current_dir(crate::workspace_root());
    for (k, v) in check.get_envs() {
        match v {
            Some(v) => proxied.env(k, v),
            None => proxied.env_remove(k),
        };
    }
    proxied.args(check.get_args());
    run(proxied)?;
    println!("msrv: the workspace builds (every target) with Rust {wanted}, and the locked dependencies fit");
    Ok(())
}
