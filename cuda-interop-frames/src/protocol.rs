//! The frame-ring protocol: the small fixed-size packets a frame producer
//! (this crate's `producer` module, the `frame_server` example) and its
//! consumers (the `consumer` module: the Python module, the `frame_client`
//! example) exchange on the same `SOCK_SEQPACKET` socket as
//! the `vk-export` wire message that shares the ring.
//!
//! # Contract
//!
//! * One conversation: the producer sends a [`Kind::Hello`] packet (the
//!   ring's layout), then one `vk-export` wire message tagged [`SETUP_TAG`]
//!   whose resources are the `slots` buffers (or images, when the hello has
//!   [`HELLO_IMAGES`]), the "produced" timeline and `slots` "released"
//!   timelines (resource `slots + 1 + i` belongs to slot `i`; a ring
//!   without semaphores sends the `slots` buffers or images alone); then [`Kind::Frame`] packets, each naming the
//!   slot, the frame's sequence number and its presentation time
//!   ([`Packet::timestamp_ns`], `CLOCK_MONOTONIC`). The consumer answers
//!   each frame with one [`Kind::Release`] packet.
//! * Delivery: a consumer subscribes first thing after connecting; one that
//!   says nothing is served *lossless* (after a grace period, the
//!   sender's `SUBSCRIBE_GRACE`): every frame from then on, in order, and
//!   the producer waits (bounded) for its releases. A
//!   consumer that sends [`Kind::Subscribe`] with [`MODE_LATEST`] is served
//!   *latest*: it gets a frame only after asking with [`Kind::Acquire`],
//!   and then the newest presented one; frames it did not ask for are
//!   skipped (the gaps in the sequence numbers are its dropped frames), and
//!   the producer never waits for it. Asking twice before a frame comes is
//!   one request.
//! * GPU order: the producer signals "produced" with the frame number when
//!   the frame is written; a consumer waits for that value before it reads.
//!   A release with [`RELEASE_GPU_SIGNALLED`] promises that the consumer
//!   signals slot `i`'s "released" timeline with the frame number once its
//!   GPU work on the frame is done; the producer's next write to the slot
//!   waits for that value. A release without it means the consumer's reads
//!   have completed already.
//! * Image rings: a hello with [`HELLO_IMAGES`] in its flags announces
//!   OPTIMAL images; its `format` is the images' `VkFormat` (raw value) and
//!   its `row_pitch` the bytes of one row tightly packed (`width` times the
//!   texel size), which is what a read-back of a frame gives. The producer
//!   releases each frame's image to `VK_QUEUE_FAMILY_EXTERNAL` in
//!   `VK_IMAGE_LAYOUT_GENERAL`; a Vulkan consumer acquires it from there
//!   and releases it back the same way before its release packet.
//! * The producer never writes a slot a consumer holds (sent, not yet
//!   released); a consumer that closes its socket releases everything it
//!   held.
//! * Packets are [`PACKET_LEN`] bytes, little-endian, magic [`MAGIC`],
//!   version [`VERSION`]; anything else is refused whole by
//!   [`Packet::decode`]. A wire message (magic `"CIVX"`) is told apart by its
//!   first four bytes.
//!
//! This module is std-only (and [`thiserror`]): it uses nothing else of the
//! crate.

/// First four bytes of every packet.
pub const MAGIC: [u8; 4] = *b"CIFR";
/// The one version this build reads and writes.
pub const VERSION: u16 = 2;
/// Bytes in every packet.
pub const PACKET_LEN: usize = 48;
/// The tag of the wire message that shares the ring (`"CIFRRING"`).
pub const SETUP_TAG: u64 = u64::from_le_bytes(*b"CIFRRING");
/// Most slots a ring may have: `2 * slots + 1` resources fit one wire message.
pub const MAX_SLOTS: u32 = 7;
/// [`Packet::format`] of 8-bit RGBA, 4 bytes per pixel.
pub const FORMAT_RGBA8: u32 = 1;
/// [`Packet::flags`] of a hello: the slots are images (see the module
/// contract); without it they are pitched buffers of [`FORMAT_RGBA8`].
pub const HELLO_IMAGES: u32 = 1;
/// Texel sizes an image ring's hello may announce, in bytes.
pub const IMAGE_TEXEL_BYTES: [u64; 5] = [1, 2, 4, 8, 16];
/// [`Packet::flags`] of a release: the consumer signals the slot's "released"
/// timeline with the frame number when its GPU work is done.
pub const RELEASE_GPU_SIGNALLED: u32 = 1;

