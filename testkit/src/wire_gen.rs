//! Wire messages described field by field as raw integers, for generators:
//! the fuzzer in `fuzz/` (through [`arbitrary`]) and the stable proptest run
//! in `tests/tests/fuzz_corpus.rs`.
//!
//! # Contract
//!
//! * [`WireSpec::encode`] writes the layout `vk_export::wire` documents
//!   (header: magic, version, reserved 0, payload length, CRC-32 of the
//!   payload; payload: tag, count, then per resource a kind byte and its
//!   fields in the order of [`crate::tamper`]'s field tables), with a correct
//!   length and CRC unless the spec's [`Framing`] says otherwise. Every field
//!   is a raw integer, so any value, valid or not, reaches the decoder's
//!   per-field validators.
//! * [`from_fuzz_bytes`] is the one mapping from a fuzzer's input to wire
//!   bytes: the fuzz targets and the corpus replay test both use it, so a
//!   file in `fuzz/corpus/` means the same message everywhere.
//! * [`classify`] says which resource decoder an input reached, from the
//!   decode result alone (the library is not instrumented).
//! * [`receive`] is the one place the fuzz harness and the replay test call
//!   `Connection::recv`.

use std::fmt;
use std::os::fd::{AsFd, OwnedFd};

use arbitrary::{Arbitrary, Unstructured};
use vk_export::socket::Connection;
use vk_export::wire::{Message, Received, Resource, WireError, HEADER_LEN, MAGIC, VERSION};
use vk_export::{BufferInfo, ImageInfo, SemaphoreInfo};

/// A boolean byte as a generator draws it: 0 or 1 fifteen times in sixteen,
/// otherwise a byte from `0xf0..=0xff` (invalid). The decoder reads the
/// `dedicated` byte before it validates anything, so uniformly random bytes
/// there would stop 255 inputs in 256 before the per-field validators.
pub fn flag_byte(u: &mut Unstructured<'_>) -> arbitrary::Result<u8> {
    let b: u8 = u.arbitrary()?;
    Ok(if b & 0xf0 == 0xf0 { b } else { b & 1 })
}

/// An image record's fields, in wire order, as raw integers.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
#[allow(
    missing_docs,
    reason = "the fields are the wire fields of the same names"
)]
pub struct ImageSpec {
    pub format: u32,
    pub image_type: u32,
    pub width: u32,
    pub height: u32,
    pub depth: u32,
    pub mip_levels: u32,
    pub array_layers: u32,
    pub flags: u32,
    pub tiling: u32,
    pub usage: u32,
    pub allocation_size: u64,
    pub memory_type_index: u32,
    pub memory_flags: u32,
    /// 0 or 1 on a valid record; see [`flag_byte`].
    #[arbitrary(with = flag_byte)]
    pub dedicated: u8,
    pub alignment: u64,
    pub offset: u64,
    pub row_pitch: u64,
    pub array_pitch: u64,
    pub device_uuid: [u8; 16],
    pub driver_uuid: [u8; 16],
}

/// A buffer record's fields, in wire order, as raw integers.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
#[allow(
    missing_docs,
    reason = "the fields are the wire fields of the same names"
)]
pub struct BufferSpec {
    pub size: u64,
    pub usage: u32,
    pub allocation_size: u64,
    pub memory_type_index: u32,
    pub memory_flags: u32,
    /// 0 or 1 on a valid record; see [`flag_byte`].
    #[arbitrary(with = flag_byte)]
    pub dedicated: u8,
    pub alignment: u64,
    pub device_uuid: [u8; 16],
    pub driver_uuid: [u8; 16],
}

/// A semaphore record's fields, in wire order, as raw integers.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
#[allow(
    missing_docs,
    reason = "the fields are the wire fields of the same names"
)]
pub struct SemaphoreSpec {
    pub semaphore_type: u32,
    pub device_uuid: [u8; 16],
    pub driver_uuid: [u8; 16],
}

/// One resource of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResourceSpec {
    /// Kind 1 and an image's fields.
    Image(ImageSpec),
    /// Kind 2 and a buffer's fields.
    Buffer(BufferSpec),
    /// Kind 3 and a semaphore's fields.
    Semaphore(SemaphoreSpec),
    /// Any kind byte followed by any bytes.
    Raw {
        /// The kind byte.
        kind: u8,
        /// What follows it.
        body: Vec<u8>,
    },
}

