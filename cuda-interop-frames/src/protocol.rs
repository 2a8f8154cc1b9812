//! The frame-ring protocol: typed messages ([`Message`]) that a sender and
//! its receivers exchange as fixed-size packets on one `SOCK_SEQPACKET`
//! socket, next to the one `vk-export` wire message that shares the ring.
//!
//! # Contract
//!
//! * One conversation: the receiver connects and sends
//!   [`Message::Subscribe`] (its [`Delivery`]) before anything else, within
//!   the sender's subscribe bound; the sender answers with
//!   [`Message::Hello`] (the [`RingLayout`]), then one `vk-export` wire
//!   message tagged [`SETUP_TAG`] whose resources are the `slots` buffers
//!   or images, the "produced" timeline and `slots` "released" timelines
//!   (resource `slots + 1 + i` belongs to slot `i`; a ring without
//!   semaphores sends the `slots` buffers or images alone); then
//!   [`Message::Frame`]s, each naming a slot, the frame's sequence number
//!   and its presentation time (`CLOCK_MONOTONIC` nanoseconds). The receiver
//!   answers each frame with one [`Message::Release`].
//! * Delivery: a [`Delivery::Lossless`] receiver gets every frame from its
//!   subscribe on, in order, and the sender waits (bounded) for its
//!   releases. A [`Delivery::Latest`] receiver gets a frame only after
//!   asking with [`Message::Acquire`], and then the newest presented one;
//!   the sender never waits for it. Asking twice before a frame comes is
//!   one request.
//! * GPU order: the sender signals "produced" with the frame number when
//!   the frame is written; a receiver waits for that value before it
//!   reads. A release with `gpu_signalled` promises that the receiver
//!   signals slot `i`'s "released" timeline with the frame number once its
//!   GPU work on the frame is done; the sender does not write the slot
//!   before that value is reached. A release without it means the
//!   receiver's reads have completed already.
//! * Image rings ([`SlotFormat::Image`]): the layout's `row_pitch` is the
//!   bytes of one row tightly packed (`width` times the texel size), which
//!   is what a read-back of a frame gives. The sender releases each frame's
//!   image to `VK_QUEUE_FAMILY_EXTERNAL` in `VK_IMAGE_LAYOUT_GENERAL`; a
//!   Vulkan receiver acquires it from there and releases it back the same
//!   way before its release message.
//! * Multi-image rings (a hello whose [`RingLayout::parts`] is not 0):
//!   each slot holds that many named images (a frame's colour, depth,
//!   segmentation, ...), all written by one present and sharing the slot's
//!   one sequence number, timestamp and "produced"/"released" timeline
//!   pair. The hello is followed by one [`Message::Part`] per image, in
//!   order ([`PartLayout`]: a unique name, the `VkFormat`, the texel
//!   size; part 0 is the hello's format), then by the setup message, whose
//!   images come slot by slot, part by part (resource `slot * parts +
//!   part`; [`RingLayout::resource_of`]), then "produced", then the
//!   "released" timelines. Every image is the hello's size. A receiver of
//!   one image per slot refuses such a ring (its hello flag is unknown to
//!   builds before it): see `crate::session`.
//! * Ending: a sender that drops a receiver sends [`Message::Goodbye`]
//!   with the [`DropReason`] and then shuts the socket down, before it can
//!   write any slot that receiver held. A receiver therefore tells a frame
//!   message queued before its drop from a live one by the socket's
//!   hang-up, which the kernel reports at once, queued messages or not
//!   (see `crate::session`).
//! * Packets are [`PACKET_LEN`] bytes, little-endian, magic [`MAGIC`],
//!   version [`VERSION`]; a field a message does not use must be 0.
//!   [`Message::decode`] refuses anything else whole, and checks a hello's
//!   layout. A wire message (magic `"CIVX"`) is told apart by its first
//!   four bytes.
//!
//! This module is std-only (and [`thiserror`]): it uses nothing else of the
//! crate.

use std::time::Duration;

/// First four bytes of every packet.
pub const MAGIC: [u8; 4] = *b"CIFR";
/// The one version this build reads and writes (3: subscribe first, hello
/// after it, goodbye messages, strict unused fields).
pub const VERSION: u16 = 3;
/// Bytes in every packet.
pub const PACKET_LEN: usize = 48;
/// The tag of the wire message that shares the ring (`"CIFRRING"`).
pub const SETUP_TAG: u64 = u64::from_le_bytes(*b"CIFRRING");
/// Most slots a ring may have: `2 * slots + 1` resources fit one wire message.
pub const MAX_SLOTS: u32 = 7;
/// Texel sizes an image ring's layout may announce, in bytes.
pub const IMAGE_TEXEL_BYTES: [u64; 5] = [1, 2, 4, 8, 16];
/// Largest frame a layout may announce, in bytes.
pub const MAX_FRAME_BYTES: u64 = 1 << 31;
/// Most named images a slot of a multi-image ring may hold.
pub const MAX_PARTS: u32 = 4;
/// Longest name of a part, in bytes.
pub const MAX_PART_NAME: usize = 16;
/// Most resources one setup message may carry (the `vk-export` wire
/// message's bound, `interop_share::wire::MAX_RESOURCES`): a multi-image
/// ring's `slots * (parts + 1) + 1` must fit it.
pub const MAX_SETUP_RESOURCES: u32 = 16;

/// The `format` field of a buffer ring's hello: 8-bit RGBA, 4 bytes a pixel.
const FORMAT_RGBA8: u32 = 1;
/// ... NV12: 8-bit luma plane, then interleaved 8-bit CbCr at half size.
const FORMAT_NV12: u32 = 2;
/// ... P010: as NV12 with 16-bit samples, the value in the top 10 bits.
const FORMAT_P010: u32 = 3;
/// The hello flag of an image ring.
const HELLO_IMAGES: u32 = 1;
/// The hello flag of a multi-image ring (with [`HELLO_IMAGES`]): the
/// part count is in the hello's bytes 16..24.
const HELLO_PARTS: u32 = 2;
/// The release flag of a GPU-signalled release.
const RELEASE_GPU_SIGNALLED: u32 = 1;

/// How a receiver wants its frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// The newest frame when it asks; the sender never waits for it.
    #[default]
    Latest,
    /// Every frame, in order; the sender waits (bounded) for its releases.
    Lossless,
}

impl Delivery {
    /// `"latest"` or `"lossless"`.
    pub fn name(self) -> &'static str {
        match self {
            Delivery::Latest => "latest",
            Delivery::Lossless => "lossless",
        }
    }
}

/// A planar YUV 4:2:0 layout of a buffer ring (what NVENC takes and NVDEC
/// writes): a luma plane of `height` rows, then, at the layout's chroma
/// offset, a chroma plane of `height / 2` rows of `width / 2` interleaved
/// Cb, Cr pairs; both planes' rows [`RingLayout::row_pitch`] apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Planar {
    /// 8-bit samples.
    Nv12,
    /// 16-bit little-endian samples holding 10-bit values in their top
    /// bits (`value << 6`).
    P010,
}

impl Planar {
    /// Bytes of one sample (1 or 2): a luma row holds `width` samples, a
    /// chroma row `width` too (Cb, Cr for every other column).
    pub fn sample_bytes(self) -> u64 {
        match self {
            Planar::Nv12 => 1,
            Planar::P010 => 2,
        }
    }

