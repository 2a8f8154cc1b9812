//! The versioned wire record sent with the fds of shared resources.
//!
//! A message is a fixed 16-byte header and a payload:
//!
//! ```text
//! header:  magic "CIVX" | version u16 | reserved u16 (0) | payload length u32 | CRC-32 of payload u32
//! payload: tag u64 | resource count u16 | resources…
//! ```
//!
//! All integers are little-endian. Resource `i` owns fd `i` of the message's
//! `SCM_RIGHTS` control data, so the fd count must equal the resource count.
//! A two-plane image is two resources, one per plane ([`Resource::PlanarPlane`],
//! plane 0 first), each with the image's whole record and its plane's fd;
//! [`Received::take_planar_image`] takes them only as such a pair.
//! [`Message::decode`] checks every field it can without a device (known
//! format, ranges, flags, booleans) and rejects the message whole on the first
//! problem; device-specific checks (UUIDs, memory types) happen at import.

use std::os::fd::OwnedFd;

use ash::vk;

use crate::error::Error;
pub use crate::error::WireError;
use crate::format::Format;
use crate::format::{PlanarFormat, Plane};
use crate::markers::SemaphoreKind;
use crate::markers::{MemoryLocation, Tiling, Usage};
use crate::received::{
    PeerCredentials, ReceivedBuffer, ReceivedImage, ReceivedPlanarImage, ReceivedSemaphore,
};
use crate::record::{BufferInfo, ImageInfo, PlanarImageInfo, PlaneMemory, SemaphoreInfo};

pub use crate::limits::{HEADER_LEN, MAGIC, MAX_MESSAGE_LEN, MAX_RESOURCES, VERSION};

const KIND_IMAGE: u8 = 1;
const KIND_BUFFER: u8 = 2;
const KIND_SEMAPHORE: u8 = 3;
const KIND_PLANAR_PLANE: u8 = 4;

/// One shared resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    /// An image's record.
    Image(ImageInfo),
    /// A buffer's record.
    Buffer(BufferInfo),
    /// A semaphore's record.
    Semaphore(SemaphoreInfo),
    /// One plane of a two-plane image: the image's record and which plane
    /// this resource's fd exports. A two-plane image travels as two of
    /// these, plane 0 then plane 1, with the same record.
    PlanarPlane(PlanarImageInfo, Plane),
}

impl Resource {
    fn kind_name(&self) -> &'static str {
        match self {
            Resource::Image(_) => "an image",
            Resource::Buffer(_) => "a buffer",
            Resource::Semaphore(_) => "a semaphore",
            Resource::PlanarPlane(..) => "a plane of a two-plane image",
        }
    }
}

/// A set of resources shared together (a frame's image and its semaphores, say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// An application value (a frame number, a stream id).
    pub tag: u64,
    /// The resources; resource `i` travels with fd `i`.
    pub resources: Vec<Resource>,
}

