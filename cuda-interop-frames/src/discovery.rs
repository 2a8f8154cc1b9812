//! Named senders: a sender announces itself in a directory of this user,
//! receivers list what is there, wait for a name and connect by it.
//!
//! # Contract
//!
//! * Where: [`Directory::from_env`] is `$XDG_RUNTIME_DIR/cuda-interop-frames`
//!   when `XDG_RUNTIME_DIR` is an absolute path; without it (or with a
//!   relative one) it falls back to `cuda-interop-frames-<uid>` in `$TMPDIR`
//!   (when absolute) or `/tmp`. [`Directory::new`] takes a directory of the
//!   caller's choice. Each is made `0700` if missing and must be a real
//!   directory (not a symlink) owned by this user with no group or other
//!   permission bits; otherwise [`DiscoveryError::Directory`] says what is
//!   wrong and the shell command that fixes it (for the fallback, also
//!   `export XDG_RUNTIME_DIR=/run/user/$(id -u)`).
//! * A name `N` is 1 to [`MAX_NAME_LEN`] bytes of ASCII letters, digits,
//!   `-`, `_` and `.`, not starting with `.` ([`validate_name`]). Its files:
//!   `N.lock` (empty, `0600`, made by the first announce or look-up of `N`
//!   and never removed: removing it would let two senders own `N`),
//!   `N.sock` (the listener, `0600`, with `vk-export`'s peer credential
//!   check) and `N.info` (what [`SenderInfo`] holds, `0600`, at most 4 KiB,
//!   replaced whole by a rename from `.N.info.tmp`).
//! * Ownership: a sender owns `N` while it holds an exclusive open file
//!   description (OFD) lock on byte 0 of `N.lock`, taken by
//!   [`Directory::announce`] and kept by the [`Announcement`]. The kernel
//!   releases it when the last descriptor of that open file description
//!   closes, so when the owner drops its announcement or dies. No pid and
//!   no connect probe decide it: a sender that is stopped, or whose backlog
//!   is full, keeps its name, and owners are seen alike from any pid
//!   namespace that shares the directory. Of concurrent announces of one
//!   name exactly one wins; the others get [`DiscoveryError::NameTaken`] at
//!   once. The descriptor is close-on-exec, but a child forked without exec
//!   shares it and keeps the name while it lives.
//! * `N`'s other files are made and removed only by `N`'s owner, or by
//!   whoever holds byte 1 of `N.lock` (the setup byte) and then sees byte 0
//!   free. [`Directory::announce`] takes byte 1 after byte 0 and before it
//!   touches the files (waiting for it at most [`SETUP_WAIT`], since others
//!   hold it only for a few system calls: else
//!   [`DiscoveryError::NameBusy`]), binds, renames its socket and then its
//!   entry over whatever a dead sender left (refusing files of another
//!   user: [`DiscoveryError::Directory`]), and releases byte 1. A lister
//!   that finds byte 0 of a name with an `N.info` or `N.sock` free takes
//!   byte 1 without waiting and, if byte 0 is still free, removes the dead
//!   sender's `N.sock`, `N.info` and `.N.info.tmp` (never `N.lock`, never a
//!   file of another user).
//! * [`Directory::list`] and [`Directory::find`] return a sender only while
//!   its byte 0 is held and its byte 1 is not (an announce in progress is
//!   not listed yet), and only if `N.lock` is a regular file of this user
//!   and `N.info` a file of this user of at most 4 KiB (both opened without
//!   following a symlink or blocking) that parses and names `N`; anything
//!   of another user is ignored, never removed. [`SenderInfo::pid`] is the pid
//!   as the sender sees itself: from another pid namespace it names another
//!   process or none, and nothing here relies on it.
//! * [`Directory::announce`] binds the listener at a hidden temporary name
//!   (`.<random>.bind`) and renames it to `N.sock`: the returned
//!   [`Listener`]'s `path()` is that temporary name, gone once announced, so
//!   the listener's drop never removes `N.sock` (the socket's path is
//!   [`Announcement::info`]`().socket`). Dropping the [`Announcement`]
//!   removes `N.info` and `N.sock` while still owning `N`, then releases the
//!   lock; the listener may be dropped before or after it (stop accepting
//!   first: then no receiver reaches a sender that is going away). A
//!   sender killed between its bind and its rename leaves an unused
//!   `.<random>.bind` behind.
//! * [`Directory::wait_for`], [`Directory::connect`] and
//!   [`Directory::connect_info`] wait for a name to appear, looking every
//!   [`POLL_INTERVAL`], up to their timeout ([`DiscoveryError::NotFound`]
//!   says how long); connecting uses `crate::transport::connect` with what
//!   is left of the timeout. [`Directory::find`] and [`Directory::list`]
//!   look once.
//!   Nothing here waits longer than its timeout or [`SETUP_WAIT`].

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vk_export::socket::{Connection, Listener};

use crate::transport::{self, ConsumerError};

/// The directory's name under `$XDG_RUNTIME_DIR` (and, with `-<uid>`, the
/// fallback's under `$TMPDIR` or `/tmp`).
pub const DIRECTORY_NAME: &str = "cuda-interop-frames";
/// Longest sender name, in bytes (the socket path must fit 107 bytes).
pub const MAX_NAME_LEN: usize = 64;
/// Longest `.info` file read, in bytes.
const MAX_INFO_LEN: u64 = 4096;
/// Version line of a `.info` file this build writes and reads.
const INFO_VERSION: &str = "cuda-interop-frames-info 1";
/// How long [`Directory::announce`] waits for a name's setup byte, which
/// others hold only for a few system calls.
pub const SETUP_WAIT: Duration = Duration::from_secs(1);
/// How often [`Directory::wait_for`] looks for the name.
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// The byte of `N.lock` its owner holds for its life.
const OWNER: i64 = 0;
/// The byte of `N.lock` held while `N`'s files are made or cleaned.
const SETUP: i64 = 1;

