//! `cargo xtask modgraph`: the module graph of every workspace crate, and the
//! cycles in it.
//!
//! # Contract
//!
//! * A crate's nodes are the top-level modules of its `src/`: each `NAME.rs`
//!   (not `lib.rs`, `main.rs`) and each directory `NAME/` (with a `mod.rs`
//!   or beside a `NAME.rs`; `src/bin/` is other crates and is skipped). A
//!   node's text is its file and every `.rs` file below its directory.
//! * An edge `a -> b` is a reference from `a`'s text, comments and string
//!   literals stripped, to `crate::b`, `$crate::b`, a `b` in
//!   `crate::{.., b, ..}` (first segments only), or `super::b` (and
//!   `super::super::b`, ...) where the `super`s reach the crate root,
//!   counting inline `mod NAME { .. }` blocks as a level. The crate root
//!   itself is no node (everything may use what it declares).
//! * Prints each crate's edges and its cycles (the strongly connected
//!   components of more than one module, Tarjan), then the workspace crates
//!   in dependency order (normal and build dependencies from
//!   `cargo metadata`, dev-dependencies shown apart). Fails, naming the
//!   modules of each cycle, if any crate has one.
//! * Not seen: macros used by their bare name (`cu!`) and glob re-exports
//!   through the root; an edge through them is not drawn.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A crate's module graph: module name -> the modules it references.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// `cargo xtask modgraph`.
pub fn run(args: &[String]) -> Result<(), String> {
    if !args.is_empty() {
        return Err("usage: cargo xtask modgraph".into());
    }
    let crates = workspace_crates()?;
    let mut failing = Vec::new();
    for krate in &crates {
        let src = krate.dir.join("src");
        if !src.is_dir() {
            // A package of test targets only (tests/): no module tree.
            println!("{} (no src/: test targets only)\n", krate.name);
            continue;
        }
        let graph = crate_graph(&src)?;
        println!(
            "\n{} ({}, {} modules)",
            krate.name,
            src.strip_prefix(crate::workspace_root())
                .unwrap_or(&src)
                .display(),
            graph.len()
        );
        for (module, uses) in &graph {
            let uses: Vec<&str> = uses.iter().map(String::as_str).collect();
            let uses = if uses.is_empty() {
                "(nothing)".to_string()
            } else {
                uses.join(", ")
            };
            println!("  {module} -> {uses}");
        }
        let cycles = cycles(&graph);
        if cycles.is_empty() {
            println!("  no cycles");
        }
        for cycle in &cycles {
            println!(
                "  CYCLE: {} (e.g. {})",
                cycle.join(", "),
                example_loop(&graph, cycle).join(" -> ")
            );
            failing.push(format!("{}: {}", krate.name, cycle.join(", ")));
        }
    }
    println!("\ncrate order (each imports only crates above it):");
    for krate in crate_order(&crates)? {
        let deps: Vec<&str> = krate.deps.iter().map(String::as_str).collect();
        let dev: Vec<&str> = krate
            .dev_deps
            .iter()
            .filter(|d| !krate.deps.contains(*d))
            .map(String::as_str)
            .collect();
        let dev = if dev.is_empty() {
            String::new()
        } else {
            format!("   (dev: {})", dev.join(", "))
        };
        if deps.is_empty() {
            println!("  {}{dev}", krate.name);
        } else {
            println!("  {} <- {}{dev}", krate.name, deps.join(", "));
        }
    }
    if failing.is_empty() {
        println!("\nmodgraph: no module cycles");
        Ok(())
    } else {
        Err(format!(
            "{} module cycle(s):\n  {}",
            failing.len(),
            failing.join("\n  ")
        ))
    }
}

/// A workspace crate as `cargo metadata` describes it.
#[derive(Debug)]
struct Crate {
    name: String,
    dir: PathBuf,
    /// Workspace crates it needs to build (normal and build dependencies).
    deps: BTreeSet<String>,
    /// Workspace crates its tests, examples and benches add.
    dev_deps: BTreeSet<String>,
}