impl<'a> Arbitrary<'a> for ResourceSpec {
    /// Images 11/32, buffers and semaphores 10/32 each, raw bytes 1/32 (under
    /// a known kind 15 times in 16). A choice byte of 0 (as when the input
    /// runs out) means an image.
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u.int_in_range(0u8..=31)? {
            0..=10 => ResourceSpec::Image(u.arbitrary()?),
            11..=20 => ResourceSpec::Buffer(u.arbitrary()?),
            21..=30 => ResourceSpec::Semaphore(u.arbitrary()?),
            _ => {
                let kind: u8 = u.arbitrary()?;
                ResourceSpec::Raw {
                    kind: if kind < 0xf0 { 1 + kind % 3 } else { kind },
                    body: u.arbitrary()?,
                }
            }
        })
    }
}

/// How the message is framed: correctly, or broken in one stated way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Correct count, length and CRC.
    Exact,
    /// The count field holds this instead of the number of resources.
    Count(u16),
    /// These bytes follow the last resource (length and CRC cover them).
    Trailing(Vec<u8>),
    /// The payload is cut to this many bytes (length and CRC fixed).
    Cut(u16),
    /// The header's CRC is xor'ed with this.
    Crc(u32),
    /// The header's length field has this added (wrapping).
    Length(u32),
    /// The header's first 8 bytes (magic, version, reserved) are these.
    Header([u8; 8]),
}

impl<'a> Arbitrary<'a> for Framing {
    /// Exact 26/32 (and when the input runs out); each way of breaking it 1/32.
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u.int_in_range(0u8..=31)? {
            26 => Framing::Count(u.arbitrary()?),
            27 => Framing::Trailing(u.arbitrary()?),
            28 => Framing::Cut(u.arbitrary()?),
            29 => Framing::Crc(u.arbitrary()?),
            30 => Framing::Length(u.arbitrary()?),
            31 => Framing::Header(u.arbitrary()?),
            _ => Framing::Exact,
        })
    }
}

/// A message: tag, 1 to 16 resources, framing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireSpec {
    /// The tag.
    pub tag: u64,
    /// 1 to [`vk_export::wire::MAX_RESOURCES`] resources.
    pub resources: Vec<ResourceSpec>,
    /// How the header and count are written.
    pub framing: Framing,
}

impl<'a> Arbitrary<'a> for WireSpec {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let tag = u.arbitrary()?;
        let framing = u.arbitrary()?;
        let mut resources = vec![u.arbitrary()?];
        for more in u.arbitrary_iter::<ResourceSpec>()? {
            if resources.len() == vk_export::wire::MAX_RESOURCES {
                break;
            }
            resources.push(more?);
        }
        Ok(WireSpec {
            tag,
            resources,
            framing,
        })
    }
}

fn put32(p: &mut Vec<u8>, v: u32) {
    p.extend_from_slice(&v.to_le_bytes());
}
fn put64(p: &mut Vec<u8>, v: u64) {
    p.extend_from_slice(&v.to_le_bytes());
}

impl ResourceSpec {
    fn encode(&self, p: &mut Vec<u8>) {
        match self {
            ResourceSpec::Image(i) => {
                p.push(1);
                for v in [
                    i.format,
                    i.image_type,
                    i.width,
                    i.height,
                    i.depth,
                    i.mip_levels,
                    i.array_layers,
                    i.flags,
                    i.tiling,
                    i.usage,
                ] {
                    put32(p, v);
                }
                put64(p, i.allocation_size);
                put32(p, i.memory_type_index);
                put32(p, i.memory_flags);
                p.push(i.dedicated);
                for v in [i.alignment, i.offset, i.row_pitch, i.array_pitch] {
                    put64(p, v);
                }
                p.extend_from_slice(&i.device_uuid);
                p.extend_from_slice(&i.driver_uuid);
            }
            ResourceSpec::Buffer(b) => {
                p.push(2);
                put64(p, b.size);
                put32(p, b.usage);
                put64(p, b.allocation_size);
                put32(p, b.memory_type_index);
                put32(p, b.memory_flags);
                p.push(b.dedicated);
                put64(p, b.alignment);
                p.extend_from_slice(&b.device_uuid);
                p.extend_from_slice(&b.driver_uuid);
            }
            ResourceSpec::Semaphore(s) => {
                p.push(3);
                put32(p, s.semaphore_type);
                p.extend_from_slice(&s.device_uuid);
                p.extend_from_slice(&s.driver_uuid);
            }
            ResourceSpec::Raw { kind, body } => {
                p.push(*kind);
                p.extend_from_slice(body);
            }
        }
    }
}

