//! This crate's resources as [`Exported`]: what
//! [`Connection::send_exported`](interop_share::socket::Connection::send_exported)
//! sends, each record with a fresh export of its own fd.

use std::os::fd::OwnedFd;

use interop_share::format::Format;
use interop_share::markers::{MemoryLocation, SemaphoreKind, Tiling, Usage};
use interop_share::socket::Exported;
use interop_share::wire::Resource;

use crate::buffer::ExportableBuffer;
use crate::error::Result;
use crate::image::ExportableImage;
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
