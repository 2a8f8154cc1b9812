//! Records: what an importer needs to know about an exported resource.
//!
//! # Contract
//!
//! * A record is made by an export (`vk_export::ExportableImage::info` and
//!   friends, through [`ImageInfo::from_fields`]) or by the wire decoder
//!   ([`crate::wire::Message::decode`]). Fields are private; the one
//!   constructor validates, so there is no setter and no way around the rules.
//! * Every record satisfies the shape rules, whatever path made it: known
//!   format, ranges, row pitch against tiling, offset 0, levels against
//!   extent, cube shape, allocation size against the texels it must hold.
//!   This module is their only home.
//! * A record does not prove that an fd holds the memory it describes: that is
//!   what import-time verification (`vk_export::Context::verify_image` and
//!   friends) and the peer model (see the guide's "Trust boundary") are for.
//! * Typed records ([`ImageRecord`], [`BufferRecord`], [`SemaphoreRecord`],
//!   [`PlanarImageRecord`]) add the type-level facts, checked exactly: a
//!   memory class states both what it requires and what it excludes.
//! * A two-plane image ([`PlanarImageInfo`]) is always disjoint, optimal
//!   and 2D with one level and one layer: one allocation per plane, none
//!   dedicated (a disjoint image cannot have one), each at least as large
//!   as its plane's texels. A multi-planar format in an [`ImageInfo`] is
//!   refused (`image.format`).

use std::fmt;
use std::marker::PhantomData;

use ash::vk;

use crate::error::{Error, Result, WireError};
use crate::format::{self, Format, PlanarFormat, Plane};
use crate::markers::{usage, DeviceLocal, MemoryLocation, Optimal, SemaphoreKind, Tiling, Usage};
use crate::uuid::{DeviceUuid, DriverUuid};

/// Usage of every exportable buffer: storage (shader access) and transfers.
pub const BUFFER_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw(),
);

/// Largest allocation a record may describe (1 TiB).
pub const MAX_ALLOCATION: u64 = 1 << 40;
/// Image usage bits a record may carry (`TRANSFER_SRC` .. `INPUT_ATTACHMENT`).
const KNOWN_IMAGE_USAGE: u32 = 0xff;
/// Buffer usage bits a record may carry.
const KNOWN_BUFFER_USAGE: u32 = 0x3ff;
/// Memory property bits a record may carry.
const KNOWN_MEMORY_FLAGS: u32 = 0x1ff;
/// Largest image side a record may describe.
const MAX_EXTENT: u32 = 1 << 16;
/// Most array layers a record may describe.
const MAX_LAYERS: u32 = 2048;

fn check(field: &'static str, value: u64, ok: bool) -> Result<(), WireError> {
    if ok {
        Ok(())
    } else {
        Err(WireError::InvalidValue { field, value })
    }
}

/// Everything an importer needs to know about an exported image, in another
/// `VkDevice`, another process, or CUDA. Made only by an export or the wire
/// decoder; [`crate::wire`] encodes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    pub(crate) format: vk::Format,
    pub(crate) image_type: vk::ImageType,
    pub(crate) extent: [u32; 3],
    pub(crate) mip_levels: u32,
    pub(crate) array_layers: u32,
    pub(crate) flags: vk::ImageCreateFlags,
    pub(crate) tiling: vk::ImageTiling,
    pub(crate) usage: vk::ImageUsageFlags,
    pub(crate) allocation_size: u64,
    pub(crate) memory_type_index: u32,
    pub(crate) memory_flags: vk::MemoryPropertyFlags,
    pub(crate) dedicated: bool,
    pub(crate) alignment: u64,
    pub(crate) offset: u64,
    pub(crate) row_pitch: u64,
    pub(crate) array_pitch: u64,
    pub(crate) device_uuid: DeviceUuid,
    pub(crate) driver_uuid: DriverUuid,
}

/// The fields of an [`ImageInfo`], for [`ImageInfo::from_fields`]: what an
/// exporter read from its own `VkImageCreateInfo`, `VkMemoryRequirements`
/// and `VkPhysicalDeviceIDProperties`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(
    missing_docs,
    reason = "each field is the ImageInfo accessor of the same name"
)]
pub struct ImageFields {
    pub format: vk::Format,
    pub image_type: vk::ImageType,
    pub extent: [u32; 3],
    pub mip_levels: u32,
    pub array_layers: u32,
    pub flags: vk::ImageCreateFlags,
    pub tiling: vk::ImageTiling,
    pub usage: vk::ImageUsageFlags,
    pub allocation_size: u64,
    pub memory_type_index: u32,
    pub memory_flags: vk::MemoryPropertyFlags,
    pub dedicated: bool,
    pub alignment: u64,
    pub offset: u64,
    pub row_pitch: u64,
    pub array_pitch: u64,
    pub device_uuid: DeviceUuid,
    pub driver_uuid: DriverUuid,
}

impl ImageInfo {
    /// A record from its fields, if they satisfy every shape rule (the same
    /// check the wire decoder ends with).
    pub fn from_fields(f: ImageFields) -> Result<ImageInfo, WireError> {
        let info = ImageInfo {
            format: f.format,
            image_type: f.image_type,
            extent: f.extent,
            mip_levels: f.mip_levels,
            array_layers: f.array_layers,
            flags: f.flags,
            tiling: f.tiling,
            usage: f.usage,
            allocation_size: f.allocation_size,
            memory_type_index: f.memory_type_index,
            memory_flags: f.memory_flags,
            dedicated: f.dedicated,
            alignment: f.alignment,
            offset: f.offset,
            row_pitch: f.row_pitch,
            array_pitch: f.array_pitch,
            device_uuid: f.device_uuid,
            driver_uuid: f.driver_uuid,
        };
        info.validate()?;
        Ok(info)
    }

