//! [`InteropImage`]: a vk-export image (an exportable image, a frame ring's
//! slot, an imported image) as a vulkano [`Image`], for vulkano's command
//! buffers.
//!
//! # Contract
//!
//! * The vulkano image borrows the `VkImage`: vulkano never destroys it or
//!   its memory. The [`InteropImage`] keeps the vk-export image alive; when
//!   it goes while vulkano still holds the [`Image`] (a clone of the `Arc`
//!   in a command buffer or a future), the vk-export image is leaked, never
//!   destroyed under vulkano, and that is reported
//!   ([`vk_export::drop_errors`]).
//! * vulkano tracks the image's layout itself: it takes the image in the
//!   [`CurrentLayout`] given, transitions it as its commands need, and
//!   leaves it in `GENERAL` at the end of every command buffer (vulkano's
//!   default layout of a storage image; `GENERAL` is where the frame ring
//!   and CUDA expect it). Hence `unsafe`: nothing else may change the
//!   layout while vulkano uses it (see [`Interop::image`]).

use std::fmt;
use std::sync::Arc;

use vk_export::format::Format;
use vk_export::markers::{MemoryLocation, Tiling, Usage};
use vk_export::{ExportableImage, KeepAlive};
use vulkano::image::sys::{ImageCreateInfo, RawImage};
use vulkano::image::{
    Image, ImageCreateFlags, ImageLayout, ImageTiling, ImageType, ImageUsage, SampleCount,
};
use vulkano::memory::ExternalMemoryHandleTypes;
use vulkano::sync::Sharing;

use crate::context::Interop;
use crate::error::{Error, Result};

/// The layout the image is in when it is wrapped: where vulkano's first
/// command buffer takes it from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CurrentLayout {
    /// The contents do not matter (a new image, or one vulkano writes
    /// whole first): vulkano's first use transitions from `UNDEFINED`,
    /// which may discard them.
    Undefined,
    /// `GENERAL`, contents kept: a frame ring's slot (open for the
    /// sender, or held by a receiver), or an image released in `GENERAL`.
    General,
}

/// A vk-export image as a vulkano [`Image`] (see the module contract).
pub struct InteropImage {
    image: Arc<Image>,
    /// Dropped with this wrapper only when vulkano holds no other
    /// reference to the image; leaked otherwise.
    keep: Option<KeepAlive>,
}

impl fmt::Debug for InteropImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InteropImage")
            .field("format", &self.image.format())
            .field("extent", &self.image.extent())
            .finish()
    }
}

impl InteropImage {
    /// The vulkano image: clone it into command buffers.
    pub fn image(&self) -> &Arc<Image> {
        &self.image
    }
}

impl Drop for InteropImage {
    fn drop(&mut self) {
        // Sole owner (no strong clone, no weak one to upgrade): vulkano
        // has nothing left that uses the VkImage.
        if Arc::strong_count(&self.image) == 1 && Arc::weak_count(&self.image) == 0 {
            drop(self.keep.take());
        } else {
            vk_export::report_drop_error(format_args!(
                "cuda-interop-vulkano: an InteropImage went while vulkano still held its Image \
                 ({} references): the vk-export image is leaked, not destroyed under it",
                Arc::strong_count(&self.image) - 1
            ));
            std::mem::forget(self.keep.take());
        }
    }
}

/// The layout vulkano 0.35 leaves an image of `usage` in after each of its
/// command buffers (its `RawImage::default_layout`, which it does not
/// export): `GENERAL` unless every usage but the transfers is sampling or
/// input attachment, colour attachment, or depth/stencil attachment alone.
fn layout_vulkano_leaves(usage: ImageUsage) -> ImageLayout {
    let usage = usage.difference(ImageUsage::TRANSFER_SRC | ImageUsage::TRANSFER_DST);
    let only = |these: ImageUsage| usage.intersects(these) && usage.difference(these).is_empty();
    if only(ImageUsage::SAMPLED | ImageUsage::INPUT_ATTACHMENT) {
        ImageLayout::ShaderReadOnlyOptimal
    } else if only(ImageUsage::COLOR_ATTACHMENT) {
        ImageLayout::ColorAttachmentOptimal
    } else if only(ImageUsage::DEPTH_STENCIL_ATTACHMENT) {
        ImageLayout::DepthStencilAttachmentOptimal
    } else {
        ImageLayout::General
    }
}

