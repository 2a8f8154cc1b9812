//! Shared helpers for the integration tests: Vulkan contexts with validation,
//! fd counting, records made on the wire ([`sample`], [`tamper`]) and
//! structure-aware wire inputs for the fuzzer and its replay ([`wire_gen`]).

use std::time::Duration;

use vk_export::{Context, HeadlessOptions, Validation};

pub mod wire_gen;

/// A headless context with the validation layer required, unless
/// `CUDA_INTEROP_VALIDATION=off` (for machines without the layer: never CI).
pub fn vulkan(device_uuid: Option<[u8; 16]>) -> Context {
    let validation = match std::env::var("CUDA_INTEROP_VALIDATION").as_deref() {
        Ok("off") => Validation::Off,
        _ => Validation::Required,
    };
    Context::headless(&HeadlessOptions {
        device_uuid,
        validation,
    })
    .unwrap_or_else(|e| panic!("a Vulkan device with external memory is needed for this test: {e}"))
}

/// Asserts that the validation layer reported no error on `ctx`.
pub fn assert_no_validation_errors(ctx: &Context) {
    assert_eq!(
        ctx.validation_errors(),
        0,
        "validation errors on {ctx:?} (see stderr)"
    );
}

/// Debian's validation layer 1.3.239 keeps its own list of pending signal
/// operations per `VkSemaphore` and cannot see another device's or CUDA's
/// operations on a shared payload: a host signal of an exported or imported
/// timeline is then reported as `VUID-VkSemaphoreSignalInfo-value-03259`
/// against a "pending signal" that no submission of this process made (seen
/// on the H200: "pending signal operation (0)" on a semaphore nothing here
/// signals). It is the class of shared-payload tracking that upstream VVL
/// removed for its false positives (commit a701959d, "layers: Remove FD
/// payload tracking validation", VVL issue #11900; `INTEROP-RULES.md`
/// rule 17). Tests that host-signal a shared timeline allow exactly this id.
pub const IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE: &str =
    "VUID-VkSemaphoreSignalInfo-value-03259";

/// Asserts that every validation error reported on `ctx` has one of the
/// `allowed` message ids (each a known false positive, cited where defined).
pub fn assert_no_validation_errors_except(ctx: &Context, allowed: &[&str]) {
    let ids = ctx.validation_error_ids();
    let unexpected: Vec<&String> = ids
        .iter()
        .filter(|id| !allowed.contains(&id.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "validation errors on {ctx:?}: {unexpected:?} (see stderr)"
    );
    if !ids.is_empty() {
        println!("allowed validation errors (known false positives): {ids:?}");
    }
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

/// Open fds of this process (`/proc/self/fd`), less the one used to list them.
pub fn open_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1))
}

/// A generous timeout for host waits in tests.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Records as a hostile or buggy peer would send them: encoded, one field
/// overwritten on the wire, the checksum fixed, decoded again (so every
/// record the tests use was made by the crate's own decoder).
pub mod tamper {
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
}

/// Well-formed records written byte by byte (records have no public
/// constructor: tests make them the way a peer does, on the wire).
pub mod sample {
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
}

impl sample::ImageFields {
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
        match vk_export::wire::Message::decode(&sample::frame(&p)) {
            Ok(mut m) => match m.resources.remove(0) {
                vk_export::wire::Resource::Image(i) => i,
                other => panic!("decoded as {other:?}"),
            },
            Err(e) => panic!("{self:?} does not decode: {e}"),
        }
    }
}

/// Runs the ignored test `name` of the calling test binary in a child
/// process with `envs`, bounded (a child that hangs for 120 s is killed and
/// reported, never waited for for ever); `keep` (a socket end the child
/// inherits) is closed here once the child runs. Prints the child's output,
/// asserts that it passed, and returns its stdout.
pub fn run_child_test(
    name: &str,
    envs: &[(&str, &std::ffi::OsStr)],
    keep: Option<std::os::fd::OwnedFd>,
) -> String {
    let dir = std::env::temp_dir().join(format!("test-child-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    for (k, v) in envs {
        command.env(k, v);
    }
    let mut child = command.spawn().unwrap();
    drop(keep); // the child's copy of an inherited socket is its own now
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    std::fs::remove_dir_all(&dir).ok();
    println!("--- {name} stdout:\n{stdout}--- {name} stderr:\n{stderr}---");
    let status = status.unwrap_or_else(|| panic!("{name} hung for 120 s and was killed"));
    assert!(status.success(), "{name} failed: {status}");
    assert!(
        stdout.contains("1 passed"),
        "{name} did not run (is it still called that?)"
    );
    stdout
}

/// The environment variable that names the socket a child test inherits.
pub const CHILD_SOCKET_ENV: &str = "CUDA_INTEROP_CHILD_FD";

/// A connected pair whose second end a child process inherits: this
/// process's end, the child's (close-on-exec cleared: drop it once the child
/// runs), and its number for [`CHILD_SOCKET_ENV`].
pub fn socket_for_child() -> (
    vk_export::socket::Connection,
    std::os::fd::OwnedFd,
    std::ffi::OsString,
) {
    let (mine, theirs) = vk_export::socket::Connection::pair().unwrap();
    let theirs = theirs.into_fd();
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty()).unwrap();
    let number = std::os::fd::AsRawFd::as_raw_fd(&theirs).to_string().into();
    (mine, theirs, number)
}

/// In a child test: the connection its parent handed over with
/// [`socket_for_child`].
pub fn inherited_connection() -> vk_export::socket::Connection {
    let fd: i32 = std::env::var(CHILD_SOCKET_ENV)
        .expect("started by the parent test")
        .parse()
        .unwrap();
    // SAFETY: the parent passed this connected socket's number, open and
    // inherited by this process; nothing else here owns it.
    let fd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
    vk_export::socket::Connection::from_fd(fd).unwrap()
}