    /// `VkImageCreateInfo::format`.
    pub fn format(&self) -> vk::Format {
        self.format
    }
    /// `VkImageCreateInfo::imageType`.
    pub fn image_type(&self) -> vk::ImageType {
        self.image_type
    }
    /// `VkImageCreateInfo::extent` (width, height, depth).
    pub fn extent(&self) -> [u32; 3] {
        self.extent
    }
    /// `VkImageCreateInfo::mipLevels`.
    pub fn mip_levels(&self) -> u32 {
        self.mip_levels
    }
    /// `VkImageCreateInfo::arrayLayers`.
    pub fn array_layers(&self) -> u32 {
        self.array_layers
    }
    /// `VkImageCreateInfo::flags`.
    pub fn flags(&self) -> vk::ImageCreateFlags {
        self.flags
    }
    /// `VkImageCreateInfo::tiling`.
    pub fn tiling(&self) -> vk::ImageTiling {
        self.tiling
    }
    /// `VkImageCreateInfo::usage`.
    pub fn usage(&self) -> vk::ImageUsageFlags {
        self.usage
    }
    /// `VkMemoryAllocateInfo::allocationSize` (= `VkMemoryRequirements::size`):
    /// the size CUDA must import.
    pub fn allocation_size(&self) -> u64 {
        self.allocation_size
    }
    /// `VkMemoryAllocateInfo::memoryTypeIndex`.
    pub fn memory_type_index(&self) -> u32 {
        self.memory_type_index
    }
    /// That memory type's property flags.
    pub fn memory_flags(&self) -> vk::MemoryPropertyFlags {
        self.memory_flags
    }
    /// Whether the allocation is dedicated (`CUDA_EXTERNAL_MEMORY_DEDICATED`).
    pub fn dedicated(&self) -> bool {
        self.dedicated
    }
    /// `VkMemoryRequirements::alignment`.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// Offset of the image in its memory (always 0: one image per allocation).
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Row pitch of level 0, layer 0 for linear images (0 for optimal tiling).
    pub fn row_pitch(&self) -> u64 {
        self.row_pitch
    }
    /// Layer pitch for linear images (0 for optimal tiling).
    pub fn array_pitch(&self) -> u64 {
        self.array_pitch
    }
    /// The exporter's `deviceUUID`.
    pub fn device_uuid(&self) -> DeviceUuid {
        self.device_uuid
    }
    /// The exporter's `driverUUID`.
    pub fn driver_uuid(&self) -> DriverUuid {
        self.driver_uuid
    }
    /// Whether the image is cube-compatible.
    pub fn is_cube(&self) -> bool {
        self.flags.contains(vk::ImageCreateFlags::CUBE_COMPATIBLE)
    }
    /// Bytes per texel of the record's format.
    pub fn texel_bytes(&self) -> u32 {
        format::describe(self.format).map_or(0, |(_, channels, channel)| channels * channel.bytes())
    }

    /// Extent of mip `level` (`max(1, extent >> level)` per axis), or `None`
    /// for a level the image does not have.
    pub fn level_extent(&self, level: u32) -> Option<[u32; 3]> {
        (level < self.mip_levels).then(|| self.extent.map(|e| (e >> level).max(1)))
    }

    /// Bytes of one layer of `level`, tightly packed; `None` for a level the
    /// image does not have.
    pub fn level_bytes(&self, level: u32) -> Option<u64> {
        let e = self.level_extent(level)?;
        e.iter().try_fold(u64::from(self.texel_bytes()), |acc, &x| {
            acc.checked_mul(u64::from(x))
        })
    }

    /// The rules every image record satisfies; the decoder and the exporter
    /// both end with this check.
    pub(crate) fn validate(&self) -> Result<(), WireError> {
        let format = self.format.as_raw() as u32;
        check(
            "image.format",
            format.into(),
            format::describe(self.format).is_some(),
        )?;
        let ty = self.image_type.as_raw() as u32;
        check("image.image_type", ty.into(), ty == 1 || ty == 2)?;
        for (e, name) in self
            .extent
            .iter()
            .zip(["image.width", "image.height", "image.depth"])
        {
            check(name, (*e).into(), (1..=MAX_EXTENT).contains(e))?;
        }
        let max_levels = 32
            - self
                .extent
                .iter()
                .max()
                .copied()
                .unwrap_or(1)
                .leading_zeros();
        check(
            "image.mip_levels",
            self.mip_levels.into(),
            (1..=max_levels).contains(&self.mip_levels),
        )?;
        check(
            "image.array_layers",
            self.array_layers.into(),
            (1..=MAX_LAYERS).contains(&self.array_layers),
        )?;
        let flags = self.flags.as_raw();
        check(
            "image.flags",
            flags.into(),
            flags & !vk::ImageCreateFlags::CUBE_COMPATIBLE.as_raw() == 0,
        )?;
        let tiling = self.tiling.as_raw() as u32;
        check("image.tiling", tiling.into(), tiling <= 1)?;
        let usage = self.usage.as_raw();
        check(
            "image.usage",
            usage.into(),
            usage != 0 && usage & !KNOWN_IMAGE_USAGE == 0,
        )?;
        check(
            "image.allocation_size",
            self.allocation_size,
            (1..=MAX_ALLOCATION).contains(&self.allocation_size),
        )?;
        check(
            "image.memory_type_index",
            self.memory_type_index.into(),
            self.memory_type_index < vk::MAX_MEMORY_TYPES as u32,
        )?;
        check(
            "image.memory_flags",
            self.memory_flags.as_raw().into(),
            self.memory_flags.as_raw() & !KNOWN_MEMORY_FLAGS == 0,
        )?;
        check(
            "image.alignment",
            self.alignment,
            self.alignment.is_power_of_two(),
        )?;
        check("image.offset", self.offset, self.offset == 0)?;
        let linear = self.tiling == vk::ImageTiling::LINEAR;
        let row_bytes = u64::from(self.extent[0]) * u64::from(self.texel_bytes());
        check(
            "image.row_pitch",
            self.row_pitch,
            if linear {
                self.row_pitch >= row_bytes && self.row_pitch <= self.allocation_size
            } else {
                self.row_pitch == 0
            },
        )?;
        check(
            "image.array_pitch",
            self.array_pitch,
            self.array_pitch <= self.allocation_size && (linear || self.array_pitch == 0),
        )?;
        check(
            "image.array_layers",
            self.array_layers.into(),
            !self.is_cube()
                || (self.array_layers.is_multiple_of(6)
                    && self.extent[0] == self.extent[1]
                    && self.image_type == vk::ImageType::TYPE_2D),
        )?;
        let three_d = self.image_type == vk::ImageType::TYPE_3D;
        check(
            "image.depth",
            self.extent[2].into(),
            three_d || self.extent[2] == 1,
        )?;
        check(
            "image.array_layers",
            self.array_layers.into(),
            !three_d || self.array_layers == 1,
        )?;
        // Level 0 of every layer must fit: an allocation smaller than the
        // texels it holds is not this image's memory.
        let texels = self
            .level_bytes(0)
            .and_then(|b| b.checked_mul(u64::from(self.array_layers)));
        check(
            "image.allocation_size",
            self.allocation_size,
            texels.is_some_and(|t| t <= self.allocation_size),
        )?;
        Ok(())
    }