/// [`Packet::flags`] of a subscribe: every frame, in order (the default).
pub const MODE_LOSSLESS: u32 = 0;
/// [`Packet::flags`] of a subscribe: the newest frame, on request.
pub const MODE_LATEST: u32 = 1;

/// What a packet says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Producer to consumer, once: the ring's layout.
    Hello = 1,
    /// Producer to consumer: frame `frame` is in slot `slot`.
    Frame = 2,
    /// Consumer to producer: done with frame `frame` in slot `slot`.
    Release = 3,
    /// Consumer to producer, at most once, before its first acquire or
    /// release: the delivery mode in `flags` ([`MODE_LATEST`] or
    /// [`MODE_LOSSLESS`]).
    Subscribe = 4,
    /// Consumer (latest mode) to producer: send the newest frame, or the
    /// next one if it has had the newest.
    Acquire = 5,
}

/// One packet; fields a kind does not use are 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// What it says.
    pub kind: Kind,
    /// The slot (hello: the number of slots).
    pub slot: u32,
    /// Release: [`RELEASE_GPU_SIGNALLED`] or 0; subscribe: the mode; hello:
    /// [`HELLO_IMAGES`] or 0.
    pub flags: u32,
    /// The frame number (from 1; hello: 0).
    pub frame: u64,
    /// Hello: pixels per row.
    pub width: u32,
    /// Hello: rows.
    pub height: u32,
    /// Hello: bytes from one row to the next.
    pub row_pitch: u64,
    /// Hello: [`FORMAT_RGBA8`] (buffer rings) or the images' `VkFormat`
    /// (image rings).
    pub format: u32,
    /// Frame: its presentation time, nanoseconds of `CLOCK_MONOTONIC`.
    pub timestamp_ns: u64,
}

/// Why a packet was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Not [`PACKET_LEN`] bytes.
    #[error(
        "frame packet of {0} bytes (expected {PACKET_LEN}): not a cuda-interop frame producer"
    )]
    Length(usize),
    /// Does not start with [`MAGIC`].
    #[error(
        "frame packet with magic {0:02x?} (expected \"CIFR\"): not a cuda-interop frame producer"
    )]
    Magic([u8; 4]),
    /// Another [`VERSION`].
    #[error("frame protocol version {0} is not supported (this build speaks {VERSION}); update both sides")]
    Version(u16),
    /// An unknown kind.
    #[error("unknown frame packet kind {0}")]
    Kind(u16),
    /// A subscribe with an unknown mode.
    #[error("unknown delivery mode {0} (0: lossless, 1: latest)")]
    Mode(u32),
    /// A hello whose layout cannot be a ring of RGBA8 frames or of images.
    #[error("bad ring layout: {0}")]
    Layout(String),
}

impl Packet {
    /// A hello for a ring of `slots` RGBA8 frames.
    pub fn hello(slots: u32, width: u32, height: u32, row_pitch: u64) -> Packet {
        Packet {
            kind: Kind::Hello,
            slot: slots,
            flags: 0,
            frame: 0,
            width,
            height,
            row_pitch,
            format: FORMAT_RGBA8,
            timestamp_ns: 0,
        }
    }