impl Message {
    /// Encodes header and payload.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        if self.resources.is_empty() || self.resources.len() > MAX_RESOURCES {
            return Err(WireError::ResourceCount(self.resources.len()));
        }
        let mut p = Vec::with_capacity(256);
        p.extend_from_slice(&self.tag.to_le_bytes());
        p.extend_from_slice(&(self.resources.len() as u16).to_le_bytes());
        for r in &self.resources {
            match r {
                Resource::Image(i) => {
                    p.push(KIND_IMAGE);
                    put32(&mut p, i.format.as_raw() as u32);
                    put32(&mut p, i.image_type.as_raw() as u32);
                    for e in i.extent {
                        put32(&mut p, e);
                    }
                    put32(&mut p, i.mip_levels);
                    put32(&mut p, i.array_layers);
                    put32(&mut p, i.flags.as_raw());
                    put32(&mut p, i.tiling.as_raw() as u32);
                    put32(&mut p, i.usage.as_raw());
                    put64(&mut p, i.allocation_size);
                    put32(&mut p, i.memory_type_index);
                    put32(&mut p, i.memory_flags.as_raw());
                    p.push(u8::from(i.dedicated));
                    put64(&mut p, i.alignment);
                    put64(&mut p, i.offset);
                    put64(&mut p, i.row_pitch);
                    put64(&mut p, i.array_pitch);
                    p.extend_from_slice(i.device_uuid.as_bytes());
                    p.extend_from_slice(i.driver_uuid.as_bytes());
                }
                Resource::Buffer(b) => {
                    p.push(KIND_BUFFER);
                    put64(&mut p, b.size);
                    put32(&mut p, b.usage.as_raw());
                    put64(&mut p, b.allocation_size);
                    put32(&mut p, b.memory_type_index);
                    put32(&mut p, b.memory_flags.as_raw());
                    p.push(u8::from(b.dedicated));
                    put64(&mut p, b.alignment);
                    p.extend_from_slice(b.device_uuid.as_bytes());
                    p.extend_from_slice(b.driver_uuid.as_bytes());
                }
                Resource::Semaphore(s) => {
                    p.push(KIND_SEMAPHORE);
                    put32(&mut p, s.semaphore_type.as_raw() as u32);
                    p.extend_from_slice(s.device_uuid.as_bytes());
                    p.extend_from_slice(s.driver_uuid.as_bytes());
                }
                Resource::PlanarPlane(i, plane) => {
                    p.push(KIND_PLANAR_PLANE);
                    p.push(plane.index() as u8);
                    put32(&mut p, i.format.as_raw() as u32);
                    put32(&mut p, i.extent[0]);
                    put32(&mut p, i.extent[1]);
                    put32(&mut p, i.usage.as_raw());
                    for m in &i.planes {
                        put64(&mut p, m.allocation_size);
                        put32(&mut p, m.memory_type_index);
                        put32(&mut p, m.memory_flags.as_raw());
                        put64(&mut p, m.alignment);
                        p.push(u8::from(m.dedicated));
                    }
                    p.extend_from_slice(i.device_uuid.as_bytes());
                    p.extend_from_slice(i.driver_uuid.as_bytes());
                }
            }
        }
        let mut out = Vec::with_capacity(HEADER_LEN + p.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&p).to_le_bytes());
        out.extend_from_slice(&p);
        if out.len() > MAX_MESSAGE_LEN {
            return Err(WireError::TooLarge(out.len()));
        }
        Ok(out)
    }

    /// Decodes and validates a message; never panics on any input.
    pub fn decode(bytes: &[u8]) -> Result<Message, WireError> {
        if bytes.len() > MAX_MESSAGE_LEN {
            return Err(WireError::TooLarge(bytes.len()));
        }
        if bytes.len() < HEADER_LEN {
            return Err(WireError::TooShort(bytes.len()));
        }
        if bytes[0..4] != MAGIC {
            return Err(WireError::BadMagic);
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != VERSION {
            return Err(WireError::UnsupportedVersion {
                found: version,
                supported: VERSION,
            });
        }
        let reserved = u16::from_le_bytes([bytes[6], bytes[7]]);
        if reserved != 0 {
            return Err(WireError::InvalidValue {
                field: "header.reserved",
                value: reserved.into(),
            });
        }
        let declared = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
        let expected = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        let payload = &bytes[HEADER_LEN..];
        if declared != payload.len() {
            return Err(WireError::LengthMismatch {
                declared,
                actual: payload.len(),
            });
        }
        let computed = crc32fast::hash(payload);
        if computed != expected {
            return Err(WireError::Checksum { expected, computed });
        }
        let mut r = Reader {
            buf: payload,
            pos: 0,
        };
        let tag = r.u64("tag")?;
        let count = r.u16("count")? as usize;
        if count == 0 || count > MAX_RESOURCES {
            return Err(WireError::ResourceCount(count));
        }
        let mut resources = Vec::with_capacity(count);
        for _ in 0..count {
            resources.push(match r.u8("kind")? {
                KIND_IMAGE => Resource::Image(decode_image(&mut r)?),
                KIND_BUFFER => Resource::Buffer(decode_buffer(&mut r)?),
                KIND_SEMAPHORE => Resource::Semaphore(decode_semaphore(&mut r)?),
                KIND_PLANAR_PLANE => {
                    let (info, plane) = decode_planar_plane(&mut r)?;
                    Resource::PlanarPlane(info, plane)
                }
                other => return Err(WireError::UnknownKind(other)),
            });
        }
        if r.pos != payload.len() {
            return Err(WireError::TrailingBytes(payload.len() - r.pos));
        }
        Ok(Message { tag, resources })
    }
}

