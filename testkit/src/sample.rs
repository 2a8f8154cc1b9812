//! Well-formed records written byte by byte (records have no public
//! constructor: tests make them the way a peer does, on the wire).

use vk_export::wire::{Message, HEADER_LEN, MAGIC, VERSION};

fn put32(p: &mut Vec<u8>, v: u32) {
    p.extend_from_slice(&v.to_le_bytes());
}
fn put64(p: &mut Vec<u8>, v: u64) {
    p.extend_from_slice(&v.to_le_bytes());
}

/// The fields of an image record a test chooses (the rest are fixed).
#[derive(Clone, Copy, Debug)]
pub struct ImageFields {
    /// `VkFormat` as a number.
    pub format: u32,
    /// 1 (2D) or 2 (3D).
    pub image_type: u32,
    /// Width, height, depth.
    pub extent: [u32; 3],
    /// Mip levels.
    pub mip_levels: u32,
    /// Array layers.
    pub array_layers: u32,
    /// Create flags.
    pub flags: u32,
    /// 0 optimal, 1 linear.
    pub tiling: u32,
    /// Usage bits.
    pub usage: u32,
    /// Allocation size.
    pub allocation_size: u64,
    /// Memory type index.
    pub memory_type_index: u32,
    /// Memory property bits.
    pub memory_flags: u32,
}

/// A 1920x1080 RGBA8 optimal, device-local storage image's record fields.
pub fn image_fields(p: &mut Vec<u8>) {
    p.push(1); // kind: image
    put32(p, 37); // R8G8B8A8_UNORM
    put32(p, 1); // 2D
    for e in [1920, 1080, 1] {
        put32(p, e);
    }
    put32(p, 1); // levels
    put32(p, 1); // layers
    put32(p, 0); // flags
    put32(p, 0); // OPTIMAL
    put32(p, 0x1 | 0x2 | 0x4 | 0x8); // TRANSFER_SRC|DST|SAMPLED|STORAGE
    put64(p, 8_388_608); // allocation size
    put32(p, 1); // memory type
    put32(p, 1); // DEVICE_LOCAL
    p.push(1); // dedicated
    put64(p, 65536); // alignment
    put64(p, 0); // offset
    put64(p, 0); // row pitch
    put64(p, 0); // array pitch
    p.extend_from_slice(&[7; 16]);
    p.extend_from_slice(&[9; 16]);
}

/// A 1000-byte device-local buffer's record fields.
pub fn buffer_fields(p: &mut Vec<u8>) {
    p.push(2);
    put64(p, 1000);
    put32(p, 0x20 | 0x1 | 0x2); // STORAGE_BUFFER|TRANSFER_SRC|DST
    put64(p, 4096);
    put32(p, 2);
    put32(p, 1);
    p.push(0);
    put64(p, 256);
    p.extend_from_slice(&[7; 16]);
    p.extend_from_slice(&[9; 16]);
}

/// A timeline semaphore's record fields.
pub fn semaphore_fields(p: &mut Vec<u8>) {
    p.push(3);
    put32(p, 1); // TIMELINE
    p.extend_from_slice(&[7; 16]);
    p.extend_from_slice(&[9; 16]);
}

/// Header + payload around `payload`.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crate::tamper::crc32(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Tag 77 with an image, a buffer and a semaphore, encoded.
pub fn message_bytes() -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&77u64.to_le_bytes());
    p.extend_from_slice(&3u16.to_le_bytes());
    image_fields(&mut p);
    buffer_fields(&mut p);
    semaphore_fields(&mut p);
    frame(&p)
}

/// [`message_bytes`], decoded.
pub fn message() -> Message {
    Message::decode(&message_bytes()).expect("the sample decodes")
}

impl ImageFields {
    /// The record these fields encode, through the decoder.
    pub fn decode(&self) -> vk_export::ImageInfo {
        let mut p = Vec::new();
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&1u16.to_le_bytes());
        p.push(1);
        for v in [
            self.format,
            self.image_type,
            self.extent[0],
            self.extent[1],
            self.extent[2],
            self.mip_levels,
            self.array_layers,
            self.flags,
            self.tiling,
            self.usage,
        ] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        p.extend_from_slice(&self.allocation_size.to_le_bytes());
        p.extend_from_slice(&self.memory_type_index.to_le_bytes());
        p.extend_from_slice(&self.memory_flags.to_le_bytes());
        p.push(1);
        p.extend_from_slice(&1024u64.to_le_bytes());
        p.extend_from_slice(&[0; 24]);
        p.extend_from_slice(&[7; 32]);
        match vk_export::wire::Message::decode(&frame(&p)) {
            Ok(mut m) => match m.resources.remove(0) {
                vk_export::wire::Resource::Image(i) => i,
                other => panic!("decoded as {other:?}"),
            },
            Err(e) => panic!("{self:?} does not decode: {e}"),
        }
    }
}

/// The image record of [`message`] (1920x1080 RGBA8), decoded.
pub fn image() -> vk_export::ImageInfo {
    match message().resources.remove(0) {
        vk_export::wire::Resource::Image(i) => i,
        other => panic!("the sample's first resource is {other:?}"),
    }
}

/// The buffer record of [`message`] (1000 bytes in 4096), decoded.
pub fn buffer() -> vk_export::BufferInfo {
    match message().resources.remove(1) {
        vk_export::wire::Resource::Buffer(b) => b,
        other => panic!("the sample's second resource is {other:?}"),
    }
}

/// The timeline semaphore record of [`message`], decoded.
pub fn semaphore() -> vk_export::SemaphoreInfo {
    match message().resources.remove(2) {
        vk_export::wire::Resource::Semaphore(s) => s,
        other => panic!("the sample's third resource is {other:?}"),
    }
}
