//! S9 (issue 30): the frame ring against its CUDA-only peer, with one and
//! four receiving processes, without and with CUDA MPS, in one run.
//!
//! # Contract
//!
//! * Runs before this process makes any Vulkan or CUDA context (it loads
//!   no driver): every ring runs in child processes of this binary
//!   (`ipc_ring`, `frame_ring`), whose output goes to files in a private
//!   folder (removed at the end) and whose lines (`s9_wire`) it reads. A
//!   child that outlives [`CHILD_LIMIT`] is killed; a failed child is a
//!   failure of the run (reported, the other cells still run).
//! * Cells: for MPS off, then on (a private daemon, `mps`), for 1 and 4
//!   receivers: the CUDA IPC ring, then the frame ring. Without MPS the
//!   children get an empty pipe folder of their own, so that a daemon
//!   running for this user does not take them. MPS unavailable: a note
//!   `S9 with MPS: NOT RUN (why)`; a daemon that does not start or stop:
//!   a failure.
//! * Rows (the first [`WARM_UP`] frames of each receiver left out): each
//!   ring's hand-off median (packet received -> CUDA waited; the worst
//!   receiver's median for four), four against one (goal: at most 1.5x
//!   one receiver without MPS), the frame ring against the IPC ring (goal:
//!   at most 1.5x), the present-to-waited latency and frames/s against the
//!   IPC ring, and the latency by step, medians over every receiver.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::frame_ring;
use crate::ipc_ring;
use crate::mps::{self, Mps};
use crate::report::Report;
use crate::s9_wire::{median, span_us, FrameLine, SentLine};
use crate::Res;

/// Frames each receiver leaves out of its figures (setup and warm-up).
const WARM_UP: usize = 10;
const CHILD_LIMIT: Duration = Duration::from_secs(240);
/// The goals of issue 30.
const GOAL: f64 = 1.5;

/// What one child printed, and how it ended.
struct Ran {
    label: String,
    stdout: String,
    ok: Result<(), String>,
}

/// Children of one cell, each with its stdout in a file.
struct Cell {
    dir: PathBuf,
    children: Vec<(String, Child, PathBuf)>,
}

impl Cell {
    fn spawn(
        &mut self,
        label: &str,
        flag: &str,
        env: &[(String, String)],
        inherit: Option<&OwnedFd>,
    ) -> Res<()> {
        let out = self.dir.join(format!("{label}.out"));
        let mut c = Command::new(std::env::current_exe()?);
        c.arg(flag)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::from(File::create(&out)?))
            .stderr(Stdio::inherit());
        if let Some(fd) = inherit {
            // SAFETY: clears FD_CLOEXEC on an fd this function's caller
            // owns, so that this child (started next, on this thread)
            // inherits it; the caller closes its copy right after.
            if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
                return Err("fcntl(F_SETFD) on a child's socket failed".into());
            }
        }
        let child = c.spawn()?;
        self.children.push((label.to_string(), child, out));
        Ok(())
    }

    /// Waits for every child (bounded; killed past it).
    fn wait(self) -> Vec<Ran> {
        let deadline = Instant::now() + CHILD_LIMIT;
        self.children
            .into_iter()
            .map(|(label, mut child, out)| {
                let ok = loop {
                    match child.try_wait() {
                        Ok(Some(status)) if status.success() => break Ok(()),
                        Ok(Some(status)) => break Err(format!("{status}")),
                        Ok(None) if Instant::now() > deadline => {
                            let _ = child.kill();
                            let _ = child.wait();
                            break Err(format!("killed after {CHILD_LIMIT:?}"));
                        }
                        Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                        Err(e) => break Err(e.to_string()),
                    }
                };
                let stdout = std::fs::read_to_string(&out).unwrap_or_default();
                Ran { label, stdout, ok }
            })
            .collect()
    }
}

/// A `SOCK_SEQPACKET` pair, close-on-exec.
fn seqpacket_pair() -> Res<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: writes two fds into the array on success.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(format!("socketpair: {}", std::io::Error::last_os_error()).into());
    }
    // SAFETY: both are new fds this function owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The frames of each receiver, and the sender's lines (frame ring).
struct Measured {
    receivers: Vec<Vec<FrameLine>>,
    sent: Vec<SentLine>,
}

