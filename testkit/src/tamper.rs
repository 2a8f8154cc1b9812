//! Records as a hostile or buggy peer would send them: encoded, one field
//! overwritten on the wire, the checksum fixed, decoded again (so every
//! record the tests use was made by the crate's own decoder).

use vk_export::wire::{Message, Resource, HEADER_LEN};
use vk_export::{BufferInfo, ImageInfo, SemaphoreInfo};

/// Offset of a resource's first field in an encoded one-resource message:
/// header, tag (8), count (2), kind (1).
const FIRST_FIELD: usize = HEADER_LEN + 8 + 2 + 1;

/// `(field, offset, width)` of an image record's fields on the wire.
pub const IMAGE_FIELDS: &[(&str, usize, usize)] = &[
    ("format", 0, 4),
    ("image_type", 4, 4),
    ("width", 8, 4),
    ("height", 12, 4),
    ("depth", 16, 4),
    ("mip_levels", 20, 4),
    ("array_layers", 24, 4),
    ("flags", 28, 4),
    ("tiling", 32, 4),
    ("usage", 36, 4),
    ("allocation_size", 40, 8),
    ("memory_type_index", 48, 4),
    ("memory_flags", 52, 4),
    ("dedicated", 56, 1),
    ("alignment", 57, 8),
    ("offset", 65, 8),
    ("row_pitch", 73, 8),
    ("array_pitch", 81, 8),
    ("device_uuid", 89, 16),
    ("driver_uuid", 105, 16),
];
/// `(field, offset, width)` of a buffer record's fields on the wire.
pub const BUFFER_FIELDS: &[(&str, usize, usize)] = &[
    ("size", 0, 8),
    ("usage", 8, 4),
    ("allocation_size", 12, 8),
    ("memory_type_index", 20, 4),
    ("memory_flags", 24, 4),
    ("dedicated", 28, 1),
    ("alignment", 29, 8),
    ("device_uuid", 37, 16),
    ("driver_uuid", 53, 16),
];
/// `(field, offset, width)` of a semaphore record's fields on the wire.
pub const SEMAPHORE_FIELDS: &[(&str, usize, usize)] = &[
    ("semaphore_type", 0, 4),
    ("device_uuid", 4, 16),
    ("driver_uuid", 20, 16),
];

fn field(fields: &[(&str, usize, usize)], name: &str) -> (usize, usize) {
    let f = fields
        .iter()
        .find(|f| f.0 == name)
        .unwrap_or_else(|| panic!("no wire field {name}"));
    (FIRST_FIELD + f.1, f.2)
}

/// Encodes `resource`, lets `edit` rewrite the named field's bytes, fixes
/// the CRC, and returns the bytes (to send with `send_raw`) and what the
/// decoder makes of them.
pub fn edit(
    resource: Resource,
    fields: &[(&str, usize, usize)],
    name: &str,
    edit: impl FnOnce(&mut [u8]),
) -> (Vec<u8>, Result<Message, vk_export::wire::WireError>) {
    let mut bytes = Message {
        tag: 0,
        resources: vec![resource],
    }
    .encode()
    .expect("encodes");
    let (at, width) = field(fields, name);
    edit(&mut bytes[at..at + width]);
    let crc = crc32(&bytes[HEADER_LEN..]);
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
    let decoded = Message::decode(&bytes);
    (bytes, decoded)
}

/// Adds `delta` to a little-endian integer field of 1, 4 or 8 bytes.
pub fn add(delta: i64) -> impl Fn(&mut [u8]) {
    move |b: &mut [u8]| {
        let mut v = [0u8; 8];
        v[..b.len()].copy_from_slice(b);
        let x = (i64::from_le_bytes(v)).wrapping_add(delta);
        b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
    }
}

/// Sets a little-endian integer field to `value`.
pub fn set(value: u64) -> impl Fn(&mut [u8]) {
    move |b: &mut [u8]| {
        if b.len() > 8 {
            // A UUID: every byte the value's low byte.
            b.fill(value as u8);
        } else {
            let n = b.len();
            b.copy_from_slice(&value.to_le_bytes()[..n]);
        }
    }
}

/// Flips every bit of the field's first byte.
pub fn flip() -> impl Fn(&mut [u8]) {
    |b: &mut [u8]| b[0] ^= 0xff
}

/// An image record with one field edited on the wire; panics if the
/// decoder rejects it (use [`edit`] to see rejections).
pub fn image(info: &ImageInfo, name: &str, e: impl FnOnce(&mut [u8])) -> ImageInfo {
    match edit(Resource::Image(info.clone()), IMAGE_FIELDS, name, e).1 {
        Ok(mut m) => match m.resources.remove(0) {
            Resource::Image(i) => i,
            other => panic!("decoded as {other:?}"),
        },
        Err(err) => panic!("the decoder rejected the edited {name}: {err}"),
    }
}

/// A buffer record with one field edited on the wire.
pub fn buffer(info: &BufferInfo, name: &str, e: impl FnOnce(&mut [u8])) -> BufferInfo {
    match edit(Resource::Buffer(info.clone()), BUFFER_FIELDS, name, e).1 {
        Ok(mut m) => match m.resources.remove(0) {
            Resource::Buffer(i) => i,
            other => panic!("decoded as {other:?}"),
        },
        Err(err) => panic!("the decoder rejected the edited {name}: {err}"),
    }
}

/// A semaphore record with one field edited on the wire.
pub fn semaphore(info: &SemaphoreInfo, name: &str, e: impl FnOnce(&mut [u8])) -> SemaphoreInfo {
    match edit(Resource::Semaphore(info.clone()), SEMAPHORE_FIELDS, name, e).1 {
        Ok(mut m) => match m.resources.remove(0) {
            Resource::Semaphore(i) => i,
            other => panic!("decoded as {other:?}"),
        },
        Err(err) => panic!("the decoder rejected the edited {name}: {err}"),
    }
}

/// CRC-32 (IEEE), as the wire header carries it.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