    /// Checks that this record describes an image of the given types, exactly
    /// (a memory class's required *and* excluded properties), and returns it
    /// typed.
    pub fn typed<F: Format, T: Tiling, M: MemoryLocation, U: Usage>(
        self,
    ) -> Result<ImageRecord<F, T, M, U>> {
        let mismatch = |what: &str, found: String, expected: String| {
            Err(Error::Record(format!(
                "the record's {what} is {found}, but the receiver expects {expected}"
            )))
        };
        if self.format != F::VK {
            let found = format::describe(self.format)
                .map_or(format!("{:?}", self.format), |d| d.0.to_string());
            return mismatch("format", found, F::NAME.to_string());
        }
        if self.tiling != T::VK {
            return mismatch(
                "tiling",
                format!("{:?}", self.tiling),
                format!("{:?}", T::VK),
            );
        }
        if self.usage != U::VK {
            return mismatch("usage", format!("{:?}", self.usage), format!("{:?}", U::VK));
        }
        if !M::admits(self.memory_flags) {
            return mismatch("memory", format!("{:?}", self.memory_flags), M::describe());
        }
        Ok(ImageRecord {
            info: self,
            _types: PhantomData,
        })
    }
}

/// Carries an image's type parameters without owning any of them.
pub(crate) type TypeMarkers<F, T, M, U> = PhantomData<fn() -> (F, T, M, U)>;

/// An [`ImageInfo`] known to describe an image of these types.
pub struct ImageRecord<F, T = Optimal, M = DeviceLocal, U = usage::Storage> {
    pub(crate) info: ImageInfo,
    pub(crate) _types: TypeMarkers<F, T, M, U>,
}

impl<F, T, M, U> Clone for ImageRecord<F, T, M, U> {
    fn clone(&self) -> Self {
        ImageRecord {
            info: self.info.clone(),
            _types: PhantomData,
        }
    }
}

impl<F, T, M, U> fmt::Debug for ImageRecord<F, T, M, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.info.fmt(f)
    }
}

impl<F, T, M, U> ImageRecord<F, T, M, U> {
    /// The plain record.
    pub fn info(&self) -> &ImageInfo {
        &self.info
    }
    /// The plain record, for sending.
    pub fn into_info(self) -> ImageInfo {
        self.info
    }
}

/// Usage of every exportable two-plane image: transfers (Vulkan fills and
/// reads each plane) and sampling. Drivers give these formats no storage
/// usage (NVIDIA: `VK_ERROR_FORMAT_NOT_SUPPORTED` with it).
pub const PLANAR_USAGE: vk::ImageUsageFlags = vk::ImageUsageFlags::from_raw(
    vk::ImageUsageFlags::TRANSFER_SRC.as_raw()
        | vk::ImageUsageFlags::TRANSFER_DST.as_raw()
        | vk::ImageUsageFlags::SAMPLED.as_raw(),
);

/// One plane's allocation in a [`PlanarImageInfo`]: what
/// `vkGetImageMemoryRequirements2` with `VkImagePlaneMemoryRequirementsInfo`
/// gave for the plane, and the memory type it was allocated from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaneMemory {
    /// `VkMemoryAllocateInfo::allocationSize` (= the plane's
    /// `VkMemoryRequirements::size`): the size CUDA imports for the plane.
    pub allocation_size: u64,
    /// `VkMemoryAllocateInfo::memoryTypeIndex`.
    pub memory_type_index: u32,
    /// That memory type's property flags.
    pub memory_flags: vk::MemoryPropertyFlags,
    /// The plane's `VkMemoryRequirements::alignment`.
    pub alignment: u64,
    /// Whether the allocation is dedicated: never, for a disjoint image
    /// (`VUID-VkMemoryDedicatedAllocateInfo-image-01797`); a record that says
    /// so is refused.
    pub dedicated: bool,
}

/// Everything an importer needs to know about an exported disjoint two-plane
/// 4:2:0 image (optimal tiling, 2D, one level, one layer,
/// `VK_IMAGE_CREATE_DISJOINT_BIT`, usage [`PLANAR_USAGE`]): its format and
/// extent, and each plane's allocation. Made only by an export (through
/// [`PlanarImageInfo::from_fields`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanarImageInfo {
    pub(crate) format: vk::Format,
    pub(crate) extent: [u32; 2],
    pub(crate) usage: vk::ImageUsageFlags,
    pub(crate) planes: [PlaneMemory; 2],
    pub(crate) device_uuid: DeviceUuid,
    pub(crate) driver_uuid: DriverUuid,
}

/// The fields of a [`PlanarImageInfo`], for [`PlanarImageInfo::from_fields`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(
    missing_docs,
    reason = "each field is the PlanarImageInfo accessor of the same name"
)]
pub struct PlanarImageFields {
    pub format: vk::Format,
    pub extent: [u32; 2],
    pub usage: vk::ImageUsageFlags,
    pub planes: [PlaneMemory; 2],
    pub device_uuid: DeviceUuid,
    pub driver_uuid: DriverUuid,
}