    /// Its name: `nv12` or `p010`.
    pub fn name(self) -> &'static str {
        match self {
            Planar::Nv12 => "nv12",
            Planar::P010 => "p010",
        }
    }
}

/// What a ring's slots hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotFormat {
    /// Pitched linear buffers of 8-bit RGBA pixels.
    Rgba8Buffer,
    /// Pitched linear buffers of planar YUV 4:2:0 ([`Planar`]).
    PlanarBuffer {
        /// NV12 or P010.
        planar: Planar,
        /// Byte offset of the chroma plane's first row: a multiple of the
        /// row pitch, at least `row_pitch * height` (more where the
        /// producer aligns the luma plane's height, as decoders do).
        chroma_offset: u64,
    },
    /// OPTIMAL images of this `VkFormat` (its raw value).
    Image {
        /// The images' `VkFormat`.
        vk_format: u32,
    },
}

/// A ring's layout: what a hello announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingLayout {
    /// Slots in the ring (1 to [`MAX_SLOTS`]).
    pub slots: u32,
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Bytes from one row to the next (an image ring: the tightly packed row).
    pub row_pitch: u64,
    /// What the slots are (a multi-image ring: part 0's format).
    pub format: SlotFormat,
    /// Named images a slot holds, for a multi-image ring (1 to
    /// [`MAX_PARTS`]; their [`PartLayout`]s follow the hello); 0 for every
    /// other ring (one unnamed image or buffer a slot).
    pub parts: u32,
}

impl RingLayout {
    /// A ring of `slots` RGBA8 buffers of `width` x `height` with rows
    /// `row_pitch` bytes apart.
    pub fn buffers(slots: u32, width: u32, height: u32, row_pitch: u64) -> RingLayout {
        RingLayout {
            slots,
            width,
            height,
            row_pitch,
            format: SlotFormat::Rgba8Buffer,
            parts: 0,
        }
    }

    /// A ring of `slots` planar YUV buffers of `width` x `height` (both
    /// even) with rows `row_pitch` bytes apart and the chroma plane right
    /// after the luma plane (`row_pitch * height`), the layout NVENC takes.
    pub fn planar(
        slots: u32,
        width: u32,
        height: u32,
        row_pitch: u64,
        planar: Planar,
    ) -> RingLayout {
        RingLayout {
            slots,
            width,
            height,
            row_pitch,
            format: SlotFormat::PlanarBuffer {
                planar,
                chroma_offset: row_pitch.saturating_mul(u64::from(height)),
            },
            parts: 0,
        }
    }

    /// The planar layout and the chroma plane's offset, for a planar ring.
    pub fn planar_format(&self) -> Option<(Planar, u64)> {
        match self.format {
            SlotFormat::PlanarBuffer {
                planar,
                chroma_offset,
            } => Some((planar, chroma_offset)),
            _ => None,
        }
    }

    /// A ring of `slots` images of `vk_format` (a raw `VkFormat`) whose
    /// texels are `texel_bytes` bytes.
    pub fn images(
        slots: u32,
        width: u32,
        height: u32,
        vk_format: u32,
        texel_bytes: u32,
    ) -> RingLayout {
        RingLayout {
            slots,
            width,
            height,
            row_pitch: u64::from(width) * u64::from(texel_bytes),
            format: SlotFormat::Image { vk_format },
            parts: 0,
        }
    }

    /// A multi-image ring of `slots` slots of `width` x `height`, each
    /// holding one image of each of `parts` (1 to [`MAX_PARTS`]; the hello
    /// carries part 0's format, the part messages all of them).
    pub fn multi_image(slots: u32, width: u32, height: u32, parts: &[PartLayout]) -> RingLayout {
        let (vk_format, texel_bytes) = parts
            .first()
            .map_or((0, 0), |p| (p.vk_format, p.texel_bytes));
        RingLayout {
            parts: u32::try_from(parts.len()).unwrap_or(u32::MAX),
            ..RingLayout::images(slots, width, height, vk_format, texel_bytes)
        }
    }

    /// Whether it is a multi-image ring ([`RingLayout::parts`] is not 0).
    pub fn is_multi_image(&self) -> bool {
        self.parts != 0
    }

    /// Images (or buffers) in one slot: the parts of a multi-image ring, 1
    /// otherwise.
    pub fn images_per_slot(&self) -> u32 {
        self.parts.max(1)
    }

    /// Index in the setup message of slot `slot`'s image of part `part`
    /// (part 0 for a ring of one image or buffer a slot).
    pub fn resource_of(&self, slot: u32, part: u32) -> usize {
        slot as usize * self.images_per_slot() as usize + part as usize
    }

    /// Index in the setup message of the "produced" timeline (after every
    /// slot's images); the "released" timeline of slot `i` follows it at
    /// `produced_index() + 1 + i`.
    pub fn produced_index(&self) -> usize {
        self.slots as usize * self.images_per_slot() as usize
    }

    /// Whether the slots are images.
    pub fn is_image_ring(&self) -> bool {
        matches!(self.format, SlotFormat::Image { .. })
    }

    /// The images' raw `VkFormat`, for an image ring.
    pub fn vk_format(&self) -> Option<u32> {
        match self.format {
            SlotFormat::Image { vk_format } => Some(vk_format),
            SlotFormat::Rgba8Buffer | SlotFormat::PlanarBuffer { .. } => None,
        }
    }

    /// Bytes of one texel (a pixel of an RGBA8 buffer ring: 4; a planar
    /// ring's luma sample: 1 or 2).
    pub fn texel_bytes(&self) -> u64 {
        match self.format {
            SlotFormat::Rgba8Buffer => 4,
            SlotFormat::PlanarBuffer { planar, .. } => planar.sample_bytes(),
            SlotFormat::Image { .. } => self.row_pitch / u64::from(self.width.max(1)),
        }
    }