/// Why a discovery call failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The directory (or a lock file in it) is not private to this user.
    #[error("{path}: {why}")]
    Directory {
        /// The directory or file.
        path: PathBuf,
        /// What is wrong with it and what to do.
        why: String,
    },
    /// A name [`validate_name`] refuses.
    #[error("bad sender name {name:?}: {why}")]
    Name {
        /// The name.
        name: String,
        /// Why.
        why: &'static str,
    },
    /// A live sender already has the name.
    #[error(
        "a sender named {name:?} is already running{}: stop it or choose another name",
        pid_note(*.pid)
    )]
    NameTaken {
        /// The name.
        name: String,
        /// Its process as its entry says (in its own pid namespace); 0 when
        /// the entry could not be read.
        pid: u32,
    },
    /// The name's setup byte stayed locked for [`SETUP_WAIT`].
    #[error(
        "cannot announce {name:?}: another process kept its lock file {} busy for {:?} \
         (`fuser -v {}` shows which); try again",
        .lock.display(), SETUP_WAIT, .lock.display()
    )]
    NameBusy {
        /// The name.
        name: String,
        /// Its lock file.
        lock: PathBuf,
    },
    /// No live sender has the name.
    #[error("no sender named {name:?} in {}{}", .dir.display(), waited_note(*.waited))]
    NotFound {
        /// The name.
        name: String,
        /// The directory looked in.
        dir: PathBuf,
        /// How long it was waited for (zero: looked once).
        waited: Duration,
    },
    /// A file system call failed.
    #[error("{what} {}: {source}", .path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Binding the sender's socket failed.
    #[error(transparent)]
    Socket(#[from] vk_export::Error),
    /// Connecting to the sender failed.
    #[error(transparent)]
    Connect(#[from] ConsumerError),
}

fn pid_note(pid: u32) -> String {
    if pid == 0 {
        String::new()
    } else {
        format!(" (pid {pid})")
    }
}

fn waited_note(waited: Duration) -> String {
    if waited.is_zero() {
        " (list_senders() shows those there)".into()
    } else {
        format!(
            " after waiting {waited:?}: start the sender, or wait longer \
             (list_senders() shows those there)"
        )
    }
}

fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> DiscoveryError + 'a {
    move |source| DiscoveryError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// Checks a sender name: 1 to [`MAX_NAME_LEN`] bytes of ASCII letters,
/// digits, `-`, `_`, `.`, not starting with `.` (no `/`, no hidden files,
/// no `..`).
pub fn validate_name(name: &str) -> Result<(), DiscoveryError> {
    let bad = |why| {
        Err(DiscoveryError::Name {
            name: name.to_owned(),
            why,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("longer than 64 bytes");
    }
    if name.starts_with('.') {
        return bad("starts with '.'");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return bad("only ASCII letters, digits, '-', '_' and '.' are allowed");
    }
    Ok(())
}

/// What a ring's slots are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// Pitched linear buffers.
    Buffer,
    /// Images.
    Image,
}

/// One announced sender.
#[derive(Clone, Debug, PartialEq)]
pub struct SenderInfo {
    /// Its name.
    pub name: String,
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Bytes from one row to the next (buffer rings).
    pub row_pitch: u64,
    /// The pixel format: the `VkFormat` name in lower case (`"r8g8b8a8_unorm"`),
    /// or `"nv12"` / `"p010"` for a planar buffer ring.
    pub format: String,
    /// What the slots are.
    pub kind: SlotKind,
    /// Slots in the ring.
    pub slots: u32,
    /// Frames presented per second, over the last second or so (0 before).
    pub fps: f64,
    /// The sender's process, as it sees itself (in another pid namespace
    /// this pid names another process or none): for people, not liveness.
    pub pid: u32,
    /// Its socket.
    pub socket: PathBuf,
}

impl SenderInfo {
    fn encode(&self) -> String {
        let kind = match self.kind {
            SlotKind::Buffer => "buffer",
            SlotKind::Image => "image",
        };
        format!(
            "{INFO_VERSION}\nname={}\nwidth={}\nheight={}\nrow_pitch={}\nformat={}\nkind={kind}\n\
             slots={}\nfps={:.3}\npid={}\n",
            self.name,
            self.width,
            self.height,
            self.row_pitch,
            self.format,
            self.slots,
            self.fps,
            self.pid
        )
    }

    /// Parses a `.info` file; `None` for anything malformed.
    fn decode(text: &str, socket: PathBuf) -> Option<SenderInfo> {
        let mut lines = text.lines();
        if lines.next()? != INFO_VERSION {
            return None;
        }
        let fields: std::collections::HashMap<&str, &str> =
            lines.filter_map(|l| l.split_once('=')).collect();
        let kind = match *fields.get("kind")? {
            "buffer" => SlotKind::Buffer,
            "image" => SlotKind::Image,
            _ => return None,
        };
        let info = SenderInfo {
            name: fields.get("name")?.to_string(),
            width: fields.get("width")?.parse().ok()?,
            height: fields.get("height")?.parse().ok()?,
            row_pitch: fields.get("row_pitch")?.parse().ok()?,
            format: fields.get("format")?.to_string(),
            kind,
            slots: fields.get("slots")?.parse().ok()?,
            fps: fields.get("fps")?.parse().ok()?,
            pid: fields.get("pid")?.parse().ok()?,
            socket,
        };
        validate_name(&info.name).ok()?;
        Some(info)
    }
}

/// `fcntl(fd, cmd, {l_type, byte, 1 byte})` with an OFD lock command;
/// returns the `flock` as the kernel left it (`F_OFD_GETLK` fills it in).
fn ofd_lock(
    file: &File,
    cmd: libc::c_int,
    l_type: libc::c_int,
    byte: i64,
) -> std::io::Result<libc::flock> {
    // SAFETY: `flock` is plain integers; all zeroes is a valid value (and
    // `l_pid` must be 0 for OFD commands).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l_type as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte as libc::off_t;
    fl.l_len = 1;
    loop {
        // SAFETY: the fd is open for the call (borrowed from `file`), and
        // `fl` is a valid `flock` the OFD commands read and write.
        if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl as *mut libc::flock) } != -1 {
            return Ok(fl);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Takes `byte` of `file` exclusively without waiting; `false` if another
/// open file description holds it.
fn try_lock(file: &File, byte: i64) -> std::io::Result<bool> {
    match ofd_lock(file, libc::F_OFD_SETLK, libc::F_WRLCK, byte) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

fn unlock(file: &File, byte: i64) -> std::io::Result<()> {
    ofd_lock(file, libc::F_OFD_SETLK, libc::F_UNLCK, byte).map(drop)
}

/// Whether another open file description holds `byte` of `file` (without
/// taking it).
fn is_locked(file: &File, byte: i64) -> std::io::Result<bool> {
    let fl = ofd_lock(file, libc::F_OFD_GETLK, libc::F_WRLCK, byte)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// 48 random bits for a temporary name.
fn random_tag() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: `bytes` is valid for writes of its length.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got == 8 {
        u64::from_ne_bytes(bytes) & 0xffff_ffff_ffff
    } else {
        // No getrandom: the time and the pid (a collision makes a bind fail,
        // nothing worse).
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        (nanos ^ (u64::from(std::process::id()) << 24)) & 0xffff_ffff_ffff
    }
}

/// Points between two steps of a lock protocol, where the unit tests step
/// in to check what another process would see there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// A lister found a name's owner byte free, before its setup byte.
    OwnerSeenFree,
    /// A lister is about to remove a dead sender's files.
    Cleaning,
    /// An announcement removed its files and is about to release the name.
    Releasing,
}

/// Nothing outside the unit tests.
#[cfg(not(test))]
fn step(_: Step, _: &Path) {}

#[cfg(test)]
fn step(at: Step, lock: &Path) {
    tests::step(at, lock)
}

/// Removes `path` if it is a file of this user; leaves another user's.
fn remove_if_mine(path: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.uid() == uid() && !m.is_dir()) {
        let _ = std::fs::remove_file(path);
    }
}

/// A directory of named senders, private to this user.
#[derive(Clone, Debug)]
pub struct Directory {
    path: PathBuf,
}

impl Directory {
    /// `$XDG_RUNTIME_DIR/cuda-interop-frames`, or without `XDG_RUNTIME_DIR`
    /// `cuda-interop-frames-<uid>` in `$TMPDIR` or `/tmp`; made if missing
    /// (see the module contract).
    pub fn from_env() -> Result<Directory, DiscoveryError> {
        let var = |name| std::env::var_os(name).map(PathBuf::from);
        match Directory::location(var("XDG_RUNTIME_DIR"), var("TMPDIR")) {
            Ok(runtime) => Directory::new(runtime.join(DIRECTORY_NAME)),
            Err(tmp) => Directory::fallback_in(&tmp),
        }
    }

    /// `Ok(runtime directory)` when `xdg` is absolute, else `Err(where the
    /// fallback goes)`: `tmpdir` when absolute, else `/tmp`.
    fn location(xdg: Option<PathBuf>, tmpdir: Option<PathBuf>) -> Result<PathBuf, PathBuf> {
        match xdg.filter(|p| p.is_absolute()) {
            Some(runtime) => Ok(runtime),
            None => Err(tmpdir
                .filter(|p| p.is_absolute())
                .unwrap_or_else(|| PathBuf::from("/tmp"))),
        }
    }

    /// `cuda-interop-frames-<uid>` in `base`, checked as [`Directory::new`]
    /// does; its errors also say how to avoid the fallback.
    fn fallback_in(base: &Path) -> Result<Directory, DiscoveryError> {
        let path = base.join(format!("{DIRECTORY_NAME}-{}", uid()));
        Directory::new(path).map_err(|e| match e {
            DiscoveryError::Directory { path, why } => DiscoveryError::Directory {
                path,
                why: format!(
                    "{why}. XDG_RUNTIME_DIR is not set, so named senders use this directory \
                     instead: fix it, or run `export XDG_RUNTIME_DIR=/run/user/$(id -u)` (your \
                     login session's private directory) in the shells of both the sender and \
                     the receiver"
                ),
            },
            other => other,
        })
    }

    /// The directory `path` (made `0700` if missing; its parent must
    /// exist), checked private to this user.
    pub fn new(path: impl Into<PathBuf>) -> Result<Directory, DiscoveryError> {
        let path = path.into();
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
                .map_err(io("chmod 0700", &path))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("mkdir", &path)(e)),
        }
        let meta = std::fs::symlink_metadata(&path).map_err(io("stat", &path))?;
        let shown = path.display();
        let bad = |why: String| {
            Err(DiscoveryError::Directory {
                path: path.clone(),
                why,
            })
        };
        if !meta.file_type().is_dir() {
            return bad(format!(
                "not a directory (a symlink or a file is refused); remove it (rm {shown})"
            ));
        }
        let uid = uid();
        if meta.uid() != uid {
            return bad(format!(
                "owned by uid {}, not this user ({uid}); have it removed (sudo rm -r {shown})",
                meta.uid()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            return bad(format!(
                "mode {:o} lets other users in; it must be 0700 (chmod 700 {shown})",
                meta.mode() & 0o777
            ));
        }
        Ok(Directory { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn socket_path(&self, name: &str) -> PathBuf {
        self.path.join(format!("{name}.sock"))
    }

    fn info_path(&self, name: &str) -> PathBuf {
        self.path.join(format!("{name}.info"))
    }

    fn info_tmp_path(&self, name: &str) -> PathBuf {
        self.path.join(format!(".{name}.info.tmp"))
    }

    fn lock_path(&self, name: &str) -> PathBuf {
        self.path.join(format!("{name}.lock"))
    }

    /// Opens (making if missing) `name`'s lock file: a regular file of this
    /// user, not through a symlink.
    fn open_lock(&self, name: &str) -> Result<File, DiscoveryError> {
        let path = self.lock_path(name);
        let refused = |why: String| DiscoveryError::Directory {
            path: path.clone(),
            why,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    refused(format!(
                        "a symlink where a sender's lock file belongs; remove it (rm {})",
                        path.display()
                    ))
                } else {
                    io("open the lock file", &path)(e)
                }
            })?;
        let meta = file.metadata().map_err(io("stat", &path))?;
        if !meta.is_file() {
            return Err(refused(format!(
                "not a regular file where a sender's lock file belongs; remove it (rm {})",
                path.display()
            )));
        }
        if meta.uid() != uid() {
            return Err(refused(format!(
                "a lock file of uid {}, not this user ({}); remove it (rm {})",
                meta.uid(),
                uid(),
                path.display()
            )));
        }
        Ok(file)
    }

    /// `name`'s `.info` if it is a file of this user (opened without
    /// following a symlink or blocking: a FIFO gives what it holds) of at
    /// most [`MAX_INFO_LEN`] bytes that parses and names `name`; says
    /// nothing about liveness.
    fn read_info(&self, name: &str) -> Option<SenderInfo> {
        let path = self.info_path(name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .ok()?;
        let meta = file.metadata().ok()?;
        if meta.uid() != uid() || meta.len() > MAX_INFO_LEN {
            return None;
        }
        let mut text = String::new();
        file.take(MAX_INFO_LEN).read_to_string(&mut text).ok()?;
        let info = SenderInfo::decode(&text, self.socket_path(name))?;
        (info.name == name).then_some(info)
    }

    /// The sender named `name` if it is live (its owner byte held, its
    /// setup byte not); the files of a dead one are removed (see the module
    /// contract).
    fn probe(&self, name: &str) -> Option<SenderInfo> {
        let lock = self.open_lock(name).ok()?;
        if is_locked(&lock, OWNER).ok()? {
            if is_locked(&lock, SETUP).ok()? {
                return None;
            }
            return self.read_info(name);
        }
        // No owner: what is here is a dead sender's. Clean it only while
        // holding the setup byte with the owner byte still free: a new owner
        // makes its files only after taking the setup byte.
        step(Step::OwnerSeenFree, &self.lock_path(name));
        if try_lock(&lock, SETUP).unwrap_or(false) {
            if is_locked(&lock, OWNER).is_ok_and(|held| !held) {
                step(Step::Cleaning, &self.lock_path(name));
                for path in [
                    self.info_path(name),
                    self.socket_path(name),
                    self.info_tmp_path(name),
                ] {
                    remove_if_mine(&path);
                }
            }
            let _ = unlock(&lock, SETUP);
        }
        None
    }

    /// The live senders, sorted by name (see the module contract).
    pub fn list(&self) -> Result<Vec<SenderInfo>, DiscoveryError> {
        let mut names: Vec<String> = std::fs::read_dir(&self.path)
            .map_err(io("read_dir", &self.path))?
            .filter_map(|e| {
                let file = e.ok()?.file_name();
                let file = file.to_str()?;
                let name = file
                    .strip_suffix(".info")
                    .or_else(|| file.strip_suffix(".sock"))?;
                validate_name(name).ok()?;
                Some(name.to_owned())
            })
            .collect();
        names.sort();
        names.dedup();
        Ok(names.iter().filter_map(|name| self.probe(name)).collect())
    }

    /// The live sender named `name`, now.
    pub fn find(&self, name: &str) -> Result<SenderInfo, DiscoveryError> {
        validate_name(name)?;
        self.probe(name).ok_or_else(|| DiscoveryError::NotFound {
            name: name.to_owned(),
            dir: self.path.clone(),
            waited: Duration::ZERO,
        })
    }

    /// The live sender named `name`, waiting up to `timeout` for it to
    /// appear (looking every [`POLL_INTERVAL`]).
    pub fn wait_for(&self, name: &str, timeout: Duration) -> Result<SenderInfo, DiscoveryError> {
        validate_name(name)?;
        let start = Instant::now();
        loop {
            if let Some(info) = self.probe(name) {
                return Ok(info);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(DiscoveryError::NotFound {
                    name: name.to_owned(),
                    dir: self.path.clone(),
                    waited: timeout,
                });
            }
            std::thread::sleep((timeout - waited).min(POLL_INTERVAL));
        }
    }

    /// Waits up to `timeout` for the sender named `name` (as
    /// [`Directory::wait_for`]) and connects to it with what is left of
    /// `timeout`; returns its entry too.
    pub fn connect_info(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<(SenderInfo, Connection), DiscoveryError> {
        let start = Instant::now();
        loop {
            let info = self.wait_for(name, timeout.saturating_sub(start.elapsed()))?;
            let path = info
                .socket
                .to_str()
                .ok_or_else(|| DiscoveryError::NotFound {
                    name: name.to_owned(),
                    dir: self.path.clone(),
                    waited: Duration::ZERO,
                })?;
            let left = timeout.saturating_sub(start.elapsed());
            match transport::connect(path, left) {
                Ok(connection) => return Ok((info, connection)),
                // A sender going away (its listener closed before its
                // entry): a successor may take the name; look again while
                // time is left.
                Err(ConsumerError::Connect { ref source, .. })
                    if matches!(
                        source.kind(),
                        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                    ) && start.elapsed() + POLL_INTERVAL < timeout =>
                {
                    std::thread::sleep(POLL_INTERVAL);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Waits up to `timeout` for the sender named `name` to appear and
    /// connects to it, all within `timeout`.
    pub fn connect(&self, name: &str, timeout: Duration) -> Result<Connection, DiscoveryError> {
        self.connect_info(name, timeout).map(|(_, c)| c)
    }

    /// Takes the name `info.name` for this process's life or the returned
    /// [`Announcement`]'s, whichever ends first, binds its socket and writes
    /// its entry (`info.pid` and `info.socket` are filled in here). The name
    /// of a live sender is [`DiscoveryError::NameTaken`] (at once); a dead
    /// one's files are replaced. The [`Listener`]'s `path()` is a temporary
    /// name, gone once this returns: the socket is `info().socket`.
    pub fn announce(
        &self,
        mut info: SenderInfo,
    ) -> Result<(Listener, Announcement), DiscoveryError> {
        validate_name(&info.name)?;
        let name = info.name.clone();
        let lock_path = self.lock_path(&name);
        let lock = self.open_lock(&name)?;
        if !try_lock(&lock, OWNER).map_err(io("lock", &lock_path))? {
            let pid = self.read_info(&name).map_or(0, |i| i.pid);
            return Err(DiscoveryError::NameTaken { name, pid });
        }
        // The name is ours. Take the setup byte (a lister cleaning after a
        // dead sender holds it for a few system calls) before touching files.
        let deadline = Instant::now() + SETUP_WAIT;
        while !try_lock(&lock, SETUP).map_err(io("lock", &lock_path))? {
            if Instant::now() >= deadline {
                return Err(DiscoveryError::NameBusy {
                    name,
                    lock: lock_path,
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // A dead sender's files are replaced below (renames over them); not
        // those of another user.
        let socket = self.socket_path(&name);
        for path in [
            self.info_path(&name),
            socket.clone(),
            self.info_tmp_path(&name),
        ] {
            if let Ok(m) = std::fs::symlink_metadata(&path) {
                if m.uid() != uid() {
                    return Err(DiscoveryError::Directory {
                        why: format!(
                            "left by uid {}, not this user ({}); remove it (rm {})",
                            m.uid(),
                            uid(),
                            path.display()
                        ),
                        path,
                    });
                }
            }
        }
        info.pid = std::process::id();
        info.socket = socket.clone();
        // From here on, a failure drops the announcement: it removes what
        // was made, then releases the name.
        let announcement = Announcement {
            info_path: self.info_path(&name),
            tmp_path: self.info_tmp_path(&name),
            socket_path: socket.clone(),
            info,
            lock,
        };
        let temp = self.path.join(format!(".{:012x}.bind", random_tag()));
        let listener = Listener::bind(&temp)?;
        std::fs::rename(&temp, &socket).map_err(io("rename the socket to", &socket))?;
        announcement.write()?;
        unlock(&announcement.lock, SETUP).map_err(io("unlock", &lock_path))?;
        Ok((listener, announcement))
    }
}

/// A sender's ownership of its name and its entry in a [`Directory`]: when
/// dropped, removes the entry and the socket file, then gives the name up.
#[derive(Debug)]
pub struct Announcement {
    info_path: PathBuf,
    tmp_path: PathBuf,
    socket_path: PathBuf,
    info: SenderInfo,
    /// `N.lock`, its owner byte held; closed last (fields drop after
    /// `drop`'s body).
    lock: File,
}

impl Announcement {
    /// What the entry says.
    pub fn info(&self) -> &SenderInfo {
        &self.info
    }

    /// Updates the frame rate in the entry.
    pub fn set_fps(&mut self, fps: f64) -> Result<(), DiscoveryError> {
        self.info.fps = fps;
        self.write()
    }

    /// Writes the entry to a new temporary file (`0600`, never through
    /// whatever was at its name) and renames it over the entry: readers see
    /// the old one or the new one, whole.
    fn write(&self) -> Result<(), DiscoveryError> {
        let tmp = &self.tmp_path;
        let create = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(tmp)
        };
        // Something left there (by a killed owner, or planted) is removed,
        // never written through.
        let mut file = match create() {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let _ = std::fs::remove_file(tmp);
                create()
            }
            other => other,
        }
        .map_err(io("create", tmp))?;
        file.write_all(self.info.encode().as_bytes())
            .map_err(io("write", tmp))?;
        drop(file);
        std::fs::rename(tmp, &self.info_path).map_err(io("rename", &self.info_path))
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        // Still the owner: nobody else makes or removes these files now.
        let _ = std::fs::remove_file(&self.info_path);
        let _ = std::fs::remove_file(&self.socket_path);
        let _ = std::fs::remove_file(&self.tmp_path);
        step(Step::Releasing, &self.info_path.with_extension("lock"));
        // `self.lock` closes after this, releasing the name last.
    }
}

/// The live senders of [`Directory::from_env`].
pub fn list_senders() -> Result<Vec<SenderInfo>, DiscoveryError> {
    Directory::from_env()?.list()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc, Barrier};

    fn temp_dir(tag: &str) -> PathBuf {
        let base = std::env::temp_dir().join(format!("cif-discovery-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        base
    }

    fn fresh(tag: &str) -> (PathBuf, Directory) {
        let base = temp_dir(tag);
        let dir = Directory::new(base.join("d")).unwrap();
        (base, dir)
    }

    fn info(name: &str) -> SenderInfo {
        SenderInfo {
            name: name.into(),
            width: 64,
            height: 32,
            row_pitch: 256,
            format: "rgba8".into(),
            kind: SlotKind::Buffer,
            slots: 3,
            fps: 0.0,
            pid: 0,
            socket: PathBuf::new(),
        }
    }

    /// Holds `name`'s owner byte through an open file description of its
    /// own, as another process's sender would.
    fn hold(dir: &Directory, name: &str) -> File {
        let file = dir.open_lock(name).unwrap();
        assert!(try_lock(&file, OWNER).unwrap());
        file
    }

    /// The files a sender killed with `pid` would leave: `.info`, `.sock`,
    /// `.info.tmp`.
    fn leave_entry(dir: &Directory, name: &str, pid: u32) {
        let mut entry = info(name);
        entry.pid = pid;
        std::fs::write(dir.info_path(name), entry.encode()).unwrap();
        std::fs::write(dir.socket_path(name), b"").unwrap();
        std::fs::write(dir.info_tmp_path(name), b"half").unwrap();
    }

    fn names(dir: &Directory) -> Vec<String> {
        dir.list().unwrap().into_iter().map(|s| s.name).collect()
    }

    type Hook = Box<dyn FnMut(Step, &Path)>;

    thread_local! {
        /// What [`step`] runs on this thread (a test's own calls only).
        static HOOK: std::cell::RefCell<Option<Hook>> = const { std::cell::RefCell::new(None) };
    }

    /// Runs this thread's hook (not nested: calls made from the hook pass
    /// the steps by).
    pub(super) fn step(at: Step, lock: &Path) {
        if let Some(mut hook) = HOOK.with(|h| h.borrow_mut().take()) {
            hook(at, lock);
            HOOK.with(|h| *h.borrow_mut() = Some(hook));
        }
    }

    /// Runs `body` with `hook` called at each [`Step`] this thread passes.
    fn with_hook<R>(hook: impl FnMut(Step, &Path) + 'static, body: impl FnOnce() -> R) -> R {
        HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
        let result = body();
        HOOK.with(|h| *h.borrow_mut() = None);
        result
    }

    /// A lock file opened again: another process's view of it.
    fn other_view(lock: &Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(lock)
            .unwrap()
    }

    /// A pid no process has (above pid_max's largest value, 2^22), as the
    /// pid of a sender in another pid namespace looks from here.
    const NO_PID: u32 = 4_194_305;

    #[test]
    fn names_are_checked() {
        for good in ["cam", "a.b-c_D9", &"x".repeat(64)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".hidden",
            "..",
            "a/b",
            "/abs",
            "sp ace",
            "é",
            &"x".repeat(65),
        ] {
            assert!(
                matches!(validate_name(bad), Err(DiscoveryError::Name { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn announce_list_find_and_drop() {
        let (base, dir) = fresh("announce");
        let mode = std::fs::metadata(dir.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let (listener, mut entry) = dir.announce(info("cam")).unwrap();
        assert_eq!(entry.info().socket, dir.socket_path("cam"));
        for path in [
            dir.socket_path("cam"),
            dir.info_path("cam"),
            dir.lock_path("cam"),
        ] {
            let mode = std::fs::symlink_metadata(&path).unwrap().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", path.display());
        }
        // The listener was bound elsewhere and moved: nothing at its path.
        assert!(std::fs::symlink_metadata(listener.path()).is_err());
        entry.set_fps(59.5).unwrap();
        let listed = dir.list().unwrap();
        assert_eq!(listed.len(), 1);
        let got = &listed[0];
        assert_eq!(
            (got.name.as_str(), got.width, got.height, got.slots, got.pid),
            ("cam", 64, 32, 3, std::process::id())
        );
        assert_eq!(
            (got.fps, got.kind, got.format.as_str()),
            (59.5, SlotKind::Buffer, "rgba8")
        );
        assert_eq!(dir.find("cam").unwrap(), *got);
        // The name is taken while this entry lives.
        assert!(matches!(
            dir.announce(info("cam")),
            Err(DiscoveryError::NameTaken { pid, .. }) if pid == std::process::id()
        ));
        let conn = dir.connect("cam", Duration::from_secs(2)).unwrap();
        drop(conn);
        assert!(matches!(
            dir.find("other"),
            Err(DiscoveryError::NotFound { .. })
        ));
        drop(listener);
        drop(entry);
        assert!(dir.list().unwrap().is_empty());
        assert!(!dir.info_path("cam").exists() && !dir.socket_path("cam").exists());
        assert!(!dir.info_tmp_path("cam").exists());
        // The lock file stays (removing it would allow two owners).
        assert!(dir.lock_path("cam").exists());
        let (_l, _a) = dir.announce(info("cam")).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn of_two_concurrent_announces_exactly_one_wins() {
        let (base, dir) = fresh("race");
        let barrier = Arc::new(Barrier::new(2));
        for round in 0..300 {
            let name = format!("r{round}");
            let racer = |dir: Directory, barrier: Arc<Barrier>, name: String| {
                std::thread::spawn(move || {
                    barrier.wait();
                    dir.announce(info(&name))
                })
            };
            let a = racer(dir.clone(), barrier.clone(), name.clone());
            let b = racer(dir.clone(), barrier.clone(), name.clone());
            let results = [a.join().unwrap(), b.join().unwrap()];
            let won = results.iter().filter(|r| r.is_ok()).count();
            let taken = results
                .iter()
                .filter(|r| matches!(r, Err(DiscoveryError::NameTaken { .. })))
                .count();
            assert_eq!((won, taken), (1, 1), "round {round}: {results:?}");
            assert_eq!(names(&dir), [name], "round {round}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_sender_that_never_accepts_keeps_its_name() {
        let (base, dir) = fresh("backlog");
        let (_listener, entry) = dir.announce(info("cam")).unwrap();
        // Fill its backlog: connects now time out at once.
        let socket = entry.info().socket.to_str().unwrap().to_owned();
        let mut queued = Vec::new();
        let full = (0..256).any(
            |_| match transport::connect(&socket, Duration::from_micros(1)) {
                Ok(c) => {
                    queued.push(c);
                    false
                }
                Err(_) => true,
            },
        );
        assert!(full, "the backlog never filled");
        assert!(matches!(
            dir.announce(info("cam")),
            Err(DiscoveryError::NameTaken { .. })
        ));
        assert!(dir.socket_path("cam").exists() && dir.info_path("cam").exists());
        assert_eq!(names(&dir), ["cam"]);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn listing_while_a_sender_restarts_never_removes_its_files() {
        let (base, dir) = fresh("restart");
        let stop = Arc::new(AtomicBool::new(false));
        let lister = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut lists = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _ = dir.list().unwrap();
                    lists += 1;
                }
                lists
            })
        };
        for round in 0..5000 {
            // What a killed predecessor left, for the lister to clean.
            leave_entry(&dir, "cam", NO_PID);
            let (listener, entry) = dir.announce(info("cam")).unwrap();
            assert!(
                dir.find("cam").is_ok(),
                "round {round}: a live sender is not found"
            );
            assert!(
                dir.socket_path("cam").exists() && dir.info_path("cam").exists(),
                "round {round}: a live sender's files were removed"
            );
            drop(listener);
            drop(entry);
        }
        stop.store(true, Ordering::Relaxed);
        assert!(lister.join().unwrap() > 0);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn two_senders_restarting_one_name_never_erase_each_other() {
        let (base, dir) = fresh("restarts");
        let run = |dir: Directory| {
            std::thread::spawn(move || {
                let mut owned = 0u32;
                for round in 0..3000 {
                    let Ok((listener, entry)) = dir.announce(info("cam")) else {
                        continue;
                    };
                    owned += 1;
                    assert!(
                        dir.socket_path("cam").exists() && dir.info_path("cam").exists(),
                        "round {round}: an owner's files were removed"
                    );
                    drop(listener);
                    drop(entry);
                }
                owned
            })
        };
        let (a, b) = (run(dir.clone()), run(dir.clone()));
        assert!(a.join().unwrap() + b.join().unwrap() > 0);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_listener_dropped_after_its_announcement_leaves_the_next_socket() {
        let (base, dir) = fresh("order");
        let (old_listener, old) = dir.announce(info("cam")).unwrap();
        drop(old);
        // A child another test of this binary forks shares the lock's
        // descriptor until it execs (the module contract): the name may
        // read as taken for that moment.
        let start = std::time::Instant::now();
        let (_listener, entry) = loop {
            match dir.announce(info("cam")) {
                Err(DiscoveryError::NameTaken { .. })
                    if start.elapsed() < Duration::from_secs(10) =>
                {
                    std::thread::sleep(Duration::from_millis(10))
                }
                other => break other.unwrap(),
            }
        };
        drop(old_listener);
        assert!(dir.socket_path("cam").exists());
        let socket = entry.info().socket.to_str().unwrap().to_owned();
        transport::connect(&socket, Duration::from_secs(2)).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn an_owner_whose_pid_is_not_ours_to_see_is_listed_and_kept() {
        let (base, dir) = fresh("pidns");
        leave_entry(&dir, "far", NO_PID);
        let held = hold(&dir, "far");
        let listed = dir.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].name.as_str(), listed[0].pid), ("far", NO_PID));
        assert!(matches!(
            dir.announce(info("far")),
            Err(DiscoveryError::NameTaken { pid: NO_PID, .. })
        ));
        assert!(dir.info_path("far").exists() && dir.socket_path("far").exists());
        // Released: the same entry is a dead one's now.
        drop(held);
        assert!(names(&dir).is_empty());
        assert!(!dir.info_path("far").exists() && !dir.socket_path("far").exists());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_cleaner_leaves_an_owner_that_came_after_its_look() {
        let (base, dir) = fresh("late-owner");
        leave_entry(&dir, "cam", NO_PID);
        let owner = std::rc::Rc::new(std::cell::RefCell::new(None));
        let hook = {
            let (dir, owner) = (dir.clone(), owner.clone());
            move |at: Step, _: &Path| {
                if at == Step::OwnerSeenFree && owner.borrow().is_none() {
                    // A sender starts between the lister's look and its
                    // cleaning.
                    *owner.borrow_mut() = Some(dir.announce(info("cam")).unwrap());
                }
            }
        };
        with_hook(hook, || dir.find("cam").unwrap_err());
        assert!(owner.borrow().is_some());
        assert!(dir.socket_path("cam").exists() && dir.info_path("cam").exists());
        assert_eq!(dir.find("cam").unwrap().pid, std::process::id());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_cleaner_holds_the_setup_byte_while_it_removes() {
        let (base, dir) = fresh("cleaner");
        leave_entry(&dir, "cam", NO_PID);
        let checked = std::rc::Rc::new(std::cell::Cell::new(false));
        let hook = {
            let checked = checked.clone();
            move |at: Step, lock: &Path| {
                if at == Step::Cleaning {
                    // A sender starting now takes the owner byte but must
                    // wait for the setup byte before it makes any file.
                    let arriving = other_view(lock);
                    assert!(try_lock(&arriving, OWNER).unwrap());
                    assert!(
                        !try_lock(&arriving, SETUP).unwrap(),
                        "cleaning without the setup byte"
                    );
                    checked.set(true);
                }
            }
        };
        with_hook(hook, || dir.find("cam").unwrap_err());
        assert!(checked.get());
        assert!(!dir.info_path("cam").exists() && !dir.socket_path("cam").exists());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn an_announcement_removes_its_files_before_it_gives_the_name_up() {
        let (base, dir) = fresh("release-order");
        let (listener, entry) = dir.announce(info("cam")).unwrap();
        drop(listener);
        let checked = std::rc::Rc::new(std::cell::Cell::new(false));
        let hook = {
            let (dir, checked) = (dir.clone(), checked.clone());
            move |at: Step, lock: &Path| {
                if at == Step::Releasing {
                    assert!(
                        is_locked(&other_view(lock), OWNER).unwrap(),
                        "released before"
                    );
                    assert!(!dir.info_path("cam").exists() && !dir.socket_path("cam").exists());
                    checked.set(true);
                }
            }
        };
        with_hook(hook, || drop(entry));
        assert!(checked.get());
        assert!(!is_locked(&other_view(&dir.lock_path("cam")), OWNER).unwrap());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn an_announce_in_progress_is_neither_listed_nor_cleaned() {
        let (base, dir) = fresh("setup");
        leave_entry(&dir, "cam", NO_PID);
        let owner = hold(&dir, "cam");
        assert!(try_lock(&owner, SETUP).unwrap());
        assert!(names(&dir).is_empty());
        assert!(dir.info_path("cam").exists() && dir.socket_path("cam").exists());
        unlock(&owner, SETUP).unwrap();
        assert_eq!(names(&dir), ["cam"]);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_setup_byte_held_too_long_fails_the_announce_and_frees_the_name() {
        let (base, dir) = fresh("busy");
        let cleaner = dir.open_lock("cam").unwrap();
        assert!(try_lock(&cleaner, SETUP).unwrap());
        let e = dir.announce(info("cam")).unwrap_err();
        assert!(matches!(e, DiscoveryError::NameBusy { .. }), "{e}");
        drop(cleaner);
        let (_l, _a) = dir.announce(info("cam")).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn dead_entries_are_not_listed_and_are_cleaned() {
        let (base, dir) = fresh("stale");
        // Our own (live) pid, but nobody holds the lock: dead.
        leave_entry(&dir, "ours", std::process::id());
        leave_entry(&dir, "dead", NO_PID);
        // Garbage and an orphan socket, lock free: dead too.
        std::fs::write(dir.info_path("junk"), b"not an entry").unwrap();
        std::fs::write(dir.socket_path("orphan"), b"").unwrap();
        assert!(names(&dir).is_empty());
        for name in ["ours", "dead", "junk", "orphan"] {
            for path in [
                dir.info_path(name),
                dir.socket_path(name),
                dir.info_tmp_path(name),
            ] {
                assert!(!path.exists(), "{}", path.display());
            }
            assert!(dir.lock_path(name).exists(), "{name}");
        }
        // find cleans too.
        leave_entry(&dir, "dead", NO_PID);
        assert!(matches!(
            dir.find("dead"),
            Err(DiscoveryError::NotFound { .. })
        ));
        assert!(!dir.info_path("dead").exists());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn another_users_files_are_ignored_and_never_removed() {
        let (base, dir) = fresh("foreign");
        let chown = |path: PathBuf| {
            std::os::unix::fs::chown(&path, Some(12345), Some(12345))
                .unwrap_or_else(|e| panic!("chown {} ({e}): run the tests as root", path.display()))
        };
        // A foreign entry, lock free: neither listed nor removed.
        leave_entry(&dir, "free", NO_PID);
        chown(dir.info_path("free"));
        chown(dir.socket_path("free"));
        // A foreign entry whose lock is held: not listed.
        leave_entry(&dir, "held", NO_PID);
        chown(dir.info_path("held"));
        let _held = hold(&dir, "held");
        // A valid entry of ours whose lock file is another user's: ignored,
        // not cleaned, and not announced over.
        leave_entry(&dir, "lockless", NO_PID);
        std::fs::write(dir.lock_path("lockless"), b"").unwrap();
        chown(dir.lock_path("lockless"));
        assert!(names(&dir).is_empty());
        assert!(dir.info_path("free").exists() && dir.socket_path("free").exists());
        assert!(dir.info_path("held").exists());
        assert!(dir.info_path("lockless").exists() && dir.socket_path("lockless").exists());
        let e = dir.announce(info("lockless")).unwrap_err();
        assert!(e.to_string().contains("uid 12345"), "{e}");
        // Announcing over another user's leftovers is refused, not done.
        let e = dir.announce(info("free")).unwrap_err();
        assert!(matches!(e, DiscoveryError::Directory { .. }), "{e}");
        assert!(dir.info_path("free").exists());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_lock_file_symlink_is_refused() {
        let (base, dir) = fresh("locklink");
        let target = base.join("target");
        std::os::unix::fs::symlink(&target, dir.lock_path("cam")).unwrap();
        let e = dir.announce(info("cam")).unwrap_err();
        assert!(matches!(e, DiscoveryError::Directory { .. }), "{e}");
        assert!(!target.exists(), "the lock was taken through the symlink");
        // Nor is anything but a regular file.
        let fifo =
            std::ffi::CString::new(dir.lock_path("pipe").into_os_string().into_encoded_bytes())
                .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = dir.announce(info("pipe")).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn an_info_file_is_read_only_if_small_regular_and_direct() {
        let (base, dir) = fresh("infofile");
        // Through a symlink: not listed.
        let elsewhere = base.join("elsewhere");
        let mut linked = info("linked");
        linked.pid = NO_PID;
        std::fs::write(&elsewhere, linked.encode()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.info_path("linked")).unwrap();
        let _l = hold(&dir, "linked");
        // Too long: not listed.
        let mut big = info("big").encode();
        big.push_str(&format!("pad={}\n", "x".repeat(MAX_INFO_LEN as usize)));
        std::fs::write(dir.info_path("big"), big).unwrap();
        let _b = hold(&dir, "big");
        // A FIFO: not listed, and the lister does not block on it.
        let fifo =
            std::ffi::CString::new(dir.info_path("fifo").into_os_string().into_encoded_bytes())
                .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let _f = hold(&dir, "fifo");
        // Naming another sender: not listed.
        std::fs::write(dir.info_path("alias"), info("cam").encode()).unwrap();
        let _a = hold(&dir, "alias");
        let (tx, rx) = mpsc::channel();
        let lister = dir.clone();
        std::thread::spawn(move || tx.send(names(&lister)).unwrap());
        let listed = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("list() blocked on a FIFO");
        assert!(listed.is_empty(), "{listed:?}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_entry_is_never_written_through_a_planted_symlink() {
        let (base, dir) = fresh("tmplink");
        let (_listener, mut entry) = dir.announce(info("cam")).unwrap();
        let victim = base.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.info_tmp_path("cam")).unwrap();
        entry.set_fps(30.0).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(dir.find("cam").unwrap().fps, 30.0);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_released_lock_frees_the_name() {
        let (base, dir) = fresh("release");
        let held = hold(&dir, "cam");
        assert!(matches!(
            dir.announce(info("cam")),
            Err(DiscoveryError::NameTaken { pid: 0, .. })
        ));
        drop(held);
        let (_l, _a) = dir.announce(info("cam")).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// The environment variable that makes [`lock_holder_child`] a lock
    /// holder: `<directory>/<name>`.
    const HOLDER_ENV: &str = "CUDA_INTEROP_FRAMES_TEST_HOLD_NAME";

    /// Not a test of its own: run by [`a_killed_process_gives_its_name_up`]
    /// as another process, it takes a name's owner byte, says `locked` and
    /// waits for its stdin to close (it is killed first).
    #[test]
    fn lock_holder_child() {
        let Some(target) = std::env::var_os(HOLDER_ENV).map(PathBuf::from) else {
            return;
        };
        let dir = Directory::new(target.parent().unwrap()).unwrap();
        let name = target.file_name().unwrap().to_str().unwrap();
        let _held = hold(&dir, name);
        println!("locked");
        std::io::stdout().flush().unwrap();
        let _ = std::io::stdin().read(&mut [0u8]);
    }

    /// A child process, killed and reaped when dropped.
    struct Child(std::process::Child);

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_killed_process_gives_its_name_up() {
        let (base, dir) = fresh("killed");
        let mut child = Child(
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "discovery::tests::lock_holder_child",
                    "--nocapture",
                ])
                .env(HOLDER_ENV, dir.path().join("cam"))
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let stdout = std::io::BufReader::new(child.0.stdout.take().unwrap());
        let locked = std::io::BufRead::lines(stdout).any(|l| l.unwrap() == "locked");
        assert!(locked, "the child did not lock");
        assert!(matches!(
            dir.announce(info("cam")),
            Err(DiscoveryError::NameTaken { .. })
        ));
        assert!(dir.lock_path("cam").exists());
        // SIGKILL: the child's descriptors close with it, and its lock.
        drop(child);
        let (_l, _a) = dir.announce(info("cam")).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Returns once someone has looked for `name` (a look makes its lock
    /// file): the sender comes after a look that found nothing.
    fn wait_until_looked(dir: &Directory, name: &str) {
        let looked = (0..10_000_000).any(|_| {
            std::thread::yield_now();
            dir.lock_path(name).exists()
        });
        assert!(looked, "nobody looked for {name:?}");
    }

    #[test]
    fn wait_for_returns_once_the_sender_announces() {
        let (base, dir) = fresh("wait");
        let waiter = {
            let dir = dir.clone();
            std::thread::spawn(move || dir.wait_for("cam", Duration::from_secs(60)))
        };
        wait_until_looked(&dir, "cam");
        let (_listener, _entry) = dir.announce(info("cam")).unwrap();
        let found = waiter.join().unwrap().unwrap();
        assert_eq!(
            (found.name.as_str(), found.pid),
            ("cam", std::process::id())
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn connect_waits_for_the_sender() {
        let (base, dir) = fresh("connect");
        let receiver = {
            let dir = dir.clone();
            std::thread::spawn(move || dir.connect("cam", Duration::from_secs(60)))
        };
        wait_until_looked(&dir, "cam");
        let (listener, _entry) = dir.announce(info("cam")).unwrap();
        receiver.join().unwrap().unwrap();
        listener.accept(Duration::from_secs(10)).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn wait_for_gives_up_with_not_found() {
        let (base, dir) = fresh("timeout");
        let e = dir.wait_for("cam", Duration::from_millis(200)).unwrap_err();
        assert!(
            matches!(e, DiscoveryError::NotFound { waited, .. } if waited == Duration::from_millis(200)),
            "{e}"
        );
        let e = dir.connect("cam", Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, DiscoveryError::NotFound { .. }), "{e}");
        assert!(matches!(
            dir.wait_for("a/b", Duration::from_millis(200)),
            Err(DiscoveryError::Name { .. })
        ));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_directory_open_to_others_is_refused() {
        let base = temp_dir("perm");
        let path = base.join("d");
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = Directory::new(&path).unwrap_err();
        assert!(e.to_string().contains("must be 0700"), "{e}");
        std::os::unix::fs::symlink(&path, base.join("link")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(Directory::new(base.join("link")).is_err());
        let file = base.join("f");
        std::fs::write(&file, b"").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = Directory::new(&file).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        let other = base.join("o");
        std::fs::create_dir(&other).unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&other, Some(12345), None).expect("chown: run the tests as root");
        let e = Directory::new(&other).unwrap_err();
        assert!(e.to_string().contains("owned by uid 12345"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_fallback_is_used_without_an_absolute_xdg_runtime_dir() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(
            Directory::location(p("/run/user/7"), p("/t")),
            Ok("/run/user/7".into())
        );
        assert_eq!(Directory::location(None, p("/t")), Err("/t".into()));
        assert_eq!(
            Directory::location(p("run/user/7"), p("/t")),
            Err("/t".into())
        );
        assert_eq!(Directory::location(None, None), Err("/tmp".into()));
        assert_eq!(Directory::location(None, p("tmp")), Err("/tmp".into()));
    }

    #[test]
    fn the_fallback_directory_is_private_or_refused() {
        let base = temp_dir("fallback");
        let path = base.join(format!("{DIRECTORY_NAME}-{}", uid()));
        let dir = Directory::fallback_in(&base).unwrap();
        assert_eq!(dir.path(), path);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o700);
        Directory::fallback_in(&base).unwrap();
        let refused = |why: &str| {
            let e = Directory::fallback_in(&base).unwrap_err();
            let text = e.to_string();
            assert!(
                matches!(e, DiscoveryError::Directory { .. }),
                "{why}: {text}"
            );
            assert!(
                text.contains("export XDG_RUNTIME_DIR=/run/user/$(id -u)"),
                "{why}: {text}"
            );
        };
        // Open to others.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        refused("0755");
        // Another user's.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&path, Some(12345), None).expect("chown: run the tests as root");
        refused("another uid");
        // A symlink to a private directory of ours.
        std::fs::remove_dir(&path).unwrap();
        let real = base.join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&real, &path).unwrap();
        refused("symlink");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