/// The field names of each plane's checks (plane 0, plane 1).
const PLANE_FIELDS: [[&str; 5]; 2] = [
    [
        "planar.plane0.allocation_size",
        "planar.plane0.memory_type_index",
        "planar.plane0.memory_flags",
        "planar.plane0.alignment",
        "planar.plane0.dedicated",
    ],
    [
        "planar.plane1.allocation_size",
        "planar.plane1.memory_type_index",
        "planar.plane1.memory_flags",
        "planar.plane1.alignment",
        "planar.plane1.dedicated",
    ],
];

impl PlanarImageInfo {
    /// A record from its fields, if they satisfy every shape rule.
    pub fn from_fields(f: PlanarImageFields) -> Result<PlanarImageInfo, WireError> {
        let info = PlanarImageInfo {
            format: f.format,
            extent: f.extent,
            usage: f.usage,
            planes: f.planes,
            device_uuid: f.device_uuid,
            driver_uuid: f.driver_uuid,
        };
        info.validate()?;
        Ok(info)
    }

    /// The multi-planar `VkFormat`.
    pub fn format(&self) -> vk::Format {
        self.format
    }
    /// Width and height of the image (plane 0), both even.
    pub fn extent(&self) -> [u32; 2] {
        self.extent
    }
    /// `VkImageCreateInfo::usage` ([`PLANAR_USAGE`]).
    pub fn usage(&self) -> vk::ImageUsageFlags {
        self.usage
    }
    /// `VkImageCreateInfo::flags`: always `VK_IMAGE_CREATE_DISJOINT_BIT`.
    pub fn flags(&self) -> vk::ImageCreateFlags {
        vk::ImageCreateFlags::DISJOINT
    }
    /// `VkImageCreateInfo::tiling`: always optimal.
    pub fn tiling(&self) -> vk::ImageTiling {
        vk::ImageTiling::OPTIMAL
    }
    /// The allocation of `plane`.
    pub fn plane(&self, plane: Plane) -> &PlaneMemory {
        &self.planes[plane.index()]
    }
    /// Width and height of `plane`.
    pub fn plane_extent(&self, plane: Plane) -> [u32; 2] {
        plane.extent(self.extent[0], self.extent[1])
    }
    /// The single-plane format `plane` is compatible with (its copies' and
    /// its CUDA array's format).
    pub fn plane_format(&self, plane: Plane) -> vk::Format {
        let (_, luma, chroma) =
            format::describe_planar(self.format).expect("a validated record has a planar format");
        match plane {
            Plane::Luma => luma,
            Plane::Chroma => chroma,
        }
    }
    /// Bytes of `plane`'s texels, tightly packed.
    pub fn plane_bytes(&self, plane: Plane) -> u64 {
        let [w, h] = self.plane_extent(plane);
        let texel = format::describe(self.plane_format(plane))
            .map_or(0, |(_, channels, channel)| channels * channel.bytes());
        u64::from(w) * u64::from(h) * u64::from(texel)
    }
    /// The exporter's `deviceUUID`.
    pub fn device_uuid(&self) -> DeviceUuid {
        self.device_uuid
    }
    /// The exporter's `driverUUID`.
    pub fn driver_uuid(&self) -> DriverUuid {
        self.driver_uuid
    }

    /// The rules every two-plane image record satisfies.
    pub(crate) fn validate(&self) -> Result<(), WireError> {
        let format = self.format.as_raw() as u32;
        check(
            "planar.format",
            format.into(),
            format::describe_planar(self.format).is_some(),
        )?;
        for (e, name) in self.extent.iter().zip(["planar.width", "planar.height"]) {
            // 4:2:0 subsampling: the chroma plane is half of each side.
            check(
                name,
                (*e).into(),
                (2..=MAX_EXTENT).contains(e) && e.is_multiple_of(2),
            )?;
        }
        check(
            "planar.usage",
            self.usage.as_raw().into(),
            self.usage == PLANAR_USAGE,
        )?;
        for plane in Plane::ALL {
            let m = &self.planes[plane.index()];
            let [size, index, flags, alignment, dedicated] = PLANE_FIELDS[plane.index()];
            // An allocation smaller than the plane's texels is not this
            // plane's memory.
            check(
                size,
                m.allocation_size,
                (1..=MAX_ALLOCATION).contains(&m.allocation_size)
                    && m.allocation_size >= self.plane_bytes(plane),
            )?;
            check(
                index,
                m.memory_type_index.into(),
                m.memory_type_index < vk::MAX_MEMORY_TYPES as u32,
            )?;
            check(
                flags,
                m.memory_flags.as_raw().into(),
                m.memory_flags.as_raw() & !KNOWN_MEMORY_FLAGS == 0,
            )?;
            check(alignment, m.alignment, m.alignment.is_power_of_two())?;
            check(dedicated, u64::from(m.dedicated), !m.dedicated)?;
        }
        Ok(())
    }

    /// Checks that this record describes an image of format `P` whose planes
    /// are both in memory of class `M` (exactly), and returns it typed.
    pub fn typed<P: PlanarFormat, M: MemoryLocation>(self) -> Result<PlanarImageRecord<P, M>> {
        if self.format != P::VK {
            let found = format::describe_planar(self.format)
                .map_or(format!("{:?}", self.format), |d| d.0.to_string());
            return Err(Error::Record(format!(
                "the record's format is {found}, but the receiver expects {}",
                P::NAME
            )));
        }
        for plane in Plane::ALL {
            let flags = self.planes[plane.index()].memory_flags;
            if !M::admits(flags) {
                return Err(Error::Record(format!(
                    "the record's {plane:?} plane is in {flags:?} memory, but the receiver expects {}",
                    M::describe()
                )));
            }
        }
        Ok(PlanarImageRecord {
            info: self,
            _types: PhantomData,
        })
    }
}

/// A [`PlanarImageInfo`] known to describe a two-plane image of format `P`
/// in memory `M`.
pub struct PlanarImageRecord<P, M = DeviceLocal> {
    pub(crate) info: PlanarImageInfo,
    pub(crate) _types: PhantomData<fn() -> (P, M)>,
}

impl<P, M> Clone for PlanarImageRecord<P, M> {
    fn clone(&self) -> Self {
        PlanarImageRecord {
            info: self.info.clone(),
            _types: PhantomData,
        }
    }
}

