//! Senders and receivers on lavapipe (no CUDA): host-visible rings without
//! semaphores. Receivers here take frame announcements and release them
//! (they do not read pixels: lavapipe receivers have no CUDA, and vk-export
//! maps no imported memory); the CUDA import is the GPU's (`frame_client`).
//!
//! Cross-process tests run the sender and each receiver as `child_*` tests
//! of this binary in processes of their own (testkit's child runner); they
//! meet by name in a directory of the parent test's. Results come back as
//! `RESULT key=value` lines on the children's stdout. Assertions are on
//! frame counts and sequence numbers, never on timing.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::{Directory, SlotKind};
use cuda_interop_frames::protocol::{Delivery, DropReason, Fault, Message};
use cuda_interop_frames::sender::{self, AcquireError, Address, Sender, SenderOptions};
use cuda_interop_frames::session::{Frame, Session};
use cuda_interop_frames::transport::{self, ConsumerError};

mod common;
use common::{env, num, results, seqs};

#[path = "../examples/common/demo.rs"]
mod demo;
use cuda_interop_testkit::child;
use cuda_interop_testkit::Mem;

const W: u32 = 64;
const H: u32 = 32;
const SLOTS: u32 = 3;
/// Bound on every loop of these tests.
const BOUND: Duration = Duration::from_secs(60);

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Held by each parent test that runs `child_sender` or `child_receiver_*`:
/// the child runner keeps a child's output in a file named after the
/// parent's pid and the child's name, so one child name runs once at a time.
fn children_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh private directory for one test's senders.
fn test_dir(tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("cif-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    Directory::new(&path).expect("a private directory");
    path
}

/// The tests' sender options at `address`: no timelines, the demo
/// pattern's transfer commands on the transfer queue (lavapipe has no
/// transfer-only family: the main queue takes them), default limits.
fn sender_options(address: Address) -> SenderOptions {
    SenderOptions {
        semaphores: false,
        queue: vk_export::QueueRole::Transfer,
        ..SenderOptions::new(address, W, H, SLOTS)
    }
}

fn make_sender(address: Address, hold_timeout: Duration) -> (vk_export::Context, Sender<Mem>) {
    let ctx = cuda_interop_testkit::vulkan(None);
    let opts = SenderOptions {
        hold_timeout,
        // The fd test connects 10,000 times from one process.
        connects_per_second: 1_000_000,
        ..sender_options(address)
    };
    let sender = Sender::<Mem>::new(&ctx, opts).expect("a sender");
    (ctx, sender)
}

/// One frame of the demo pattern, if a slot is free; `Ok(false)` if the
/// frame was skipped or back-pressure held it.
fn present_one(sender: &mut Sender<Mem>, acquire_timeout: Duration) -> bool {
    demo::Pattern::of(sender)
        .present_next(sender, acquire_timeout)
        .expect("present")
}

/// A sender named `CIF_NAME` in `CIF_DIR` at `CIF_FPS` frames/s (at most)
/// until `CIF_STOP` exists or it presented `CIF_FRAMES` frames (counting
/// only while a receiver is connected).
#[test]
#[ignore = "a child process of the cross-process tests"]
fn child_sender() {
    let directory = Directory::new(env("CIF_DIR")).unwrap();
    let stop = PathBuf::from(env("CIF_STOP"));
    let fps: f64 = env_or("CIF_FPS", "200").parse().unwrap();
    let frames: u64 = env_or("CIF_FRAMES", "0").parse().unwrap();
    let address = Address::Named {
        directory,
        name: env("CIF_NAME"),
    };
    let (ctx, mut sender) = make_sender(address, Duration::from_secs(5));
    let period = Duration::from_secs_f64(1.0 / fps);
    let start = Instant::now();
    let mut present_calls = 0u64;
    let done = |presented: u64| frames > 0 && presented >= frames;
    while !stop.exists() && !done(sender.stats().presented) {
        assert!(start.elapsed() < BOUND, "the sender ran past its bound");
        let t = Instant::now();
        if sender.stats().receivers == 0 {
            sender.serve(Duration::from_millis(10));
            continue;
        }
        present_one(&mut sender, sender::POLL);
        present_calls += 1;
        std::thread::sleep(period.saturating_sub(t.elapsed()));
    }
    let stats = sender.stats();
    for line in sender.take_log() {
        println!("[sender] {line}");
    }
    println!("RESULT present_calls={present_calls}");
    println!("RESULT presented={}", stats.presented);
    println!("RESULT skipped={}", stats.skipped);
    println!(
        "RESULT backpressure_timeouts={}",
        stats.backpressure_timeouts
    );
    println!("RESULT dropped={}", stats.dropped);
    println!("RESULT pid={}", std::process::id());
    drop(sender);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
}

/// Connects to `name` in `directory` once it is listed (bounded).
fn connect_when_listed(directory: &Directory, name: &str, delivery: Delivery) -> (Session, u32) {
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < BOUND, "sender {name} never appeared");
        if let Ok(info) = directory.find(name) {
            if let Ok((rx, _setup)) =
                Session::connect_named(directory, name, delivery, Duration::from_secs(5))
            {
                return (rx, info.pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn delivery_of(mode: &str) -> Delivery {
    match mode {
        "latest" => Delivery::Latest,
        "lossless" => Delivery::Lossless,
        other => panic!("mode {other}"),
    }
}

/// A receiver of `CIF_NAME` in `CIF_MODE`. Fast: receives and releases at
/// once, writes `CIF_MARKS/fast-ready` after its first frame, stops once
/// `CIF_MARKS/stall-done` exists. Stall: receives and releases until
/// `fast-ready` exists, then takes a frame (`s0`), stops reading for 2 s
/// holding it, releases it, takes the next (`s1`), and writes `stall-done`.
#[test]
#[ignore = "a child process of the cross-process tests"]
fn child_receiver_fast() {
    receiver("fast");
}

#[test]
#[ignore = "a child process of the cross-process tests"]
fn child_receiver_stall() {
    receiver("stall");
}

/// One receiver of the stall tests (`role` as [`child_receiver_fast`]
/// and [`child_receiver_stall`] say).
fn receiver(role: &str) {
    let directory = Directory::new(env("CIF_DIR")).unwrap();
    let marks = PathBuf::from(env("CIF_MARKS"));
    let delivery = delivery_of(&env("CIF_MODE"));
    let (rx, _) = connect_when_listed(&directory, &env("CIF_NAME"), delivery);
    let timeout = Duration::from_secs(10);
    let start = Instant::now();
    let mut got = Vec::new();
    match role {
        "fast" => loop {
            assert!(start.elapsed() < BOUND);
            let frame = rx.next(timeout).expect("a frame");
            got.push(frame.sequence());
            rx.release(frame, false).expect("release");
            if got.len() == 1 {
                std::fs::write(marks.join("fast-ready"), b"").unwrap();
            }
            if marks.join("stall-done").exists() {
                break;
            }
        },
        "stall" => {
            while !marks.join("fast-ready").exists() {
                assert!(start.elapsed() < BOUND);
                let frame = rx.next(timeout).expect("a frame");
                got.push(frame.sequence());
                rx.release(frame, false).expect("release");
            }
            let frame = rx.next(timeout).expect("s0");
            let s0 = frame.sequence();
            got.push(s0);
            // Stops reading (and holds s0) for 2 s.
            std::thread::sleep(Duration::from_secs(2));
            rx.release(frame, false).expect("release s0");
            let frame = rx.next(timeout).expect("s1");
            println!("RESULT s0={s0}");
            println!("RESULT s1={}", frame.sequence());
            got.push(frame.sequence());
            rx.release(frame, false).expect("release s1");
            std::fs::write(marks.join("stall-done"), b"").unwrap();
        }
        other => panic!("role {other}"),
    }
    let list: Vec<String> = got.iter().map(u64::to_string).collect();
    println!("RESULT seqs={}", list.join(","));
    println!("RESULT dropped={}", rx.stats().dropped);
    println!("RESULT received={}", rx.stats().received);
}

/// Runs a sender and a fast and a stalling receiver, each in its own
/// process; returns (sender, fast, stall) results.
fn stall_run(
    tag: &str,
    mode: &str,
) -> (
    HashMap<String, String>,
    HashMap<String, String>,
    HashMap<String, String>,
) {
    let _children = children_lock();
    let dir = test_dir(tag);
    let marks = dir.join("marks");
    std::fs::create_dir(&marks).unwrap();
    let stop = marks.join("stop");
    let name = format!("stall-{mode}");
    let base = |extra: &[(&str, String)]| -> Vec<(String, String)> {
        let mut v = vec![
            ("CIF_DIR".to_string(), dir.display().to_string()),
            ("CIF_MARKS".to_string(), marks.display().to_string()),
            ("CIF_STOP".to_string(), stop.display().to_string()),
            ("CIF_NAME".to_string(), name.clone()),
            ("CIF_MODE".to_string(), mode.to_string()),
        ];
        v.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        v
    };
    let spawn = |test: &'static str, envs: Vec<(String, String)>| {
        std::thread::spawn(move || {
            let envs: Vec<(&str, &str)> =
                envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            child::run_with(test, &envs)
        })
    };
    let sender = spawn("child_sender", base(&[]));
    let fast = spawn("child_receiver_fast", base(&[]));
    let stall = spawn("child_receiver_stall", base(&[]));
    let stall = results(&stall.join().expect("stall receiver"));
    let fast = results(&fast.join().expect("fast receiver"));
    std::fs::write(&stop, b"").unwrap();
    let sender = results(&sender.join().expect("sender"));
    std::fs::remove_dir_all(&dir).unwrap();
    (sender, fast, stall)
}

#[test]
fn latest_a_stalled_receiver_slows_neither_the_sender_nor_the_others() {
    let (sender, fast, stall) = stall_run("latest", "latest");
    let (s0, s1) = (num(&stall, "s0"), num(&stall, "s1"));
    let during: Vec<u64> = seqs(&fast, "seqs")
        .into_iter()
        .filter(|&s| s0 < s && s < s1)
        .collect();
    // The sender went on past the held slot: far more frames than the
    // ring holds were presented while one receiver held s0...
    assert!(
        s1 - s0 > u64::from(2 * SLOTS),
        "the sender presented only {} frames during the stall",
        s1 - s0
    );
    // ...and the fast receiver got them: more than a ring's worth.
    assert!(
        during.len() > 2 * SLOTS as usize,
        "the fast receiver got {} frames during the stall (s0={s0}, s1={s1})",
        during.len()
    );
    // The stalled receiver missed the frames presented meanwhile: counted
    // (every sequence number from its first to its last that it did not get).
    let first = seqs(&stall, "seqs")[0];
    assert_eq!(
        num(&stall, "dropped"),
        s1 - first + 1 - num(&stall, "received")
    );
    assert!(num(&stall, "dropped") >= s1 - s0 - 1);
    // The sender never waited: no back-pressure timeouts, every present
    // call returned, nobody dropped.
    assert_eq!(num(&sender, "backpressure_timeouts"), 0);
    assert_eq!(num(&sender, "dropped"), 0);
    assert!(num(&sender, "presented") >= s1);
}

#[test]
fn lossless_every_frame_in_order_with_back_pressure() {
    let (sender, fast, stall) = stall_run("lossless", "lossless");
    let (s0, s1) = (num(&stall, "s0"), num(&stall, "s1"));
    // Every frame, in order, for both receivers.
    assert_eq!(s1, s0 + 1, "the stalled receiver skipped frames");
    assert_eq!(num(&stall, "dropped"), 0);
    assert_eq!(num(&fast, "dropped"), 0);
    let fast_seqs = seqs(&fast, "seqs");
    assert!(
        fast_seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "{fast_seqs:?}"
    );
    // The documented back-pressure: while the stalled receiver held its
    // slots, the sender's acquires waited and timed out (bounded).
    assert!(
        num(&sender, "backpressure_timeouts") > 0,
        "the sender never waited for the stalled lossless receiver"
    );
    assert_eq!(num(&sender, "dropped"), 0);
}

#[test]
fn discovery_by_name_across_processes() {
    let _children = children_lock();
    let dir = test_dir("discovery");
    let stop = dir.join("stop");
    let envs = [
        ("CIF_DIR".to_string(), dir.display().to_string()),
        ("CIF_STOP".to_string(), stop.display().to_string()),
        ("CIF_NAME".to_string(), "cam-1".to_string()),
    ];
    let sender = std::thread::spawn(move || {
        let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        child::run_with("child_sender", &envs)
    });
    let directory = Directory::new(&dir).unwrap();
    let (rx, pid) = connect_when_listed(&directory, "cam-1", Delivery::Latest);
    let listed = directory.list().unwrap();
    assert_eq!(listed.len(), 1);
    let info = &listed[0];
    assert_eq!(
        (
            info.name.as_str(),
            info.width,
            info.height,
            info.slots,
            info.kind
        ),
        ("cam-1", W, H, SLOTS, SlotKind::Buffer)
    );
    assert_eq!(
        (info.format.as_str(), info.row_pitch),
        ("r8g8b8a8_unorm", u64::from(W) * 4)
    );
    assert_eq!(info.pid, pid);
    assert_ne!(info.pid, std::process::id());
    assert_eq!(rx.layout().width, W);
    let mut last = 0;
    for _ in 0..5 {
        let frame = rx.next(Duration::from_secs(10)).expect("a frame");
        assert!(frame.sequence() > last);
        assert!(frame.timestamp_ns() > 0 && frame.timestamp_ns() <= sender::monotonic_ns());
        last = frame.sequence();
        rx.release(frame, false).unwrap();
    }
    drop(rx);
    std::fs::write(&stop, b"").unwrap();
    let out = results(&sender.join().unwrap());
    assert_eq!(num(&out, "pid"), u64::from(pid));
    // The sender's entry went with it.
    assert!(directory.list().unwrap().is_empty());
    assert!(matches!(
        directory.find("cam-1"),
        Err(cuda_interop_frames::discovery::DiscoveryError::NotFound { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_restarted_sender_is_reconnected_by_name() {
    let _children = children_lock();
    let dir = test_dir("restart");
    let stop = dir.join("stop");
    let base = vec![
        ("CIF_DIR".to_string(), dir.display().to_string()),
        ("CIF_STOP".to_string(), stop.display().to_string()),
        ("CIF_NAME".to_string(), "restart".to_string()),
    ];
    let directory = Directory::new(&dir).unwrap();
    let receiver = {
        let directory = directory.clone();
        std::thread::spawn(move || {
            let (rx, first_pid) = connect_when_listed(&directory, "restart", Delivery::Latest);
            let start = Instant::now();
            // Frames until the first sender goes away.
            let mut frames_first = 0;
            loop {
                assert!(start.elapsed() < BOUND);
                match rx.next(Duration::from_secs(10)) {
                    Ok(frame) => {
                        frames_first += 1;
                        // The sender may be gone already: a failed release is fine.
                        let _ = rx.release(frame, false);
                    }
                    Err(_) => break,
                }
            }
            drop(rx);
            // Reconnect by name to whichever sender has it now.
            let (rx, second_pid) = loop {
                let (rx, pid) = connect_when_listed(&directory, "restart", Delivery::Latest);
                if pid != first_pid {
                    break (rx, pid);
                }
                // The first sender's entry is still being removed.
                drop(rx);
                std::thread::sleep(Duration::from_millis(20));
            };
            for _ in 0..3 {
                let frame = rx.next(Duration::from_secs(10)).expect("a frame");
                rx.release(frame, false).unwrap();
            }
            (frames_first, first_pid, second_pid)
        })
    };
    let run = |envs: Vec<(String, String)>| {
        let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        results(&child::run_with("child_sender", &envs))
    };
    let mut first = base.clone();
    first.push(("CIF_FRAMES".to_string(), "20".to_string()));
    let first = run(first);
    let second = std::thread::spawn(move || run(base));
    let (frames_first, first_pid, second_pid) = receiver.join().expect("receiver");
    std::fs::write(&stop, b"").unwrap();
    let second = second.join().unwrap();
    assert!(frames_first > 0);
    assert_eq!(u64::from(first_pid), num(&first, "pid"));
    assert_eq!(u64::from(second_pid), num(&second, "pid"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// In a process of its own (exact fd counts): 10,000 receivers connect and
/// leave, half of them after taking the ring, half at once; the sender's
/// process ends with the fds it started with.
#[test]
#[ignore = "a child process of fds_are_flat_over_10000_connects"]
fn child_fds_flat() {
    child::started_as_child("CIF_FDS_CHILD");
    let dir = test_dir("fds");
    let socket = dir.join("fds.sock");
    let (ctx, mut sender) = make_sender(Address::Path(socket.clone()), Duration::from_secs(5));
    let path = socket.to_str().unwrap().to_string();
    let cycle = {
        let path = path.clone();
        move |i: u32| {
            if i.is_multiple_of(2) {
                // The sender admits 16 connections at once, and this loop
                // can outrun its reaping of the ones just closed (a loaded
                // machine): that refusal is the limit working, so the
                // connect is tried again, within a bound.
                let start = Instant::now();
                let rx = loop {
                    match Session::connect(&path, Delivery::Latest, Duration::from_secs(10)) {
                        Err(ConsumerError::Dropped(DropReason::TooManyReceivers { .. }))
                            if start.elapsed() < BOUND =>
                        {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        other => break other.expect("connect"),
                    }
                };
                drop(rx);
            } else {
                let conn = transport::connect(&path, Duration::from_secs(10)).expect("connect");
                drop(conn);
            }
        }
    };
    // Warm-up: the first connection's lazy allocations are not leaks.
    let warm = {
        let path = path.clone();
        std::thread::spawn(move || {
            let rx = Session::connect(&path, Delivery::Latest, Duration::from_secs(10));
            drop(rx.expect("connect"));
        })
    };
    let start = Instant::now();
    while !warm.is_finished() || sender.stats().receivers > 0 {
        assert!(start.elapsed() < BOUND);
        sender.serve(Duration::from_millis(5));
    }
    warm.join().unwrap();
    let before = cuda_interop_testkit::open_fd_count();
    const CYCLES: u32 = 10_000;
    let mut clients = Some(std::thread::spawn(move || (0..CYCLES).for_each(cycle)));
    let start = Instant::now();
    loop {
        // A connecting thread that failed fails the test now, not after
        // the bound (its connects would never add up).
        if clients.as_ref().is_some_and(|c| c.is_finished()) {
            let done = clients.take().expect("checked above").join();
            done.expect("the connecting thread");
        }
        let stats = sender.stats();
        if clients.is_none()
            && stats.receivers == 0
            && stats.connected + stats.refused > u64::from(CYCLES)
        {
            break;
        }
        // A hang bound, under the parent's 120 s for the whole child.
        assert!(
            start.elapsed() < Duration::from_secs(100),
            "cycles did not end"
        );
        sender.serve(Duration::from_millis(5));
        // Some frames meanwhile, so that slots are held and given back.
        present_one(&mut sender, Duration::ZERO);
    }
    let after = cuda_interop_testkit::open_fd_count();
    let stats = sender.stats();
    println!(
        "RESULT connected={} refused={} presented={}",
        stats.connected, stats.refused, stats.presented
    );
    assert_eq!(after, before, "fds before and after {CYCLES} connects");
    drop(sender);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fds_are_flat_over_10000_connects() {
    child::run_marked("child_fds_flat", "CIF_FDS_CHILD");
}

/// In a process of its own (exact fd counts): a flood of connections the
/// sender's thread never gets to (nothing serves while they come). The
/// accept thread hands it `max_receivers + ACCEPT_SLACK` of them at most
/// and refuses the rest itself, with the limit's goodbye: the sender's
/// process holds no fd for those, and a receiver that connects meanwhile
/// learns at once why it is not served. Served, every connection closes.
#[test]
#[ignore = "a child process of a_connection_flood_is_refused_by_the_accept_thread"]
fn child_connection_flood() {
    child::started_as_child("CIF_FLOOD_CHILD");
    let dir = test_dir("flood");
    let socket = dir.join("flood.sock");
    let ctx = cuda_interop_testkit::vulkan(None);
    let limit = 4u32;
    let opts = SenderOptions {
        max_receivers: limit,
        connects_per_second: 1_000_000,
        ..sender_options(Address::Path(socket.clone()))
    };
    let mut sender = Sender::<Mem>::new(&ctx, opts).expect("a sender");
    let path = socket.to_str().unwrap().to_string();
    let cap = limit as usize + sender::ACCEPT_SLACK;
    let before = cuda_interop_testkit::open_fd_count();
    const FLOOD: usize = 200;
    let clients: Vec<_> = (0..FLOOD)
        .map(|_| transport::connect(&path, Duration::from_secs(10)).expect("connect"))
        .collect();
    // Past the cap, each was refused by the accept thread with a goodbye.
    for conn in &clients[cap..] {
        assert_eq!(
            goodbye_of(conn),
            Some(DropReason::TooManyReceivers { limit })
        );
    }
    assert_eq!(sender.stats().refused, (FLOOD - cap) as u64);
    // The sender's side holds one fd per connection it was handed, none
    // for the refused ones (the clients' own fds are this process's too).
    let held = cuda_interop_testkit::open_fd_count() - before - FLOOD;
    assert!(
        held <= cap,
        "{held} fds held for {FLOOD} connections (cap {cap})"
    );
    // A receiver that connects now is told why at once.
    match Session::connect(&path, Delivery::Latest, Duration::from_secs(10)) {
        Err(ConsumerError::Dropped(DropReason::TooManyReceivers { limit: l })) => {
            assert_eq!(l, limit)
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    drop(clients);
    let start = Instant::now();
    while sender.stats().receivers > 0 || cuda_interop_testkit::open_fd_count() > before {
        assert!(start.elapsed() < BOUND, "connections still open");
        sender.serve(Duration::from_millis(5));
    }
    drop(sender);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_connection_flood_is_refused_by_the_accept_thread() {
    child::run_marked("child_connection_flood", "CIF_FLOOD_CHILD");
}

/// Peers that keep connecting and closing never keep a sender call past
/// its bound: every present (its `acquire(0)` handles the receivers'
/// events first) returns within `HANG`, frames keep being presented.
///
/// A guard, not the defect's reproduction: eight flooding *processes*
/// held a call of the earlier code for up to 1.7 s (the review's, on this
/// 2-core machine); these eight threads did not, with or without the cap
/// and the budget. The cap's own test is the deterministic one above.
#[test]
fn a_connection_flood_never_holds_a_sender_call() {
    const HANG: Duration = Duration::from_secs(2);
    let dir = test_dir("flood-calls");
    let socket = dir.join("flood.sock");
    let ctx = cuda_interop_testkit::vulkan(None);
    // The default limits: most of the flood is over the rate.
    let opts = sender_options(Address::Path(socket.clone()));
    let mut sender = Sender::<Mem>::new(&ctx, opts).expect("a sender");
    let path = socket.to_str().unwrap().to_string();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooders: Vec<_> = (0..8)
        .map(|_| {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                // A raw connect and close: no protocol, as fast as it goes.
                let address = rustix::net::SocketAddrUnix::new(path.as_str()).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let fd = rustix::net::socket(
                        rustix::net::AddressFamily::UNIX,
                        rustix::net::SocketType::SEQPACKET,
                        None,
                    )
                    .unwrap();
                    let _ = rustix::net::connect(&fd, &address);
                }
            })
        })
        .collect();
    let (start, mut longest, mut presented) = (Instant::now(), Duration::ZERO, 0);
    while start.elapsed() < Duration::from_secs(4) {
        let call = Instant::now();
        if present_one(&mut sender, Duration::ZERO) {
            presented += 1;
        }
        longest = longest.max(call.elapsed());
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flooders.into_iter().for_each(|f| f.join().unwrap());
    assert!(sender.stats().refused > 0, "the flood was refused");
    assert!(longest < HANG, "a present took {longest:?} under the flood");
    assert!(presented > 0);
    drop(sender);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Sends `message` on `conn`, the raw way a hostile peer would.
fn send(conn: &vk_export::socket::Connection, message: Message) {
    transport::send_message(conn, &message).expect("send");
}

/// The goodbye a raw connection gets (bounded), skipping what came before.
fn goodbye_of(conn: &vk_export::socket::Connection) -> Option<DropReason> {
    let deadline = Instant::now() + BOUND;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match transport::recv_message(conn, deadline, left) {
            Ok(Message::Goodbye(reason)) => return Some(reason),
            Ok(_) => continue,
            // A wire message (the ring's setup) is not a packet: skip it.
            Err(ConsumerError::Packet(_)) => continue,
            Err(_) => return None,
        }
    }
}

/// Faulty receivers (garbage, a sender's message, a release of a frame it
/// does not hold, a lossless one that stops reading and holds its slots,
/// one that never subscribes, one that dies holding a slot) are dropped,
/// each told why; a good latest receiver keeps getting frames and the
/// sender's presents keep returning.
#[test]
#[ignore = "a child process of faulty_receivers_are_dropped_without_affecting_others"]
fn child_faults() {
    child::started_as_child("CIF_FAULTS_CHILD");
    let dir = test_dir("faults");
    let socket = dir.join("faults.sock");
    let (ctx, mut sender) = make_sender(Address::Path(socket.clone()), Duration::from_secs(1));
    let path = socket.to_str().unwrap().to_string();
    let good = {
        let path = path.clone();
        std::thread::spawn(move || {
            let (rx, _) = Session::connect(&path, Delivery::Latest, Duration::from_secs(10))
                .expect("connect");
            let mut seqs = Vec::new();
            while seqs.len() < 300 {
                let frame = rx.next(Duration::from_secs(10)).expect("a frame");
                seqs.push(frame.sequence());
                rx.release(frame, false).expect("release");
            }
            seqs
        })
    };
    let faulty = {
        let path = path.clone();
        std::thread::spawn(move || {
            let t = Duration::from_secs(10);
            let connect = || transport::connect(&path, t).unwrap();
            let garbage = connect();
            rustix::net::send(
                &garbage,
                b"not a packet at all",
                rustix::net::SendFlags::empty(),
            )
            .unwrap();
            let wrong_kind = connect();
            send(&wrong_kind, Message::Subscribe(Delivery::Latest));
            send(
                &wrong_kind,
                Message::Frame {
                    slot: 0,
                    sequence: 1,
                    timestamp_ns: 1,
                },
            );
            let bad_release = connect();
            send(&bad_release, Message::Subscribe(Delivery::Latest));
            send(
                &bad_release,
                Message::Release {
                    slot: 1,
                    sequence: 99,
                    gpu_signalled: false,
                },
            );
            // Lossless, never reads or releases: its slots are held until
            // the hold timeout drops it.
            let stuck = connect();
            send(&stuck, Message::Subscribe(Delivery::Lossless));
            // Never subscribes: closed after the subscribe bound.
            let idle = connect();
            // Takes a frame and dies holding it.
            let (dies, _) = Session::connect(&path, Delivery::Latest, t).unwrap();
            let held = dies.next(t).unwrap();
            assert_eq!(dies.held(), 1);
            // As a crashed process's would, its socket goes with its frame
            // still held.
            dies.close("dies holding a frame");
            drop((held, dies));
            let reasons: Vec<Option<DropReason>> =
                [&garbage, &wrong_kind, &bad_release, &stuck, &idle]
                    .into_iter()
                    .map(goodbye_of)
                    .collect();
            reasons
        })
    };
    let start = Instant::now();
    let mut presented_while_faulty = 0;
    while !good.is_finished() || !faulty.is_finished() {
        assert!(
            start.elapsed() < BOUND,
            "the good receiver stopped getting frames"
        );
        sender.serve(Duration::from_millis(1));
        if present_one(&mut sender, Duration::from_millis(50)) && !faulty.is_finished() {
            presented_while_faulty += 1;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let reasons = faulty.join().unwrap();
    let seqs = good.join().unwrap();
    while sender.stats().receivers > 0 {
        assert!(start.elapsed() < BOUND);
        sender.serve(Duration::from_millis(10));
    }
    let log = sender.take_log().join("\n");
    println!("{log}");
    let stats = sender.stats();
    // Each faulty one was told why, in the protocol's own terms.
    assert_eq!(
        reasons[0],
        Some(DropReason::ProtocolFault(Fault::BadPacket)),
        "{log}"
    );
    assert_eq!(
        reasons[1],
        Some(DropReason::ProtocolFault(Fault::SenderMessage))
    );
    assert_eq!(
        reasons[2],
        Some(DropReason::ProtocolFault(Fault::NotHeld { sequence: 99 }))
    );
    assert!(
        matches!(reasons[3], Some(DropReason::HeldTooLong { .. })),
        "{:?}",
        reasons[3]
    );
    assert!(
        matches!(reasons[4], Some(DropReason::NotSubscribed { .. })),
        "{:?}",
        reasons[4]
    );
    // The five faulty ones dropped; the one that died left on its own.
    assert_eq!(stats.dropped, 5, "{log}");
    assert!(presented_while_faulty > 0);
    assert_eq!(seqs.len(), 300);
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    drop(sender);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn faulty_receivers_are_dropped_without_affecting_others() {
    child::run_marked("child_faults", "CIF_FAULTS_CHILD");
}

/// With every slot held by latest receivers, acquire does not wait: the
/// frame is skipped and counted (the ring-size rule: `L` latest receivers
/// holding one frame each need `L + 1` slots).
#[test]
fn all_slots_held_by_latest_receivers_skips_without_waiting() {
    let dir = test_dir("skip");
    let socket = dir.join("skip.sock");
    let (ctx, mut sender) = make_sender(Address::Path(socket.clone()), Duration::from_secs(30));
    let path = socket.to_str().unwrap().to_string();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    // SLOTS latest receivers, each holding one frame in a slot no other
    // holds (one that got a frame another holds gives it back and asks again).
    let holders = std::thread::spawn(move || {
        let mut all: Vec<(Session, Frame)> = Vec::new();
        for _ in 0..SLOTS {
            let (rx, _) = Session::connect(&path, Delivery::Latest, Duration::from_secs(10))
                .expect("connect");
            let start = Instant::now();
            let frame = loop {
                assert!(start.elapsed() < BOUND);
                let frame = rx.next(Duration::from_secs(10)).expect("a frame");
                if all.iter().all(|(_, f)| f.slot() != frame.slot()) {
                    break frame;
                }
                rx.release(frame, false).expect("release");
            };
            held_tx.send(frame.slot()).unwrap();
            all.push((rx, frame));
        }
        done_rx.recv_timeout(BOUND).unwrap();
        drop(all);
    });
    let start = Instant::now();
    let mut slots_held = std::collections::BTreeSet::new();
    while slots_held.len() < SLOTS as usize {
        assert!(
            start.elapsed() < BOUND,
            "{:?} {:?}",
            sender.stats(),
            sender.take_log()
        );
        sender.serve(Duration::from_millis(5));
        present_one(&mut sender, Duration::ZERO);
        while let Ok(slot) = held_rx.try_recv() {
            slots_held.insert(slot);
        }
    }
    // Every slot held: a long acquire timeout, yet no wait.
    let skipped = sender.stats().skipped;
    let result = sender.acquire(Duration::from_secs(30)).map(|s| s.index());
    assert!(
        matches!(result, Err(AcquireError::AllSlotsHeld)),
        "{result:?}"
    );
    assert_eq!(sender.stats().skipped, skipped + 1);
    assert_eq!(sender.stats().backpressure_timeouts, 0);
    done_tx.send(()).unwrap();
    holders.join().unwrap();
    // Given back: a slot is free again.
    let start = Instant::now();
    while sender.stats().receivers > 0 {
        assert!(start.elapsed() < BOUND);
        sender.serve(Duration::from_millis(5));
    }
    assert!(sender.acquire(Duration::ZERO).is_ok());
    drop(sender);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A ring without semaphores (lavapipe) is refused by a CUDA receiver with
/// an error that names what is missing, before any CUDA call.
#[test]
fn a_ring_without_semaphores_is_refused_with_what_is_missing() {
    let dir = test_dir("nosem");
    let socket = dir.join("nosem.sock");
    let (ctx, mut sender) = make_sender(Address::Path(socket.clone()), Duration::from_secs(5));
    let path = socket.to_str().unwrap().to_string();
    let client = std::thread::spawn(move || {
        let (session, setup) =
            Session::connect(&path, Delivery::Latest, Duration::from_secs(10)).expect("connect");
        let refused =
            cuda_interop_frames::cuda_receiver::CudaReceiver::from_session(session, setup, |_| {
                panic!("no CUDA call before the refusal")
            });
        refused.expect_err("no semaphores").to_string()
    });
    let start = Instant::now();
    while !client.is_finished() {
        assert!(start.elapsed() < BOUND);
        sender.serve(Duration::from_millis(5));
    }
    let message = client.join().unwrap();
    assert!(message.contains("no semaphores"), "{message}");
    assert!(
        message.contains("VK_KHR_external_semaphore_fd"),
        "{message}"
    );
    assert!(message.contains("NumPy"), "{message}");
    drop(sender);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}