    /// A hello for a ring of `slots` images of `vk_format` (a raw
    /// `VkFormat`) with texels of `texel_bytes` bytes.
    pub fn image_hello(
        slots: u32,
        width: u32,
        height: u32,
        vk_format: u32,
        texel_bytes: u32,
    ) -> Packet {
        Packet {
            flags: HELLO_IMAGES,
            format: vk_format,
            ..Packet::hello(
                slots,
                width,
                height,
                u64::from(width) * u64::from(texel_bytes),
            )
        }
    }

    /// Whether a hello announces an image ring ([`HELLO_IMAGES`]).
    pub fn is_image_ring(&self) -> bool {
        self.kind == Kind::Hello && self.flags & HELLO_IMAGES != 0
    }

    /// Frame `frame` is in `slot`, presented at `timestamp_ns`.
    pub fn frame(slot: u32, frame: u64, timestamp_ns: u64) -> Packet {
        Packet {
            kind: Kind::Frame,
            slot,
            frame,
            timestamp_ns,
            ..Packet::hello(0, 0, 0, 0)
        }
    }

    /// The consumer's delivery mode ([`MODE_LATEST`] or [`MODE_LOSSLESS`]).
    pub fn subscribe(mode: u32) -> Packet {
        Packet {
            kind: Kind::Subscribe,
            slot: 0,
            flags: mode,
            ..Packet::hello(0, 0, 0, 0)
        }
    }

    /// A latest-mode consumer asks for the newest frame.
    pub fn acquire() -> Packet {
        Packet {
            kind: Kind::Acquire,
            slot: 0,
            ..Packet::hello(0, 0, 0, 0)
        }
    }

    /// The consumer is done with `frame` in `slot`.
    pub fn release(slot: u32, frame: u64, gpu_signalled: bool) -> Packet {
        Packet {
            kind: Kind::Release,
            slot,
            frame,
            flags: if gpu_signalled {
                RELEASE_GPU_SIGNALLED
            } else {
                0
            },
            ..Packet::hello(0, 0, 0, 0)
        }
    }

    /// The packet's bytes.
    pub fn encode(&self) -> [u8; PACKET_LEN] {
        let mut b = [0u8; PACKET_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(self.kind as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.slot.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.frame.to_le_bytes());
        b[24..28].copy_from_slice(&self.width.to_le_bytes());
        b[28..32].copy_from_slice(&self.height.to_le_bytes());
        b[32..40].copy_from_slice(&self.row_pitch.to_le_bytes());
        b[40..44].copy_from_slice(&self.format.to_le_bytes());
        // Bytes 24..32 are the width and height of a hello and the
        // timestamp of every other packet (0 where unused).
        if self.kind != Kind::Hello {
            b[24..32].copy_from_slice(&self.timestamp_ns.to_le_bytes());
        }
        b
    }

    /// Parses one packet; a hello's layout is checked too
    /// ([`Packet::check_layout`]).
    pub fn decode(bytes: &[u8]) -> Result<Packet, PacketError> {
        if bytes.len() != PACKET_LEN {
            return Err(PacketError::Length(bytes.len()));
        }
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let magic: [u8; 4] = bytes[0..4].try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(PacketError::Magic(magic));
        }
        if u16_at(4) != VERSION {
            return Err(PacketError::Version(u16_at(4)));
        }
        let kind = match u16_at(6) {
            1 => Kind::Hello,
            2 => Kind::Frame,
            3 => Kind::Release,
            4 => Kind::Subscribe,
            5 => Kind::Acquire,
            k => return Err(PacketError::Kind(k)),
        };
        let hello = kind == Kind::Hello;
        let packet = Packet {
            kind,
            slot: u32_at(8),
            flags: u32_at(12),
            frame: u64_at(16),
            width: if hello { u32_at(24) } else { 0 },
            height: if hello { u32_at(28) } else { 0 },
            row_pitch: u64_at(32),
            format: u32_at(40),
            timestamp_ns: if hello { 0 } else { u64_at(24) },
        };
        if hello {
            packet.check_layout()?;
        }
        if kind == Kind::Subscribe && packet.flags > MODE_LATEST {
            return Err(PacketError::Mode(packet.flags));
        }
        Ok(packet)
    }