impl WireSpec {
    /// Header and payload, framed as [`WireSpec::framing`] says.
    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(16 + self.resources.len() * 128);
        put64(&mut p, self.tag);
        let count = match self.framing {
            Framing::Count(c) => c,
            _ => self.resources.len() as u16,
        };
        p.extend_from_slice(&count.to_le_bytes());
        for r in &self.resources {
            r.encode(&mut p);
        }
        match &self.framing {
            Framing::Trailing(extra) => p.extend_from_slice(extra),
            Framing::Cut(n) => p.truncate(usize::from(*n)),
            _ => {}
        }
        let mut length = p.len() as u32;
        let mut crc = crc32fast::hash(&p);
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&MAGIC);
        head[4..6].copy_from_slice(&VERSION.to_le_bytes());
        match self.framing {
            Framing::Crc(x) => crc ^= x,
            Framing::Length(d) => length = length.wrapping_add(d),
            Framing::Header(h) => head = h,
            _ => {}
        }
        let mut out = Vec::with_capacity(HEADER_LEN + p.len());
        out.extend_from_slice(&head);
        put32(&mut out, length);
        put32(&mut out, crc);
        out.extend_from_slice(&p);
        out
    }

    /// Whether the decoder must reject this message whatever its fields hold:
    /// the framing is broken in a way a valid message cannot be, and no
    /// [`ResourceSpec::Raw`] makes the resource boundaries unknowable.
    pub fn must_be_rejected(&self) -> bool {
        if self
            .resources
            .iter()
            .any(|r| matches!(r, ResourceSpec::Raw { .. }))
        {
            return false;
        }
        let full = 8
            + 2
            + self
                .resources
                .iter()
                .map(ResourceSpec::wire_len)
                .sum::<usize>();
        match &self.framing {
            Framing::Exact => false,
            Framing::Count(c) => usize::from(*c) != self.resources.len(),
            Framing::Trailing(extra) => !extra.is_empty(),
            Framing::Cut(n) => usize::from(*n) < full,
            Framing::Crc(x) => *x != 0,
            Framing::Length(d) => *d != 0,
            Framing::Header(h) => {
                h[..4] != MAGIC || h[4..6] != VERSION.to_le_bytes() || h[6..8] != [0, 0]
            }
        }
    }
}

impl ResourceSpec {
    /// Encoded size, kind byte included.
    pub fn wire_len(&self) -> usize {
        match self {
            ResourceSpec::Image(_) => 1 + 121,
            ResourceSpec::Buffer(_) => 1 + 69,
            ResourceSpec::Semaphore(_) => 1 + 36,
            ResourceSpec::Raw { body, .. } => 1 + body.len(),
        }
    }
}

impl ImageSpec {
    /// Number of wire fields.
    pub const FIELDS: usize = 20;

    /// Overwrites wire field `index % FIELDS` with `value`, cut to its width
    /// (a UUID gets it in its first 8 bytes).
    pub fn set_field(&mut self, index: usize, value: u64) {
        let v32 = value as u32;
        match index % Self::FIELDS {
            0 => self.format = v32,
            1 => self.image_type = v32,
            2 => self.width = v32,
            3 => self.height = v32,
            4 => self.depth = v32,
            5 => self.mip_levels = v32,
            6 => self.array_layers = v32,
            7 => self.flags = v32,
            8 => self.tiling = v32,
            9 => self.usage = v32,
            10 => self.allocation_size = value,
            11 => self.memory_type_index = v32,
            12 => self.memory_flags = v32,
            13 => self.dedicated = value as u8,
            14 => self.alignment = value,
            15 => self.offset = value,
            16 => self.row_pitch = value,
            17 => self.array_pitch = value,
            18 => self.device_uuid[..8].copy_from_slice(&value.to_le_bytes()),
            _ => self.driver_uuid[..8].copy_from_slice(&value.to_le_bytes()),
        }
    }
}

impl BufferSpec {
    /// Number of wire fields.
    pub const FIELDS: usize = 9;

    /// Overwrites wire field `index % FIELDS` with `value`, cut to its width.
    pub fn set_field(&mut self, index: usize, value: u64) {
        let v32 = value as u32;
        match index % Self::FIELDS {
            0 => self.size = value,
            1 => self.usage = v32,
            2 => self.allocation_size = value,
            3 => self.memory_type_index = v32,
            4 => self.memory_flags = v32,
            5 => self.dedicated = value as u8,
            6 => self.alignment = value,
            7 => self.device_uuid[..8].copy_from_slice(&value.to_le_bytes()),
            _ => self.driver_uuid[..8].copy_from_slice(&value.to_le_bytes()),
        }
    }
}

impl SemaphoreSpec {
    /// Number of wire fields.
    pub const FIELDS: usize = 3;

    /// Overwrites wire field `index % FIELDS` with `value`, cut to its width.
    pub fn set_field(&mut self, index: usize, value: u64) {
        match index % Self::FIELDS {
            0 => self.semaphore_type = value as u32,
            1 => self.device_uuid[..8].copy_from_slice(&value.to_le_bytes()),
            _ => self.driver_uuid[..8].copy_from_slice(&value.to_le_bytes()),
        }
    }
}