impl<P, M> fmt::Debug for PlanarImageRecord<P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.info.fmt(f)
    }
}

impl<P, M> PlanarImageRecord<P, M> {
    /// The plain record.
    pub fn info(&self) -> &PlanarImageInfo {
        &self.info
    }
    /// The plain record.
    pub fn into_info(self) -> PlanarImageInfo {
        self.info
    }
}

/// What an importer needs to know about an exported buffer. Made only by an
/// export or the wire decoder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferInfo {
    pub(crate) size: u64,
    pub(crate) usage: vk::BufferUsageFlags,
    pub(crate) allocation_size: u64,
    pub(crate) memory_type_index: u32,
    pub(crate) memory_flags: vk::MemoryPropertyFlags,
    pub(crate) dedicated: bool,
    pub(crate) alignment: u64,
    pub(crate) device_uuid: DeviceUuid,
    pub(crate) driver_uuid: DriverUuid,
}

/// The fields of a [`BufferInfo`], for [`BufferInfo::from_fields`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(
    missing_docs,
    reason = "each field is the BufferInfo accessor of the same name"
)]
pub struct BufferFields {
    pub size: u64,
    pub usage: vk::BufferUsageFlags,
    pub allocation_size: u64,
    pub memory_type_index: u32,
    pub memory_flags: vk::MemoryPropertyFlags,
    pub dedicated: bool,
    pub alignment: u64,
    pub device_uuid: DeviceUuid,
    pub driver_uuid: DriverUuid,
}

impl BufferInfo {
    /// A record from its fields, if they satisfy every rule.
    pub fn from_fields(f: BufferFields) -> Result<BufferInfo, WireError> {
        let info = BufferInfo {
            size: f.size,
            usage: f.usage,
            allocation_size: f.allocation_size,
            memory_type_index: f.memory_type_index,
            memory_flags: f.memory_flags,
            dedicated: f.dedicated,
            alignment: f.alignment,
            device_uuid: f.device_uuid,
            driver_uuid: f.driver_uuid,
        };
        info.validate()?;
        Ok(info)
    }

    /// `VkBufferCreateInfo::size`: the bytes the buffer covers.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// `VkBufferCreateInfo::usage`.
    pub fn usage(&self) -> vk::BufferUsageFlags {
        self.usage
    }
    /// `VkMemoryAllocateInfo::allocationSize` (at least `size`).
    pub fn allocation_size(&self) -> u64 {
        self.allocation_size
    }
    /// `VkMemoryAllocateInfo::memoryTypeIndex`.
    pub fn memory_type_index(&self) -> u32 {
        self.memory_type_index
    }
    /// That memory type's property flags.
    pub fn memory_flags(&self) -> vk::MemoryPropertyFlags {
        self.memory_flags
    }
    /// Whether the allocation is dedicated.
    pub fn dedicated(&self) -> bool {
        self.dedicated
    }
    /// `VkMemoryRequirements::alignment`.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// The exporter's `deviceUUID`.
    pub fn device_uuid(&self) -> DeviceUuid {
        self.device_uuid
    }
    /// The exporter's `driverUUID`.
    pub fn driver_uuid(&self) -> DriverUuid {
        self.driver_uuid
    }

    /// The rules every buffer record satisfies.
    pub(crate) fn validate(&self) -> Result<(), WireError> {
        check(
            "buffer.size",
            self.size,
            (1..=MAX_ALLOCATION).contains(&self.size),
        )?;
        let usage = self.usage.as_raw();
        check(
            "buffer.usage",
            usage.into(),
            usage != 0 && usage & !KNOWN_BUFFER_USAGE == 0,
        )?;
        check(
            "buffer.allocation_size",
            self.allocation_size,
            (self.size..=MAX_ALLOCATION).contains(&self.allocation_size),
        )?;
        check(
            "buffer.memory_type_index",
            self.memory_type_index.into(),
            self.memory_type_index < vk::MAX_MEMORY_TYPES as u32,
        )?;
        check(
            "buffer.memory_flags",
            self.memory_flags.as_raw().into(),
            self.memory_flags.as_raw() & !KNOWN_MEMORY_FLAGS == 0,
        )?;
        check(
            "buffer.alignment",
            self.alignment,
            self.alignment.is_power_of_two(),
        )?;
        Ok(())
    }

    /// Checks usage and the memory class exactly, and returns the record typed.
    pub fn typed<M: MemoryLocation>(self) -> Result<BufferRecord<M>> {
        if !M::admits(self.memory_flags) || self.usage != BUFFER_USAGE {
            return Err(Error::Record(format!(
                "the record describes a buffer with usage {:?} in {:?} memory; the receiver expects usage {:?} \
                 in {}",
                self.usage,
                self.memory_flags,
                BUFFER_USAGE,
                M::describe()
            )));
        }
        Ok(BufferRecord {
            info: self,
            _types: PhantomData,
        })
    }
}

/// A [`BufferInfo`] known to describe a buffer in memory `M`.
pub struct BufferRecord<M = DeviceLocal> {
    pub(crate) info: BufferInfo,
    pub(crate) _types: PhantomData<fn() -> M>,
}

impl<M> Clone for BufferRecord<M> {
    fn clone(&self) -> Self {
        BufferRecord {
            info: self.info.clone(),
            _types: PhantomData,
        }
    }
}

impl<M> fmt::Debug for BufferRecord<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.info.fmt(f)
    }
}

impl<M> BufferRecord<M> {
    /// The plain record.
    pub fn info(&self) -> &BufferInfo {
        &self.info
    }
    /// The plain record, for sending.
    pub fn into_info(self) -> BufferInfo {
        self.info
    }
}

/// What an importer needs to know about an exported semaphore. Made only by
/// an export or the wire decoder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemaphoreInfo {
    pub(crate) semaphore_type: vk::SemaphoreType,
    pub(crate) device_uuid: DeviceUuid,
    pub(crate) driver_uuid: DriverUuid,
}

