//! Several receiving processes and CUDA MPS (issue 30): whether an MPS
//! control daemon runs for this user, and how to start one.
//!
//! # Contract
//!
//! * [`probe`] reads only the file system: the pipe folder
//!   (`$CUDA_MPS_PIPE_DIRECTORY`, else `/tmp/nvidia-mps`) and whether its
//!   `control` socket is there, the `nvidia-cuda-mps-control` and
//!   `nvidia-cuda-mps-server` processes of this user (`/proc/*/comm`,
//!   `/proc/*/cmdline`, the real uid in `/proc/*/status` against
//!   `/proc/self/status`), and where the control binary is
//!   (`PATH`, `/usr/local/nvidia/bin`, `/usr/bin`, `/usr/local/cuda/bin`).
//!   It starts nothing, never panics, and is never a reason for the
//!   doctor's verdict.
//! * [`MpsReport::findings`] says whether MPS is running and what that
//!   means: without it, the CUDA contexts of several receiving processes
//!   are time-sliced on the GPU (issue 30, H100: one receiver's hand-off
//!   12.3 µs, four at once 351-364 µs each, four under MPS 11.0-12.9 µs);
//!   how to start and stop it; and its caveats (one server per user,
//!   error isolation, Vulkan work outside it).
//! * Uses no other module of this crate but [`crate::Finding`].

use std::path::{Path, PathBuf};

use crate::Finding;

/// The default pipe folder of the MPS control daemon.
pub const DEFAULT_PIPE_DIRECTORY: &str = "/tmp/nvidia-mps";

/// What the MPS probe found (`Report::mps`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpsReport {
    /// The pipe folder looked at, and whether it came from
    /// `CUDA_MPS_PIPE_DIRECTORY`.
    pub pipe_directory: (PathBuf, bool),
    /// Whether `control` exists in it.
    pub control_socket: bool,
    /// This user's `nvidia-cuda-mps-control` processes.
    pub control_pids: Vec<u32>,
    /// This user's `nvidia-cuda-mps-server` processes.
    pub server_pids: Vec<u32>,
    /// Other users' MPS processes (one server serves one user at a time).
    pub other_users: Vec<(u32, u32)>,
    /// Where `nvidia-cuda-mps-control` is, if found.
    pub control_binary: Option<PathBuf>,
}

impl MpsReport {
    /// Whether a control daemon answers for this user at the pipe folder.
    pub fn running(&self) -> bool {
        self.control_socket && !self.control_pids.is_empty()
    }
}

/// Looks at this machine (see the module contract).
pub(crate) fn probe() -> MpsReport {
    let (pipe, from_env) = match std::env::var_os("CUDA_MPS_PIPE_DIRECTORY") {
        Some(p) if !p.is_empty() => (PathBuf::from(p), true),
        _ => (PathBuf::from(DEFAULT_PIPE_DIRECTORY), false),
    };
    let control_socket = pipe.join("control").exists();
    let me = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_uid(&s));
    let (mut control_pids, mut server_pids, mut other_users) = (Vec::new(), Vec::new(), Vec::new());
    for (pid, comm, uid) in processes(Path::new("/proc")) {
        let kind = match comm.as_str() {
            "nvidia-cuda-mps-control" => 0,
            "nvidia-cuda-mps-server" => 1,
            _ => continue,
        };
        if Some(uid) != me {
            other_users.push((pid, uid));
        } else if kind == 0 {
            control_pids.push(pid);
        } else {
            server_pids.push(pid);
        }
    }
    MpsReport {
        pipe_directory: (pipe, from_env),
        control_socket,
        control_pids,
        server_pids,
        other_users,
        control_binary: control_binary(),
    }
}

/// `(pid, name, real uid)` of the MPS processes `/proc` shows (their
/// names are cut to 15 bytes in `comm`, `nvidia-cuda-mps`: the command
/// line tells the server from the control daemon).
fn processes(proc: &Path) -> Vec<(u32, String, u32)> {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(e.path().join("comm")) else {
            continue;
        };
        let comm = comm.trim().to_string();
        if !comm.starts_with("nvidia-cuda-mps") {
            continue;
        }
        // Which of the two: the command line says (comm is cut).
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let name = if String::from_utf8_lossy(&cmdline).contains("mps-server") {
            "nvidia-cuda-mps-server".to_string()
        } else if comm == "nvidia-cuda-mps" {
            "nvidia-cuda-mps-control".to_string()
        } else {
            comm
        };
        let uid = std::fs::read_to_string(e.path().join("status"))
            .ok()
            .and_then(|s| parse_uid(&s));
        if let Some(uid) = uid {
            found.push((pid, name, uid));
        }
    }
    found
}

/// The real uid of a `/proc/PID/status` text.
fn parse_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Where `nvidia-cuda-mps-control` is.
fn control_binary() -> Option<PathBuf> {
    let mut places: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    places.extend(["/usr/local/nvidia/bin", "/usr/bin", "/usr/local/cuda/bin"].map(PathBuf::from));
    places
        .into_iter()
        .map(|d| d.join("nvidia-cuda-mps-control"))
        .find(|p| p.is_file())
}

