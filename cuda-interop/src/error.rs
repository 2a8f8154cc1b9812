//! The crate's errors: one [`Error`] for every call, [`DriverError`] naming
//! the failed driver call, and [`ImportError`], which hands a failed import's
//! fd back to the caller.

use std::fmt;

use cuda_interop_sys::{CUresult, LoadError, MissingFunction};

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A CUDA driver call that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverError {
    /// The driver function (`cuImportExternalMemory`).
    pub call: &'static str,
    /// The raw result.
    pub code: CUresult,
    /// `cuGetErrorName` (`CUDA_ERROR_INVALID_VALUE`).
    pub name: String,
    /// `cuGetErrorString` (`invalid argument`).
    pub description: String,
    /// What to check, where a known cause exists.
    pub hint: Option<&'static str>,
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} ({})",
            self.call, self.name, self.description
        )?;
        if let Some(hint) = self.hint {
            write!(f, "; {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for DriverError {}

/// Everything that can go wrong on the CUDA side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libcuda could not be opened.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The driver lacks a function.
    #[error(transparent)]
    MissingFunction(#[from] MissingFunction),
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// The Vulkan side failed.
    #[error(transparent)]
    Vulkan(#[from] vk_export::Error),
    /// No CUDA device has the Vulkan device's UUID.
    #[error("no CUDA device has the Vulkan deviceUUID {vulkan}; CUDA devices: {cuda}. Is MIG enabled, or CUDA_VISIBLE_DEVICES hiding it?")]
    NoMatchingDevice {
        /// The Vulkan `deviceUUID`.
        vulkan: String,
        /// Every CUDA device seen, with its UUID.
        cuda: String,
    },
    /// A resource of one device was given to another.
    #[error("device mismatch: the resource was exported by device {resource}, but this CUDA device is {device}; import it on the GPU that created it")]
    DeviceMismatch {
        /// The resource's `deviceUUID`.
        resource: String,
        /// This device's UUID.
        device: String,
    },
    /// An argument out of range; nothing was done.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The combination is not supported; nothing was done.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// An earlier sticky error (e.g. an illegal address) left the CUDA
    /// context unusable; the process must restart to use CUDA again.
    #[error(
        "the CUDA context is poisoned by an earlier {0}; CUDA cannot be used again in this process"
    )]
    Poisoned(String),
    /// CUDA was initialised in a parent process; it cannot be used after `fork`.
    #[error("CUDA was initialised in process {parent}, and this is a forked child ({child}); CUDA cannot be used between fork and exec")]
    ForkedChild {
        /// Pid that initialised CUDA.
        parent: u32,
        /// This pid.
        child: u32,
    },
    /// A host wait ran out of time.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// A destructor could not clean up as it should and did something safe
    /// instead (leaked a resource, left the context stack as it found it).
    /// Destructors only report this, through [`drop_errors`](crate::drop_errors)
    /// and stderr; no call returns it.
    #[error("{0}")]
    Cleanup(String),
}

/// A failed CUDA import: the error, and the fd, still owned by the caller
/// (a failed import does not consume it), to retry or drop. The one
/// `ImportError` of the workspace ([`interop_share::fd::ImportError`]), with
/// this crate's [`Error`].
pub type ImportError = interop_share::fd::ImportError<Error>;