impl SemaphoreInfo {
    /// A record of a semaphore of `semaphore_type` on the given device and
    /// driver, if the type is binary or timeline.
    pub fn new(
        semaphore_type: vk::SemaphoreType,
        device_uuid: DeviceUuid,
        driver_uuid: DriverUuid,
    ) -> Result<SemaphoreInfo, WireError> {
        let info = SemaphoreInfo {
            semaphore_type,
            device_uuid,
            driver_uuid,
        };
        info.validate()?;
        Ok(info)
    }

    /// Binary or timeline: decides the CUDA handle type.
    pub fn semaphore_type(&self) -> vk::SemaphoreType {
        self.semaphore_type
    }
    /// The exporter's `deviceUUID`.
    pub fn device_uuid(&self) -> DeviceUuid {
        self.device_uuid
    }
    /// The exporter's `driverUUID`.
    pub fn driver_uuid(&self) -> DriverUuid {
        self.driver_uuid
    }

    /// The rules every semaphore record satisfies.
    pub(crate) fn validate(&self) -> Result<(), WireError> {
        let ty = self.semaphore_type.as_raw() as u32;
        check("semaphore.type", ty.into(), ty <= 1)
    }

    /// Checks the kind and returns the record typed.
    pub fn typed<K: SemaphoreKind>(self) -> Result<SemaphoreRecord<K>> {
        if self.semaphore_type != K::VK {
            return Err(Error::Record(format!(
                "the record describes a {:?} semaphore; the receiver expects {:?}",
                self.semaphore_type,
                K::VK
            )));
        }
        Ok(SemaphoreRecord {
            info: self,
            _kind: PhantomData,
        })
    }
}

/// A [`SemaphoreInfo`] known to describe a semaphore of kind `K`.
pub struct SemaphoreRecord<K> {
    pub(crate) info: SemaphoreInfo,
    pub(crate) _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for SemaphoreRecord<K> {
    fn clone(&self) -> Self {
        SemaphoreRecord {
            info: self.info.clone(),
            _kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for SemaphoreRecord<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.info.fmt(f)
    }
}

impl<K: SemaphoreKind> SemaphoreRecord<K> {
    /// The record of a semaphore of kind `K` on the given device and driver
    /// (every kind is a valid record, so this cannot fail).
    pub fn of_kind(device_uuid: DeviceUuid, driver_uuid: DriverUuid) -> SemaphoreRecord<K> {
        SemaphoreRecord {
            info: SemaphoreInfo {
                semaphore_type: K::VK,
                device_uuid,
                driver_uuid,
            },
            _kind: PhantomData,
        }
    }
}

impl<K> SemaphoreRecord<K> {
    /// The plain record.
    pub fn info(&self) -> &SemaphoreInfo {
        &self.info
    }
    /// The plain record, for sending.
    pub fn into_info(self) -> SemaphoreInfo {
        self.info
    }
}

#[cfg(test)]
mod tests {
    //! One case per shape rule, each breaking only that rule, so that a rule
    //! deleted from `validate` fails its own case (issue 18 item 6).
    use super::*;

    fn image() -> ImageFields {
        ImageFields {
            format: vk::Format::R8G8B8A8_UNORM,
            image_type: vk::ImageType::TYPE_2D,
            extent: [64, 64, 1],
            mip_levels: 1,
            array_layers: 1,
            flags: vk::ImageCreateFlags::empty(),
            tiling: vk::ImageTiling::OPTIMAL,
            usage: vk::ImageUsageFlags::STORAGE,
            allocation_size: 64 * 64 * 4,
            memory_type_index: 0,
            memory_flags: vk::MemoryPropertyFlags::DEVICE_LOCAL,
            dedicated: true,
            alignment: 256,
            offset: 0,
            row_pitch: 0,
            array_pitch: 0,
            device_uuid: DeviceUuid::from_bytes([1; 16]),
            driver_uuid: DriverUuid::from_bytes([2; 16]),
        }
    }

    fn refused_field(f: ImageFields) -> &'static str {
        match ImageInfo::from_fields(f) {
            Err(WireError::InvalidValue { field, .. }) => field,
            other => panic!("expected an InvalidValue, got {other:?}"),
        }
    }

    #[test]
    fn the_sample_is_valid() {
        ImageInfo::from_fields(image()).unwrap();
        let cube = ImageFields {
            flags: vk::ImageCreateFlags::CUBE_COMPATIBLE,
            array_layers: 6,
            allocation_size: 6 * 64 * 64 * 4,
            ..image()
        };
        ImageInfo::from_fields(cube).unwrap();
    }

    #[test]
    fn each_image_rule_refuses_its_own_case() {
        let linear = |f: ImageFields| ImageFields {
            tiling: vk::ImageTiling::LINEAR,
            row_pitch: 256,
            ..f
        };
        let cases: Vec<(&str, ImageFields, &str)> = vec![
            (
                "a format outside the whitelist",
                ImageFields {
                    format: vk::Format::R8G8B8_UNORM,
                    ..image()
                },
                "image.format",
            ),
            (
                "a 1D image",
                ImageFields {
                    image_type: vk::ImageType::TYPE_1D,
                    ..image()
                },
                "image.image_type",
            ),
            (
                "a zero width",
                ImageFields {
                    extent: [0, 64, 1],
                    ..image()
                },
                "image.width",
            ),
            (
                "more levels than the extent has",
                ImageFields {
                    mip_levels: 8,
                    ..image()
                },
                "image.mip_levels",
            ),
            (
                "too many layers",
                ImageFields {
                    array_layers: MAX_LAYERS + 1,
                    allocation_size: MAX_ALLOCATION,
                    ..image()
                },
                "image.array_layers",
            ),
            (
                "an unknown create flag",
                ImageFields {
                    flags: vk::ImageCreateFlags::MUTABLE_FORMAT,
                    ..image()
                },
                "image.flags",
            ),
            (
                "an unknown tiling",
                ImageFields {
                    tiling: vk::ImageTiling::DRM_FORMAT_MODIFIER_EXT,
                    ..image()
                },
                "image.tiling",
            ),
            (
                "no usage",
                ImageFields {
                    usage: vk::ImageUsageFlags::empty(),
                    ..image()
                },
                "image.usage",
            ),
            (
                "an allocation over 1 TiB",
                ImageFields {
                    allocation_size: MAX_ALLOCATION + 1,
                    ..image()
                },
                "image.allocation_size",
            ),
            (
                "a memory type index past the last",
                ImageFields {
                    memory_type_index: vk::MAX_MEMORY_TYPES as u32,
                    ..image()
                },
                "image.memory_type_index",
            ),
            (
                "an unknown memory flag",
                ImageFields {
                    memory_flags: vk::MemoryPropertyFlags::from_raw(1 << 12),
                    ..image()
                },
                "image.memory_flags",
            ),
            (
                "an alignment that is not a power of two",
                ImageFields {
                    alignment: 3,
                    ..image()
                },
                "image.alignment",
            ),
            (
                "a non-zero offset",
                ImageFields {
                    offset: 4096,
                    ..image()
                },
                "image.offset",
            ),
            (
                "an optimal image with a row pitch",
                ImageFields {
                    row_pitch: 256,
                    ..image()
                },
                "image.row_pitch",
            ),
            (
                "a linear row pitch below the row",
                ImageFields {
                    row_pitch: 255,
                    ..linear(image())
                },
                "image.row_pitch",
            ),
            (
                "an optimal image with a layer pitch",
                ImageFields {
                    array_pitch: 4096,
                    ..image()
                },
                "image.array_pitch",
            ),
            (
                "a cube that is not square",
                ImageFields {
                    flags: vk::ImageCreateFlags::CUBE_COMPATIBLE,
                    extent: [64, 32, 1],
                    array_layers: 6,
                    allocation_size: 6 * 64 * 32 * 4,
                    ..image()
                },
                "image.array_layers",
            ),
            (
                "a cube of 5 layers",
                ImageFields {
                    flags: vk::ImageCreateFlags::CUBE_COMPATIBLE,
                    array_layers: 5,
                    allocation_size: 6 * 64 * 64 * 4,
                    ..image()
                },
                "image.array_layers",
            ),
            (
                "a 2D image with depth",
                ImageFields {
                    extent: [64, 64, 2],
                    allocation_size: 2 * 64 * 64 * 4,
                    ..image()
                },
                "image.depth",
            ),
            (
                "a 3D image with layers",
                ImageFields {
                    image_type: vk::ImageType::TYPE_3D,
                    extent: [64, 64, 2],
                    array_layers: 2,
                    allocation_size: 4 * 64 * 64 * 4,
                    ..image()
                },
                "image.array_layers",
            ),
            (
                "an allocation smaller than its texels",
                ImageFields {
                    allocation_size: 64 * 64 * 4 - 1,
                    ..image()
                },
                "image.allocation_size",
            ),
        ];
        for (what, fields, expected) in cases {
            assert_eq!(refused_field(fields), expected, "{what}");
        }
    }

    /// A multi-planar format is no single-plane image format: a record of
    /// one as an `ImageInfo` is refused (the disjoint `PlanarImageInfo` is
    /// its only record).
    #[test]
    fn a_multi_planar_format_is_refused_as_an_image_record() {
        for format in [
            vk::Format::G8_B8R8_2PLANE_420_UNORM,
            vk::Format::G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16,
        ] {
            let fields = ImageFields {
                format,
                usage: PLANAR_USAGE,
                allocation_size: 1 << 20,
                ..image()
            };
            assert_eq!(refused_field(fields), "image.format");
        }
    }

    fn plane(allocation_size: u64) -> PlaneMemory {
        PlaneMemory {
            allocation_size,
            memory_type_index: 1,
            memory_flags: vk::MemoryPropertyFlags::DEVICE_LOCAL,
            alignment: 65536,
            dedicated: false,
        }
    }

    /// The H100's 256x128 NV12 planes (run 23): exactly the texels.
    fn planar() -> PlanarImageFields {
        PlanarImageFields {
            format: vk::Format::G8_B8R8_2PLANE_420_UNORM,
            extent: [256, 128],
            usage: PLANAR_USAGE,
            planes: [plane(256 * 128), plane(128 * 64 * 2)],
            device_uuid: DeviceUuid::from_bytes([1; 16]),
            driver_uuid: DriverUuid::from_bytes([2; 16]),
        }
    }

    fn planar_refused_field(f: PlanarImageFields) -> &'static str {
        match PlanarImageInfo::from_fields(f) {
            Err(WireError::InvalidValue { field, .. }) => field,
            other => panic!("expected an InvalidValue, got {other:?}"),
        }
    }