    /// Checks the layout: 1 to [`MAX_SLOTS`] slots, a non-empty frame of at
    /// most [`MAX_FRAME_BYTES`]; buffer rings: rows that fit the pitch (a
    /// multiple of 4, at most 2 GiB); image rings: a nonzero format and a
    /// pitch of `width` texels of one of [`IMAGE_TEXEL_BYTES`]. A layout
    /// built by hand is checked like a received one.
    pub fn check(&self) -> Result<(), PacketError> {
        let bad = |why: String| Err(PacketError::Layout(why));
        if self.slots == 0 || self.slots > MAX_SLOTS {
            return bad(format!("{} slots (1 to {MAX_SLOTS})", self.slots));
        }
        if self.width == 0 || self.height == 0 {
            return bad(format!("{}x{} pixels", self.width, self.height));
        }
        if self.parts != 0 {
            if !self.is_image_ring() {
                return bad(format!("{} parts in a buffer ring", self.parts));
            }
            if self.parts > MAX_PARTS {
                return bad(format!("{} images a slot (1 to {MAX_PARTS})", self.parts));
            }
            let resources = u64::from(self.slots) * u64::from(self.parts + 1) + 1;
            if resources > u64::from(MAX_SETUP_RESOURCES) {
                return bad(format!(
                    "{} slots of {} images: {resources} resources to share, one setup message \
                     carries at most {MAX_SETUP_RESOURCES} (fewer slots or parts)",
                    self.slots, self.parts
                ));
            }
        }
        match self.format {
            SlotFormat::Image { vk_format } => {
                if vk_format == 0 {
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
            }
            SlotFormat::PlanarBuffer {
                planar,
                chroma_offset,
            } => {
                if self.width % 2 == 1 || self.height % 2 == 1 {
                    return bad(format!(
                        "a {} frame of {}x{} (4:2:0 needs an even width and height)",
                        planar.name(),
                        self.width,
                        self.height
                    ));
                }
                let row = u64::from(self.width) * planar.sample_bytes();
                if self.row_pitch < row
                    || !self.row_pitch.is_multiple_of(4)
                    || self.row_pitch > MAX_FRAME_BYTES
                {
                    return bad(format!(
                        "row pitch {} for {} rows of {row} bytes (at least a row, a multiple of \
                         4, at most 2 GiB)",
                        self.row_pitch,
                        planar.name()
                    ));
                }
                let luma = self.row_pitch * u64::from(self.height);
                if chroma_offset < luma || !chroma_offset.is_multiple_of(self.row_pitch) {
                    return bad(format!(
                        "chroma plane at byte {chroma_offset} (a multiple of the row pitch {}, \
                         after the luma plane's {luma} bytes)",
                        self.row_pitch
                    ));
                }
            }
            SlotFormat::Rgba8Buffer => {
                let row = u64::from(self.width) * 4;
                // The pitch becomes a tensor stride (an i64) and is bounded
                // like the frame: a one-row frame would otherwise leave it
                // unchecked.
                if self.row_pitch < row
                    || !self.row_pitch.is_multiple_of(4)
                    || self.row_pitch > MAX_FRAME_BYTES
                {
                    return bad(format!(
                        "row pitch {} for rows of {row} bytes (at least a row, a multiple of \
                         4, at most 2 GiB)",
                        self.row_pitch
                    ));
                }
            }
        }
        match self.frame_bytes() {
            Some(n) if n <= MAX_FRAME_BYTES => Ok(()),
            _ => bad(format!(
                "{}x{} with pitch {} is larger than 2 GiB",
                self.width, self.height, self.row_pitch
            )),
        }
    }

    /// Bytes a frame spans: all rows but the last at the pitch, the last
    /// one only as wide as the image (4 bytes a pixel in a buffer ring; an
    /// image ring's rows are the pitch; a planar ring's last row is the
    /// chroma plane's). `None` if it overflows.
    pub fn frame_bytes(&self) -> Option<u64> {
        let last_row = match self.format {
            SlotFormat::Image { .. } => self.row_pitch,
            SlotFormat::Rgba8Buffer => u64::from(self.width) * 4,
            SlotFormat::PlanarBuffer {
                planar,
                chroma_offset,
            } => {
                // The chroma plane's rows: as wide as a luma row.
                let row = u64::from(self.width) * planar.sample_bytes();
                return u64::from(self.height / 2)
                    .checked_sub(1)?
                    .checked_mul(self.row_pitch)?
                    .checked_add(row)?
                    .checked_add(chroma_offset);
            }
        };
        u64::from(self.height)
            .checked_sub(1)?
            .checked_mul(self.row_pitch)?
            .checked_add(last_row)
    }

    /// [`RingLayout::frame_bytes`] of a checked layout.
    pub fn checked_frame_bytes(&self) -> Result<u64, PacketError> {
        self.check()?;
        self.frame_bytes()
            .ok_or_else(|| PacketError::Layout("frame size overflows".into()))
    }
}

/// The name of one image of a multi-image ring's slots: 1 to
/// [`MAX_PART_NAME`] bytes of ASCII letters, digits, `_`, `-` and `.`,
/// starting with a letter (`color`, `depth`, `segmentation`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartName {
    bytes: [u8; MAX_PART_NAME],
    len: u8,
}

impl PartName {
    /// `name`, checked.
    pub fn new(name: &str) -> Result<PartName, PacketError> {
        let b = name.as_bytes();
        let valid = !b.is_empty()
            && b.len() <= MAX_PART_NAME
            && b[0].is_ascii_alphabetic()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'));
        if !valid {
            return Err(PacketError::Layout(format!(
                "part name {name:?}: 1 to {MAX_PART_NAME} ASCII letters, digits, '_', '-' or \
                 '.', starting with a letter"
            )));
        }
        let mut bytes = [0u8; MAX_PART_NAME];
        bytes[..b.len()].copy_from_slice(b);
        Ok(PartName {
            bytes,
            len: b.len() as u8,
        })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Only `new` makes one, from a str of ASCII bytes.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    /// The name's wire bytes: the name, then zeros.
    fn wire(&self) -> [u8; MAX_PART_NAME] {
        self.bytes
    }

    /// A name from its wire bytes: the name, then zeros only.
    fn from_wire(bytes: [u8; MAX_PART_NAME]) -> Result<PartName, PacketError> {
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(MAX_PART_NAME);
        if bytes[len..].iter().any(|&b| b != 0) {
            return Err(PacketError::Layout(
                "a part name with bytes after its end (a name is zero-padded)".into(),
            ));
        }
        let name = std::str::from_utf8(&bytes[..len]).map_err(|_| {
            PacketError::Layout(format!(
                "part name bytes {:02x?} are not ASCII",
                &bytes[..len]
            ))
        })?;
        PartName::new(name)
    }
}

impl std::fmt::Debug for PartName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl std::fmt::Display for PartName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One named image of a multi-image ring's slots: what a
/// [`Message::Part`] announces. Every part is the ring's width and height.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PartLayout {
    /// Its name, unique in the ring.
    pub name: PartName,
    /// Its raw `VkFormat` (not 0).
    pub vk_format: u32,
    /// Bytes of one texel of the format (one of [`IMAGE_TEXEL_BYTES`]).
    pub texel_bytes: u32,
}

impl PartLayout {
    /// Checks it: a format, and a texel size of [`IMAGE_TEXEL_BYTES`].
    pub fn check(&self) -> Result<(), PacketError> {
        if self.vk_format == 0 {
            return Err(PacketError::Layout(format!(
                "part {} of VK_FORMAT_UNDEFINED",
                self.name
            )));
        }
        if !IMAGE_TEXEL_BYTES.contains(&u64::from(self.texel_bytes)) {
            return Err(PacketError::Layout(format!(
                "part {} with texels of {} bytes (1, 2, 4, 8 or 16)",
                self.name, self.texel_bytes
            )));
        }
        Ok(())
    }

    /// Bytes of one tightly packed row of `width` texels.
    pub fn row_bytes(&self, width: u32) -> u64 {
        u64::from(width) * u64::from(self.texel_bytes)
    }
}

/// Checks a multi-image ring's parts against its hello: as many as it
/// announces, each valid, names unique, part 0 the hello's format and row.
pub fn check_parts(layout: &RingLayout, parts: &[PartLayout]) -> Result<(), PacketError> {
    let bad = |why: String| Err(PacketError::Layout(why));
    layout.check()?;
    if parts.len() != layout.parts as usize {
        return bad(format!(
            "{} part layouts for a hello of {} parts",
            parts.len(),
            layout.parts
        ));
    }
    for (i, p) in parts.iter().enumerate() {
        p.check()?;
        if parts[..i].iter().any(|q| q.name == p.name) {
            return bad(format!("two parts named {}", p.name));
        }
        let bytes = p.row_bytes(layout.width) * u64::from(layout.height);
        if bytes > MAX_FRAME_BYTES {
            return bad(format!(
                "part {} of {}x{} is {bytes} bytes, larger than 2 GiB",
                p.name, layout.width, layout.height
            ));
        }
    }
    if let Some(first) = parts.first() {
        if layout.vk_format() != Some(first.vk_format)
            || layout.row_pitch != first.row_bytes(layout.width)
        {
            return bad(format!(
                "the hello says VkFormat {:?} with rows of {} bytes, part 0 ({}) is VkFormat {} \
                 with rows of {}",
                layout.vk_format(),
                layout.row_pitch,
                first.name,
                first.vk_format,
                first.row_bytes(layout.width)
            ));
        }
    }
    Ok(())
}

