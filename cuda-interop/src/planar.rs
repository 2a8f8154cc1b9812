//! Two-plane 4:2:0 images (`vk_export::ExportablePlanarImage`: NV12's and
//! P010's layouts, always disjoint) in CUDA: each plane's memory imported on
//! its own and typed as an [`ImportedImage`] of the plane's single-plane
//! format, so that each maps as a CUDA array of its own
//! ([`ImportedPlanarImage::map_planes`]).
//!
//! ```text
//! CudaDevice ── ImportedPlanarImage ─┬─ luma:   ImportedImage<Luma>   ── MappedArray<'i> ── LevelArray<'m>
//!                                    └─ chroma: ImportedImage<Chroma> ── MappedArray<'i> ── LevelArray<'m>
//! ```
//!
//! # Contract
//!
//! * **What was proven, nothing else.** Each plane maps at offset 0 of its
//!   own memory as a one-level 2D array: plane 0 `UNSIGNED_INT8` x 1
//!   (P010: `UNSIGNED_INT16` x 1) at `W x H`, plane 1 x 2 at `W/2 x H/2`,
//!   flags 0 (the H100 probe, run 23: exact texels, both formats, 256x128 and
//!   1920x1080). CUDA's own `NV12`/`P010` array formats are never used (wrong
//!   texels, or refused); a non-disjoint image cannot reach this module.
//! * **Each plane is an [`ImportedImage`]** of the plane's format
//!   (`R8Unorm`/`Rg8Unorm`, `R16Unorm`/`Rg16Unorm`), optimal, `usage::Sampled`,
//!   whose record is derived from the two-plane record (the plane's extent,
//!   its own allocation size, memory type and alignment; never dedicated). So
//!   the lifetime rules are `ImportedImage`'s: an array borrows its plane's
//!   import, a level its array; no array outlives its memory import, each
//!   import of this process's image keeps that Vulkan image (both planes'
//!   memory) alive, and copies are recorded as uses that the drops wait for.
//! * **NV12's luma plane is read-only in CUDA.** On an H100 (driver 580,
//!   run 44) every texel CUDA wrote into it (`copy_from_host`, a copy into
//!   the level) read back wrong in Vulkan, though Vulkan's writes read back
//!   exact in CUDA, and NV12's chroma and both P010 planes were exact both
//!   ways: those writes are refused with [`Error::Unsupported`] saying what
//!   to do instead.
//! * **Fds.** [`CudaDevice::import_planar_image`] exports and imports the
//!   planes of an image of this process. [`CudaDevice::import_planar_image_fds`]
//!   (`unsafe`: the fds must export what the record describes) takes both
//!   planes' fds: on success both are consumed (CUDA holds duplicates), on
//!   any failure, including one at the second plane after the first was
//!   imported (that import is undone), both come back, open and unchanged,
//!   in [`PlanarImportError`].
//! * **Received** two-plane images ([`CudaDevice::import_received_planar_image`])
//!   are verified on the paired Vulkan device before CUDA sees an fd, and
//!   each plane's size is probed right after its import, as received images
//!   are.

use std::os::fd::OwnedFd;

use vk_export::format::{Format, PlanarFormat, Plane};
use vk_export::markers::{usage, MemoryLocation, Optimal, Usage};
use vk_export::{
    ExportablePlanarImage, ImageFields, ImageInfo, ImageRecord, PlanarImageInfo, PlanarImageRecord,
    ReceivedPlanarImage, PLANAR_USAGE,
};

use crate::array::MappedArray;
use crate::context::CudaDevice;
use crate::error::{Error, ImportError, Result};
use crate::external::SizeCheck;
use crate::import::ImportedImage;
use crate::markers::ArrayMemory;

// A plane is imported as an image of `usage::Sampled`: the two-plane
// image's own usage, so that the array descriptor has the same flags (0).
const _: () = assert!(<usage::Sampled as Usage>::VK.as_raw() == PLANAR_USAGE.as_raw());