    /// A hello's layout: 1 to [`MAX_SLOTS`] slots, a non-empty image, at
    /// most 2^31 bytes a frame; buffer rings: RGBA8, rows that fit the pitch
    /// (a multiple of 4); image rings ([`HELLO_IMAGES`]): a nonzero format
    /// and a pitch of `width` texels of one of [`IMAGE_TEXEL_BYTES`].
    pub fn check_layout(&self) -> Result<(), PacketError> {
        let bad = |why: String| Err(PacketError::Layout(why));
        if self.slot == 0 || self.slot > MAX_SLOTS {
            return bad(format!("{} slots (1 to {MAX_SLOTS})", self.slot));
        }
        if self.flags & !HELLO_IMAGES != 0 {
            return bad(format!(
                "hello flags {:#x} (only HELLO_IMAGES, 1, is known)",
                self.flags
            ));
        }
        if self.width == 0 || self.height == 0 {
            return bad(format!("{}x{} pixels", self.width, self.height));
        }
        if self.is_image_ring() {
            if self.format == 0 {
                return bad("an image ring of VK_FORMAT_UNDEFINED".into());
            }
            let width = u64::from(self.width);
            if !self.row_pitch.is_multiple_of(width)
                || !IMAGE_TEXEL_BYTES.contains(&(self.row_pitch / width))
            {
                return bad(format!(
                    "image row of {} bytes for {} texels (texels of 1, 2, 4, 8 or 16 bytes)",
                    self.row_pitch, self.width
                ));
            }
        } else {
            if self.format != FORMAT_RGBA8 {
                return bad(format!("format {} (only RGBA8, 1, is known)", self.format));
            }
            let row = u64::from(self.width) * 4;
            // The pitch becomes a tensor stride (an i64) and is bounded like the
            // frame: a one-row frame would otherwise leave it unchecked.
            if self.row_pitch < row || !self.row_pitch.is_multiple_of(4) || self.row_pitch > 1 << 31
            {
                return bad(format!(
                    "row pitch {} for rows of {row} bytes (at least a row, a multiple of 4, \
                     at most 2 GiB)",
                    self.row_pitch
                ));
            }
        }
        match self.frame_bytes() {
            Some(n) if n <= 1 << 31 => Ok(()),
            _ => bad(format!(
                "{}x{} with pitch {} is larger than 2 GiB",
                self.width, self.height, self.row_pitch
            )),
        }
    }

    /// Bytes a frame of a hello's layout spans: all rows but the last at
    /// the pitch, the last one only as wide as the image (4 bytes a pixel
    /// in a buffer ring; an image ring's rows are the pitch).
    pub fn frame_bytes(&self) -> Option<u64> {
        let last_row = if self.is_image_ring() {
            self.row_pitch
        } else {
            u64::from(self.width) * 4
        };
        u64::from(self.height)
            .checked_sub(1)?
            .checked_mul(self.row_pitch)?
            .checked_add(last_row)
    }
}

/// The pixel value (read as a little-endian `u32`) of the background of frame
/// `frame` of the demo pattern: the frame number itself.
pub fn background(frame: u64) -> u32 {
    frame as u32
}

/// The pixel value of the moving band of frame `frame`: every bit of the
/// background flipped.
pub fn band_value(frame: u64) -> u32 {
    !background(frame)
}

