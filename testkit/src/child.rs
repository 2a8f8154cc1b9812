//! Child processes of a test binary: a parent test runs one `#[ignore]`d
//! `child_*` test of its own binary by exact name, in a process of its own,
//! with an environment of its choosing and, if it wants, one end of a
//! socket pair.
//!
//! # Contract
//!
//! * [`run_child_test`] runs `current_exe() --exact NAME --ignored
//!   --nocapture --test-threads=1`, kills a child that runs for 120 s, prints
//!   the child's output and panics unless it passed and ran exactly one test
//!   (a renamed child is a failure, not a silent pass).
//! * The child end of [`socket_for_child`] is inherited (close-on-exec
//!   cleared) and named by [`CHILD_SOCKET_ENV`]; the parent drops its copy
//!   once the child runs; the child takes it with [`inherited_connection`].
//! * A child started with [`run_marked`] checks its marker with
//!   [`started_as_child`], so that running it by hand is a clear failure.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::time::Duration;

/// Runs the ignored test `name` of the calling test binary in a child
/// process with `envs`, bounded (a child that hangs for 120 s is killed and
/// reported, never waited for for ever); `keep` (a socket end the child
/// inherits) is closed here once the child runs. Prints the child's output,
/// asserts that it passed, and returns its stdout.
pub fn run_child_test(name: &str, envs: &[(&str, &OsStr)], keep: Option<OwnedFd>) -> String {
    let dir = std::env::temp_dir().join(format!("test-child-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    for (k, v) in envs {
        command.env(k, v);
    }
    let mut child = command.spawn().unwrap();
    drop(keep); // the child's copy of an inherited socket is its own now
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    std::fs::remove_dir_all(&dir).ok();
    println!("--- {name} stdout:\n{stdout}--- {name} stderr:\n{stderr}---");
    let status = status.unwrap_or_else(|| panic!("{name} hung for 120 s and was killed"));
    assert!(status.success(), "{name} failed: {status}");
    assert!(
        stdout.contains("1 passed"),
        "{name} did not run (is it still called that?)"
    );
    stdout
}

/// The environment variable that names the socket a child test inherits.
pub const CHILD_SOCKET_ENV: &str = "CUDA_INTEROP_CHILD_FD";

/// A connected pair whose second end a child process inherits: this
/// process's end, the child's (close-on-exec cleared: drop it once the child
/// runs), and its number for [`CHILD_SOCKET_ENV`].
pub fn socket_for_child() -> (vk_export::socket::Connection, OwnedFd, OsString) {
    let (mine, theirs) = vk_export::socket::Connection::pair().unwrap();
    let theirs = theirs.into_fd();
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty()).unwrap();
    let number = std::os::fd::AsRawFd::as_raw_fd(&theirs).to_string().into();
    (mine, theirs, number)
}

/// In a child test: the connection its parent handed over with
/// [`socket_for_child`].
pub fn inherited_connection() -> vk_export::socket::Connection {
    let fd: i32 = std::env::var(CHILD_SOCKET_ENV)
        .expect("started by the parent test")
        .parse()
        .unwrap();
    // SAFETY: the parent passed this connected socket's number, open and
    // inherited by this process; nothing else here owns it.
    let fd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
    vk_export::socket::Connection::from_fd(fd).unwrap()
}

/// Runs the `child_*` test `name` of this binary with `marker=1` in its
/// environment (see [`run_child_test`]).
pub fn run_marked(name: &str, marker: &str) -> String {
    run_child_test(name, &[(marker, "1".as_ref())], None)
}

/// Runs the `child_*` test `name` of this binary with `envs` (strings).
pub fn run_with(name: &str, envs: &[(&str, &str)]) -> String {
    let envs: Vec<(&str, &OsStr)> = envs.iter().map(|(k, v)| (*k, v.as_ref())).collect();
    run_child_test(name, &envs, None)
}

/// Runs the `child_*` test `name` of this binary with `envs`, handing it
/// `keep` (see [`run_child_test`]).
pub fn run_with_os(name: &str, envs: &[(&str, OsString)], keep: Option<OwnedFd>) -> String {
    let envs: Vec<(&str, &OsStr)> = envs.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    run_child_test(name, &envs, keep)
}

/// A connected pair whose second end a child process inherits: the fd
/// (close-on-exec cleared) and the environment entry naming it.
pub fn socket_env_for_child() -> (
    vk_export::socket::Connection,
    OwnedFd,
    (&'static str, OsString),
) {
    let (mine, theirs, number) = socket_for_child();
    (mine, theirs, (CHILD_SOCKET_ENV, number))
}

/// In a child test: panics unless the parent started it with `marker` set.
pub fn started_as_child(marker: &str) {
    assert!(
        std::env::var_os(marker).is_some(),
        "started by the parent test"
    );
}