/// A plane of a two-plane image imported into CUDA: an image of the plane's
/// format `F`.
pub type ImportedPlane<F, M> = ImportedImage<F, Optimal, M, usage::Sampled>;

/// A disjoint two-plane 4:2:0 image imported into CUDA, one import per
/// plane. Made by [`CudaDevice::import_planar_image`].
pub struct ImportedPlanarImage<P: PlanarFormat, M> {
    luma: ImportedPlane<P::Luma, M>,
    chroma: ImportedPlane<P::Chroma, M>,
    record: PlanarImageRecord<P, M>,
}

impl<P: PlanarFormat, M> std::fmt::Debug for ImportedPlanarImage<P, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedPlanarImage")
            .field("format", &P::NAME)
            .field("extent", &self.record.info().extent())
            .field("luma", &self.luma.memory.raw())
            .field("chroma", &self.chroma.memory.raw())
            .finish()
    }
}

/// The record of `plane` as an image of the plane's format `F`: what the
/// plane's import and array are made from.
fn plane_record<F: Format, M: MemoryLocation>(
    info: &PlanarImageInfo,
    plane: Plane,
) -> Result<ImageRecord<F, Optimal, M, usage::Sampled>> {
    if F::VK != info.plane_format(plane) {
        return Err(Error::InvalidArgument(format!(
            "the {plane:?} plane of {:?} is {:?}, not {}",
            info.format(),
            info.plane_format(plane),
            F::NAME
        )));
    }
    let memory = info.plane(plane);
    let [width, height] = info.plane_extent(plane);
    let fields = ImageFields {
        format: F::VK,
        image_type: vk_export::ash::vk::ImageType::TYPE_2D,
        extent: [width, height, 1],
        mip_levels: 1,
        array_layers: 1,
        flags: vk_export::ash::vk::ImageCreateFlags::empty(),
        tiling: vk_export::ash::vk::ImageTiling::OPTIMAL,
        usage: PLANAR_USAGE,
        allocation_size: memory.allocation_size,
        memory_type_index: memory.memory_type_index,
        memory_flags: memory.memory_flags,
        dedicated: memory.dedicated,
        alignment: memory.alignment,
        offset: 0,
        row_pitch: 0,
        array_pitch: 0,
        device_uuid: info.device_uuid(),
        driver_uuid: info.driver_uuid(),
    };
    let record = ImageInfo::from_fields(fields)
        .map_err(|e| vk_export::Error::Record(format!("the {plane:?} plane's record: {e}")))?
        .typed::<F, Optimal, M, usage::Sampled>()?;
    Ok(record)
}

impl CudaDevice {
    /// Imports both planes of a two-plane image of this process: each
    /// plane's memory is exported (a fresh fd), imported with the plane's own
    /// size (never dedicated) and typed as an image of the plane's format.
    /// Each import keeps the Vulkan image alive.
    pub fn import_planar_image<P: PlanarFormat, M: MemoryLocation>(
        &self,
        image: &ExportablePlanarImage<P, M>,
    ) -> Result<ImportedPlanarImage<P, M>> {
        let info = image.info();
        self.check_resource_device(&info.device_uuid())?;
        let luma = self.import_plane::<P::Luma, P, M>(image, Plane::Luma)?;
        // On failure, `luma` drops here: its import is destroyed.
        let chroma = self.import_plane::<P::Chroma, P, M>(image, Plane::Chroma)?;
        Ok(ImportedPlanarImage::new(luma, chroma, image.record()))
    }
}

/// A failed two-plane import ([`CudaDevice::import_planar_image_fds`]): why,
/// and both planes' fds (plane 0 first), still the caller's, open and
/// unchanged.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct PlanarImportError {
    /// Why the import failed.
    pub error: Error,
    /// The caller's fds, plane 0's then plane 1's.
    pub fds: [OwnedFd; 2],
}