/// Reads the children's lines; `Err` names every failed child.
fn collect(ran: Vec<Ran>, what: &str) -> Result<Measured, String> {
    let mut m = Measured {
        receivers: Vec::new(),
        sent: Vec::new(),
    };
    let mut failed = Vec::new();
    for r in ran {
        let mut frames = Vec::new();
        for line in r.stdout.lines() {
            if let Some(f) = FrameLine::parse(line) {
                frames.push(f);
            } else if let Some(s) = SentLine::parse(line) {
                m.sent.push(s);
            } else {
                println!("S9 {what} {}: {line}", r.label);
            }
        }
        if let Err(e) = r.ok {
            failed.push(format!("{} ({e})", r.label));
        }
        if r.label.starts_with("consumer") || r.label.starts_with("receiver") {
            m.receivers.push(frames);
        }
    }
    if failed.is_empty() {
        Ok(m)
    } else {
        Err(format!(
            "{what}: {} failed (its error is on stderr above)",
            failed.join(", ")
        ))
    }
}

fn ipc_cell(dir: &Path, n: usize, frames: u64, env: &[(String, String)]) -> Res<Measured> {
    let mut cell = Cell {
        dir: dir.to_path_buf(),
        children: Vec::new(),
    };
    let pairs = (0..n).map(|_| seqpacket_pair()).collect::<Res<Vec<_>>>()?;
    let (ours, theirs): (Vec<OwnedFd>, Vec<OwnedFd>) = pairs.into_iter().unzip();
    let fds: Vec<String> = ours.iter().map(|f| f.as_raw_fd().to_string()).collect();
    let mut penv = env.to_vec();
    penv.push((ipc_ring::FDS_ENV.into(), fds.join(",")));
    penv.push((ipc_ring::FRAMES_ENV.into(), frames.to_string()));
    for fd in &ours {
        // SAFETY: clears FD_CLOEXEC on fds this function owns, for the
        // producer started next; they are closed here right after.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
            return Err("fcntl(F_SETFD) on the producer's sockets failed".into());
        }
    }
    cell.spawn("producer", ipc_ring::PRODUCER_FLAG, &penv, None)?;
    drop(ours);
    for (i, fd) in theirs.into_iter().enumerate() {
        let mut cenv = env.to_vec();
        cenv.push((ipc_ring::FD_ENV.into(), fd.as_raw_fd().to_string()));
        cenv.push((ipc_ring::FRAMES_ENV.into(), frames.to_string()));
        cell.spawn(
            &format!("consumer{}", i + 1),
            ipc_ring::CONSUMER_FLAG,
            &cenv,
            Some(&fd),
        )?;
        drop(fd);
    }
    Ok(collect(cell.wait(), "CUDA IPC ring")?)
}