impl ResourceSpec {
    /// [`ImageSpec::set_field`] and friends; a raw resource gets `value`'s
    /// low byte at `index` of its body, if it is that long.
    pub fn set_field(&mut self, index: usize, value: u64) {
        match self {
            ResourceSpec::Image(i) => i.set_field(index, value),
            ResourceSpec::Buffer(b) => b.set_field(index, value),
            ResourceSpec::Semaphore(s) => s.set_field(index, value),
            ResourceSpec::Raw { body, .. } => {
                if let Some(b) = body.get_mut(index) {
                    *b = value as u8;
                }
            }
        }
    }
}

impl From<&ImageInfo> for ImageSpec {
    fn from(i: &ImageInfo) -> ImageSpec {
        let [width, height, depth] = i.extent();
        ImageSpec {
            format: i.format().as_raw() as u32,
            image_type: i.image_type().as_raw() as u32,
            width,
            height,
            depth,
            mip_levels: i.mip_levels(),
            array_layers: i.array_layers(),
            flags: i.flags().as_raw(),
            tiling: i.tiling().as_raw() as u32,
            usage: i.usage().as_raw(),
            allocation_size: i.allocation_size(),
            memory_type_index: i.memory_type_index(),
            memory_flags: i.memory_flags().as_raw(),
            dedicated: u8::from(i.dedicated()),
            alignment: i.alignment(),
            offset: i.offset(),
            row_pitch: i.row_pitch(),
            array_pitch: i.array_pitch(),
            device_uuid: i.device_uuid().into(),
            driver_uuid: i.driver_uuid().into(),
        }
    }
}

impl From<&BufferInfo> for BufferSpec {
    fn from(b: &BufferInfo) -> BufferSpec {
        BufferSpec {
            size: b.size(),
            usage: b.usage().as_raw(),
            allocation_size: b.allocation_size(),
            memory_type_index: b.memory_type_index(),
            memory_flags: b.memory_flags().as_raw(),
            dedicated: u8::from(b.dedicated()),
            alignment: b.alignment(),
            device_uuid: b.device_uuid().into(),
            driver_uuid: b.driver_uuid().into(),
        }
    }
}

impl From<&SemaphoreInfo> for SemaphoreSpec {
    fn from(s: &SemaphoreInfo) -> SemaphoreSpec {
        SemaphoreSpec {
            semaphore_type: s.semaphore_type().as_raw() as u32,
            device_uuid: s.device_uuid().into(),
            driver_uuid: s.driver_uuid().into(),
        }
    }
}

impl From<&Message> for WireSpec {
    /// The spec that encodes exactly as `Message::encode` does.
    fn from(m: &Message) -> WireSpec {
        WireSpec {
            tag: m.tag,
            resources: m
                .resources
                .iter()
                .map(|r| match r {
                    Resource::Image(i) => ResourceSpec::Image(i.into()),
                    Resource::Buffer(b) => ResourceSpec::Buffer(b.into()),
                    Resource::Semaphore(s) => ResourceSpec::Semaphore(s.into()),
                    // A plane of a two-plane image has no field spec here
                    // (the generators draw the first three kinds): its
                    // encoded bytes, as a raw resource of its kind.
                    Resource::PlanarPlane(..) => planar_plane_raw(r),
                })
                .collect(),
            framing: Framing::Exact,
        }
    }
}

/// A plane resource of a two-plane image as a [`ResourceSpec::Raw`]: its
/// kind byte and the bytes `Message::encode` writes after it.
fn planar_plane_raw(r: &Resource) -> ResourceSpec {
    let bytes = Message {
        tag: 0,
        resources: vec![r.clone()],
    }
    .encode()
    .expect("a decoded resource encodes");
    // Header, then tag (8 bytes) and count (2), then the kind byte.
    let kind_at = HEADER_LEN + 8 + 2;
    ResourceSpec::Raw {
        kind: bytes[kind_at],
        body: bytes[kind_at + 1..].to_vec(),
    }
}