impl CudaDevice {
    /// Imports a two-plane image from its record and each plane's fd
    /// (plane 0's first) that did not come from this process's
    /// [`ExportablePlanarImage`]. Only the device UUID is checked; run
    /// [`Context::verify_planar_image`](vk_export::Context::verify_planar_image)
    /// on the paired Vulkan device first for a record that came from
    /// elsewhere. On success both fds are consumed; on failure both come back
    /// in the error, and nothing stays imported.
    ///
    /// # Safety
    /// `fds[0]` and `fds[1]` are OPAQUE_FD exports of plane 0's and plane
    /// 1's memory of the disjoint image `record` describes, and `record` is
    /// that image's own, unmodified record (a record that misstates a
    /// plane's size or the extent makes CUDA read and write memory laid out
    /// for another image).
    pub unsafe fn import_planar_image_fds<P: PlanarFormat, M: MemoryLocation>(
        &self,
        record: PlanarImageRecord<P, M>,
        fds: [OwnedFd; 2],
    ) -> Result<ImportedPlanarImage<P, M>, PlanarImportError> {
        self.import_planes(record, fds, SizeCheck::Trusted)
    }

    /// Imports a two-plane image received over a socket (both planes'
    /// records and fds arrived together from a peer:
    /// [`Received::take_planar_image`](vk_export::wire::Received::take_planar_image)).
    /// Before CUDA sees an fd, the record is verified on the Vulkan device
    /// this CUDA device was paired with
    /// ([`Context::verify_planar_image`](vk_export::Context::verify_planar_image):
    /// both UUIDs, each plane's memory type, and the size and alignment that
    /// device derives for each plane), so the device must come from
    /// [`CudaDevice::for_vulkan`]; right after each plane's import, a mapping
    /// of the plane's whole size is made and freed, and the import undone if
    /// the driver refuses it (the memory behind the fd is smaller). What stays
    /// the peer's word is the layout, as for images. On failure both fds come
    /// back in the error.
    pub fn import_received_planar_image<P: PlanarFormat, M: MemoryLocation>(
        &self,
        received: ReceivedPlanarImage<P, M>,
    ) -> Result<ImportedPlanarImage<P, M>, PlanarImportError> {
        let (record, fds, _peer) = received.into_parts();
        if let Err(error) = self.verify_with_vulkan(|ctx| ctx.verify_planar_image(&record)) {
            return Err(PlanarImportError { error, fds });
        }
        self.import_planes(record, fds, SizeCheck::Probe)
    }

    /// The import of both planes from the caller's fds (see
    /// [`CudaDevice::import_planar_image_fds`] for the fds' fate).
    fn import_planes<P: PlanarFormat, M: MemoryLocation>(
        &self,
        record: PlanarImageRecord<P, M>,
        fds: [OwnedFd; 2],
        check: SizeCheck,
    ) -> Result<ImportedPlanarImage<P, M>, PlanarImportError> {
        let info = record.info();
        let planes = self
            .check_resource_device(&info.device_uuid())
            .and_then(|()| {
                Ok((
                    plane_record::<P::Luma, M>(info, Plane::Luma)?,
                    plane_record::<P::Chroma, M>(info, Plane::Chroma)?,
                ))
            });
        let (luma_record, chroma_record) = match planes {
            Ok(records) => records,
            Err(error) => return Err(PlanarImportError { error, fds }),
        };
        // Each plane is imported from a duplicate, so that the caller's fds
        // stay as they are until both imports succeeded, and come back
        // unchanged from a failure at either plane.
        let luma = match self.import_plane_fd(luma_record, &fds[0], check) {
            Ok(luma) => luma,
            Err(error) => return Err(PlanarImportError { error, fds }),
        };
        let chroma = match self.import_plane_fd(chroma_record, &fds[1], check) {
            Ok(chroma) => chroma,
            Err(error) => {
                // Undoes plane 0's import (the driver closes its duplicate).
                drop(luma);
                return Err(PlanarImportError { error, fds });
            }
        };
        // Both imports hold duplicates of their own: the caller's fds are
        // consumed (closed) as a successful import consumes its fd.
        drop(fds);
        Ok(ImportedPlanarImage::new(luma, chroma, record))
    }

