//! Named senders: a sender announces itself in a directory of this user
//! (`$XDG_RUNTIME_DIR/cuda-interop-frames/`), receivers list what is there
//! and connect by name.
//!
//! # Contract
//!
//! * The directory is made `0700` and must be owned by this user, not a
//!   symlink and not open to others ([`DiscoveryError::Directory`]
//!   otherwise); without `XDG_RUNTIME_DIR` (or with a relative one)
//!   [`Directory::from_env`] fails with [`DiscoveryError::NoRuntimeDir`],
//!   which names the variable and [`Directory::new`], the way to choose a
//!   directory explicitly. There is no silent fallback to `/tmp`.
//! * A sender named `N` owns `N.sock` (its listener, `0600`, the peer
//!   credential check of `vk-export`'s sockets) and `N.info` (what
//!   [`SenderInfo`] holds, `0600`, replaced atomically by a rename when it
//!   changes). Names are 1 to [`MAX_NAME_LEN`] bytes of ASCII letters,
//!   digits, `-`, `_` and `.`, not starting with `.` ([`validate_name`]).
//! * [`Directory::list`] returns the live senders sorted by name; an entry
//!   owned by another user or unreadable is ignored; an entry whose process
//!   is gone is ignored and its files removed. [`Directory::connect`]
//!   connects to a live sender by name, bounded by its timeout.
//! * [`Announcement`] removes its `.info` file when dropped; the socket file
//!   goes with the listener. A name is taken while its process lives and
//!   something listens on its socket (a killed sender's pid reused by
//!   another process does not keep the name; it may still be listed until
//!   that process ends, and connecting to it fails).
//! * Uses [`crate::consumer`] for connecting; nothing here waits unbounded.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use vk_export::socket::{Connection, Listener};

use crate::consumer::{self, ConsumerError};

/// The directory's name under `$XDG_RUNTIME_DIR`.
pub const DIRECTORY_NAME: &str = "cuda-interop-frames";
/// Longest sender name, in bytes (the socket path must fit 107 bytes).
pub const MAX_NAME_LEN: usize = 64;
/// Version line of a `.info` file this build writes and reads.
const INFO_VERSION: &str = "cuda-interop-frames-info 1";

/// Why a discovery call failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// No usable `XDG_RUNTIME_DIR`.
    #[error(
        "XDG_RUNTIME_DIR is not set (or not an absolute path): named senders live in \
         $XDG_RUNTIME_DIR/{DIRECTORY_NAME}; set it (systemd-logind does for a login session) or \
         choose a directory of your own with Directory::new"
    )]
    NoRuntimeDir,
    /// The directory is not private to this user.
    #[error("{path}: {why}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
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
    #[error("a sender named {name:?} is already running (pid {pid})")]
    NameTaken {
        /// The name.
        name: String,
        /// Its process.
        pid: u32,
    },
    /// No live sender has the name.
    #[error("no sender named {name:?} in {dir} (list_senders() shows those there)")]
    NotFound {
        /// The name.
        name: String,
        /// The directory looked in.
        dir: PathBuf,
    },
    /// A file system call failed.
    #[error("{what} {path}: {source}")]
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
    /// The pixel format (`"rgba8"`).
    pub format: String,
    /// What the slots are.
    pub kind: SlotKind,
    /// Slots in the ring.
    pub slots: u32,
    /// Frames presented per second, over the last second or so (0 before).
    pub fps: f64,
    /// The sender's process.
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

/// Whether process `pid` exists (a zombie or a reused pid counts; the
/// socket's connect then tells).
fn process_alive(pid: u32) -> bool {
    pid != 0 && Path::new(&format!("/proc/{pid}")).exists()
}

/// A directory of named senders, private to this user.
#[derive(Clone, Debug)]
pub struct Directory {
    path: PathBuf,
}

impl Directory {
    /// `$XDG_RUNTIME_DIR/cuda-interop-frames`, made if missing.
    pub fn from_env() -> Result<Directory, DiscoveryError> {
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .ok_or(DiscoveryError::NoRuntimeDir)?;
        Directory::new(base.join(DIRECTORY_NAME))
    }