/// Why a sender dropped a receiver: what [`Message::Goodbye`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// It held frame `sequence` longer than the hold timeout.
    HeldTooLong {
        /// The frame.
        sequence: u64,
        /// The hold timeout.
        limit: Duration,
    },
    /// It promised a GPU release of frame `sequence` and its "released"
    /// timeline did not reach it within the hold timeout.
    GpuReleaseMissing {
        /// The frame.
        sequence: u64,
        /// The hold timeout.
        limit: Duration,
    },
    /// It did not subscribe within the sender's subscribe bound.
    NotSubscribed {
        /// The bound.
        limit: Duration,
    },
    /// The sender serves this many receivers already.
    TooManyReceivers {
        /// The sender's limit.
        limit: u32,
    },
    /// Its process connected more often than the sender allows.
    TooManyConnects {
        /// Connections a second the sender allows one process.
        per_second: u32,
    },
    /// Its socket was full: it stopped reading frame messages.
    StoppedReading,
    /// It broke the protocol.
    ProtocolFault(Fault),
    /// The sender stops.
    SenderStopping,
}

/// What a receiver did wrong ([`DropReason::ProtocolFault`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// A packet that does not decode.
    BadPacket,
    /// It released frame `sequence`, which it does not hold.
    NotHeld {
        /// The frame.
        sequence: u64,
    },
    /// A second subscribe.
    SubscribedTwice,
    /// Something other than a subscribe first.
    NotSubscribedFirst,
    /// A lossless receiver asked for a frame.
    AcquireWhenLossless,
    /// A GPU-signalled release on a ring without semaphores.
    GpuSignalWithoutSemaphores,
    /// A message only senders send.
    SenderMessage,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::BadPacket => write!(f, "it sent a packet that is not a frame-protocol packet"),
            Fault::NotHeld { sequence } => {
                write!(f, "it released frame {sequence}, which it does not hold")
            }
            Fault::SubscribedTwice => write!(f, "it subscribed twice"),
            Fault::NotSubscribedFirst => write!(f, "its first message was not a subscribe"),
            Fault::AcquireWhenLossless => {
                write!(f, "it asked for a frame, but it is a lossless receiver")
            }
            Fault::GpuSignalWithoutSemaphores => write!(
                f,
                "it released with a GPU signal, but the ring has no semaphores"
            ),
            Fault::SenderMessage => write!(f, "it sent a message only senders send"),
        }
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DropReason::HeldTooLong { sequence, limit } => write!(
                f,
                "it held frame {sequence} longer than the sender's hold timeout ({limit:?}): \
                 release frames sooner, or raise SenderOptions::hold_timeout"
            ),
            DropReason::GpuReleaseMissing { sequence, limit } => write!(
                f,
                "its GPU release of frame {sequence} did not arrive within the sender's hold \
                 timeout ({limit:?}): the \"released\" timeline was never signalled"
            ),
            DropReason::NotSubscribed { limit } => {
                write!(f, "it did not subscribe within {limit:?} of connecting")
            }
            DropReason::TooManyReceivers { limit } => write!(
                f,
                "the sender serves {limit} receivers already (SenderOptions::max_receivers)"
            ),
            DropReason::TooManyConnects { per_second } => write!(
                f,
                "its process connected more than {per_second} times a second \
                 (SenderOptions::connects_per_second)"
            ),
            DropReason::StoppedReading => write!(
                f,
                "it stopped reading: its socket was full when a frame message was due"
            ),
            DropReason::ProtocolFault(fault) => write!(f, "protocol fault: {fault}"),
            DropReason::SenderStopping => write!(f, "the sender stops"),
        }
    }
}

/// One message of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// Sender to receiver, once, after the subscribe: the ring's layout.
    Hello(RingLayout),
    /// Sender to receiver, right after the hello of a multi-image ring:
    /// one per part, `index` 0, 1, ... in order.
    Part {
        /// Its place in the slot (0 to [`RingLayout::parts`] - 1).
        index: u32,
        /// Its name, format and texel size.
        part: PartLayout,
    },
    /// Sender to receiver: frame `sequence` is in `slot`.
    Frame {
        /// The slot.
        slot: u32,
        /// The frame's sequence number (from 1).
        sequence: u64,
        /// Its presentation time, nanoseconds of `CLOCK_MONOTONIC`.
        timestamp_ns: u64,
    },
    /// Receiver to sender: done with frame `sequence` of `slot`.
    Release {
        /// The slot.
        slot: u32,
        /// The frame.
        sequence: u64,
        /// The receiver signals the slot's "released" timeline with
        /// `sequence` when its GPU work is done.
        gpu_signalled: bool,
    },
    /// Receiver to sender, first and once: its delivery.
    Subscribe(Delivery),
    /// Receiver (latest delivery) to sender: send the newest frame, or the
    /// next one if it has had the newest.
    Acquire,
    /// Sender to receiver, last: why the sender drops it.
    Goodbye(DropReason),
}

/// Why a packet was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Not [`PACKET_LEN`] bytes.
    #[error("frame packet of {0} bytes (expected {PACKET_LEN}): not a cuda-interop frame peer")]
    Length(usize),
    /// Does not start with [`MAGIC`].
    #[error("frame packet with magic {0:02x?} (expected \"CIFR\"): not a cuda-interop frame peer")]
    Magic([u8; 4]),
    /// Another [`VERSION`].
    #[error(
        "frame protocol version {0} is not supported (this build speaks {VERSION}); update both \
         sides"
    )]
    Version(u16),
    /// An unknown kind.
    #[error("unknown frame packet kind {0}")]
    Kind(u16),
    /// A field the message does not use is not 0, or a code is unknown.
    #[error("malformed {kind} packet: {why}")]
    Malformed {
        /// The message kind.
        kind: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A hello whose layout cannot be a ring.
    #[error("bad ring layout: {0}")]
    Layout(String),
}

const KIND_HELLO: u16 = 1;
const KIND_FRAME: u16 = 2;
const KIND_RELEASE: u16 = 3;
const KIND_SUBSCRIBE: u16 = 4;
const KIND_ACQUIRE: u16 = 5;
const KIND_GOODBYE: u16 = 6;
const KIND_PART: u16 = 7;