fn put32(p: &mut Vec<u8>, v: u32) {
    p.extend_from_slice(&v.to_le_bytes());
}
fn put64(p: &mut Vec<u8>, v: u64) {
    p.extend_from_slice(&v.to_le_bytes());
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let end = self.pos.checked_add(N).filter(|&e| e <= self.buf.len());
        let end = end.ok_or(WireError::Truncated(field))?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..end]);
        self.pos = end;
        Ok(out)
    }
    fn u8(&mut self, f: &'static str) -> Result<u8, WireError> {
        Ok(self.take::<1>(f)?[0])
    }
    fn u16(&mut self, f: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take(f)?))
    }
    fn u32(&mut self, f: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(f)?))
    }
    fn u64(&mut self, f: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(f)?))
    }
    fn bool(&mut self, f: &'static str) -> Result<bool, WireError> {
        match self.u8(f)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(WireError::InvalidValue {
                field: f,
                value: v.into(),
            }),
        }
    }
    fn uuid(&mut self, f: &'static str) -> Result<[u8; 16], WireError> {
        self.take(f)
    }
}

fn decode_image(r: &mut Reader<'_>) -> Result<ImageInfo, WireError> {
    let format = vk::Format::from_raw(r.u32("image.format")? as i32);
    let image_type = vk::ImageType::from_raw(r.u32("image.image_type")? as i32);
    let extent = [
        r.u32("image.width")?,
        r.u32("image.height")?,
        r.u32("image.depth")?,
    ];
    let info = ImageInfo {
        format,
        image_type,
        extent,
        mip_levels: r.u32("image.mip_levels")?,
        array_layers: r.u32("image.array_layers")?,
        flags: vk::ImageCreateFlags::from_raw(r.u32("image.flags")?),
        tiling: vk::ImageTiling::from_raw(r.u32("image.tiling")? as i32),
        usage: vk::ImageUsageFlags::from_raw(r.u32("image.usage")?),
        allocation_size: r.u64("image.allocation_size")?,
        memory_type_index: r.u32("image.memory_type_index")?,
        memory_flags: vk::MemoryPropertyFlags::from_raw(r.u32("image.memory_flags")?),
        dedicated: r.bool("image.dedicated")?,
        alignment: r.u64("image.alignment")?,
        offset: r.u64("image.offset")?,
        row_pitch: r.u64("image.row_pitch")?,
        array_pitch: r.u64("image.array_pitch")?,
        device_uuid: r.uuid("image.device_uuid")?.into(),
        driver_uuid: r.uuid("image.driver_uuid")?.into(),
    };
    info.validate()?;
    Ok(info)
}

fn decode_buffer(r: &mut Reader<'_>) -> Result<BufferInfo, WireError> {
    let info = BufferInfo {
        size: r.u64("buffer.size")?,
        usage: vk::BufferUsageFlags::from_raw(r.u32("buffer.usage")?),
        allocation_size: r.u64("buffer.allocation_size")?,
        memory_type_index: r.u32("buffer.memory_type_index")?,
        memory_flags: vk::MemoryPropertyFlags::from_raw(r.u32("buffer.memory_flags")?),
        dedicated: r.bool("buffer.dedicated")?,
        alignment: r.u64("buffer.alignment")?,
        device_uuid: r.uuid("buffer.device_uuid")?.into(),
        driver_uuid: r.uuid("buffer.driver_uuid")?.into(),
    };
    info.validate()?;
    Ok(info)
}

fn decode_semaphore(r: &mut Reader<'_>) -> Result<SemaphoreInfo, WireError> {
    let info = SemaphoreInfo {
        semaphore_type: vk::SemaphoreType::from_raw(r.u32("semaphore.type")? as i32),
        device_uuid: r.uuid("semaphore.device_uuid")?.into(),
        driver_uuid: r.uuid("semaphore.driver_uuid")?.into(),
    };
    info.validate()?;
    Ok(info)
}