    #[test]
    fn the_planar_samples_are_valid() {
        let nv12 = PlanarImageInfo::from_fields(planar()).unwrap();
        assert_eq!(nv12.plane_bytes(Plane::Luma), 256 * 128);
        assert_eq!(nv12.plane_bytes(Plane::Chroma), 128 * 64 * 2);
        assert_eq!(nv12.plane_format(Plane::Chroma), vk::Format::R8G8_UNORM);
        let p010 = PlanarImageFields {
            format: vk::Format::G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16,
            planes: [plane(256 * 128 * 2), plane(128 * 64 * 4)],
            ..planar()
        };
        let p010 = PlanarImageInfo::from_fields(p010).unwrap();
        assert_eq!(p010.plane_format(Plane::Luma), vk::Format::R16_UNORM);
        assert_eq!(p010.plane_bytes(Plane::Chroma), 128 * 64 * 4);
    }

    /// One case per rule of `PlanarImageInfo::validate`, each breaking only
    /// that rule: a hostile peer's record that lies in one field is refused
    /// by that field's rule (delete the rule and its case fails).
    #[test]
    fn each_planar_rule_refuses_its_own_case() {
        let with_plane = |i: usize, m: PlaneMemory| {
            let mut f = planar();
            f.planes[i] = m;
            f
        };
        let p010_sized_nv12 = || PlanarImageFields {
            format: vk::Format::G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16,
            ..planar()
        };
        let cases: Vec<(&str, PlanarImageFields, &str)> = vec![
            (
                "a single-plane format",
                PlanarImageFields {
                    format: vk::Format::R8_UNORM,
                    ..planar()
                },
                "planar.format",
            ),
            (
                "a three-plane format",
                PlanarImageFields {
                    format: vk::Format::G8_B8_R8_3PLANE_420_UNORM,
                    ..planar()
                },
                "planar.format",
            ),
            (
                "an odd width",
                PlanarImageFields {
                    extent: [255, 128],
                    ..planar()
                },
                "planar.width",
            ),
            (
                "a zero height",
                PlanarImageFields {
                    extent: [256, 0],
                    ..planar()
                },
                "planar.height",
            ),
            (
                "a side past the largest",
                PlanarImageFields {
                    extent: [256, MAX_EXTENT + 2],
                    ..planar()
                },
                "planar.height",
            ),
            (
                "storage usage",
                PlanarImageFields {
                    usage: PLANAR_USAGE | vk::ImageUsageFlags::STORAGE,
                    ..planar()
                },
                "planar.usage",
            ),
            (
                "a luma allocation smaller than its texels",
                with_plane(0, plane(256 * 128 - 1)),
                "planar.plane0.allocation_size",
            ),
            (
                "a chroma allocation smaller than its texels",
                with_plane(1, plane(128 * 64 * 2 - 1)),
                "planar.plane1.allocation_size",
            ),
            (
                "8-bit plane sizes under a 16-bit format",
                p010_sized_nv12(),
                "planar.plane0.allocation_size",
            ),
            (
                "an allocation over 1 TiB",
                with_plane(1, plane(MAX_ALLOCATION + 1)),
                "planar.plane1.allocation_size",
            ),
            (
                "a memory type index past the last",
                with_plane(
                    0,
                    PlaneMemory {
                        memory_type_index: vk::MAX_MEMORY_TYPES as u32,
                        ..plane(256 * 128)
                    },
                ),
                "planar.plane0.memory_type_index",
            ),
            (
                "an unknown memory flag",
                with_plane(
                    1,
                    PlaneMemory {
                        memory_flags: vk::MemoryPropertyFlags::from_raw(1 << 12),
                        ..plane(128 * 64 * 2)
                    },
                ),
                "planar.plane1.memory_flags",
            ),
            (
                "an alignment that is not a power of two",
                with_plane(
                    0,
                    PlaneMemory {
                        alignment: 3,
                        ..plane(256 * 128)
                    },
                ),
                "planar.plane0.alignment",
            ),
            (
                "a dedicated plane allocation",
                with_plane(
                    1,
                    PlaneMemory {
                        dedicated: true,
                        ..plane(128 * 64 * 2)
                    },
                ),
                "planar.plane1.dedicated",
            ),
        ];
        for (what, fields, expected) in cases {
            assert_eq!(planar_refused_field(fields), expected, "{what}");
        }
    }