/// The raw fields of a packet: `a` at 8..12, `b` at 12..16, `c` at 16..24,
/// `d` at 24..32, `e` at 32..40, `g` at 40..44; 44..48 is always 0.
#[derive(Default)]
struct Fields {
    a: u32,
    b: u32,
    c: u64,
    d: u64,
    e: u64,
    g: u32,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Message {
    /// The packet's bytes.
    pub fn encode(&self) -> [u8; PACKET_LEN] {
        let (kind, f) = match *self {
            Message::Hello(l) => {
                let (flags, format, chroma_offset) = match l.format {
                    SlotFormat::Rgba8Buffer => (0, FORMAT_RGBA8, 0),
                    SlotFormat::PlanarBuffer {
                        planar: Planar::Nv12,
                        chroma_offset,
                    } => (0, FORMAT_NV12, chroma_offset),
                    SlotFormat::PlanarBuffer {
                        planar: Planar::P010,
                        chroma_offset,
                    } => (0, FORMAT_P010, chroma_offset),
                    SlotFormat::Image { vk_format } if l.parts != 0 => {
                        (HELLO_IMAGES | HELLO_PARTS, vk_format, u64::from(l.parts))
                    }
                    SlotFormat::Image { vk_format } => (HELLO_IMAGES, vk_format, 0),
                };
                let size = u64::from(l.width) | u64::from(l.height) << 32;
                let f = Fields {
                    a: l.slots,
                    b: flags,
                    c: chroma_offset,
                    d: size,
                    e: l.row_pitch,
                    g: format,
                };
                (KIND_HELLO, f)
            }
            Message::Part { index, part } => {
                let name = part.name.wire();
                let half = |h: usize| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&name[h * 8..h * 8 + 8]);
                    u64::from_le_bytes(b)
                };
                (
                    KIND_PART,
                    Fields {
                        a: index,
                        b: part.texel_bytes,
                        c: half(0),
                        d: half(1),
                        g: part.vk_format,
                        ..Fields::default()
                    },
                )
            }
            Message::Frame {
                slot,
                sequence,
                timestamp_ns,
            } => (
                KIND_FRAME,
                Fields {
                    a: slot,
                    c: sequence,
                    d: timestamp_ns,
                    ..Fields::default()
                },
            ),
            Message::Release {
                slot,
                sequence,
                gpu_signalled,
            } => (
                KIND_RELEASE,
                Fields {
                    a: slot,
                    b: if gpu_signalled {
                        RELEASE_GPU_SIGNALLED
                    } else {
                        0
                    },
                    c: sequence,
                    ..Fields::default()
                },
            ),
            Message::Subscribe(d) => (
                KIND_SUBSCRIBE,
                Fields {
                    b: match d {
                        Delivery::Lossless => 0,
                        Delivery::Latest => 1,
                    },
                    ..Fields::default()
                },
            ),
            Message::Acquire => (KIND_ACQUIRE, Fields::default()),
            Message::Goodbye(reason) => (KIND_GOODBYE, encode_reason(reason)),
        };
        let mut b = [0u8; PACKET_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&kind.to_le_bytes());
        b[8..12].copy_from_slice(&f.a.to_le_bytes());
        b[12..16].copy_from_slice(&f.b.to_le_bytes());
        b[16..24].copy_from_slice(&f.c.to_le_bytes());
        b[24..32].copy_from_slice(&f.d.to_le_bytes());
        b[32..40].copy_from_slice(&f.e.to_le_bytes());
        b[40..44].copy_from_slice(&f.g.to_le_bytes());
        b
    }

    /// Parses one packet, refusing it whole if anything is off (see the
    /// module contract); a hello's layout is checked too.
    pub fn decode(bytes: &[u8]) -> Result<Message, PacketError> {
        if bytes.len() != PACKET_LEN {
            return Err(PacketError::Length(bytes.len()));
        }
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let u32_at =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | u64::from(u32_at(i + 4)) << 32;
        let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if magic != MAGIC {
            return Err(PacketError::Magic(magic));
        }
        if u16_at(4) != VERSION {
            return Err(PacketError::Version(u16_at(4)));
        }
        let f = Fields {
            a: u32_at(8),
            b: u32_at(12),
            c: u64_at(16),
            d: u64_at(24),
            e: u64_at(32),
            g: u32_at(40),
        };
        let kind = u16_at(6);
        let name = match kind {
            KIND_HELLO => "hello",
            KIND_FRAME => "frame",
            KIND_RELEASE => "release",
            KIND_SUBSCRIBE => "subscribe",
            KIND_ACQUIRE => "acquire",
            KIND_GOODBYE => "goodbye",
            KIND_PART => "part",
            k => return Err(PacketError::Kind(k)),
        };
        let malformed = |why: String| PacketError::Malformed { kind: name, why };
        // Which of a, b, c, d, e, g the kind uses; the rest must be 0.
        let used: [bool; 6] = match kind {
            // A hello's c (the chroma offset) is checked with its format.
            KIND_HELLO => [true, true, true, true, true, true],
            KIND_FRAME => [true, false, true, true, false, false],
            KIND_RELEASE => [true, true, true, false, false, false],
            KIND_SUBSCRIBE => [false, true, false, false, false, false],
            KIND_ACQUIRE => [false; 6],
            KIND_PART => [true, true, true, true, false, true],
            _ => [false, true, true, false, true, false],
        };
        let values = [
            u64::from(f.a),
            u64::from(f.b),
            f.c,
            f.d,
            f.e,
            u64::from(f.g),
        ];
        let names = ["8..12", "12..16", "16..24", "24..32", "32..40", "40..44"];
        for i in 0..6 {
            if !used[i] && values[i] != 0 {
                return Err(malformed(format!("bytes {} are not 0", names[i])));
            }
        }
        if u32_at(44) != 0 {
            return Err(malformed("bytes 44..48 are not 0".into()));
        }
        let message = match kind {
            KIND_HELLO => {
                let planar = |planar| SlotFormat::PlanarBuffer {
                    planar,
                    chroma_offset: f.c,
                };
                let multi = f.b == HELLO_IMAGES | HELLO_PARTS;
                if f.c != 0 && !multi && !(f.b == 0 && [FORMAT_NV12, FORMAT_P010].contains(&f.g)) {
                    return Err(malformed("bytes 16..24 are not 0".into()));
                }
                let parts = if multi {
                    match u32::try_from(f.c) {
                        Ok(n @ 1..) => n,
                        _ => {
                            return Err(PacketError::Layout(format!(
                                "a multi-image hello of {} parts (1 to {MAX_PARTS})",
                                f.c
                            )))
                        }
                    }
                } else {
                    0
                };
                let format = match f.b {
                    0 if f.g == FORMAT_RGBA8 => SlotFormat::Rgba8Buffer,
                    0 if f.g == FORMAT_NV12 => planar(Planar::Nv12),
                    0 if f.g == FORMAT_P010 => planar(Planar::P010),
                    0 => {
                        return Err(PacketError::Layout(format!(
                            "format {} (a buffer ring is RGBA8, 1; NV12, 2; or P010, 3)",
                            f.g
                        )))
                    }
                    HELLO_IMAGES => SlotFormat::Image { vk_format: f.g },
                    _ if multi => SlotFormat::Image { vk_format: f.g },
                    flags => {
                        return Err(PacketError::Layout(format!(
                            "hello flags {flags:#x} (1, images, and 3, images of several parts, \
                             are known)"
                        )))
                    }
                };
                let layout = RingLayout {
                    slots: f.a,
                    width: f.d as u32,
                    height: (f.d >> 32) as u32,
                    row_pitch: f.e,
                    format,
                    parts,
                };
                layout.check()?;
                Message::Hello(layout)
            }
            KIND_FRAME => Message::Frame {
                slot: f.a,
                sequence: f.c,
                timestamp_ns: f.d,
            },
            KIND_RELEASE => Message::Release {
                slot: f.a,
                sequence: f.c,
                gpu_signalled: match f.b {
                    0 => false,
                    RELEASE_GPU_SIGNALLED => true,
                    flags => return Err(malformed(format!("release flags {flags:#x}"))),
                },
            },
            KIND_SUBSCRIBE => Message::Subscribe(match f.b {
                0 => Delivery::Lossless,
                1 => Delivery::Latest,
                mode => {
                    return Err(malformed(format!(
                        "delivery {mode} (0: lossless, 1: latest)"
                    )))
                }
            }),
            KIND_ACQUIRE => Message::Acquire,
            KIND_PART => {
                let mut name = [0u8; MAX_PART_NAME];
                name[..8].copy_from_slice(&f.c.to_le_bytes());
                name[8..].copy_from_slice(&f.d.to_le_bytes());
                let part = PartLayout {
                    name: PartName::from_wire(name)?,
                    vk_format: f.g,
                    texel_bytes: f.b,
                };
                part.check()?;
                if f.a >= MAX_PARTS {
                    return Err(PacketError::Layout(format!(
                        "part {} of a slot (0 to {})",
                        f.a,
                        MAX_PARTS - 1
                    )));
                }
                Message::Part { index: f.a, part }
            }
            _ => Message::Goodbye(decode_reason(&f).ok_or_else(|| {
                malformed(format!(
                    "reason {}.{} is not known",
                    f.b & 0xffff,
                    f.b >> 16
                ))
            })?),
        };
        if let Message::Frame { sequence: 0, .. } | Message::Release { sequence: 0, .. } = message {
            return Err(malformed("frame number 0 (frames count from 1)".into()));
        }
        // One encoding per message: anything the fields above did not
        // carry (a field a reason does not use, say) is refused too.
        if message.encode()[..] != bytes[..] {
            return Err(malformed("a field its kind does not use is not 0".into()));
        }
        Ok(message)
    }

    /// What the message is, for errors.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Message::Hello(_) => "hello",
            Message::Part { .. } => "part",
            Message::Frame { .. } => "frame",
            Message::Release { .. } => "release",
            Message::Subscribe(_) => "subscribe",
            Message::Acquire => "acquire",
            Message::Goodbye(_) => "goodbye",
        }
    }
}