impl MpsReport {
    /// The report's lines.
    pub fn findings(&self) -> Vec<Finding> {
        let (pipe, from_env) = &self.pipe_directory;
        let pipe_text = format!(
            "{}{}",
            pipe.display(),
            if *from_env {
                " ($CUDA_MPS_PIPE_DIRECTORY)"
            } else {
                " (the default; $CUDA_MPS_PIPE_DIRECTORY unset)"
            }
        );
        let binary = self
            .control_binary
            .as_ref()
            .map_or("nvidia-cuda-mps-control".to_string(), |p| {
                p.display().to_string()
            });
        let start = format!(
            "start it as the user that runs the receivers: `{binary} -d` (with \
             CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY set to folders of that user if \
             not the defaults, the same in the receivers' environment); stop it: \
             `echo quit | {binary}`"
        );
        let cost = "without MPS the CUDA contexts of several receiving processes are \
                    time-sliced on the GPU: issue 30 measured on an H100 one receiver's hand-off \
                    at 12.3 µs, four receivers at once at 351-364 µs each, four under MPS at \
                    11.0-12.9 µs each (the bench's S9 measures it on this machine: bench --s9-only)";
        let mut findings = Vec::new();
        if self.running() {
            findings.push(Finding::ok(format!(
                "CUDA MPS: a control daemon runs for this user (pid {}), pipe folder {pipe_text}; \
                 server {}: CUDA receivers started with this environment share one GPU context, \
                 so several of them are not time-sliced",
                join(&self.control_pids),
                if self.server_pids.is_empty() {
                    "not started yet (the first client starts it)".to_string()
                } else {
                    format!("pid {}", join(&self.server_pids))
                }
            )));
        } else {
            let why = match (self.control_socket, self.control_pids.is_empty()) {
                (true, true) => format!(
                    "a control socket is in {pipe_text} but no nvidia-cuda-mps-control process of \
                     this user runs (a stale socket, or another user's daemon)"
                ),
                (false, false) => format!(
                    "an nvidia-cuda-mps-control of this user runs (pid {}), but not with the pipe \
                     folder {pipe_text}: set CUDA_MPS_PIPE_DIRECTORY to its folder",
                    join(&self.control_pids)
                ),
                _ => format!(
                    "CUDA MPS is not running for this user (no control socket in {pipe_text})"
                ),
            };
            findings.push(Finding::missing(
                format!("{why}; {cost}"),
                match &self.control_binary {
                    Some(_) => format!("for several receiving processes, {start}"),
                    None => format!(
                        "nvidia-cuda-mps-control was not found (PATH, /usr/local/nvidia/bin, \
                         /usr/bin, /usr/local/cuda/bin): it comes with the NVIDIA driver's \
                         utilities (nvidia-utils / the container toolkit's driver mount); then \
                         {start}"
                    ),
                },
            ));
        }
        if !self.other_users.is_empty() {
            let who: Vec<String> = self
                .other_users
                .iter()
                .map(|(pid, uid)| format!("pid {pid} uid {uid}"))
                .collect();
            findings.push(Finding::ok(format!(
                "MPS processes of other users run ({}): one MPS server serves one user at a time, \
                 another user's clients wait until it exits",
                who.join(", ")
            )));
        }
        findings.push(Finding::ok(
            "MPS caveats: one server per user (the daemon queues other users' servers); its \
             clients share one GPU context, so a fault in one client (an illegal address, a \
             kernel killed by the watchdog) can end the work of every client of that server, \
             where without MPS it stays in its own process; Vulkan work (the sender's \
             submissions) is outside MPS and is still time-sliced against it",
        ));
        findings
    }
}

fn join(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uid_is_the_first_of_the_status_line() {
        assert_eq!(
            parse_uid("Name:\tx\nUid:\t1000\t1000\t1000\t1000\n"),
            Some(1000)
        );
        assert_eq!(parse_uid("Name:\tx\n"), None);
    }

    fn report(socket: bool, control: Vec<u32>) -> MpsReport {
        MpsReport {
            pipe_directory: (PathBuf::from("/tmp/nvidia-mps"), false),
            control_socket: socket,
            control_pids: control,
            server_pids: Vec::new(),
            other_users: Vec::new(),
            control_binary: Some(PathBuf::from(
                "/usr/local/nvidia/bin/nvidia-cuda-mps-control",
            )),
        }
    }

    #[test]
    fn not_running_says_so_with_the_cost_and_how_to_start_it() {
        let r = report(false, Vec::new());
        assert!(!r.running());
        let f = r.findings();
        assert!(!f[0].ok);
        assert!(
            f[0].what.contains("CUDA MPS is not running"),
            "{}",
            f[0].what
        );
        assert!(f[0].what.contains("351-364 µs"), "{}", f[0].what);
        let fix = f[0].fix.as_deref().unwrap();
        assert!(
            fix.contains("/usr/local/nvidia/bin/nvidia-cuda-mps-control -d"),
            "{fix}"
        );
        assert!(fix.contains("echo quit |"), "{fix}");
        assert!(f.last().unwrap().what.contains("one server per user"));
    }

    #[test]
    fn running_needs_the_socket_and_a_daemon_of_this_user() {
        assert!(report(true, vec![42]).running());
        assert!(report(true, vec![42]).findings()[0].ok);
        assert!(!report(true, Vec::new()).running());
        assert!(report(true, Vec::new()).findings()[0]
            .what
            .contains("stale socket"));
        assert!(report(false, vec![42]).findings()[0]
            .what
            .contains("set CUDA_MPS_PIPE_DIRECTORY"));
    }
}