    #[test]
    fn a_planar_record_is_typed_exactly() {
        use crate::format::{Nv12Planes, P010Planes};
        use crate::markers::HostVisible;
        let info = PlanarImageInfo::from_fields(planar()).unwrap();
        info.clone().typed::<Nv12Planes, DeviceLocal>().unwrap();
        let err = info.clone().typed::<P010Planes, DeviceLocal>().unwrap_err();
        assert!(
            err.to_string().contains("G8_B8R8_2PLANE_420_UNORM"),
            "{err}"
        );
        let err = info.typed::<Nv12Planes, HostVisible>().unwrap_err();
        assert!(err.to_string().contains("Luma plane"), "{err}");
        let mixed = PlanarImageFields {
            planes: [
                plane(256 * 128),
                PlaneMemory {
                    memory_flags: vk::MemoryPropertyFlags::DEVICE_LOCAL
                        | vk::MemoryPropertyFlags::HOST_VISIBLE,
                    ..plane(128 * 64 * 2)
                },
            ],
            ..planar()
        };
        let err = PlanarImageInfo::from_fields(mixed)
            .unwrap()
            .typed::<Nv12Planes, DeviceLocal>()
            .unwrap_err();
        assert!(err.to_string().contains("Chroma plane"), "{err}");
    }

    #[test]
    fn each_buffer_and_semaphore_rule_refuses_its_own_case() {
        let buffer = || BufferFields {
            size: 4096,
            usage: BUFFER_USAGE,
            allocation_size: 4096,
            memory_type_index: 0,
            memory_flags: vk::MemoryPropertyFlags::DEVICE_LOCAL,
            dedicated: false,
            alignment: 256,
            device_uuid: DeviceUuid::from_bytes([1; 16]),
            driver_uuid: DriverUuid::from_bytes([2; 16]),
        };
        BufferInfo::from_fields(buffer()).unwrap();
        let cases: Vec<(BufferFields, &str)> = vec![
            (
                BufferFields {
                    size: 0,
                    ..buffer()
                },
                "buffer.size",
            ),
            (
                BufferFields {
                    usage: vk::BufferUsageFlags::from_raw(1 << 20),
                    ..buffer()
                },
                "buffer.usage",
            ),
            (
                BufferFields {
                    allocation_size: 4095,
                    ..buffer()
                },
                "buffer.allocation_size",
            ),
            (
                BufferFields {
                    memory_type_index: 32,
                    ..buffer()
                },
                "buffer.memory_type_index",
            ),
            (
                BufferFields {
                    memory_flags: vk::MemoryPropertyFlags::from_raw(1 << 12),
                    ..buffer()
                },
                "buffer.memory_flags",
            ),
            (
                BufferFields {
                    alignment: 0,
                    ..buffer()
                },
                "buffer.alignment",
            ),
        ];
        for (fields, expected) in cases {
            match BufferInfo::from_fields(fields) {
                Err(WireError::InvalidValue { field, .. }) => assert_eq!(field, expected),
                other => panic!("{expected}: {other:?}"),
            }
        }
        assert!(matches!(
            SemaphoreInfo::new(
                vk::SemaphoreType::from_raw(2),
                DeviceUuid::from_bytes([1; 16]),
                DriverUuid::from_bytes([2; 16])
            ),
            Err(WireError::InvalidValue {
                field: "semaphore.type",
                ..
            })
        ));
    }
}