/// A reason's code in `b` (low half: the reason, high half: a fault's
/// kind), its frame in `c`, its bound in `e` (milliseconds or a count).
fn encode_reason(reason: DropReason) -> Fields {
    let (code, c, e) = match reason {
        DropReason::HeldTooLong { sequence, limit } => (1, sequence, millis(limit)),
        DropReason::GpuReleaseMissing { sequence, limit } => (2, sequence, millis(limit)),
        DropReason::NotSubscribed { limit } => (3, 0, millis(limit)),
        DropReason::TooManyReceivers { limit } => (4, 0, u64::from(limit)),
        DropReason::TooManyConnects { per_second } => (5, 0, u64::from(per_second)),
        DropReason::StoppedReading => (6, 0, 0),
        DropReason::SenderStopping => (7, 0, 0),
        DropReason::ProtocolFault(fault) => {
            let (kind, c) = match fault {
                Fault::BadPacket => (1, 0),
                Fault::NotHeld { sequence } => (2, sequence),
                Fault::SubscribedTwice => (3, 0),
                Fault::NotSubscribedFirst => (4, 0),
                Fault::AcquireWhenLossless => (5, 0),
                Fault::GpuSignalWithoutSemaphores => (6, 0),
                Fault::SenderMessage => (7, 0),
            };
            (8 | kind << 16, c, 0)
        }
    };
    Fields {
        b: code,
        c,
        e,
        ..Fields::default()
    }
}