impl ResourceSpec {
    /// The bytes [`ResourceSpec`]'s `Arbitrary` reads back as this resource;
    /// `None` for a raw one (its length is drawn from the end of the input).
    fn to_fuzz_bytes(&self, out: &mut Vec<u8>) -> Option<()> {
        match self {
            ResourceSpec::Image(i) => {
                out.push(0);
                for v in [
                    i.format,
                    i.image_type,
                    i.width,
                    i.height,
                    i.depth,
                    i.mip_levels,
                    i.array_layers,
                    i.flags,
                    i.tiling,
                    i.usage,
                ] {
                    put32(out, v);
                }
                put64(out, i.allocation_size);
                put32(out, i.memory_type_index);
                put32(out, i.memory_flags);
                out.push(flag_byte_for(i.dedicated));
                for v in [i.alignment, i.offset, i.row_pitch, i.array_pitch] {
                    put64(out, v);
                }
                out.extend_from_slice(&i.device_uuid);
                out.extend_from_slice(&i.driver_uuid);
            }
            ResourceSpec::Buffer(b) => {
                out.push(11);
                put64(out, b.size);
                put32(out, b.usage);
                put64(out, b.allocation_size);
                put32(out, b.memory_type_index);
                put32(out, b.memory_flags);
                out.push(flag_byte_for(b.dedicated));
                put64(out, b.alignment);
                out.extend_from_slice(&b.device_uuid);
                out.extend_from_slice(&b.driver_uuid);
            }
            ResourceSpec::Semaphore(s) => {
                out.push(21);
                put32(out, s.semaphore_type);
                out.extend_from_slice(&s.device_uuid);
                out.extend_from_slice(&s.driver_uuid);
            }
            ResourceSpec::Raw { .. } => return None,
        }
        Some(())
    }
}

/// The byte [`flag_byte`] reads as `value` (values 2 to 0xef it cannot make
/// come out as 0 or 1).
fn flag_byte_for(value: u8) -> u8 {
    if value >= 0xf0 {
        value
    } else {
        value & 1
    }
}

impl WireSpec {
    /// The fuzzer input that [`FuzzInput::new`] reads back as this spec, to
    /// seed a corpus with valid messages; `None` when the spec has a raw
    /// resource or trailing bytes (lengths are drawn from the end of the
    /// input), more than 16 resources, or a `dedicated` byte from 2 to 0xef.
    pub fn to_fuzz_bytes(&self) -> Option<Vec<u8>> {
        let mut out = vec![0u8]; // structured
        put64(&mut out, self.tag);
        match self.framing {
            Framing::Exact => out.push(0),
            Framing::Count(c) => {
                out.push(26);
                out.extend_from_slice(&c.to_le_bytes());
            }
            Framing::Trailing(_) => return None,
            Framing::Cut(n) => {
                out.push(28);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Framing::Crc(x) => {
                out.push(29);
                put32(&mut out, x);
            }
            Framing::Length(d) => {
                out.push(30);
                put32(&mut out, d);
            }
            Framing::Header(h) => {
                out.push(31);
                out.extend_from_slice(&h);
            }
        }
        let (first, rest) = self.resources.split_first()?;
        if rest.len() >= vk_export::wire::MAX_RESOURCES {
            return None;
        }
        first.to_fuzz_bytes(&mut out)?;
        for r in rest {
            out.push(1); // one more
            r.to_fuzz_bytes(&mut out)?;
        }
        out.push(0); // no more
        let back = FuzzInput::new(&out).spec;
        (back.as_ref() == Some(self)).then_some(out)
    }
}

impl ReceiveCase {
    /// The fuzzer input that [`ReceiveCase::from_fuzz_bytes`] reads back as
    /// these fds and takes and `spec`'s bytes (see [`WireSpec::to_fuzz_bytes`]);
    /// `None` for more than 3 fds or 4 takes.
    pub fn seed(fds: &[FdKind], takes: &[Take], spec: &WireSpec) -> Option<Vec<u8>> {
        if fds.len() > 3 || takes.len() > 4 {
            return None;
        }
        // A derived enum's variant i of n is read from a u32 as (v * n) >> 32.
        let variant = |i: u32, n: u64| ((u64::from(i) << 32).div_ceil(n)) as u32;
        let mut out = vec![fds.len() as u8];
        for &f in fds {
            put32(&mut out, variant(f as u32, 4));
        }
        out.push(takes.len() as u8);
        for &t in takes {
            put32(&mut out, variant(t as u32, 4));
        }
        out.extend_from_slice(&spec.to_fuzz_bytes()?);
        let back = ReceiveCase::from_fuzz_bytes(&out);
        (back.fds == fds && back.takes == takes && back.bytes == spec.encode()).then_some(out)
    }
}

/// A fuzzer's input, read: the wire bytes, and the spec they were encoded
/// from when the input is structured.
#[derive(Clone, Debug)]
pub struct FuzzInput {
    /// What is decoded or sent.
    pub bytes: Vec<u8>,
    /// The spec, or `None` for unstructured bytes.
    pub spec: Option<WireSpec>,
}

impl FuzzInput {
    /// Reads a fuzzer's input: if the first byte is 7 mod 8 (one input in
    /// eight), the rest as they are (unstructured); otherwise the rest read
    /// as a [`WireSpec`] through [`arbitrary`] and encoded.
    pub fn new(data: &[u8]) -> FuzzInput {
        let unstructured = |rest: &[u8]| FuzzInput {
            bytes: rest.to_vec(),
            spec: None,
        };
        match data.split_first() {
            None => unstructured(data),
            Some((mode, rest)) if mode % 8 == 7 => unstructured(rest),
            Some((_, rest)) => match WireSpec::arbitrary_take_rest(Unstructured::new(rest)) {
                Ok(spec) => FuzzInput {
                    bytes: spec.encode(),
                    spec: Some(spec),
                },
                Err(_) => unstructured(rest),
            },
        }
    }
}

/// The wire bytes of a fuzzer's input (see [`FuzzInput::new`]).
pub fn from_fuzz_bytes(data: &[u8]) -> Vec<u8> {
    FuzzInput::new(data).bytes
}

/// The property every input must satisfy: decoding does not panic, and what
/// decodes re-encodes to exactly the same bytes. Returns the decode result.
pub fn check_decode(bytes: &[u8]) -> Result<Message, WireError> {
    let decoded = Message::decode(bytes);
    if let Ok(message) = &decoded {
        let again = message.encode().expect("a decoded message encodes");
        assert!(
            again == bytes,
            "decode then encode changed the bytes:\n  in:  {bytes:02x?}\n  out: {again:02x?}"
        );
    }
    decoded
}

/// [`check_decode`] on a fuzzer's input, plus: a structured input whose
/// framing is broken (see [`WireSpec::must_be_rejected`]) is rejected.
pub fn decode_case(data: &[u8]) -> Result<Message, WireError> {
    let input = FuzzInput::new(data);
    let decoded = check_decode(&input.bytes);
    if let Some(spec) = &input.spec {
        assert!(
            !(decoded.is_ok() && spec.must_be_rejected()),
            "a message with broken framing was accepted: {spec:?}"
        );
    }
    decoded
}

/// A resource decoder of `vk_export::wire`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoder {
    /// `decode_image` (fields `image.*`).
    Image,
    /// `decode_buffer` (fields `buffer.*`).
    Buffer,
    /// `decode_semaphore` (fields `semaphore.*`).
    Semaphore,
}