impl Interop {
    /// `image` (of this context) as a vulkano [`Image`] with the same
    /// format, extent, levels, layers, tiling and usage, taken by vulkano
    /// in `layout`. Refused: an image of another context, a format vulkano
    /// does not know, a usage vulkano would leave in another layout than
    /// `GENERAL` after its command buffers (sampling alone:
    /// `usage::Sampled`; attachments alone).
    ///
    /// # Safety
    /// While the [`InteropImage`] (or any clone of its [`Image`]) lives:
    /// the image is in `layout` when vulkano's first command buffer that
    /// uses it executes, and in `GENERAL` whenever a later one does
    /// (vulkano leaves it there); nothing else changes its layout except
    /// ownership transfers in `GENERAL` (a frame sender's open and present,
    /// a receiver's hand-off) ordered before and after vulkano's uses; no
    /// vk-export helper that moves its layout (`clear_image`, `read_image`,
    /// `release_image`, ...) uses it; it is not wrapped twice at once
    /// (each vulkano image tracks its layout on its own); and vulkano's
    /// uses of it are ordered (by semaphores, fences or host waits) with
    /// every other user (CUDA, other devices, other processes).
    pub unsafe fn image<F: Format, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        image: &ExportableImage<F, T, M, U>,
        layout: CurrentLayout,
    ) -> Result<InteropImage> {
        if !image.context().is_same(self.context()) {
            return Err(Error::Refused(
                "the image belongs to another vk-export context than this Interop's".into(),
            ));
        }
        let info = image.info();
        let format = vulkano::format::Format::try_from(info.format())
            .map_err(|()| Error::Refused(format!("{} is no vulkano format", F::NAME)))?;
        let image_type = ImageType::try_from(info.image_type())
            .map_err(|()| Error::Refused(format!("image type {:?}", info.image_type())))?;
        let tiling = ImageTiling::try_from(info.tiling())
            .map_err(|()| Error::Refused(format!("tiling {:?}", info.tiling())))?;
        let create_info = ImageCreateInfo {
            flags: ImageCreateFlags::from(info.flags()),
            image_type,
            format,
            extent: info.extent(),
            array_layers: info.array_layers(),
            mip_levels: info.mip_levels(),
            samples: SampleCount::Sample1,
            tiling,
            usage: ImageUsage::from(info.usage()),
            sharing: Sharing::Exclusive,
            // vulkano's record of the layout the image is in now: where its
            // first command buffer takes it from.
            initial_layout: match layout {
                CurrentLayout::Undefined => ImageLayout::Undefined,
                CurrentLayout::General => ImageLayout::General,
            },
            external_memory_handle_types: ExternalMemoryHandleTypes::OPAQUE_FD,
            ..Default::default()
        };
        let usage = ImageUsage::from(info.usage());
        let after = layout_vulkano_leaves(usage);
        if after != ImageLayout::General {
            return Err(Error::Refused(format!(
                "an image of usage {usage:?}: vulkano leaves it in {after:?} after each command \
                 buffer, and frame rings, CUDA and vk-export expect GENERAL; give it the storage \
                 usage (vk_export::markers::usage::Storage)"
            )));
        }
        let keep = image.keep_alive();
        // SAFETY: the VkImage is of this device (same context, checked
        // above) and was created with exactly these parameters but the
        // initial layout, which vulkano takes as the layout the image is
        // in now (the caller's promise); it is bound to its memory (vulkano
        // never binds another) and stays valid while vulkano holds it: the
        // keep-alive goes only when the vulkano image has no other
        // reference (InteropImage's Drop), and is leaked otherwise.
        let raw = unsafe {
            RawImage::from_handle_borrowed(self.device().clone(), image.raw(), create_info)
        }
        .map_err(|e| Error::Vulkano(e.to_string()))?;
        // SAFETY: the image is bound (vk-export binds before handing it out)
        // and not sparse.
        let image = unsafe { raw.assume_bound() };
        Ok(InteropImage {
            image: Arc::new(image),
            keep: Some(keep),
        })
    }
}
