//! What the frames crate's cross-process tests share: a child's environment
//! and the `RESULT key=value` lines it prints on stdout.

#![allow(dead_code, reason = "each test binary uses part of it")]

use std::collections::HashMap;

/// The variable `name` a parent test set for its child.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name}: started by the parent test"))
}

/// `RESULT key=value` lines of a child's stdout.
pub fn results(stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        // The first may follow libtest's "test NAME ... " on its line.
        .filter_map(|l| l.find("RESULT ").map(|i| &l[i + "RESULT ".len()..]))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The number `key` of a child's results.
pub fn num(r: &HashMap<String, String>, key: &str) -> u64 {
    r.get(key)
        .unwrap_or_else(|| panic!("no RESULT {key} in {r:?}"))
        .parse()
        .unwrap()
}

/// The comma-separated numbers `key` of a child's results.
pub fn seqs(r: &HashMap<String, String>, key: &str) -> Vec<u64> {
    r.get(key)
        .unwrap_or_else(|| panic!("no RESULT {key} in {r:?}"))
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect()
}

/// A session connected to `name` in `directory` on another thread while
/// `serve` runs here (the sender answers the subscribe only when served),
/// within `bound`.
pub fn connect_serving(
    directory: &cuda_interop_frames::discovery::Directory,
    name: &str,
    delivery: cuda_interop_frames::protocol::Delivery,
    bound: std::time::Duration,
    mut serve: impl FnMut(),
) -> (
    cuda_interop_frames::session::Session,
    vk_export::wire::Received,
) {
    let (dir, name) = (directory.clone(), name.to_string());
    let t = std::thread::spawn(move || {
        cuda_interop_frames::session::Session::connect_named(
            &dir,
            &name,
            delivery,
            std::time::Duration::from_secs(10),
        )
    });
    let start = std::time::Instant::now();
    while !t.is_finished() {
        assert!(start.elapsed() < bound, "no connection within {bound:?}");
        serve();
    }
    t.join().unwrap().expect("connected")
}