    /// Imports one plane from a duplicate of `fd` (the caller's stays open).
    fn import_plane_fd<F: Format, M: MemoryLocation>(
        &self,
        record: ImageRecord<F, Optimal, M, usage::Sampled>,
        fd: &OwnedFd,
        check: SizeCheck,
    ) -> Result<ImportedPlane<F, M>> {
        // Checked here too, so that a refusal names the caller's fd, not
        // the duplicate's number.
        vk_export::check_export_fd(fd, "memory")?;
        let duplicate = fd
            .try_clone()
            .map_err(|e| Error::InvalidArgument(format!("the fd cannot be duplicated: {e}")))?;
        // A failure hands the duplicate back, which is closed here.
        self.import_image_inner(record, duplicate, None, check)
            .map_err(|e| e.error)
    }

    /// Imports `plane` of `image` as an image of the plane's format `F`.
    fn import_plane<F: Format, P: PlanarFormat, M: MemoryLocation>(
        &self,
        image: &ExportablePlanarImage<P, M>,
        plane: Plane,
    ) -> Result<ImportedPlane<F, M>> {
        let record = plane_record::<F, M>(image.info(), plane)?;
        let fd = image.export_fd(plane)?;
        self.import_image_inner(record, fd, Some(image.keep_alive()), SizeCheck::Trusted)
            .map_err(ImportError::into_error)
    }
}

/// Why CUDA may not write an NV12 image's luma plane: on an H100 (NVIDIA
/// 580, run 44) every texel CUDA wrote into it read back wrong in Vulkan,
/// at 256x128 and 1920x1080, while Vulkan's writes read back exact in CUDA
/// and both directions were exact for NV12's chroma plane and both of
/// P010's planes.
const NV12_LUMA_WRITES: &str = "CUDA writes into an NV12 image's luma plane are refused: on an \
     NVIDIA H100 (driver 580) Vulkan read them back wrong (run 44), while reads of the plane are \
     exact; read it in CUDA, write the frame in Vulkan, or use P010 planes or the pitched NV12 \
     buffers (the guide's \"Planar video\") for frames CUDA writes";

impl<P: PlanarFormat, M: MemoryLocation> ImportedPlanarImage<P, M> {
    /// Both planes' imports, with the writes a GPU run refuted refused.
    fn new(
        mut luma: ImportedPlane<P::Luma, M>,
        chroma: ImportedPlane<P::Chroma, M>,
        record: PlanarImageRecord<P, M>,
    ) -> ImportedPlanarImage<P, M> {
        if P::VK == vk_export::ash::vk::Format::G8_B8R8_2PLANE_420_UNORM {
            luma.memory.cuda_write_refusal = Some(NV12_LUMA_WRITES);
        }
        ImportedPlanarImage {
            luma,
            chroma,
            record,
        }
    }

    /// The two-plane record.
    pub fn info(&self) -> &PlanarImageInfo {
        self.record.info()
    }

    /// Plane 0 (luma), imported as a `W x H` image of [`PlanarFormat::Luma`].
    pub fn luma(&self) -> &ImportedPlane<P::Luma, M> {
        &self.luma
    }

    /// Plane 1 (chroma: Cb, Cr), imported as a `W/2 x H/2` image of
    /// [`PlanarFormat::Chroma`].
    pub fn chroma(&self) -> &ImportedPlane<P::Chroma, M> {
        &self.chroma
    }

    /// Maps both planes, each as a CUDA array of its own format (one
    /// level, flags 0): plane 0 `W x H` x 1 channel, plane 1 `W/2 x H/2` x 2
    /// channels. Only device-local images compile, as for
    /// [`ImportedImage::map_array`]. The arrays borrow this import.
    #[allow(
        clippy::type_complexity,
        reason = "the pair of the planes' array types, each named by its format"
    )]
    pub fn map_planes(
        &self,
    ) -> Result<(
        MappedArray<'_, P::Luma, usage::Sampled>,
        MappedArray<'_, P::Chroma, usage::Sampled>,
    )>
    where
        M: ArrayMemory,
    {
        Ok((self.luma.map_array()?, self.chroma.map_array()?))
    }
}