impl Decoder {
    /// All three, in wire kind order.
    pub const ALL: [Decoder; 3] = [Decoder::Image, Decoder::Buffer, Decoder::Semaphore];

    fn of_field(field: &str) -> Option<Decoder> {
        let prefix = field.split('.').next()?;
        Decoder::ALL.into_iter().find(|d| d.prefix() == prefix)
    }

    /// The field-name prefix of its errors.
    pub fn prefix(self) -> &'static str {
        match self {
            Decoder::Image => "image",
            Decoder::Buffer => "buffer",
            Decoder::Semaphore => "semaphore",
        }
    }
}

/// What became of one input, from its decode result alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Decoded; which decoders it went through.
    Decoded([bool; 3]),
    /// A resource decoder rejected it (`InvalidValue` or `Truncated` of one
    /// of its fields).
    Rejected(Decoder, &'static str),
    /// Rejected before any resource: header, length, CRC, size.
    Header,
    /// Rejected in the payload outside the resource decoders: tag, count,
    /// kind, trailing bytes.
    Payload,
}

/// Classifies a decode result.
pub fn classify(result: &Result<Message, WireError>) -> Outcome {
    match result {
        Ok(m) => {
            let mut went = [false; 3];
            for r in &m.resources {
                let decoder = match r {
                    Resource::Image(_) => 0,
                    Resource::Buffer(_) => 1,
                    Resource::Semaphore(_) => 2,
                    // Not one of the three decoders the generators aim at
                    // (a kind-4 resource reached only through raw bytes).
                    Resource::PlanarPlane(..) => continue,
                };
                went[decoder] = true;
            }
            Outcome::Decoded(went)
        }
        Err(WireError::InvalidValue { field, .. } | WireError::Truncated(field)) => {
            match Decoder::of_field(field) {
                Some(d) => Outcome::Rejected(d, field),
                None if field.starts_with("header.") => Outcome::Header,
                None => Outcome::Payload,
            }
        }
        Err(
            WireError::TooShort(_)
            | WireError::BadMagic
            | WireError::UnsupportedVersion { .. }
            | WireError::LengthMismatch { .. }
            | WireError::TooLarge(_)
            | WireError::Checksum { .. },
        ) => Outcome::Header,
        Err(_) => Outcome::Payload,
    }
}

