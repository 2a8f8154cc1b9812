//! Records bound to the fds they arrived with.
//!
//! # Contract
//!
//! * A `Received*` value is a record and its fd that travelled together in
//!   one `SCM_RIGHTS` message from a peer whose credentials were checked
//!   ([`crate::socket`]). Only the receive path makes them.
//! * Importing one is safe: the importer still verifies the record against
//!   its own device before any driver sees the fd (see the README's "Trust
//!   boundary" for what can and cannot be verified).
//! * [`ReceivedImage::into_parts`] and friends separate record and fd; the
//!   bare pair can then only be imported through an `unsafe` entry point.

use std::os::fd::OwnedFd;

use ash::vk;

use crate::error::{Error, Result};
use crate::markers::{usage, DeviceLocal, Optimal, SemaphoreKind};
use crate::record::{BufferRecord, ImageRecord, PlanarImageRecord, SemaphoreRecord};

/// Who is on the other end of a connection (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    /// Peer's process id; `None` when the kernel reports 0 (the peer is in
    /// another pid namespace, e.g. a container).
    pub pid: Option<i32>,
    /// Peer's user id.
    pub uid: u32,
    /// Peer's group id.
    pub gid: u32,
}

macro_rules! received {
    ($(#[$doc:meta])* $name:ident<$($p:ident $(= $default:ty)?),*> => $record:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name<$($p $(= $default)?),*> {
            record: $record<$($p),*>,
            fd: OwnedFd,
            peer: PeerCredentials,
        }

        impl<$($p),*> $name<$($p),*> {
            pub(crate) fn new(record: $record<$($p),*>, fd: OwnedFd, peer: PeerCredentials) -> Self {
                $name { record, fd, peer }
            }
            /// The record.
            pub fn record(&self) -> &$record<$($p),*> {
                &self.record
            }
            /// Who sent it.
            pub fn peer(&self) -> PeerCredentials {
                self.peer
            }
            /// Record, fd and sender, separated (importing the bare pair
            /// needs the `unsafe` `import_fd` entry points).
            pub fn into_parts(self) -> ($record<$($p),*>, OwnedFd, PeerCredentials) {
                (self.record, self.fd, self.peer)
            }
        }
    };
}

received! {
    /// An image record and its memory fd, received together. The type
    /// parameters default as [`ImageRecord`]'s (and `ExportableImage`'s) do:
    /// `ReceivedImage<Rgba8Unorm>` is an optimal, device-local storage image.
    ReceivedImage<F, T = Optimal, M = DeviceLocal, U = usage::Storage> => ImageRecord
}
received! {
    /// A buffer record and its memory fd, received together (device-local
    /// by default, as [`BufferRecord`]).
    ReceivedBuffer<M = DeviceLocal> => BufferRecord
}
received! {
    /// A semaphore record and its fd, received together.
    ReceivedSemaphore<K> => SemaphoreRecord
}

/// A two-plane image's record and both planes' memory fds (plane 0's
/// first), received together: two consecutive resources of one message, one
/// per plane, with the same record (`Received::take_planar_image`).
#[derive(Debug)]
pub struct ReceivedPlanarImage<P, M = DeviceLocal> {
    record: PlanarImageRecord<P, M>,
    fds: [OwnedFd; 2],
    peer: PeerCredentials,
}

impl<P, M> ReceivedPlanarImage<P, M> {
    pub(crate) fn new(
        record: PlanarImageRecord<P, M>,
        fds: [OwnedFd; 2],
        peer: PeerCredentials,
    ) -> Self {
        ReceivedPlanarImage { record, fds, peer }
    }
    /// The record.
    pub fn record(&self) -> &PlanarImageRecord<P, M> {
        &self.record
    }
    /// Who sent it.
    pub fn peer(&self) -> PeerCredentials {
        self.peer
    }
    /// Record, fds (plane 0's first) and sender, separated (importing the
    /// bare parts needs the `unsafe` `import_planar_image_fds`).
    pub fn into_parts(self) -> (PlanarImageRecord<P, M>, [OwnedFd; 2], PeerCredentials) {
        (self.record, self.fds, self.peer)
    }
}

impl<K: SemaphoreKind> ReceivedSemaphore<K> {
    /// Refuses a binary semaphore that this very process sent to itself (the
    /// peer's pid is ours): a binary payload's signal state is kept per
    /// process, so a second handle made from the bundle would keep a second
    /// state, and Vulkan and CUDA could each signal the one semaphore with
    /// no wait between. A handle of this process's own semaphore comes from
    /// `Semaphore::import_from` / `CudaDevice::import_semaphore`, which share
    /// the state. Timelines have no such state and pass.
    pub fn check_not_own_binary(&self) -> Result<()> {
        let own = i32::try_from(std::process::id()).ok();
        if K::VK == vk::SemaphoreType::BINARY && self.peer.pid.is_some() && self.peer.pid == own {
            return Err(Error::BinarySemaphore(
                "a binary semaphore this process sent to itself: its payload state is per process, so \
                 a second handle would keep a second one; import the original with import_from \
                 (Vulkan) or CudaDevice::import_semaphore (CUDA) instead"
                    .into(),
            ));
        }
        Ok(())
    }
}