/// The rows `[start, end)` of the moving band of frame `frame` in an image of
/// `height` rows: `height / 16` rows (at least 1) moving down 8 rows a frame.
pub fn band_rows(frame: u64, height: u32) -> (u32, u32) {
    let rows = (height / 16).max(1);
    let span = u64::from(height - rows + 1);
    let start = (frame.wrapping_mul(8) % span) as u32;
    (start, start + rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for p in [
            Packet::hello(4, 1920, 1080, 7680),
            Packet::frame(3, 99, 123_456_789),
            Packet::release(1, 7, true),
            Packet::subscribe(MODE_LATEST),
            Packet::subscribe(MODE_LOSSLESS),
            Packet::acquire(),
        ] {
            assert_eq!(Packet::decode(&p.encode()), Ok(p));
        }
    }

    #[test]
    fn bad_layouts() {
        assert!(Packet::decode(&Packet::hello(0, 4, 4, 16).encode()).is_err());
        assert!(Packet::decode(&Packet::hello(8, 4, 4, 16).encode()).is_err());
        assert!(Packet::decode(&Packet::hello(2, 4, 4, 15).encode()).is_err());
        assert!(Packet::decode(&Packet::hello(2, 4, 4, 12).encode()).is_err());
        assert!(Packet::decode(&Packet::hello(2, 65535, 65535, 1 << 20).encode()).is_err());
        // One row: the frame is small whatever the pitch, which becomes an
        // i64 stride, so the pitch is bounded on its own.
        assert!(Packet::decode(&Packet::hello(2, 4, 1, 1 << 31).encode()).is_ok());
        assert!(Packet::decode(&Packet::hello(2, 4, 1, (1 << 31) + 4).encode()).is_err());
        assert!(Packet::decode(&Packet::hello(2, 4, 1, u64::MAX - 3).encode()).is_err());
    }

    #[test]
    fn encoding_is_little_endian_at_fixed_offsets() {
        let b = Packet::release(3, 0x0102_0304_0506_0708, true).encode();
        assert_eq!(b.len(), PACKET_LEN);
        assert_eq!(&b[0..4], b"CIFR");
        assert_eq!(&b[4..6], &VERSION.to_le_bytes());
        assert_eq!(&b[6..8], &3u16.to_le_bytes()); // Kind::Release
        assert_eq!(&b[8..12], &3u32.to_le_bytes());
        assert_eq!(&b[12..16], &RELEASE_GPU_SIGNALLED.to_le_bytes());
        assert_eq!(&b[16..24], &0x0102_0304_0506_0708u64.to_le_bytes());
        // Unused fields are 0, but every packet carries the format (1).
        assert!(b[24..40].iter().all(|&x| x == 0));
        assert_eq!(&b[40..44], &FORMAT_RGBA8.to_le_bytes());
        assert!(b[44..].iter().all(|&x| x == 0));
        let h = Packet::hello(2, 640, 480, 2560).encode();
        assert_eq!(&h[24..28], &640u32.to_le_bytes());
        assert_eq!(&h[28..32], &480u32.to_le_bytes());
        assert_eq!(&h[32..40], &2560u64.to_le_bytes());
        assert_eq!(&h[40..44], &FORMAT_RGBA8.to_le_bytes());
        assert_eq!(Packet::release(0, 1, false).flags, 0);
        // A frame's timestamp sits where a hello's width and height are.
        let f = Packet::frame(2, 5, 0x1112_1314_1516_1718).encode();
        assert_eq!(&f[24..32], &0x1112_1314_1516_1718u64.to_le_bytes());
        assert_eq!(
            &Packet::subscribe(MODE_LATEST).encode()[12..16],
            &1u32.to_le_bytes()
        );
        assert_eq!(&Packet::acquire().encode()[6..8], &5u16.to_le_bytes());
    }

    #[test]
    fn refused_whole() {
        let good = Packet::frame(1, 2, 3).encode();
        assert_eq!(Packet::decode(&good[..47]), Err(PacketError::Length(47)));
        assert_eq!(Packet::decode(&[]), Err(PacketError::Length(0)));
        let mut b = good;
        b[0] = b'X';
        assert_eq!(Packet::decode(&b), Err(PacketError::Magic(*b"XIFR")));
        let mut b = good;
        b[4..6].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(Packet::decode(&b), Err(PacketError::Version(1)));
        let mut b = Packet::subscribe(MODE_LATEST).encode();
        b[12..16].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(Packet::decode(&b), Err(PacketError::Mode(2)));
        for kind in [0u16, 6, u16::MAX] {
            let mut b = good;
            b[6..8].copy_from_slice(&kind.to_le_bytes());
            assert_eq!(Packet::decode(&b), Err(PacketError::Kind(kind)));
        }
        // Only a hello's layout is checked: a frame packet's zero layout is fine.
        assert!(Packet::decode(&good).is_ok());
        let mut b = Packet::hello(2, 4, 4, 16).encode();
        b[40..44].copy_from_slice(&2u32.to_le_bytes());
        assert!(matches!(Packet::decode(&b), Err(PacketError::Layout(_))));
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            PacketError::Length(3).to_string(),
            "frame packet of 3 bytes (expected 48): not a cuda-interop frame producer"
        );
        assert_eq!(
            PacketError::Magic(*b"CIVX").to_string(),
            "frame packet with magic [43, 49, 56, 58] (expected \"CIFR\"): not a cuda-interop \
             frame producer"
        );
        assert_eq!(
            PacketError::Version(9).to_string(),
            "frame protocol version 9 is not supported (this build speaks 2); update both sides"
        );
        assert_eq!(
            PacketError::Kind(7).to_string(),
            "unknown frame packet kind 7"
        );
        assert_eq!(
            PacketError::Layout("x".into()).to_string(),
            "bad ring layout: x"
        );
    }

    #[test]
    fn frame_bytes_spans_the_last_row_unpadded() {
        assert_eq!(Packet::hello(2, 4, 3, 32).frame_bytes(), Some(2 * 32 + 16));
        assert_eq!(Packet::hello(2, 4, 0, 32).frame_bytes(), None);
        assert_eq!(Packet::hello(2, 1, 1, 4).frame_bytes(), Some(4));
        assert!(Packet::hello(MAX_SLOTS, 4, 4, 16).check_layout().is_ok());
        assert!(Packet::hello(2, 0, 4, 16).check_layout().is_err());
    }

    #[test]
    fn pattern() {
        assert_eq!(background(5), 5);
        assert_eq!(band_value(5), !5u32);
        assert_eq!(background((1 << 32) + 7), 7);
        assert_eq!(band_rows(0, 1080), (0, 67));
        assert_eq!(band_rows(1, 1080), (8, 75));
    }

    #[test]
    fn image_hellos() {
        let h = Packet::image_hello(3, 64, 32, 37, 4);
        assert!(h.is_image_ring());
        assert_eq!((h.row_pitch, h.frame_bytes()), (256, Some(32 * 256)));
        assert_eq!(Packet::decode(&h.encode()), Ok(h));
        assert!(!Packet::hello(3, 64, 32, 256).is_image_ring());
        assert!(!Packet::release(0, 1, true).is_image_ring());
        // 16-byte texels (RGBA32F) are fine, 3-byte ones are not.
        assert!(Packet::image_hello(3, 64, 32, 109, 16)
            .check_layout()
            .is_ok());
        let bad = [
            Packet::image_hello(3, 64, 32, 37, 3),
            Packet::image_hello(3, 64, 32, 37, 0),
            Packet::image_hello(3, 64, 32, 0, 4),
            Packet::image_hello(3, 1 << 16, 1 << 14, 37, 16),
            Packet {
                row_pitch: 255,
                ..Packet::image_hello(3, 64, 32, 37, 4)
            },
            Packet {
                flags: 2,
                ..Packet::hello(3, 64, 32, 256)
            },
        ];
        for h in bad {
            assert!(
                matches!(Packet::decode(&h.encode()), Err(PacketError::Layout(_))),
                "{h:?}"
            );
        }
    }

    #[test]
    fn setup_tag_is_cifrring() {
        assert_eq!(&SETUP_TAG.to_le_bytes(), b"CIFRRING");
    }

    #[test]
    fn band_stays_inside() {
        for f in 0..2000 {
            let (a, b) = band_rows(f, 1080);
            assert!(a < b && b <= 1080);
        }
        assert_eq!(band_rows(5, 1), (0, 1));
    }
}