/// Counts of [`Outcome`]s over many inputs.
#[derive(Clone, Debug, Default)]
pub struct Reach {
    /// Inputs counted.
    pub inputs: u64,
    /// Inputs that decoded.
    pub decoded: u64,
    /// Inputs that reached each decoder (decoded through it, or rejected by it).
    pub reached: [u64; 3],
    /// Inputs that got through a decoder's reads to its validator
    /// (`validate()`): decoded through it, or rejected by it for a value
    /// other than the `dedicated` byte and not truncated.
    pub validated: [u64; 3],
    /// Inputs each decoder rejected.
    pub rejected: [u64; 3],
    /// Inputs rejected in the header (length, CRC, magic, version, size).
    pub header: u64,
    /// Inputs rejected in the payload outside the resource decoders.
    pub payload: u64,
    /// Rejections by field, to see which validators fire.
    pub fields: std::collections::BTreeMap<&'static str, u64>,
    /// Other rejections by error (variant name, or `Truncated(field)`).
    pub others: std::collections::BTreeMap<String, u64>,
}

impl Reach {
    /// Counts one decode result.
    pub fn add(&mut self, result: &Result<Message, WireError>) {
        self.inputs += 1;
        match classify(result) {
            Outcome::Decoded(went) => {
                self.decoded += 1;
                for (i, w) in went.into_iter().enumerate() {
                    self.reached[i] += u64::from(w);
                    self.validated[i] += u64::from(w);
                }
            }
            Outcome::Rejected(d, field) => {
                self.reached[d as usize] += 1;
                if !read_error(result) {
                    self.validated[d as usize] += 1;
                }
                self.rejected[d as usize] += 1;
                *self.fields.entry(field).or_default() += 1;
            }
            Outcome::Header => self.header += 1,
            Outcome::Payload => self.payload += 1,
        }
        if let Err(e) = result {
            if !matches!(classify(result), Outcome::Rejected(..)) {
                let name = match e {
                    WireError::Truncated(field) => format!("Truncated({field})"),
                    WireError::InvalidValue { field, .. } => field.to_string(),
                    other => {
                        let debug = format!("{other:?}");
                        debug
                            .split(|c: char| !c.is_alphanumeric())
                            .next()
                            .unwrap_or_default()
                            .to_string()
                    }
                };
                *self.others.entry(name).or_default() += 1;
            }
        }
    }

    /// Share of inputs that reached `d`'s validator, 0 to 1.
    pub fn validated_share(&self, d: Decoder) -> f64 {
        self.validated[d as usize] as f64 / self.inputs.max(1) as f64
    }

    /// Share of inputs that reached `d`, 0 to 1.
    pub fn share(&self, d: Decoder) -> f64 {
        self.reached[d as usize] as f64 / self.inputs.max(1) as f64
    }
}

/// A rejection while reading a resource's fields, before its validator.
fn read_error(result: &Result<Message, WireError>) -> bool {
    matches!(result, Err(WireError::Truncated(_)))
        || matches!(result, Err(WireError::InvalidValue { field, .. }) if field.ends_with(".dedicated"))
}

impl fmt::Display for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |n: u64| 100.0 * n as f64 / self.inputs.max(1) as f64;
        writeln!(f, "{} inputs", self.inputs)?;
        for d in Decoder::ALL {
            let i = d as usize;
            writeln!(
                f,
                "  reached the {:<9} decoder: {:>6.2}%, its validator: {:>6.2}%, rejected by it: {:>6.2}%",
                d.prefix(),
                pct(self.reached[i]),
                pct(self.validated[i]),
                pct(self.rejected[i])
            )?;
        }
        writeln!(
            f,
            "  decoded: {:.2}%; rejected in the header (length, CRC, magic, version): {:.2}%; \
             in the payload outside the decoders (count, kind, trailing): {:.2}%",
            pct(self.decoded),
            pct(self.header),
            pct(self.payload)
        )?;
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(f, "  rejections by field: {}", fields.join(", "))?;
        let others: Vec<String> = self
            .others
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        write!(f, "  other rejections: {}", others.join(", "))
    }
}

/// Receives one message: the only call of `Connection::recv` in the fuzz
/// harness and the replay test (the one line to change when its signature does).
pub fn receive(connection: &Connection) -> vk_export::Result<Received> {
    connection.recv(std::time::Duration::from_secs(5))
}

/// An fd to send with a message.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdKind {
    /// A pipe's read end.
    PipeRead,
    /// A pipe's write end.
    PipeWrite,
    /// `/dev/null`.
    DevNull,
    /// A 4 KiB memfd.
    Memfd,
}