fn decode_planar_plane(r: &mut Reader<'_>) -> Result<(PlanarImageInfo, Plane), WireError> {
    let plane = match r.u8("planar.plane")? {
        0 => Plane::Luma,
        1 => Plane::Chroma,
        v => {
            return Err(WireError::InvalidValue {
                field: "planar.plane",
                value: v.into(),
            })
        }
    };
    let format = vk::Format::from_raw(r.u32("planar.format")? as i32);
    let extent = [r.u32("planar.width")?, r.u32("planar.height")?];
    let usage = vk::ImageUsageFlags::from_raw(r.u32("planar.usage")?);
    let mut plane_memory = || -> Result<PlaneMemory, WireError> {
        Ok(PlaneMemory {
            allocation_size: r.u64("planar.allocation_size")?,
            memory_type_index: r.u32("planar.memory_type_index")?,
            memory_flags: vk::MemoryPropertyFlags::from_raw(r.u32("planar.memory_flags")?),
            alignment: r.u64("planar.alignment")?,
            dedicated: r.bool("planar.dedicated")?,
        })
    };
    let planes = [plane_memory()?, plane_memory()?];
    let info = PlanarImageInfo {
        format,
        extent,
        usage,
        planes,
        device_uuid: r.uuid("planar.device_uuid")?.into(),
        driver_uuid: r.uuid("planar.driver_uuid")?.into(),
    };
    info.validate()?;
    Ok((info, plane))
}

/// A validated message with its fds, one per resource, from a checked peer.
/// Made only by the receive path; fds not taken are closed when this is
/// dropped.
#[derive(Debug)]
pub struct Received {
    /// The decoded message: private, so that no record can be swapped
    /// between receipt and the take that binds it to its fd.
    message: Message,
    fds: Vec<Option<OwnedFd>>,
    peer: PeerCredentials,
}

impl Received {
    /// Pairs a message with the fds that came with it; checks the count.
    pub(crate) fn new(
        message: Message,
        fds: Vec<OwnedFd>,
        peer: PeerCredentials,
    ) -> Result<Received, WireError> {
        if fds.len() != message.resources.len() {
            return Err(WireError::FdCount {
                expected: message.resources.len(),
                received: fds.len(),
            });
        }
        Ok(Received {
            message,
            fds: fds.into_iter().map(Some).collect(),
            peer,
        })
    }

    /// Who sent it.
    pub fn peer(&self) -> PeerCredentials {
        self.peer
    }

    /// The decoded message (read only).
    pub fn message(&self) -> &Message {
        &self.message
    }

    fn take(&mut self, index: usize, expected: &'static str) -> Result<(Resource, OwnedFd), Error> {
        let resource = self
            .message
            .resources
            .get(index)
            .ok_or(WireError::WrongResource {
                index,
                found: "absent",
                expected,
            })?;
        let fd =
            self.fds
                .get_mut(index)
                .and_then(Option::take)
                .ok_or(WireError::WrongResource {
                    index,
                    found: "already taken",
                    expected,
                })?;
        Ok((resource.clone(), fd))
    }

    /// Takes resource `index` with its fd if `typed` accepts it (`Err`: wrong
    /// kind, named; `Ok(Err)`: right kind, wrong types). On any refusal the fd stays
    /// in `self`, to be taken as what it is or closed with the message.
    fn take_typed<R>(
        &mut self,
        index: usize,
        expected: &'static str,
        typed: impl FnOnce(Resource) -> Result<Result<R, Error>, &'static str>,
    ) -> Result<(R, OwnedFd), Error> {
        let (resource, fd) = self.take(index, expected)?;
        let refused = match typed(resource) {
            Ok(Ok(record)) => return Ok((record, fd)),
            Ok(Err(e)) => e,
            Err(found) => WireError::WrongResource {
                index,
                found,
                expected,
            }
            .into(),
        };
        self.fds[index] = Some(fd);
        Err(refused)
    }