fn decode_reason(f: &Fields) -> Option<DropReason> {
    let limit = Duration::from_millis(f.e);
    let small = |v: u64| u32::try_from(v).ok();
    let (code, kind) = (f.b & 0xffff, f.b >> 16);
    if code != 8 && kind != 0 {
        return None;
    }
    Some(match code {
        1 => DropReason::HeldTooLong {
            sequence: f.c,
            limit,
        },
        2 => DropReason::GpuReleaseMissing {
            sequence: f.c,
            limit,
        },
        3 => DropReason::NotSubscribed { limit },
        4 => DropReason::TooManyReceivers { limit: small(f.e)? },
        5 => DropReason::TooManyConnects {
            per_second: small(f.e)?,
        },
        6 => DropReason::StoppedReading,
        7 => DropReason::SenderStopping,
        8 => DropReason::ProtocolFault(match kind {
            1 => Fault::BadPacket,
            2 => Fault::NotHeld { sequence: f.c },
            3 => Fault::SubscribedTwice,
            4 => Fault::NotSubscribedFirst,
            5 => Fault::AcquireWhenLossless,
            6 => Fault::GpuSignalWithoutSemaphores,
            7 => Fault::SenderMessage,
            _ => return None,
        }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_message() -> Vec<Message> {
        let limit = Duration::from_millis(5000);
        let mut all = vec![
            Message::Hello(RingLayout::buffers(4, 1920, 1080, 7680)),
            Message::Hello(RingLayout::images(3, 64, 32, 37, 4)),
            Message::Hello(RingLayout::planar(3, 1920, 1080, 2048, Planar::Nv12)),
            // A decoder's layout: the luma plane padded to 1088 rows.
            Message::Hello(RingLayout {
                format: SlotFormat::PlanarBuffer {
                    planar: Planar::P010,
                    chroma_offset: 4096 * 1088,
                },
                ..RingLayout::planar(2, 1920, 1080, 4096, Planar::P010)
            }),
            Message::Frame {
                slot: 3,
                sequence: 99,
                timestamp_ns: 123_456_789,
            },
            Message::Release {
                slot: 1,
                sequence: 7,
                gpu_signalled: true,
            },
            Message::Release {
                slot: 0,
                sequence: 1,
                gpu_signalled: false,
            },
            Message::Subscribe(Delivery::Latest),
            Message::Subscribe(Delivery::Lossless),
            Message::Acquire,
            Message::Hello(RingLayout::multi_image(3, 64, 32, &three_parts())),
            Message::Part {
                index: 2,
                part: three_parts()[2],
            },
            Message::Part {
                index: 0,
                part: PartLayout {
                    name: PartName::new("sixteen-bytes.ok").unwrap(),
                    vk_format: 109,
                    texel_bytes: 16,
                },
            },
        ];
        let reasons = [
            DropReason::HeldTooLong {
                sequence: 22,
                limit,
            },
            DropReason::GpuReleaseMissing { sequence: 9, limit },
            DropReason::NotSubscribed { limit },
            DropReason::TooManyReceivers { limit: 16 },
            DropReason::TooManyConnects { per_second: 20 },
            DropReason::StoppedReading,
            DropReason::SenderStopping,
            DropReason::ProtocolFault(Fault::BadPacket),
            DropReason::ProtocolFault(Fault::NotHeld { sequence: 4 }),
            DropReason::ProtocolFault(Fault::SubscribedTwice),
            DropReason::ProtocolFault(Fault::NotSubscribedFirst),
            DropReason::ProtocolFault(Fault::AcquireWhenLossless),
            DropReason::ProtocolFault(Fault::GpuSignalWithoutSemaphores),
            DropReason::ProtocolFault(Fault::SenderMessage),
        ];
        all.extend(reasons.into_iter().map(Message::Goodbye));
        all
    }

    /// RGBA8 colour, R32_SFLOAT depth, R32_UINT segmentation.
    fn three_parts() -> Vec<PartLayout> {
        [("color", 37, 4), ("depth", 100, 4), ("segmentation", 98, 4)]
            .map(|(name, vk_format, texel_bytes)| PartLayout {
                name: PartName::new(name).unwrap(),
                vk_format,
                texel_bytes,
            })
            .to_vec()
    }

    #[test]
    fn part_names_are_short_ascii_and_start_with_a_letter() {
        for good in [
            "color",
            "depth",
            "seg_1",
            "a",
            "normals.xyz",
            "sixteen-bytes.ok",
        ] {
            assert_eq!(PartName::new(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            "1st",
            "_x",
            "seventeen-bytes.x",
            "dépth",
            "a b",
            "a\0b",
            "a/b",
        ] {
            let e = PartName::new(bad).unwrap_err();
            assert!(e.to_string().contains("part name"), "{bad:?}: {e}");
        }
        // On the wire: the name, then zeros only.
        let mut p = Message::Part {
            index: 0,
            part: three_parts()[0],
        }
        .encode();
        p[16 + 6] = b'x';
        assert!(
            matches!(Message::decode(&p), Err(PacketError::Layout(m)) if m.contains("after its end"))
        );
        let mut p = Message::Part {
            index: 0,
            part: three_parts()[0],
        }
        .encode();
        p[16] = 0xc3;
        assert!(Message::decode(&p).is_err());
        p[16] = 0;
        assert!(Message::decode(&p).is_err(), "an empty name");
    }

    #[test]
    fn multi_image_hellos_and_parts_are_checked() {
        let parts = three_parts();
        let hello = RingLayout::multi_image(3, 64, 32, &parts);
        assert_eq!(
            (hello.parts, hello.row_pitch, hello.vk_format()),
            (3, 256, Some(37))
        );
        assert_eq!(check_parts(&hello, &parts), Ok(()));
        assert_eq!(hello.resource_of(2, 1), 7);
        assert_eq!(hello.produced_index(), 9);
        let single = RingLayout::images(3, 64, 32, 37, 4);
        assert_eq!((single.images_per_slot(), single.produced_index()), (1, 3));
        // The hello's bytes: flags 3, the part count at 16..24.
        let b = Message::Hello(hello).encode();
        assert_eq!(&b[12..16], &3u32.to_le_bytes());
        assert_eq!(&b[16..24], &3u64.to_le_bytes());
        let refused = |l: RingLayout| Message::decode(&Message::Hello(l).encode()).unwrap_err();
        // Too many parts; too many resources for one setup message.
        let five = RingLayout {
            parts: MAX_PARTS + 1,
            ..hello
        };
        assert!(
            refused(five).to_string().contains("images a slot"),
            "{}",
            refused(five)
        );
        let big = RingLayout { slots: 4, ..hello };
        assert!(
            refused(big).to_string().contains("resources"),
            "{}",
            refused(big)
        );
        assert!(RingLayout {
            slots: 5,
            parts: 2,
            ..hello
        }
        .check()
        .is_ok());
        // Parts of a buffer ring.
        let buffers = RingLayout {
            parts: 2,
            ..RingLayout::buffers(2, 4, 4, 16)
        };
        assert!(buffers.check().is_err());
        // A zero part count with the multi flag.
        let mut b = Message::Hello(hello).encode();
        b[16..24].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(Message::decode(&b), Err(PacketError::Layout(_))));
        let mut b = Message::Hello(hello).encode();
        b[16..24].copy_from_slice(&(1u64 << 32).to_le_bytes());
        assert!(Message::decode(&b).is_err());
        // The parts against the hello.
        let named = |n: &str| PartName::new(n).unwrap();
        let mut dup = parts.clone();
        dup[2].name = named("color");
        assert!(check_parts(&hello, &dup)
            .unwrap_err()
            .to_string()
            .contains("two parts named color"));
        assert!(check_parts(&hello, &parts[..2]).is_err());
        let mut other = parts.clone();
        other.swap(0, 1);
        other[0].vk_format = 100;
        assert!(check_parts(&hello, &other)
            .unwrap_err()
            .to_string()
            .contains("part 0"));
        let mut wide = parts.clone();
        wide[0].texel_bytes = 8;
        assert!(check_parts(&hello, &wide).is_err());
        let mut odd = parts.clone();
        odd[1].texel_bytes = 3;
        assert!(check_parts(&hello, &odd).is_err());
        let mut undefined = parts.clone();
        undefined[2].vk_format = 0;
        assert!(check_parts(&hello, &undefined).is_err());
        // A part larger than a frame may be, though part 0 is not.
        let mut huge = parts;
        huge[1].texel_bytes = 16;
        let wide = RingLayout::multi_image(2, 8192, 16385, &huge);
        assert_eq!(wide.check(), Ok(()));
        assert!(check_parts(&wide, &huge)
            .unwrap_err()
            .to_string()
            .contains("larger than 2 GiB"));
        // A part message's own checks: texel size, format, index.
        let part = |index, texel_bytes, vk_format| {
            Message::decode(
                &Message::Part {
                    index,
                    part: PartLayout {
                        name: named("depth"),
                        vk_format,
                        texel_bytes,
                    },
                }
                .encode(),
            )
        };
        assert!(part(0, 4, 100).is_ok());
        assert!(part(0, 3, 100).is_err());
        assert!(part(0, 4, 0).is_err());
        assert!(part(MAX_PARTS, 4, 100).is_err());
    }

    #[test]
    fn every_message_round_trips() {
        for m in every_message() {
            assert_eq!(Message::decode(&m.encode()), Ok(m), "{m:?}");
        }
    }

    #[test]
    fn planar_layouts_are_checked_and_span_both_planes() {
        let nv12 = RingLayout::planar(2, 64, 32, 64, Planar::Nv12);
        assert_eq!(nv12.check(), Ok(()));
        // 32 luma rows, then 15 chroma rows at the pitch and a last one.
        assert_eq!(nv12.frame_bytes(), Some(64 * 32 + 15 * 64 + 64));
        assert_eq!(nv12.planar_format(), Some((Planar::Nv12, 64 * 32)));
        let p010 = RingLayout::planar(2, 64, 32, 256, Planar::P010);
        assert_eq!(p010.frame_bytes(), Some(256 * 32 + 15 * 256 + 128));
        assert_eq!(p010.texel_bytes(), 2);
        let refused = |l: RingLayout| {
            let err = Message::decode(&Message::Hello(l).encode()).unwrap_err();
            assert!(matches!(err, PacketError::Layout(_)), "{err}");
            err.to_string()
        };
        assert!(refused(RingLayout::planar(2, 63, 32, 64, Planar::Nv12)).contains("even"));
        assert!(refused(RingLayout::planar(2, 64, 31, 64, Planar::Nv12)).contains("even"));
        // A P010 row of 64 samples is 128 bytes.
        assert!(refused(RingLayout::planar(2, 64, 32, 64, Planar::P010)).contains("row pitch"));
        let at = |chroma_offset| RingLayout {
            format: SlotFormat::PlanarBuffer {
                planar: Planar::Nv12,
                chroma_offset,
            },
            ..nv12
        };
        assert!(refused(at(64 * 31)).contains("chroma plane"));
        assert!(refused(at(64 * 32 + 4)).contains("chroma plane"));
        assert_eq!(at(64 * 40).check(), Ok(()));
        // A chroma offset in an RGBA8 hello: refused whole.
        let mut bytes = Message::Hello(RingLayout::buffers(2, 4, 4, 16)).encode();
        bytes[16] = 1;
        assert!(matches!(
            Message::decode(&bytes),
            Err(PacketError::Malformed { .. })
        ));
    }

    #[test]
    fn bad_layouts_are_refused() {
        let refused = |l: RingLayout| Message::decode(&Message::Hello(l).encode()).is_err();
        assert!(refused(RingLayout::buffers(0, 4, 4, 16)));
        assert!(refused(RingLayout::buffers(8, 4, 4, 16)));
        assert!(refused(RingLayout::buffers(2, 4, 4, 15)));
        assert!(refused(RingLayout::buffers(2, 4, 4, 12)));
        assert!(refused(RingLayout::buffers(2, 0, 4, 16)));
        assert!(refused(RingLayout::buffers(2, 65535, 65535, 1 << 20)));
        // One row: the frame is small whatever the pitch, which becomes an
        // i64 stride, so the pitch is bounded on its own.
        assert!(!refused(RingLayout::buffers(2, 4, 1, 1 << 31)));
        assert!(refused(RingLayout::buffers(2, 4, 1, (1 << 31) + 4)));
        assert!(refused(RingLayout::buffers(2, 4, 1, u64::MAX - 3)));
        assert!(refused(RingLayout::images(3, 64, 32, 37, 3)));
        assert!(refused(RingLayout::images(3, 64, 32, 37, 0)));
        assert!(refused(RingLayout::images(3, 64, 32, 0, 4)));
        assert!(refused(RingLayout::images(3, 1 << 16, 1 << 14, 37, 16)));
        assert!(!refused(RingLayout::images(3, 64, 32, 109, 16)));
        let mut odd = RingLayout::images(3, 64, 32, 37, 4);
        odd.row_pitch = 255;
        assert!(refused(odd));
        // A hand-built layout is checked the same way.
        assert!(RingLayout::buffers(2, 4, 4, 12).check().is_err());
        assert!(RingLayout::buffers(MAX_SLOTS, 4, 4, 16).check().is_ok());
    }

    #[test]
    fn encoding_is_little_endian_at_fixed_offsets() {
        let b = Message::Release {
            slot: 3,
            sequence: 0x0102_0304_0506_0708,
            gpu_signalled: true,
        }
        .encode();
        assert_eq!(&b[0..4], b"CIFR");
        assert_eq!(&b[4..6], &3u16.to_le_bytes());
        assert_eq!(&b[6..8], &KIND_RELEASE.to_le_bytes());
        assert_eq!(&b[8..12], &3u32.to_le_bytes());
        assert_eq!(&b[12..16], &1u32.to_le_bytes());
        assert_eq!(&b[16..24], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert!(b[24..].iter().all(|&x| x == 0));
        let h = Message::Hello(RingLayout::buffers(2, 640, 480, 2560)).encode();
        assert_eq!(&h[8..12], &2u32.to_le_bytes());
        assert_eq!(&h[24..28], &640u32.to_le_bytes());
        assert_eq!(&h[28..32], &480u32.to_le_bytes());
        assert_eq!(&h[32..40], &2560u64.to_le_bytes());
        assert_eq!(&h[40..44], &FORMAT_RGBA8.to_le_bytes());
        let f = Message::Frame {
            slot: 2,
            sequence: 5,
            timestamp_ns: 0x1112_1314_1516_1718,
        }
        .encode();
        assert_eq!(&f[24..32], &0x1112_1314_1516_1718u64.to_le_bytes());
        let s = Message::Subscribe(Delivery::Latest).encode();
        assert_eq!(&s[12..16], &1u32.to_le_bytes());
    }

    #[test]
    fn anything_off_is_refused_whole() {
        let good = Message::Frame {
            slot: 1,
            sequence: 2,
            timestamp_ns: 3,
        }
        .encode();
        assert_eq!(Message::decode(&good[..47]), Err(PacketError::Length(47)));
        assert_eq!(Message::decode(&[]), Err(PacketError::Length(0)));
        let mut b = good;
        b[0] = b'X';
        assert_eq!(Message::decode(&b), Err(PacketError::Magic(*b"XIFR")));
        let mut b = good;
        b[4..6].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(Message::decode(&b), Err(PacketError::Version(2)));
        for kind in [0u16, 8, u16::MAX] {
            let mut b = good;
            b[6..8].copy_from_slice(&kind.to_le_bytes());
            assert_eq!(Message::decode(&b), Err(PacketError::Kind(kind)));
        }
        // Every byte a message does not use must be 0: flipping any of
        // them is refused, for every kind.
        for m in every_message() {
            let bytes = m.encode();
            for i in 8..PACKET_LEN {
                let mut b = bytes;
                b[i] ^= 0x80;
                if let Ok(other) = Message::decode(&b) {
                    // A used byte changed a value: a different message.
                    assert_ne!(other, m, "byte {i} of {m:?} was ignored");
                }
            }
        }
        let mut s = Message::Subscribe(Delivery::Latest).encode();
        s[12..16].copy_from_slice(&2u32.to_le_bytes());
        assert!(matches!(
            Message::decode(&s),
            Err(PacketError::Malformed { .. })
        ));
        let mut r = Message::Release {
            slot: 0,
            sequence: 1,
            gpu_signalled: false,
        }
        .encode();
        r[12..16].copy_from_slice(&2u32.to_le_bytes());
        assert!(matches!(
            Message::decode(&r),
            Err(PacketError::Malformed { .. })
        ));
        let mut g = Message::Goodbye(DropReason::StoppedReading).encode();
        g[12..16].copy_from_slice(&99u32.to_le_bytes());
        assert!(matches!(
            Message::decode(&g),
            Err(PacketError::Malformed { .. })
        ));
        let zero = Message::Frame {
            slot: 0,
            sequence: 0,
            timestamp_ns: 0,
        };
        assert!(matches!(
            Message::decode(&zero.encode()),
            Err(PacketError::Malformed { .. })
        ));
    }

    #[test]
    fn frame_bytes_spans_the_last_row_unpadded() {
        assert_eq!(
            RingLayout::buffers(2, 4, 3, 32).frame_bytes(),
            Some(2 * 32 + 16)
        );
        assert_eq!(RingLayout::buffers(2, 4, 0, 32).frame_bytes(), None);
        assert_eq!(RingLayout::buffers(2, 1, 1, 4).frame_bytes(), Some(4));
        let image = RingLayout::images(3, 64, 32, 37, 4);
        assert_eq!(
            (image.row_pitch, image.frame_bytes()),
            (256, Some(32 * 256))
        );
        assert_eq!(image.texel_bytes(), 4);
        assert_eq!(image.vk_format(), Some(37));
        assert!(RingLayout::buffers(2, 4, 4, 12)
            .checked_frame_bytes()
            .is_err());
    }

    #[test]
    fn error_and_reason_messages_say_what_to_do() {
        assert_eq!(
            PacketError::Version(9).to_string(),
            "frame protocol version 9 is not supported (this build speaks 3); update both sides"
        );
        let held = DropReason::HeldTooLong {
            sequence: 22,
            limit: Duration::from_secs(5),
        }
        .to_string();
        assert!(
            held.contains("frame 22") && held.contains("hold_timeout"),
            "{held}"
        );
        let many = DropReason::TooManyReceivers { limit: 16 }.to_string();
        assert!(many.contains("max_receivers"), "{many}");
    }

    #[test]
    fn setup_tag_is_cifrring() {
        assert_eq!(&SETUP_TAG.to_le_bytes(), b"CIFRRING");
    }
}