impl FdKind {
    fn open(self) -> OwnedFd {
        match self {
            FdKind::PipeRead | FdKind::PipeWrite => {
                let (r, w) =
                    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
                if self == FdKind::PipeRead {
                    r
                } else {
                    w
                }
            }
            FdKind::DevNull => std::fs::File::open("/dev/null").expect("/dev/null").into(),
            FdKind::Memfd => {
                let fd = rustix::fs::memfd_create("wire-fuzz", rustix::fs::MemfdFlags::CLOEXEC)
                    .expect("memfd_create");
                rustix::fs::ftruncate(&fd, 4096).expect("ftruncate");
                fd
            }
        }
    }
}

/// What the receiver tries to take from a received message, per resource.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// `take_image::<Rgba8Unorm, Optimal, DeviceLocal, Storage>`.
    Image,
    /// `take_buffer::<DeviceLocal>`.
    Buffer,
    /// `take_semaphore::<Timeline>`.
    Semaphore,
    /// Nothing: the fd is closed with the message.
    Leave,
}

/// A receive-path input: fds to send, what to take, and the message.
#[derive(Clone, Debug)]
pub struct ReceiveCase {
    /// 0 to 3 fds.
    pub fds: Vec<FdKind>,
    /// What to take, resource by resource (missing entries: [`Take::Leave`]).
    pub takes: Vec<Take>,
    /// The bytes sent.
    pub bytes: Vec<u8>,
}

impl ReceiveCase {
    /// Reads a case from a fuzzer's input: fd count and kinds, takes, then
    /// the rest through [`from_fuzz_bytes`].
    pub fn from_fuzz_bytes(data: &[u8]) -> ReceiveCase {
        let mut u = Unstructured::new(data);
        let n = u.int_in_range(0u8..=3).unwrap_or(0);
        let fds = (0..n)
            .map(|_| u.arbitrary().unwrap_or(FdKind::DevNull))
            .collect();
        let t = u.int_in_range(0u8..=4).unwrap_or(0);
        let takes = (0..t)
            .map(|_| u.arbitrary().unwrap_or(Take::Leave))
            .collect();
        let bytes = from_fuzz_bytes(u.take_rest());
        ReceiveCase { fds, takes, bytes }
    }
}

/// Sends the case's bytes and fds over a fresh socket pair, receives, takes
/// what the case says, drops everything, and checks: no panic, the receive
/// result agrees with [`Message::decode`] and the fd count, and the process
/// has as many open fds as before (`/proc/self/fd`). Nothing else in the
/// process may open or close fds meanwhile.
pub fn receive_case(case: &ReceiveCase) -> vk_export::Result<Message> {
    let before = crate::fds::open_fd_count();
    let result = receive_and_take(case);
    let after = crate::fds::open_fd_count();
    assert_eq!(after, before, "open fds changed: {case:?} -> {result:?}");
    result
}

fn receive_and_take(case: &ReceiveCase) -> vk_export::Result<Message> {
    use vk_export::markers::{usage, DeviceLocal, Optimal};
    let (tx, rx) = Connection::pair().expect("socketpair");
    let fds: Vec<OwnedFd> = case.fds.iter().map(|k| k.open()).collect();
    let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
    // SAFETY: the receiver below only decodes, takes and drops what arrives:
    // nothing is imported.
    unsafe { tx.send_raw(&case.bytes, &borrowed) }?;
    drop(fds);
    let expected = Message::decode(&case.bytes);
    let mut received = match receive(&rx) {
        Ok(received) => received,
        Err(e) => {
            if let Ok(m) = &expected {
                assert!(
                    matches!(e, vk_export::Error::Wire(WireError::FdCount { expected, received })
                        if expected == m.resources.len() && received == case.fds.len()),
                    "a message that decodes was refused with {} fds: {e}",
                    case.fds.len()
                );
            }
            return Err(e);
        }
    };
    assert_eq!(
        Ok(received.message()),
        expected.as_ref(),
        "recv and decode disagree"
    );
    assert_eq!(received.message().resources.len(), case.fds.len());
    for (index, take) in case.takes.iter().enumerate() {
        // Each take hands over an fd (closed here) or leaves it in `received`.
        let _ = match take {
            Take::Image => received
                .take_image::<vk_export::format::Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>(
                    index,
                )
                .map(|bundle| bundle.into_parts().1),
            Take::Buffer => received
                .take_buffer::<DeviceLocal>(index)
                .map(|bundle| bundle.into_parts().1),
            Take::Semaphore => received
                .take_semaphore::<vk_export::semaphore_kinds::Timeline>(index)
                .map(|bundle| bundle.into_parts().1),
            Take::Leave => continue,
        };
    }
    Ok(received.message().clone())
}