    /// Resource `index` as an image of these types, bound to its fd. On a
    /// type mismatch the fd stays in `self` (and is closed with it).
    pub fn take_image<F: Format, T: Tiling, M: MemoryLocation, U: Usage>(
        &mut self,
        index: usize,
    ) -> Result<ReceivedImage<F, T, M, U>, Error> {
        let peer = self.peer;
        self.take_typed(index, "an image", |r| match r {
            Resource::Image(info) => Ok(info.typed()),
            other => Err(other.kind_name()),
        })
        .map(|(record, fd)| ReceivedImage::new(record, fd, peer))
    }

    /// Resource `index` as a buffer in memory `M`, bound to its fd.
    pub fn take_buffer<M: MemoryLocation>(
        &mut self,
        index: usize,
    ) -> Result<ReceivedBuffer<M>, Error> {
        let peer = self.peer;
        self.take_typed(index, "a buffer", |r| match r {
            Resource::Buffer(info) => Ok(info.typed()),
            other => Err(other.kind_name()),
        })
        .map(|(record, fd)| ReceivedBuffer::new(record, fd, peer))
    }

    /// Resources `index` and `index + 1` as the two planes of a two-plane
    /// image of format `P` in memory `M`, bound to their fds: plane 0 then
    /// plane 1, with the same record (a pair that is not one image is
    /// refused). On any refusal both fds stay in `self`.
    pub fn take_planar_image<P: PlanarFormat, M: MemoryLocation>(
        &mut self,
        index: usize,
    ) -> Result<ReceivedPlanarImage<P, M>, Error> {
        const EXPECTED: &str = "the planes 0 and 1 of one two-plane image";
        let second = index.checked_add(1).ok_or(WireError::WrongResource {
            index,
            found: "absent",
            expected: EXPECTED,
        })?;
        let plane_of = |i: usize| match self.message.resources.get(i) {
            Some(Resource::PlanarPlane(info, plane)) => Ok((info, *plane)),
            Some(other) => Err(WireError::WrongResource {
                index: i,
                found: other.kind_name(),
                expected: EXPECTED,
            }),
            None => Err(WireError::WrongResource {
                index: i,
                found: "absent",
                expected: EXPECTED,
            }),
        };
        let (luma, luma_plane) = plane_of(index)?;
        let (chroma, chroma_plane) = plane_of(second)?;
        if luma_plane != Plane::Luma || chroma_plane != Plane::Chroma {
            return Err(WireError::WrongResource {
                index,
                found: "planes out of order (plane 1 first, or one plane twice)",
                expected: EXPECTED,
            }
            .into());
        }
        if luma != chroma {
            return Err(Error::Record(format!(
                "resources {index} and {second} are planes of two different images: their records differ"
            )));
        }
        let record = luma.clone().typed::<P, M>()?;
        let taken = |fds: &mut [Option<OwnedFd>], i: usize| {
            fds.get_mut(i)
                .and_then(Option::take)
                .ok_or(WireError::WrongResource {
                    index: i,
                    found: "already taken",
                    expected: EXPECTED,
                })
        };
        let luma_fd = taken(&mut self.fds, index)?;
        let chroma_fd = match taken(&mut self.fds, second) {
            Ok(fd) => fd,
            Err(e) => {
                self.fds[index] = Some(luma_fd);
                return Err(e.into());
            }
        };
        Ok(ReceivedPlanarImage::new(
            record,
            [luma_fd, chroma_fd],
            self.peer,
        ))
    }

    /// Resource `index` as a semaphore of kind `K`, bound to its fd.
    pub fn take_semaphore<K: SemaphoreKind>(
        &mut self,
        index: usize,
    ) -> Result<ReceivedSemaphore<K>, Error> {
        let peer = self.peer;
        self.take_typed(index, "a semaphore", |r| match r {
            Resource::Semaphore(info) => Ok(info.typed()),
            other => Err(other.kind_name()),
        })
        .map(|(record, fd)| ReceivedSemaphore::new(record, fd, peer))
    }
}

