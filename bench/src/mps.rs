//! A private CUDA MPS control daemon for S9's "with MPS" cells.
//!
//! # Contract
//!
//! * [`control_binary`] finds `nvidia-cuda-mps-control`: `$BENCH_MPS_CONTROL`,
//!   then `PATH`, then `/usr/local/nvidia/bin`, `/usr/bin`,
//!   `/usr/local/cuda/bin`.
//! * [`Mps::start`] runs `nvidia-cuda-mps-control -d` with
//!   `CUDA_MPS_PIPE_DIRECTORY` and `CUDA_MPS_LOG_DIRECTORY` set to fresh
//!   folders under the given one (not the system's `/tmp/nvidia-mps`), and
//!   waits (bounded) for its `control` socket. Children given [`Mps::env`]
//!   become its clients; the server starts with the first of them.
//! * Dropping an [`Mps`] sends `quit` and waits (bounded) for the daemon
//!   to exit (its pid file's process, else its control socket); [`Mps::stop`] does the same and says whether it went.
//! * [`no_mps_env`]: the environment that keeps a child off any MPS
//!   daemon (an empty pipe folder of its own).
//! * Imports nothing of this crate.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BOUND: Duration = Duration::from_secs(15);

/// Where `nvidia-cuda-mps-control` is, or every place looked at.
pub(crate) fn control_binary() -> Result<PathBuf, String> {
    let mut places: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("BENCH_MPS_CONTROL") {
        places.push(p.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        places.extend(std::env::split_paths(&path).map(|d| d.join("nvidia-cuda-mps-control")));
    }
    for d in ["/usr/local/nvidia/bin", "/usr/bin", "/usr/local/cuda/bin"] {
        places.push(Path::new(d).join("nvidia-cuda-mps-control"));
    }
    places
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            "no nvidia-cuda-mps-control ($BENCH_MPS_CONTROL, PATH, /usr/local/nvidia/bin, /usr/bin, /usr/local/cuda/bin)".into()
        })
}

/// The environment that keeps a child off any MPS daemon: a pipe folder
/// (under `dir`) where none listens.
pub(crate) fn no_mps_env(dir: &Path) -> Result<Vec<(String, String)>, String> {
    let pipe = dir.join("no-mps-pipe");
    std::fs::create_dir_all(&pipe).map_err(|e| format!("{}: {e}", pipe.display()))?;
    Ok(vec![(
        "CUDA_MPS_PIPE_DIRECTORY".into(),
        pipe.display().to_string(),
    )])
}

/// A running private MPS control daemon.
#[derive(Debug)]
pub(crate) struct Mps {
    control: PathBuf,
    pipe: PathBuf,
    log: PathBuf,
    stopped: bool,
}

impl Mps {
    /// Starts one with its folders under `dir`.
    pub(crate) fn start(control: PathBuf, dir: &Path) -> Result<Mps, String> {
        let pipe = dir.join("mps-pipe");
        let log = dir.join("mps-log");
        for d in [&pipe, &log] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let mps = Mps {
            control,
            pipe,
            log,
            stopped: false,
        };
        let out = mps
            .command()
            .arg("-d")
            .output()
            .map_err(|e| format!("{} -d did not run: {e}", mps.control.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} -d failed ({}): {}{}",
                mps.control.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let start = Instant::now();
        while !mps.pipe.join("control").exists() {
            if start.elapsed() > BOUND {
                return Err(format!(
                    "no control socket in {} within {BOUND:?}; its log: {}",
                    mps.pipe.display(),
                    mps.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(mps)
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.control);
        c.env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log);
        c
    }

    /// What a child needs to be its client.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                self.pipe.display().to_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".into(),
                self.log.display().to_string(),
            ),
        ]
    }

    /// The last lines of its control and server logs.
    pub(crate) fn log_tail(&self) -> String {
        let mut s = String::new();
        for f in ["control.log", "server.log"] {
            if let Ok(text) = std::fs::read_to_string(self.log.join(f)) {
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(5)..].join(" / ");
                s.push_str(&format!("[{f}] {tail} "));
            }
        }
        if s.is_empty() {
            s.push_str("(empty)");
        }
        s
    }

    /// The daemon's pid from its pid file in the pipe folder, if any.
    fn daemon_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pipe.join("nvidia-cuda-mps-control.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Sends `quit` and waits (bounded) for the control socket to go.
    pub(crate) fn stop(&mut self) -> Result<(), String> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let mut child = self
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("{} did not run: {e}", self.control.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(b"quit\n");
        }
        let start = Instant::now();
        loop {
            let exited = matches!(child.try_wait(), Ok(Some(_)));
            // The daemon's pid file where it wrote one, else its socket: a
            // socket file left behind by a daemon that exited refuses
            // connections (runs 22a and 22b timed out on the file alone).
            let pid = self.daemon_pid();
            let gone = match pid {
                Some(pid) => !process_runs(pid),
                None => !accepts(&self.pipe.join("control")),
            };
            if exited && gone {
                return Ok(());
            }
            if start.elapsed() > BOUND {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the MPS daemon in {} did not quit within {BOUND:?} (`quit` client exited: \
                     {exited}; pid file: {pid:?}, state {}; control socket accepts: {}); its log: {}",
                    self.pipe.display(),
                    pid.map_or("-".into(), process_state),
                    accepts(&self.pipe.join("control")),
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether process `pid` runs: it exists and is not a zombie (a daemon
/// whose parent is a container's pid 1 may stay one, never reaped).
fn process_runs(pid: u32) -> bool {
    let state = process_state(pid);
    state != "gone" && state != "Z" && state != "X"
}

/// Process `pid`'s state letter (`/proc/PID/stat`), or `gone`.
fn process_state(pid: u32) -> String {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?")
            .to_string(),
        Err(_) => "gone".into(),
    }
}

/// Whether something listens on the unix socket at `path`.
fn accepts(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

impl Drop for Mps {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("bench: {e}");
        }
    }
}
