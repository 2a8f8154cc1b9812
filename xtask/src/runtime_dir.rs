//! A private `XDG_RUNTIME_DIR` for the processes `cargo xtask test` and
//! `cargo xtask demo` start, where none is set.
//!
//! # Contract
//!
//! * Without `XDG_RUNTIME_DIR` (or with a relative one, which libwayland
//!   rejects the same way) every Vulkan instance on Mesa prints
//!   `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` from
//!   libwayland as its WSI probes for a compositor: 86 such lines in a
//!   passing test run, none of them this project's. [`RuntimeDir::new`]
//!   then makes a fresh directory, mode `0700`, in the system's temporary
//!   directory (`/tmp/cuda-interop-xtask-PID[-N]`: short, because sockets
//!   the frame tests make inside it must fit `sockaddr_un`'s 108 bytes),
//!   and [`RuntimeDir::apply`] sets it on a child. Created with
//!   `mkdir`, never reused: a name someone else made is skipped.
//! * A set, absolute `XDG_RUNTIME_DIR` is left as it is.
//! * The directory and whatever the children left in it are removed when
//!   the [`RuntimeDir`] is dropped (at the end of the task, failed or not).

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::process::Command;

/// The directory given to the children, if one was needed.
#[derive(Debug)]
pub struct RuntimeDir {
    made: Option<PathBuf>,
}

impl RuntimeDir {
    /// Makes a private directory when `XDG_RUNTIME_DIR` is missing or
    /// relative, and says so.
    pub fn new() -> Result<RuntimeDir, String> {
        let set =
            std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| PathBuf::from(d).is_absolute());
        if set {
            return Ok(RuntimeDir { made: None });
        }
        let dir = make_private(&std::env::temp_dir(), std::process::id())?;
        eprintln!(
            "xtask: XDG_RUNTIME_DIR is not set; the processes it starts get a private one, {} \
             (removed at the end), which keeps libwayland's `XDG_RUNTIME_DIR is invalid` \
             lines out of the output",
            dir.display()
        );
        Ok(RuntimeDir { made: Some(dir) })
    }

    /// Sets `XDG_RUNTIME_DIR` on `command` when this made one.
    pub fn apply(&self, command: &mut Command) {
        if let Some(dir) = &self.made {
            command.env("XDG_RUNTIME_DIR", dir);
        }
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        if let Some(dir) = &self.made {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A new `0700` directory in `parent`, named after `pid`.
fn make_private(parent: &std::path::Path, pid: u32) -> Result<PathBuf, String> {
    let mut builder = std::fs::DirBuilder::new();
    builder.mode(0o700);
    let mut last = None;
    for n in 0..100 {
        let name = if n == 0 {
            format!("cuda-interop-xtask-{pid}")
        } else {
            format!("cuda-interop-xtask-{pid}-{n}")
        };
        let dir = parent.join(name);
        match builder.create(&dir) {
            Ok(()) => return Ok(dir),
            // Someone's (maybe a previous run's with the same pid): not ours.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(format!(
                    "cannot make a private XDG_RUNTIME_DIR in {}: {e}; set XDG_RUNTIME_DIR \
                     to a directory of yours (mode 0700)",
                    parent.display()
                ))
            }
        }
    }
    Err(format!(
        "cannot make a private XDG_RUNTIME_DIR in {} ({}); set XDG_RUNTIME_DIR to a \
         directory of yours (mode 0700)",
        parent.display(),
        last.map_or_else(String::new, |e| e.to_string())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_directory_is_new_private_and_removed() {
        let parent = std::env::temp_dir().join(format!("xtask-rt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir_all(&parent).unwrap();
        // A name taken already is skipped, not reused.
        std::fs::create_dir(parent.join("cuda-interop-xtask-7")).unwrap();
        let dir = make_private(&parent, 7).unwrap();
        assert_eq!(dir, parent.join("cuda-interop-xtask-7-1"));
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::write(dir.join("left-behind.sock"), "").unwrap();
        let mut command = Command::new("true");
        let runtime = RuntimeDir {
            made: Some(dir.clone()),
        };
        runtime.apply(&mut command);
        assert!(command
            .get_envs()
            .any(|(k, v)| k == "XDG_RUNTIME_DIR" && v == Some(dir.as_os_str())));
        drop(runtime);
        assert!(!dir.exists());
        std::fs::remove_dir_all(&parent).unwrap();
    }
}
