//! [`Error`]: every failure of the shared layer and of the Vulkan side
//! (one enum, so that a caller of `vk-export` and of this crate matches one
//! type), each naming the call, its `VkResult` or OS error and what to do;
//! [`WireError`]: why a message was rejected.
//! [`ImportError`](crate::fd::ImportError) hands a failed import's fd back.

use ash::vk;

use crate::limits::{HEADER_LEN, MAX_MESSAGE_LEN, MAX_RESOURCES};

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the transport or on the Vulkan side.
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
    Wire(#[from] WireError),
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
    /// A resource (or semaphore) of another `vk_export::Context` was given to a
    /// helper; nothing was submitted.
    #[error("foreign resource: {0}")]
    ForeignResource(String),
    /// A binary semaphore was signalled while a signal was already pending,
    /// or waited with a token it did not mint; nothing was submitted.
    #[error("binary semaphore misuse: {0}")]
    BinarySemaphore(String),
}

impl Error {
    pub(crate) fn socket(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> Error {
        move |e| Error::Socket {
            call,
            source: e.into(),
        }
    }
}

/// Why a message was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The peer closed the connection.
    #[error("the peer closed the connection")]
    Closed,
    /// Shorter than the header.
    #[error("message of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    TooShort(usize),
    /// Does not start with [`MAGIC`](crate::limits::MAGIC).
    #[error("not a cuda-interop message (bad magic)")]
    BadMagic,
    /// A version this build does not read.
    #[error("wire version {found} is not supported (this build reads version {supported}); update both sides")]
    UnsupportedVersion {
        /// The message's version.
        found: u16,
        /// [`VERSION`](crate::limits::VERSION).
        supported: u16,
    },
    /// The header's length disagrees with the bytes received.
    #[error("header declares {declared} payload bytes, {actual} arrived")]
    LengthMismatch {
        /// Declared.
        declared: usize,
        /// Received.
        actual: usize,
    },
    /// Larger than [`MAX_MESSAGE_LEN`].
    #[error("message too large ({0} bytes)")]
    TooLarge(usize),
    /// The payload's CRC does not match: corrupted in transit or forged.
    #[error("checksum mismatch (header {expected:#010x}, payload {computed:#010x}): the record is corrupted")]
    Checksum {
        /// From the header.
        expected: u32,
        /// Computed over the payload.
        computed: u32,
    },
    /// The payload ended inside a field.
    #[error("record truncated inside `{0}`")]
    Truncated(&'static str),
    /// Bytes after the last resource.
    #[error("{0} unexpected bytes after the last resource")]
    TrailingBytes(usize),
    /// A resource kind this version does not know.
    #[error("unknown resource kind {0}")]
    UnknownKind(u8),
    /// A field outside its valid range.
    #[error("field `{field}` has invalid value {value:#x}")]
    InvalidValue {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// More than [`MAX_RESOURCES`] resources, or none.
    #[error("{0} resources in one message (1 to {MAX_RESOURCES} allowed)")]
    ResourceCount(usize),
    /// The fds received do not match the resources.
    #[error("{received} fds arrived for {expected} resources")]
    FdCount {
        /// Resources in the message.
        expected: usize,
        /// Fds in the control message.
        received: usize,
    },
    /// The kernel truncated the payload (`MSG_TRUNC`).
    #[error("the message was truncated by the kernel (larger than {MAX_MESSAGE_LEN} bytes)")]
    MessageTruncated,
    /// The kernel truncated the control data (`MSG_CTRUNC`); excess fds were closed.
    #[error("the control message was truncated (more fds than expected); the excess fds were closed by the kernel")]
    ControlTruncated,
    /// The receiver asked for a resource of another kind or index.
    #[error("resource {index} is {found}, not {expected}")]
    WrongResource {
        /// Index asked for.
        index: usize,
        /// What it is.
        found: &'static str,
        /// What was asked for.
        expected: &'static str,
    },
}