#[cfg(test)]
mod tests {
    //! The planes' records and CUDA array descriptors, derived without a
    //! device: what the H100 probe mapped (run 23), and nothing else.
    use super::*;
    use crate::array::array_descriptor;
    use cuda_interop_sys::CUarray_format;
    use vk_export::ash::vk;
    use vk_export::format::{P010Planes, R16Unorm, R8Unorm, Rg16Unorm, Rg8Unorm};
    use vk_export::markers::DeviceLocal;
    use vk_export::{DeviceUuid, DriverUuid, PlanarImageFields, PlaneMemory};

    fn info(format: vk::Format, bytes: u64, width: u32, height: u32) -> PlanarImageInfo {
        let plane = |size: u64| PlaneMemory {
            allocation_size: size.next_multiple_of(65536),
            memory_type_index: 1,
            memory_flags: vk::MemoryPropertyFlags::DEVICE_LOCAL,
            alignment: 65536,
            dedicated: false,
        };
        let (w, h) = (u64::from(width), u64::from(height));
        PlanarImageInfo::from_fields(PlanarImageFields {
            format,
            extent: [width, height],
            usage: PLANAR_USAGE,
            planes: [plane(w * h * bytes), plane(w / 2 * (h / 2) * 2 * bytes)],
            device_uuid: DeviceUuid::from_bytes([1; 16]),
            driver_uuid: DriverUuid::from_bytes([2; 16]),
        })
        .unwrap()
    }

    fn descriptor<F: Format>(
        info: &PlanarImageInfo,
        plane: Plane,
    ) -> (usize, usize, usize, CUarray_format, u32, u32) {
        let record = plane_record::<F, DeviceLocal>(info, plane).unwrap();
        let i = record.info();
        assert_eq!(i.allocation_size(), info.plane(plane).allocation_size);
        assert_eq!(i.memory_type_index(), info.plane(plane).memory_type_index);
        assert!(!i.dedicated() && i.offset() == 0 && i.mip_levels() == 1);
        let d = array_descriptor(&record);
        (d.Width, d.Height, d.Depth, d.Format, d.NumChannels, d.Flags)
    }

    #[test]
    fn each_plane_maps_as_an_array_of_its_own_format() {
        const U8: CUarray_format = CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8;
        const U16: CUarray_format = CUarray_format::CU_AD_FORMAT_UNSIGNED_INT16;
        let nv12 = info(vk::Format::G8_B8R8_2PLANE_420_UNORM, 1, 1920, 1080);
        assert_eq!(
            descriptor::<R8Unorm>(&nv12, Plane::Luma),
            (1920, 1080, 0, U8, 1, 0)
        );
        assert_eq!(
            descriptor::<Rg8Unorm>(&nv12, Plane::Chroma),
            (960, 540, 0, U8, 2, 0)
        );
        let p010 = info(P010Planes::VK, 2, 256, 128);
        assert_eq!(
            descriptor::<R16Unorm>(&p010, Plane::Luma),
            (256, 128, 0, U16, 1, 0)
        );
        assert_eq!(
            descriptor::<Rg16Unorm>(&p010, Plane::Chroma),
            (128, 64, 0, U16, 2, 0)
        );
    }

    /// A plane typed as another format than the record's plane is refused.
    #[test]
    fn a_plane_of_another_format_is_refused() {
        let nv12 = info(vk::Format::G8_B8R8_2PLANE_420_UNORM, 1, 256, 128);
        for err in [
            plane_record::<R16Unorm, DeviceLocal>(&nv12, Plane::Luma).unwrap_err(),
            plane_record::<R8Unorm, DeviceLocal>(&nv12, Plane::Chroma).unwrap_err(),
        ] {
            assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        }
    }
}