#[cfg(test)]
mod tests {
    //! The decoder on every prefix and every single-byte change of a
    //! message with a buffer record: each is refused or decodes to a message
    //! that re-encodes to exactly its bytes. Plain CPU work with no syscall,
    //! so that Miri can run it (`cargo +nightly miri test -p interop-share
    //! wire`): the unsafe-free decoder's bounds and arithmetic under Miri's
    //! UB checks (issue 22 item 3).
    use super::*;
    use crate::record::{BufferFields, BUFFER_USAGE};
    use crate::uuid::{DeviceUuid, DriverUuid};

    fn sample() -> Vec<u8> {
        let buffer = BufferInfo::from_fields(BufferFields {
            size: 1000,
            usage: BUFFER_USAGE,
            allocation_size: 4096,
            memory_type_index: 1,
            memory_flags: vk::MemoryPropertyFlags::DEVICE_LOCAL,
            dedicated: false,
            alignment: 256,
            device_uuid: DeviceUuid::from_bytes([7; 16]),
            driver_uuid: DriverUuid::from_bytes([8; 16]),
        })
        .unwrap();
        Message {
            tag: 77,
            resources: vec![Resource::Buffer(buffer)],
        }
        .encode()
        .unwrap()
    }

    fn planar_info(luma_size: u64) -> PlanarImageInfo {
        let plane = |size| PlaneMemory {
            allocation_size: size,
            memory_type_index: 1,
            memory_flags: vk::MemoryPropertyFlags::DEVICE_LOCAL,
            alignment: 65536,
            dedicated: false,
        };
        PlanarImageInfo::from_fields(crate::record::PlanarImageFields {
            format: vk::Format::G8_B8R8_2PLANE_420_UNORM,
            extent: [256, 128],
            usage: crate::record::PLANAR_USAGE,
            planes: [plane(luma_size), plane(65536)],
            device_uuid: DeviceUuid::from_bytes([7; 16]),
            driver_uuid: DriverUuid::from_bytes([8; 16]),
        })
        .unwrap()
    }

    /// A two-plane image as its two resources.
    fn planar_message() -> Message {
        let info = planar_info(65536);
        Message {
            tag: 78,
            resources: vec![
                Resource::PlanarPlane(info.clone(), Plane::Luma),
                Resource::PlanarPlane(info, Plane::Chroma),
            ],
        }
    }

    #[test]
    fn a_planar_pair_round_trips() {
        let message = planar_message();
        let bytes = message.encode().unwrap();
        assert_eq!(Message::decode(&bytes).unwrap(), message);
    }