fn frame_cell(dir: &Path, n: usize, frames: u64, env: &[(String, String)]) -> Res<Measured> {
    let mut cell = Cell {
        dir: dir.to_path_buf(),
        children: Vec::new(),
    };
    let socket = dir.join(format!("frames-{n}-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let mut senv = env.to_vec();
    senv.push((frame_ring::SOCKET_ENV.into(), socket.display().to_string()));
    senv.push((frame_ring::RECEIVERS_ENV.into(), n.to_string()));
    cell.spawn("sender", frame_ring::SENDER_FLAG, &senv, None)?;
    let start = Instant::now();
    while !socket.exists() {
        if start.elapsed() > Duration::from_secs(30) {
            // The sender's failure is reported by wait().
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut renv = env.to_vec();
    renv.push((frame_ring::SOCKET_ENV.into(), socket.display().to_string()));
    renv.push((ipc_ring::FRAMES_ENV.into(), frames.to_string()));
    for i in 0..n {
        cell.spawn(
            &format!("receiver{}", i + 1),
            frame_ring::RECEIVER_FLAG,
            &renv,
            None,
        )?;
    }
    Ok(collect(cell.wait(), "frame ring")?)
}

/// The figures of one cell.
#[derive(Clone, Debug, PartialEq)]
struct Figures {
    /// Each receiver's hand-off median (µs).
    pub hand_off: Vec<f64>,
    /// Present called -> CUDA waited, median over every receiver (µs).
    pub latency: f64,
    /// Frames per second, the slowest receiver.
    pub fps: f64,
    /// The steps' medians over every receiver: (name, µs).
    pub steps: Vec<(&'static str, f64)>,
}

impl Figures {
    pub(crate) fn worst(&self) -> f64 {
        self.hand_off.iter().copied().fold(f64::NAN, f64::max)
    }
}

/// Draws the figures from a cell's lines.
fn figures(m: &Measured) -> Result<Figures, String> {
    let returned: std::collections::HashMap<u64, u64> =
        m.sent.iter().map(|s| (s.sequence, s.returned)).collect();
    let (mut latency, mut fps) = (Vec::new(), f64::INFINITY);
    let mut hand_off = Vec::new();
    let ipc = m.sent.is_empty();
    let names: &[&'static str] = if ipc {
        &[
            "present called -> GPU work done (event synchronised)",
            "GPU work done -> packet sent",
            "packet sent -> packet received",
            "packet received -> CUDA waited (hand-off)",
        ]
    } else {
        &[
            "present called -> present returned (GPU work done, produced signalled, packet sent)",
            "present returned -> packet received",
            "packet received -> CUDA waited (hand-off)",
        ]
    };
    let mut steps: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for (i, frames) in m.receivers.iter().enumerate() {
        let frames = frames.get(WARM_UP..).unwrap_or_default();
        if frames.len() < 2 {
            return Err(format!(
                "receiver {} has {} frames after the warm-up",
                i + 1,
                frames.len()
            ));
        }
        let mut h: Vec<f64> = frames.iter().map(FrameLine::hand_off_us).collect();
        hand_off.push(median(&mut h));
        let secs = span_us(frames[0].waited, frames[frames.len() - 1].waited) / 1e6;
        fps = fps.min((frames.len() - 1) as f64 / secs);
        for f in frames {
            latency.push(span_us(f.called, f.waited));
            if ipc {
                steps[0].push(span_us(f.called, f.gpu_done));
                steps[1].push(span_us(f.gpu_done, f.sent));
                steps[2].push(span_us(f.sent, f.received));
                steps[3].push(f.hand_off_us());
            } else {
                let r = *returned.get(&f.sequence).ok_or_else(|| {
                    format!("the sender printed no line for frame {}", f.sequence)
                })?;
                steps[0].push(span_us(f.called, r));
                steps[1].push(span_us(r, f.received));
                steps[2].push(f.hand_off_us());
            }
        }
    }
    Ok(Figures {
        hand_off,
        latency: median(&mut latency),
        fps,
        steps: names
            .iter()
            .zip(steps.iter_mut())
            .map(|(n, v)| (*n, median(v)))
            .collect(),
    })
}

/// One mode's cells: (n, IPC figures, frame figures).
type Cells = Vec<(usize, Result<Figures, String>, Result<Figures, String>)>;

fn run_mode(dir: &Path, frames: u64, env: &[(String, String)], label: &str) -> Cells {
    [1usize, 4]
        .into_iter()
        .map(|n| {
            println!("S9 {label}: {n} receiver(s), CUDA IPC ring, then the frame ring");
            let ipc = ipc_cell(dir, n, frames, env)
                .map_err(|e| e.to_string())
                .and_then(|m| figures(&m));
            let ring = frame_cell(dir, n, frames, env)
                .map_err(|e| e.to_string())
                .and_then(|m| figures(&m));
            (n, ipc, ring)
        })
        .collect()
}

/// S9: see the module contract. `--s9-only` runs nothing else.
pub(crate) fn s9(report: &mut Report, quick: bool) -> Res<()> {
    let frames: u64 = if quick { 300 } else { 2000 };
    // Whether a driver is there at all (loads no context).
    if let Err(e) = cuda_interop::sys::Driver::load() {
        report.note(format!(
            "S9 (CUDA IPC ring, frame ring) skipped: no CUDA driver ({e})"
        ));
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("bench-s9-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = s9_in(report, frames, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn s9_in(report: &mut Report, frames: u64, dir: &Path) -> Res<()> {
    report.note(format!(
        "S9: {} slots of {}x{} RGBA8, lossless, {frames} frames per receiver (the first {WARM_UP} left out); hand-off = packet received -> CUDA waited (the frame ring: CudaReceiver::wait_on + stream sync; the IPC ring: cuStreamWaitEvent + cuStreamSynchronize); both producers wait for their GPU work before sending",
        ipc_ring::SLOTS,
        ipc_ring::WIDTH,
        ipc_ring::HEIGHT
    ));
    let no_mps = mps::no_mps_env(dir)?;
    let off = run_mode(dir, frames, &no_mps, "without MPS");
    // The sender's wait for its own submission, the largest step of the
    // frame ring's latency: blocked (the default, in `off`) against polled.
    println!("S9 without MPS: 1 receiver, the frame ring with a polled fence wait");
    let mut polled_env = no_mps.clone();
    polled_env.push((frame_ring::POLL_ENV.into(), "1".into()));
    let polled = frame_cell(dir, 1, frames, &polled_env)
        .map_err(|e| e.to_string())
        .and_then(|m| figures(&m));
    let on = match mps::control_binary() {
        Err(why) => {
            report.note(format!("S9 with MPS: NOT RUN ({why})"));
            None
        }
        Ok(control) => match Mps::start(control, dir) {
            Err(e) => {
                report.fail(format!("S9 with MPS: the daemon did not start: {e}"));
                None
            }
            Ok(mut daemon) => {
                let cells = run_mode(dir, frames, &daemon.env(), "with MPS");
                let log = daemon.log_tail();
                if let Err(e) = daemon.stop() {
                    report.fail(format!("S9: {e}"));
                }
                report.note(format!("S9 MPS daemon's log: {log}"));
                Some(cells)
            }
        },
    };
    let one_without = |cells: &Cells, ipc: bool| {
        cells.iter().find(|c| c.0 == 1).and_then(|c| {
            let f = if ipc { &c.1 } else { &c.2 };
            f.as_ref().ok().map(|f| f.worst())
        })
    };
    let (ipc_one, ring_one) = (one_without(&off, true), one_without(&off, false));
    let blocked = off
        .iter()
        .find(|c| c.0 == 1)
        .and_then(|c| c.2.as_ref().ok());
    match (&polled, blocked) {
        (Ok(p), Some(b)) => {
            let step = |f: &Figures| f.steps.first().map_or(f64::NAN, |s| s.1);
            report.add_vs(
                "S9",
                "frame ring, 1 receiver, no MPS, polled fence wait: present called -> present returned",
                step(p),
                "us",
                ("blocked in vkWaitForFences", step(b)),
            );
            report.add_vs(
                "S9",
                "frame ring, 1 receiver, no MPS, polled fence wait: present called -> CUDA waited, median",
                p.latency,
                "us",
                ("blocked in vkWaitForFences", b.latency),
            );
            report.add_vs(
                "S9",
                "frame ring, 1 receiver, no MPS, polled fence wait: hand-off median",
                p.worst(),
                "us",
                ("blocked in vkWaitForFences", b.worst()),
            );
        }
        (Err(e), _) => report.fail(format!("S9 frame ring with a polled fence wait: {e}")),
        (Ok(_), None) => report.note("S9 polled fence wait: no blocked cell to compare with"),
    }
    for (mode, cells) in [("no MPS", Some(&off)), ("MPS", on.as_ref())] {
        let Some(cells) = cells else { continue };
        for (n, ipc, ring) in cells {
            let who = if *n == 1 {
                "1 receiver".to_string()
            } else {
                format!("{n} receivers (the worst one's median)")
            };
            let ipc = match ipc {
                Ok(f) => Some(f),
                Err(e) => {
                    report.fail(format!("S9 CUDA IPC ring, {n}, {mode}: {e}"));
                    None
                }
            };
            let ring = match ring {
                Ok(f) => Some(f),
                Err(e) => {
                    report.fail(format!("S9 frame ring, {n}, {mode}: {e}"));
                    None
                }
            };
            for (name, f, one) in [
                ("CUDA IPC ring", ipc, ipc_one),
                ("frame ring", ring, ring_one),
            ] {
                let Some(f) = f else { continue };
                let case = format!("{name}, {who}, {mode}: hand-off median");
                match (*n, one) {
                    (1, _) | (_, None) => report.add("S9", case, f.worst(), "us"),
                    (_, Some(one)) => {
                        report.add_vs("S9", case, f.worst(), "us", ("1 receiver, no MPS", one));
                        report.goal(
                            format!("each of {n} <= {GOAL}x one"),
                            f.worst() <= GOAL * one,
                        );
                    }
                }
                if *n > 1 {
                    let each: Vec<String> = f.hand_off.iter().map(|h| format!("{h:.1}")).collect();
                    report.note(format!(
                        "S9 {name}, {n} receivers, {mode}: each one's hand-off median {} µs",
                        each.join(", ")
                    ));
                }
            }
            if let (Some(i), Some(r)) = (ipc, ring) {
                report.add_vs(
                    "S9",
                    format!("frame ring against CUDA IPC ring, {who}, {mode}: hand-off median"),
                    r.worst(),
                    "us",
                    ("CUDA IPC ring", i.worst()),
                );
                report.goal(
                    format!("<= {GOAL}x the CUDA IPC ring"),
                    r.worst() <= GOAL * i.worst(),
                );
                report.add_vs("S9", format!("frame ring against CUDA IPC ring, {n} receiver(s), {mode}: present called -> CUDA waited, median"), r.latency, "us", ("CUDA IPC ring", i.latency));
                report.add_vs("S9", format!("frame ring against CUDA IPC ring, {n} receiver(s), {mode}: frames/s (slowest receiver)"), r.fps, "frames/s", ("CUDA IPC ring", i.fps));
            }
            for (name, f) in [("CUDA IPC ring", ipc), ("frame ring", ring)] {
                let Some(f) = f else { continue };
                for (step, v) in &f.steps {
                    report.add(
                        "S9",
                        format!("latency by step, {name}, {n} receiver(s), {mode}: {step}"),
                        *v,
                        "us",
                    );
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(sequence: u64, base: u64) -> FrameLine {
        FrameLine {
            sequence,
            called: base,
            gpu_done: base + 5_000,
            sent: base + 6_000,
            received: base + 8_000,
            waited: base + 20_000,
        }
    }

    #[test]
    fn figures_of_the_ipc_ring_take_each_step_and_leave_the_warm_up_out() {
        let mut frames: Vec<FrameLine> = (1..=40).map(|s| line(s, s * 1_000_000)).collect();
        // A slow warm-up frame must not count.
        frames[0].waited += 10_000_000;
        let m = Measured {
            receivers: vec![frames.clone(), frames],
            sent: Vec::new(),
        };
        let f = figures(&m).unwrap();
        assert_eq!(f.hand_off, vec![12.0, 12.0]);
        assert_eq!(f.worst(), 12.0);
        assert_eq!(f.latency, 20.0);
        assert_eq!(f.steps.len(), 4);
        assert_eq!(f.steps[0].1, 5.0);
        assert_eq!(f.steps[2].1, 2.0);
        assert!((f.fps - 1000.0).abs() < 1e-6, "{}", f.fps);
    }

    #[test]
    fn figures_of_the_frame_ring_join_the_senders_lines_and_need_them() {
        let frames: Vec<FrameLine> = (1..=20)
            .map(|s| FrameLine {
                gpu_done: 0,
                sent: 0,
                ..line(s, s * 1_000_000)
            })
            .collect();
        let sent: Vec<SentLine> = (1..=20)
            .map(|s| SentLine {
                sequence: s,
                called: s * 1_000_000,
                returned: s * 1_000_000 + 7_000,
            })
            .collect();
        let mut m = Measured {
            receivers: vec![frames],
            sent,
        };
        let f = figures(&m).unwrap();
        assert_eq!(f.steps.len(), 3);
        assert_eq!(f.steps[0].1, 7.0);
        assert_eq!(f.steps[1].1, 1.0);
        assert_eq!(f.steps[2].1, 12.0);
        m.sent.retain(|s| s.sequence != 15);
        assert!(figures(&m).unwrap_err().contains("frame 15"));
    }

    #[test]
    fn a_receiver_with_too_few_frames_is_an_error() {
        let m = Measured {
            receivers: vec![(1..=5).map(|s| line(s, s)).collect()],
            sent: Vec::new(),
        };
        assert!(figures(&m).is_err());
    }
}