fn workspace_crates() -> Result<Vec<Crate>, String> {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(crate::workspace_root())
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata: not JSON: {e}"))?;
    let packages = metadata["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?;
    let mut crates = Vec::new();
    for package in packages {
        let name = package["name"].as_str().unwrap_or_default().to_string();
        let manifest = package["manifest_path"].as_str().unwrap_or_default();
        let dir = Path::new(manifest)
            .parent()
            .ok_or_else(|| format!("{name}: no manifest directory"))?
            .to_path_buf();
        let mut deps = BTreeSet::new();
        let mut dev_deps = BTreeSet::new();
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            if dep.get("path").is_none() {
                continue;
            }
            let dep_name = dep["name"].as_str().unwrap_or_default().to_string();
            if dep["kind"].as_str() == Some("dev") {
                dev_deps.insert(dep_name);
            } else {
                deps.insert(dep_name);
            }
        }
        crates.push(Crate {
            name,
            dir,
            deps,
            dev_deps,
        });
    }
    Ok(crates)
}

/// The workspace crates ordered so that each comes after what it needs,
/// in the order `cargo metadata` lists them where that leaves a choice.
fn crate_order(crates: &[Crate]) -> Result<Vec<&Crate>, String> {
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    let mut order = Vec::new();
    while order.len() < crates.len() {
        let next = crates.iter().find(|c| {
            !placed.contains(c.name.as_str())
                && c.deps
                    .iter()
                    .all(|d| placed.contains(d.as_str()) || !crates.iter().any(|k| &k.name == d))
        });
        let Some(next) = next else {
            return Err("the workspace crates depend on each other in a circle".into());
        };
        placed.insert(&next.name);
        order.push(next);
    }
    Ok(order)
}

/// The module graph of the crate whose sources are in `src`.
pub fn crate_graph(src: &Path) -> Result<Graph, String> {
    let mut modules: BTreeMap<String, Vec<(PathBuf, usize)>> = BTreeMap::new();
    let entries =
        std::fs::read_dir(src).map_err(|e| format!("cannot read {}: {e}", src.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(String::from) else {
            continue;
        };
        if path.is_dir() {
            if name == "bin"
                || !(path.join("mod.rs").exists() || src.join(format!("{name}.rs")).exists())
            {
                continue;
            }
            let files = modules.entry(name).or_default();
            collect_dir(&path, 1, files)?;
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" && stem != "main" {
                modules.entry(stem.to_string()).or_default().push((path, 1));
            }
        }
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let mut graph = Graph::new();
    for (module, files) in &modules {
        let mut uses = BTreeSet::new();
        for (file, depth) in files {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            for used in references(&strip(&text), *depth) {
                if names.contains(&used) && &used != module {
                    uses.insert(used);
                }
            }
        }
        graph.insert(module.clone(), uses);
    }
    Ok(graph)
}

/// Every `.rs` file below `dir`, with its module depth (`dir/mod.rs` is at
/// `depth`, `dir/x.rs` one deeper).
fn collect_dir(dir: &Path, depth: usize, files: &mut Vec<(PathBuf, usize)>) -> Result<(), String> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect_dir(&path, depth + 1, files)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            let mod_rs = path.file_name().is_some_and(|n| n == "mod.rs");
            files.push((path, if mod_rs { depth } else { depth + 1 }));
        }
    }
    Ok(())
}

