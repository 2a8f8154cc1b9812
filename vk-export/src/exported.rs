//! This crate's resources as [`Exported`]: what
//! [`Connection::send_exported`](interop_share::socket::Connection::send_exported)
//! sends, each record with a fresh export of its own fd; a two-plane image as
//! its two planes ([`PlaneToSend`]), each with its own plane's fd.

use std::os::fd::OwnedFd;

use interop_share::format::{Format, PlanarFormat, Plane};
use interop_share::markers::{MemoryLocation, SemaphoreKind, Tiling, Usage};
use interop_share::socket::Exported;
use interop_share::wire::Resource;

use crate::buffer::ExportableBuffer;
use crate::error::Result;
use crate::image::ExportableImage;
use crate::planar::ExportablePlanarImage;
use crate::semaphore::Semaphore;

// SAFETY: `export_fd` is `vkGetMemoryFdKHR` on the image's own memory, which
// `info()` describes (made from that image's create info and requirements).
unsafe impl<F: Format, T: Tiling, M: MemoryLocation, U: Usage> Exported
    for ExportableImage<F, T, M, U>
{
    fn resource(&self) -> Resource {
        Resource::Image(self.info().clone())
    }
    fn export_fd(&self) -> Result<OwnedFd> {
        ExportableImage::export_fd(self)
    }
}

// SAFETY: as for images: the buffer's own memory, described by its `info()`.
unsafe impl<M: MemoryLocation> Exported for ExportableBuffer<M> {
    fn resource(&self) -> Resource {
        Resource::Buffer(self.info().clone())
    }
    fn export_fd(&self) -> Result<OwnedFd> {
        ExportableBuffer::export_fd(self)
    }
}

// SAFETY: `vkGetSemaphoreFdKHR` of this semaphore, whose kind and device
// `record()` names.
unsafe impl<K: SemaphoreKind> Exported for Semaphore<K> {
    fn resource(&self) -> Resource {
        Resource::Semaphore(self.record().into_info())
    }
    fn export_fd(&self) -> Result<OwnedFd> {
        Semaphore::export_fd(self)
    }
}

/// One plane of an [`ExportablePlanarImage`] as
/// [`Connection::send_exported`](interop_share::socket::Connection::send_exported)
/// sends it: the image's record naming the plane, and a fresh export of that
/// plane's memory. [`ExportablePlanarImage::planes_to_send`] gives both, in
/// the order the receiver takes them
/// ([`Received::take_planar_image`](interop_share::wire::Received::take_planar_image)).
#[derive(Debug)]
pub struct PlaneToSend<'a, P: PlanarFormat, M: MemoryLocation> {
    image: &'a ExportablePlanarImage<P, M>,
    plane: Plane,
}

impl<P: PlanarFormat, M: MemoryLocation> ExportablePlanarImage<P, M> {
    /// Both planes, plane 0 first, to send as two consecutive resources of
    /// one message: `connection.send_exported(tag, &[&planes[0], &planes[1]])`.
    pub fn planes_to_send(&self) -> [PlaneToSend<'_, P, M>; 2] {
        Plane::ALL.map(|plane| PlaneToSend { image: self, plane })
    }
}

// SAFETY: `export_fd` is `vkGetMemoryFdKHR` on the memory of exactly the
// plane `resource()` names, of the image whose own record it carries (made
// from that image's create info and per-plane requirements).
unsafe impl<P: PlanarFormat, M: MemoryLocation> Exported for PlaneToSend<'_, P, M> {
    fn resource(&self) -> Resource {
        Resource::PlanarPlane(self.image.info().clone(), self.plane)
    }
    fn export_fd(&self) -> Result<OwnedFd> {
        ExportablePlanarImage::export_fd(self.image, self.plane)
    }
}
