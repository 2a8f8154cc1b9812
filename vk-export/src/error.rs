//! [`Error`]: every Vulkan-side failure, each naming the call, its
//! `VkResult` and what to do; [`ImportError`](crate::ImportError) hands a
//! failed import's fd back to the caller.

use ash::vk;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong on the Vulkan side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Vulkan call failed.
    #[error("{call} failed: {result:?} ({code}); {hint}", code = result.as_raw())]
    Vulkan {
        /// The Vulkan function.
        call: &'static str,
        /// What it returned.
        result: vk::Result,
        /// What to check or do.
        hint: &'static str,
    },
    /// The Vulkan loader could not be opened.
    #[error("could not load the Vulkan loader (libvulkan.so.1): {0}; install libvulkan1 and a Vulkan driver")]
    Loader(String),
    /// The request is not supported by this driver; nothing was created.
    #[error("{what} is not supported: {reason}")]
    Unsupported {
        /// What was asked for.
        what: String,
        /// Why not, as the driver reported it.
        reason: String,
    },
    /// No physical device fits.
    #[error("no usable Vulkan device: {0}")]
    NoDevice(String),
    /// A value the caller passed is out of range; nothing was created.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A record received from elsewhere does not fit this device or this type.
    #[error("export record rejected: {0}")]
    Record(String),
    /// A wire message could not be decoded or validated.
    #[error(transparent)]
    Wire(#[from] crate::wire::WireError),
    /// A socket operation failed.
    #[error("{call} failed: {source}")]
    Socket {
        /// The socket call.
        call: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A connection from a user the listener does not allow was dropped.
    #[error("refused a connection from pid {}, uid {uid}: only allowed users may connect (Listener::allow_uid)", pid.map_or("unknown (another pid namespace)".to_string(), |p| p.to_string()))]
    PeerRefused {
        /// The peer's pid, if the kernel reports one in this pid namespace.
        pid: Option<i32>,
        /// The peer's uid.
        uid: u32,
    },
    /// A wait ran out of time. Nothing was freed that the GPU may still use;
    /// the context stays usable.
    #[error("timed out after {0:?} waiting for the GPU (a semaphore value nobody signals, or a dead peer?)")]
    Timeout(std::time::Duration),
    /// A resource (or semaphore) of another [`crate::Context`] was given to a
    /// helper; nothing was submitted.
    #[error("foreign resource: {0}")]
    ForeignResource(String),
    /// A binary semaphore was signalled while a signal was already pending,
    /// or waited with a token it did not mint; nothing was submitted.
    #[error("binary semaphore misuse: {0}")]
    BinarySemaphore(String),
}

impl Error {
    pub(crate) fn vk(call: &'static str, hint: &'static str) -> impl FnOnce(vk::Result) -> Error {
        move |result| Error::Vulkan { call, result, hint }
    }
    pub(crate) fn unsupported(what: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::Unsupported {
            what: what.into(),
            reason: reason.into(),
        }
    }
    pub(crate) fn socket(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> Error {
        move |e| Error::Socket {
            call,
            source: e.into(),
        }
    }
}