/// `text` with comments removed and string and character literals emptied
/// (line structure kept), so that only code is searched.
pub fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push(b'\n');
                    }
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(b, i) {
            // r"..", r#".."#, br#".."#, cr#".."#: ends at `"` and `hashes` #s.
            let open = b[i..].iter().position(|&c| c == b'"').unwrap_or(0) + i + 1;
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let mut j = open;
            while j < b.len() && !b[j..].starts_with(&close) {
                if b[j] == b'\n' {
                    out.push(b'\n');
                }
                j += 1;
            }
            out.extend_from_slice(b"\"\"");
            i = (j + close.len()).min(b.len());
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                if i < b.len() && b[i] == b'\n' {
                    out.push(b'\n');
                }
                i += 1;
            }
            out.extend_from_slice(b"\"\"");
            i += 1;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime ('a).
            if b.get(i + 1) == Some(&b'\\') {
                let end = b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map_or(b.len(), |p| i + 2 + p);
                out.extend_from_slice(b"' '");
                i = end + 1;
            } else if let Some(len) = std::str::from_utf8(&b[i + 1..(i + 6).min(b.len())])
                .ok()
                .or_else(|| std::str::from_utf8(&b[i + 1..]).ok())
                .and_then(|s| s.chars().next())
                .map(char::len_utf8)
                .filter(|len| b.get(i + 1 + len) == Some(&b'\''))
            {
                out.extend_from_slice(b"' '");
                i += len + 2;
            } else {
                out.push(b'\'');
                i += 1;
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// If a raw string literal starts at `i`, its number of `#`s.
fn raw_string_start(b: &[u8], i: usize) -> Option<usize> {
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
        return None;
    }
    let mut j = i;
    if matches!(b.get(j), Some(b'b' | b'c')) {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    (b.get(j + hashes) == Some(&b'"')).then_some(hashes)
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The top-level modules that stripped `code`, a file at module `depth`
/// (1: `src/x.rs`), names through `crate::`, `crate::{..}` or `super::`.
pub fn references(code: &str, depth: usize) -> BTreeSet<String> {
    let b = code.as_bytes();
    let mut found = BTreeSet::new();
    // Brace depths at which inline `mod NAME {` blocks opened.
    let mut inline_mods: Vec<usize> = Vec::new();
    let mut braces = 0usize;
    let mut pending_mod = false;
    let mut i = 0;
    let word_at = |i: usize, word: &[u8]| {
        b[i..].starts_with(word)
            && (i == 0 || !is_ident(b[i - 1]))
            && !b.get(i + word.len()).copied().is_some_and(is_ident)
    };
    while i < b.len() {
        match b[i] {
            b'{' => {
                braces += 1;
                if pending_mod {
                    inline_mods.push(braces);
                    pending_mod = false;
                }
                i += 1;
                continue;
            }
            b'}' => {
                if inline_mods.last() == Some(&braces) {
                    inline_mods.pop();
                }
                braces = braces.saturating_sub(1);
                i += 1;
                continue;
            }
            b';' => pending_mod = false,
            _ => {}
        }
        if word_at(i, b"mod") {
            pending_mod = true;
            i += 3;
        } else if word_at(i, b"crate") && b[i + 5..].starts_with(b"::") {
            i += 7;
            i = path_heads(b, i, &mut found);
        } else if word_at(i, b"super") {
            let mut ups = 0;
            let mut j = i;
            while word_at(j, b"super") && b[j + 5..].starts_with(b"::") {
                ups += 1;
                j = skip_space(b, j + 7);
            }
            if ups > 0 && ups == depth + inline_mods.len() {
                j = path_heads(b, j, &mut found);
            }
            i = j.max(i + 5);
        } else {
            i += 1;
        }
    }
    found
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Reads the path after `crate::` at `i`: one name, or the first segment of
/// each item of a `{..}` group. Returns where it stopped.
fn path_heads(b: &[u8], i: usize, found: &mut BTreeSet<String>) -> usize {
    let mut i = skip_space(b, i);
    let ident = |i: usize| {
        let end = i + b[i..].iter().take_while(|&&c| is_ident(c)).count();
        (
            std::str::from_utf8(&b[i..end])
                .unwrap_or_default()
                .to_string(),
            end,
        )
    };
    if b.get(i) != Some(&b'{') {
        let (name, end) = ident(i);
        if !name.is_empty() {
            found.insert(name);
        }
        return end.max(i);
    }
    i += 1;
    let mut depth = 1;
    let mut item_start = true;
    while i < b.len() && depth > 0 {
        match b[i] {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b',' if depth == 1 => item_start = true,
            c if depth == 1 && item_start && is_ident(c) => {
                let (name, end) = ident(i);
                if name != "self" {
                    found.insert(name);
                }
                item_start = false;
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// The cycles of `graph`: its strongly connected components of more than
/// one module (Tarjan's algorithm), each sorted, in name order.
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        components: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.graph.contains_key(w) {
                    continue;
                }
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.components.push(component);
                }
            }
        }
    }
    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for v in graph.keys() {
        if !tarjan.index.contains_key(v.as_str()) {
            tarjan.visit(v);
        }
    }
    tarjan.components.sort();
    tarjan.components
}

/// One loop through `cycle` from its first module back to it (shortest,
/// breadth first, inside the cycle), to show why they are a cycle.
fn example_loop(graph: &Graph, cycle: &[String]) -> Vec<String> {
    let start = &cycle[0];
    let inside: BTreeSet<&String> = cycle.iter().collect();
    let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in graph.get(v).into_iter().flatten() {
            if !inside.contains(w) {
                continue;
            }
            if w == start {
                let mut back = vec![v.clone()];
                let mut at = v;
                while at != start {
                    at = came_from[at];
                    back.push(at.clone());
                }
                back.reverse();
                back.push(start.clone());
                return back;
            }
            if !came_from.contains_key(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    cycle.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &[&str])]) -> Graph {
        edges
            .iter()
            .map(|(from, to)| (from.to_string(), to.iter().map(|t| t.to_string()).collect()))
            .collect()
    }

    #[test]
    fn a_chain_has_no_cycle() {
        let g = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &[])]);
        assert!(cycles(&g).is_empty());
    }

    #[test]
    fn two_modules_that_import_each_other_are_a_cycle() {
        let g = graph(&[
            ("scenarios", &["two_process", "report"]),
            ("two_process", &["scenarios"]),
            ("report", &[]),
        ]);
        assert_eq!(
            cycles(&g),
            vec![vec!["scenarios".to_string(), "two_process".to_string()]]
        );
    }

    #[test]
    fn separate_knots_are_reported_separately() {
        let g = graph(&[
            ("a", &["b"]),
            ("b", &["c"]),
            ("c", &["a", "d"]),
            ("d", &["e"]),
            ("e", &["d"]),
            ("f", &["a"]),
        ]);
        assert_eq!(
            cycles(&g),
            vec![
                vec!["a".to_string(), "b".into(), "c".into()],
                vec!["d".to_string(), "e".into()],
            ]
        );
    }

    #[test]
    fn the_example_loop_walks_the_edges() {
        let g = graph(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"])]);
        assert_eq!(
            example_loop(&g, &["a".into(), "b".into(), "c".into()]),
            ["a", "b", "c", "a"]
        );
    }

    #[test]
    fn references_ignore_comments_strings_and_inner_super() {
        let code = strip(
            r##"
            //! See crate::docs_only.
            use crate::{error::Error, wire::{self, Header}, self};
            use crate::socket;
            /* crate::in_block /* nested crate::deeper */ */
            const S: &str = "crate::in_string";
            const R: &str = r#"crate::in_raw "quoted" "#;
            fn f<'a>(x: &'a str) -> char { let _ = super::record::X; 'c' }
            mod tests {
                use super::*;
                fn g() { super::helper(); super::super::markers::Y; }
            }
            macro_rules! m { () => { $crate::token::T } }
            "##,
        );
        let found: Vec<String> = references(&code, 1).into_iter().collect();
        assert_eq!(
            found,
            ["error", "markers", "record", "socket", "token", "wire"]
        );
    }

    #[test]
    fn super_from_a_file_below_a_directory_module_is_inside_it() {
        let code = strip("use super::sibling; use super::super::top;");
        let found: Vec<String> = references(&code, 2).into_iter().collect();
        assert_eq!(found, ["top"]);
    }

    #[test]
    fn the_bench_crate_has_no_cycle() {
        let src = crate::workspace_root().join("bench/src");
        let g = crate_graph(&src).unwrap();
        assert!(
            g.contains_key("common") && g.contains_key("scenarios"),
            "{g:?}"
        );
        assert_eq!(cycles(&g), Vec::<Vec<String>>::new(), "{g:?}");
    }
}