    #[test]
    fn every_prefix_is_refused() {
        let planar = planar_message().encode().unwrap();
        Message::decode(&planar).unwrap();
        for cut in 0..planar.len() {
            assert!(Message::decode(&planar[..cut]).is_err(), "cut at {cut}");
        }
        let bytes = sample();
        Message::decode(&bytes).unwrap();
        for cut in 0..bytes.len() {
            assert!(Message::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    /// With the checksum fixed after each change, so that the field
    /// decoders behind it see every change too.
    #[test]
    fn every_single_byte_change_is_refused_or_round_trips() {
        for bytes in [sample(), planar_message().encode().unwrap()] {
            single_byte_changes(bytes);
        }
    }

    fn single_byte_changes(bytes: Vec<u8>) {
        let (mut decoded, mut refused) = (0, 0);
        for at in 0..bytes.len() {
            for value in [0u8, 1, 0x7f, 0x80, 0xff, bytes[at] ^ 1] {
                let mut changed = bytes.clone();
                changed[at] = value;
                if !(12..16).contains(&at) {
                    let crc = crc32fast::hash(&changed[HEADER_LEN..]);
                    changed[12..16].copy_from_slice(&crc.to_le_bytes());
                }
                match Message::decode(&changed) {
                    Ok(m) => {
                        assert_eq!(m.encode().unwrap(), changed, "byte {at} = {value:#x}");
                        decoded += 1;
                    }
                    Err(_) => refused += 1,
                }
            }
        }
        assert!(
            decoded > 0 && refused > 0,
            "{decoded} decoded, {refused} refused"
        );
    }

    /// The plane byte of a planar resource is 0 or 1, and the record's rules
    /// apply to it on the wire (an odd width is refused by its field).
    #[test]
    fn a_planar_plane_is_validated_on_the_wire() {
        let bytes = planar_message().encode().unwrap();
        // Header, tag (8), count (2), kind (1): the plane byte.
        let plane_at = HEADER_LEN + 8 + 2 + 1;
        let with = |at: usize, value: &[u8]| {
            let mut changed = bytes.clone();
            changed[at..at + value.len()].copy_from_slice(value);
            let crc = crc32fast::hash(&changed[HEADER_LEN..]);
            changed[12..16].copy_from_slice(&crc.to_le_bytes());
            Message::decode(&changed)
        };
        assert!(matches!(
            with(plane_at, &[2]),
            Err(WireError::InvalidValue {
                field: "planar.plane",
                value: 2
            })
        ));
        // plane, format (4), then the width.
        assert!(matches!(
            with(plane_at + 1 + 4, &255u32.to_le_bytes()),
            Err(WireError::InvalidValue {
                field: "planar.width",
                ..
            })
        ));
    }

    fn memfd() -> OwnedFd {
        rustix::fs::memfd_create("planar-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap()
    }

    fn received(resources: Vec<Resource>) -> Received {
        let fds = resources.iter().map(|_| memfd()).collect();
        let peer = PeerCredentials {
            pid: None,
            uid: 0,
            gid: 0,
        };
        Received::new(Message { tag: 1, resources }, fds, peer).unwrap()
    }

    /// A two-plane image is taken only as planes 0 and 1 of one record, in
    /// that order, each once; every refusal leaves both fds in the message
    /// (so a right take still works after a wrong one).
    #[test]
    fn a_planar_image_is_taken_only_as_its_two_planes() {
        use crate::format::{Nv12Planes, P010Planes};
        use crate::markers::DeviceLocal;
        use std::os::fd::AsRawFd;
        let info = planar_info(65536);
        let luma = Resource::PlanarPlane(info.clone(), Plane::Luma);
        let chroma = Resource::PlanarPlane(info.clone(), Plane::Chroma);

        let mut ok = received(vec![luma.clone(), chroma.clone()]);
        let raw = [
            ok.fds[0].as_ref().unwrap().as_raw_fd(),
            ok.fds[1].as_ref().unwrap().as_raw_fd(),
        ];
        // Another format or memory class: refused, fds stay.
        let err = ok
            .take_planar_image::<P010Planes, DeviceLocal>(0)
            .unwrap_err();
        assert!(err.to_string().contains("format"), "{err}");
        let image = ok.take_planar_image::<Nv12Planes, DeviceLocal>(0).unwrap();
        let (_, fds, _) = image.into_parts();
        assert_eq!(
            fds.each_ref().map(|f| f.as_raw_fd()),
            raw,
            "each plane's own fd"
        );
        let again = ok
            .take_planar_image::<Nv12Planes, DeviceLocal>(0)
            .unwrap_err();
        assert!(again.to_string().contains("already taken"), "{again}");

        let refused = |resources: Vec<Resource>, index: usize, needle: &str| {
            let mut r = received(resources);
            let err = r
                .take_planar_image::<Nv12Planes, DeviceLocal>(index)
                .unwrap_err();
            assert!(err.to_string().contains(needle), "{needle}: {err}");
            assert!(r.fds.iter().all(Option::is_some), "{needle}: the fds stay");
        };
        refused(vec![chroma.clone(), luma.clone()], 0, "out of order");
        refused(vec![luma.clone(), luma.clone()], 0, "out of order");
        refused(vec![luma.clone()], 0, "absent");
        refused(
            vec![luma.clone(), chroma.clone()],
            1,
            "resource 2 is absent",
        );
        let other = Resource::PlanarPlane(planar_info(2 * 65536), Plane::Chroma);
        refused(vec![luma.clone(), other], 0, "two different images");
        let buffer = Message::decode(&sample()).unwrap().resources.remove(0);
        refused(vec![luma, buffer], 0, "a buffer");
        refused(vec![chroma.clone(), chroma], usize::MAX, "absent");
    }
}