    /// The directory `path` (made `0700` if missing; its parent must
    /// exist), checked private to this user.
    pub fn new(path: impl Into<PathBuf>) -> Result<Directory, DiscoveryError> {
        let path = path.into();
        match std::fs::create_dir(&path) {
            Ok(()) => std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
                .map_err(io("chmod 0700", &path))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("mkdir", &path)(e)),
        }
        let meta = std::fs::symlink_metadata(&path).map_err(io("stat", &path))?;
        let bad = |why: String| {
            Err(DiscoveryError::Directory {
                path: path.clone(),
                why,
            })
        };
        if !meta.file_type().is_dir() {
            return bad("not a directory (a symlink or a file is refused)".into());
        }
        let uid = rustix::process::getuid().as_raw();
        if meta.uid() != uid {
            return bad(format!(
                "owned by uid {}, not this user ({uid}); remove it",
                meta.uid()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            return bad(format!(
                "mode {:o} lets other users in; it must be 0700 (chmod 700 it)",
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

    /// The sender named `name` if its entry is this user's and its process
    /// lives; a dead one's files are removed.
    fn read_entry(&self, name: &str) -> Option<SenderInfo> {
        let info_path = self.info_path(name);
        let meta = std::fs::symlink_metadata(&info_path).ok()?;
        if !meta.file_type().is_file() || meta.uid() != rustix::process::getuid().as_raw() {
            return None;
        }
        let text = std::fs::read_to_string(&info_path).ok()?;
        let info = SenderInfo::decode(&text, self.socket_path(name))?;
        if info.name != name {
            return None;
        }
        if !process_alive(info.pid) {
            let _ = std::fs::remove_file(&info_path);
            let socket = self.socket_path(name);
            if std::fs::symlink_metadata(&socket)
                .is_ok_and(|m| m.uid() == rustix::process::getuid().as_raw())
            {
                let _ = std::fs::remove_file(&socket);
            }
            return None;
        }
        Some(info)
    }

    /// The live senders, sorted by name (see the module contract).
    pub fn list(&self) -> Result<Vec<SenderInfo>, DiscoveryError> {
        let mut senders: Vec<SenderInfo> = std::fs::read_dir(&self.path)
            .map_err(io("read_dir", &self.path))?
            .filter_map(|e| {
                let file = e.ok()?.file_name();
                let name = file.to_str()?.strip_suffix(".info")?;
                validate_name(name).ok()?;
                self.read_entry(name)
            })
            .collect();
        senders.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(senders)
    }

    /// The live sender named `name`.
    pub fn find(&self, name: &str) -> Result<SenderInfo, DiscoveryError> {
        validate_name(name)?;
        self.read_entry(name)
            .ok_or_else(|| DiscoveryError::NotFound {
                name: name.to_owned(),
                dir: self.path.clone(),
            })
    }

    /// Connects to the live sender named `name` (`connect(2)` bounded by
    /// `timeout`).
    pub fn connect(&self, name: &str, timeout: Duration) -> Result<Connection, DiscoveryError> {
        let info = self.find(name)?;
        let path = info
            .socket
            .to_str()
            .ok_or_else(|| DiscoveryError::NotFound {
                name: name.to_owned(),
                dir: self.path.clone(),
            })?;
        Ok(consumer::connect(path, timeout)?)
    }

    /// Binds `name`'s socket and writes its entry (`info.name` is the name;
    /// `info.pid` and `info.socket` are filled in here). A stale entry of
    /// the name (its process gone) is replaced; a live one is
    /// [`DiscoveryError::NameTaken`].
    pub fn announce(
        &self,
        mut info: SenderInfo,
    ) -> Result<(Listener, Announcement), DiscoveryError> {
        validate_name(&info.name)?;
        if let Some(live) = self.read_entry(&info.name) {
            // Its pid may have been reused by another process: the name is
            // taken only if something listens on its socket.
            let path = self.socket_path(&info.name);
            let listening = path
                .to_str()
                .is_some_and(|p| consumer::connect(p, Duration::from_millis(200)).is_ok());
            if listening {
                return Err(DiscoveryError::NameTaken {
                    name: info.name,
                    pid: live.pid,
                });
            }
        }
        let socket = self.socket_path(&info.name);
        // No live entry: a socket file left here is a dead sender's.
        if std::fs::symlink_metadata(&socket).is_ok() {
            std::fs::remove_file(&socket).map_err(io("remove stale socket", &socket))?;
        }
        let listener = Listener::bind(&socket)?;
        info.pid = std::process::id();
        info.socket = socket;
        let announcement = Announcement {
            info_path: self.info_path(&info.name),
            info,
        };
        announcement.write()?;
        Ok((listener, announcement))
    }
}

/// A sender's entry in a [`Directory`]: removed when dropped.
#[derive(Debug)]
pub struct Announcement {
    info_path: PathBuf,
    info: SenderInfo,
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

    /// Writes the entry to a temporary file (`0600`) and renames it over
    /// the entry: readers see the old one or the new one, whole.
    fn write(&self) -> Result<(), DiscoveryError> {
        let tmp = self
            .info_path
            .with_extension(format!("info-{}.tmp", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode_0600()
            .open(&tmp)
            .map_err(io("create", &tmp))?;
        file.write_all(self.info.encode().as_bytes())
            .map_err(io("write", &tmp))?;
        drop(file);
        std::fs::rename(&tmp, &self.info_path).map_err(io("rename", &self.info_path))
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.info_path);
    }
}

/// `OpenOptions::mode(0o600)` under a name that says why.
trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600)
    }
}

/// The live senders of `$XDG_RUNTIME_DIR/cuda-interop-frames`.
pub fn list_senders() -> Result<Vec<SenderInfo>, DiscoveryError> {
    Directory::from_env()?.list()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let base = std::env::temp_dir().join(format!("cif-discovery-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        base
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
        let base = temp_dir("announce");
        let dir = Directory::new(base.join("d")).unwrap();
        let mode = std::fs::metadata(dir.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let (listener, mut entry) = dir.announce(info("cam")).unwrap();
        let sock_mode = std::fs::metadata(listener.path()).unwrap().mode() & 0o777;
        assert_eq!(sock_mode, 0o600);
        let info_mode = std::fs::metadata(dir.info_path("cam")).unwrap().mode() & 0o777;
        assert_eq!(info_mode, 0o600);
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
        // The name is taken while this entry lives.
        assert!(matches!(
            dir.announce(info("cam")),
            Err(DiscoveryError::NameTaken { .. })
        ));
        let conn = dir.connect("cam", Duration::from_secs(2)).unwrap();
        drop(conn);
        assert!(matches!(
            dir.connect("other", Duration::from_secs(1)),
            Err(DiscoveryError::NotFound { .. })
        ));
        drop(entry);
        drop(listener);
        assert!(dir.list().unwrap().is_empty());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn dead_and_foreign_entries_are_ignored() {
        let base = temp_dir("stale");
        let dir = Directory::new(base.join("d")).unwrap();
        // A dead sender's entry: a pid no process has (above pid_max's
        // largest value, 2^22), and a socket file.
        let mut dead = info("dead");
        dead.pid = 4_194_305;
        std::fs::write(dir.info_path("dead"), dead.encode()).unwrap();
        std::fs::write(dir.socket_path("dead"), b"").unwrap();
        // A live process's entry owned by another user (tests run as root
        // in CI can chown; otherwise this part cannot be made, and fails).
        let mut foreign = info("foreign");
        foreign.pid = std::process::id();
        std::fs::write(dir.info_path("foreign"), foreign.encode()).unwrap();
        let chowned = std::os::unix::fs::chown(dir.info_path("foreign"), Some(12345), Some(12345));
        // Garbage is ignored too.
        std::fs::write(dir.info_path("junk"), b"not an entry").unwrap();
        let mut live = info("live");
        live.pid = std::process::id();
        std::fs::write(dir.info_path("live"), live.encode()).unwrap();
        let names: Vec<String> = dir.list().unwrap().into_iter().map(|s| s.name).collect();
        if chowned.is_ok() {
            assert_eq!(names, ["live"]);
        } else {
            panic!("cannot chown a test entry to another user ({chowned:?}): run as root");
        }
        // The dead entry's files are gone; the foreign one is left alone.
        assert!(!dir.info_path("dead").exists());
        assert!(!dir.socket_path("dead").exists());
        assert!(dir.info_path("foreign").exists());
        // A live pid whose socket nobody listens on (a reused pid) does not
        // keep the name.
        let mut reused = info("reused");
        reused.pid = std::process::id();
        std::fs::write(dir.info_path("reused"), reused.encode()).unwrap();
        std::fs::write(dir.socket_path("reused"), b"").unwrap();
        let (_l2, _a2) = dir.announce(info("reused")).unwrap();
        // A new sender may take a dead one's name.
        std::fs::write(dir.info_path("dead"), dead.encode()).unwrap();
        std::fs::write(dir.socket_path("dead"), b"").unwrap();
        let (_l, _a) = dir.announce(info("dead")).unwrap();
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
        let other = base.join("o");
        std::fs::create_dir(&other).unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o700)).unwrap();
        if std::os::unix::fs::chown(&other, Some(12345), None).is_ok() {
            let e = Directory::new(&other).unwrap_err();
            assert!(e.to_string().contains("owned by uid 12345"), "{e}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn no_runtime_dir_error_says_what_to_do() {
        let e = DiscoveryError::NoRuntimeDir.to_string();
        assert!(
            e.contains("XDG_RUNTIME_DIR") && e.contains("Directory::new"),
            "{e}"
        );
    }
}
