//! The fault and bad-input cases of `INTEROP-RULES.md` §A.8 that can be shown
//! without a GPU (the table is `docs/fault-cases.md`; each test names its
//! cases). Three kinds of test:
//!
//! * **lavapipe** (the Vulkan side, with the validation layer on): fds that
//!   are closed or are not exports, imports through a duplicate, exporters
//!   that die first, importers that are killed, records out of range, the
//!   raw mistakes the constructors make impossible, a soak;
//! * **compile-time pins** ([`pins`]): signatures and absent methods the
//!   table's "cannot compile" verdicts rest on; a change to any of them
//!   breaks this file's build;
//! * **a fake `libcuda.so.1`** ([`fake`]): the CUDA side of the crate against
//!   a stub driver, compiled from C here and loaded in a child process
//!   through `LD_LIBRARY_PATH`. It records every descriptor the crate hands
//!   the driver, insists that a context is current (and that a handle is used
//!   in the context that made it), keeps an imported fd until the import is
//!   destroyed, counts live objects, and can fail imports, delay enqueued
//!   work, lower device limits and list several devices. What it shows is
//!   what the crate does before and around the driver, never the real
//!   driver's answer (that is `gpu_faults.rs`).
//!
//! Several tests compare the process's fd table or count open fds, so every
//! test here holds [`serial`] for its whole run.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_long, c_longlong, c_void, CString, OsString};
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ash::vk;
use cuda_interop::{
    sys, CudaDevice, DeviceBuffer, Error as CudaError, HostWait, Stream, DROP_WAIT_LIMIT,
};
use cuda_interop_testkit::sample::ImageFields;
use cuda_interop_testkit::{
    assert_no_validation_errors, open_fd_count, pattern, sample, tamper, vulkan, TIMEOUT,
};
use vk_export::format::{Format, R32Sfloat, Rgba16Sfloat, Rgba8Unorm};
use vk_export::markers::{usage, DeviceLocal, Optimal, Usage};
use vk_export::semaphore_kinds::{Binary, Timeline};
use vk_export::socket::Connection;
use vk_export::wire::{Message, Resource, WireError, HEADER_LEN, MAGIC};
use vk_export::{
    BufferInfo, BufferRecord, Context, Error, ExportableBuffer, ExportableImage, ImageDesc,
    ImageInfo, ImageRecord, SemaphoreInfo, SemaphoreRecord, SharedLayout, SubmitSync,
    TimelineSemaphore,
};

/// Lavapipe has no `DeviceLocal` class (every memory type is host-visible);
/// `--features device-local` builds these tests for NVIDIA, as the other
/// Vulkan tests.
#[cfg(not(feature = "device-local"))]
type Mem = vk_export::markers::HostVisible;
#[cfg(feature = "device-local")]
type Mem = DeviceLocal;
type Image = ExportableImage<Rgba8Unorm, Optimal, Mem>;

/// One test at a time: fd tables and counts are process-wide.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's open fds and what each refers to (`/proc/self/fd`), less
/// the one the listing itself uses.
fn fd_table() -> BTreeMap<i32, PathBuf> {
    let listing = PathBuf::from(format!("/proc/{}/fd", std::process::id()));
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let n: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            (target != listing).then_some((n, target))
        })
        .collect()
}

/// `(st_dev, st_ino)`: which open file an fd is.
fn identity(fd: impl AsFd) -> (u64, u64) {
    let st = rustix::fs::fstat(fd).unwrap();
    (st.st_dev, st.st_ino)
}

/// An fd number that is closed now: high above anything this process opens,
/// so that no other thread gets it meanwhile.
fn closed_fd_number() -> i32 {
    let n = 1000;
    assert!(
        std::fs::read_link(format!("/proc/self/fd/{n}")).is_err(),
        "fd {n} is open; pick another"
    );
    n
}

/// An `OwnedFd` for the closed number `n`: the fault under test.
fn owned_closed_fd(n: i32) -> OwnedFd {
    // SAFETY: deliberately not: `n` is closed (checked by the caller), which
    // is the fault being injected. It is never closed through this value:
    // the import refuses it and the test takes the number back with
    // `into_raw_fd`, and nothing here reads or writes through it.
    unsafe { OwnedFd::from_raw_fd(n) }
}

/// Fds that are not GPU exports: an eventfd, `/dev/null`, a pipe, a regular
/// file, a socket and a directory, named.
fn not_exports(file: &Path) -> Vec<(&'static str, OwnedFd)> {
    let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
    let (socket, _peer) = Connection::pair().unwrap();
    vec![
        // Not 0: Mesa's lavapipe reads from the fd it imports, and a read of
        // an eventfd whose counter is 0 blocks for ever (see the table,
        // case 3).
        (
            "an eventfd",
            rustix::event::eventfd(1, rustix::event::EventfdFlags::CLOEXEC).unwrap(),
        ),
        (
            "/dev/null",
            std::fs::File::open("/dev/null").unwrap().into(),
        ),
        ("a pipe", pipe_r),
        ("a regular file", std::fs::File::open(file).unwrap().into()),
        ("a socket", socket.into_fd()),
        (
            "a directory",
            std::fs::File::open(std::env::temp_dir()).unwrap().into(),
        ),
    ]
}

/// Compile-time facts the table's "cannot compile" and "impossible through
/// the safe API" verdicts rest on. Each is checked by the compiler when this
/// file builds: a signature that changes, or a method that appears where the
/// table says there is none, is a build error here.
mod pins {
    use std::os::fd::OwnedFd;

    use cuda_interop::{
        BinarySignal, CudaDevice, ExternalSemaphore, ImportError, ImportedBuffer, ImportedImage,
        MappedBuffer, Stream,
    };
    use static_assertions::{assert_eq_size, assert_not_impl_any};
    use vk_export::format::Rgba8Unorm;
    use vk_export::markers::{usage, DeviceLocal, HostVisible, Optimal};
    use vk_export::semaphore_kinds::{Binary, Timeline};
    use vk_export::{
        BufferRecord, Context, ExportableBuffer, ExportableImage, ImageRecord, Semaphore,
        SemaphoreRecord, TimelineSemaphore,
    };

    // Cases 1, 2: an fd is an `OwnedFd`, whose niche is -1: -1 is not a value
    // of the type (`Option<OwnedFd>` uses it for `None`), so no import entry
    // point can be handed -1, and a closed number only through `unsafe`.
    assert_eq_size!(Option<OwnedFd>, i32);
    // Case 5: an fd cannot be copied into a second import; `try_clone` (a
    // `dup`) is the only way to two.
    assert_not_impl_any!(OwnedFd: Clone, Copy);
    assert_not_impl_any!(BinarySignal: Clone, Copy, Default);

    type VkImage = ExportableImage<Rgba8Unorm, Optimal, HostVisible>;
    type VkImageRecord = ImageRecord<Rgba8Unorm, Optimal, HostVisible>;
    type CudaImage = ImportedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>;
    type CudaImageRecord = ImageRecord<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>;
    /// A Vulkan import entry point: record `R`, fd by value, `T` or the fd back.
    type VkImport<R, T> = unsafe fn(&Context, &R, OwnedFd) -> Result<T, vk_export::ImportError>;
    /// A CUDA import entry point: record `R`, fd by value, `T` or the fd back.
    type CudaImport<R, T> = unsafe fn(&CudaDevice, R, OwnedFd) -> Result<T, ImportError>;

    /// Cases 1, 2, 4, 5, 7, 8, 12: every import takes its fd by value as an
    /// `OwnedFd` (consumed on success, handed back in the error), and no
    /// import has a flags, size, dedicated or offset parameter: those come
    /// from the record.
    pub(crate) fn import_signatures() {
        let _: VkImport<VkImageRecord, VkImage> = VkImage::import_fd;
        let _: VkImport<BufferRecord<HostVisible>, ExportableBuffer<HostVisible>> =
            ExportableBuffer::import_fd;
        let _: VkImport<SemaphoreRecord<Timeline>, TimelineSemaphore> = Semaphore::import_fd;
        let _: CudaImport<CudaImageRecord, CudaImage> = CudaDevice::import_image_fd;
        let _: CudaImport<BufferRecord<DeviceLocal>, ImportedBuffer<DeviceLocal>> =
            CudaDevice::import_buffer_fd;
        let _: CudaImport<SemaphoreRecord<Binary>, ExternalSemaphore<Binary>> =
            CudaDevice::import_semaphore_fd;
    }

    /// Cases 12, 14, 23: a buffer is mapped whole, at offset 0 (no offset or
    /// length parameter), by a unique borrow that the mapping keeps for its
    /// life: a second, overlapping mapping, and dropping the import while
    /// mapped, are borrow errors. Sub-ranges are slices of the one mapping.
    pub(crate) fn mapping_signatures() {
        let _: fn(&mut ImportedBuffer<DeviceLocal>) -> cuda_interop::Result<MappedBuffer<'_>> =
            ImportedBuffer::map;
    }

    /// Cases 35, 38: a CUDA binary wait takes a `BinarySignal` by value (no
    /// token, no wait; one token, one wait); a semaphore is imported as the
    /// kind it is.
    pub(crate) fn semaphore_signatures() {
        let _: fn(&ExternalSemaphore<Binary>, &Stream, BinarySignal) -> cuda_interop::Result<()> =
            ExternalSemaphore::<Binary>::wait;
        let _: fn(
            &CudaDevice,
            &Semaphore<Timeline>,
        ) -> cuda_interop::Result<ExternalSemaphore<Timeline>> = CudaDevice::import_semaphore;
        let _: fn(
            &CudaDevice,
            &Semaphore<Binary>,
        ) -> cuda_interop::Result<ExternalSemaphore<Binary>> = CudaDevice::import_semaphore;
    }

    /// What a call resolves to when the type has no inherent method of
    /// that name.
    #[derive(Debug, PartialEq, Eq)]
    pub(crate) struct Absent;

    /// Methods a timeline semaphore must not have. Inherent methods win over
    /// trait methods, so if `Semaphore<Timeline>` had any of these, the calls
    /// in [`timeline_has_no_sync_fd`] would resolve to it and fail to
    /// type-check.
    pub(crate) trait NotForTimelines {
        /// Case 40: SYNC_FD export exists for binary semaphores only.
        fn export_sync_fd(&self) -> Absent {
            Absent
        }
        /// Case 39: the only temporary import (SYNC_FD) is for binary
        /// semaphores; a timeline is always imported permanently.
        fn import_sync_fd(&mut self, _: ()) -> Absent {
            Absent
        }
    }
    impl NotForTimelines for Semaphore<Timeline> {}

    /// Cases 39, 40: calls the trait's methods on a timeline semaphore.
    pub(crate) fn timeline_has_no_sync_fd(t: &mut TimelineSemaphore) -> [Absent; 2] {
        [t.export_sync_fd(), t.import_sync_fd(())]
    }
}

/// Cases 1, 4, 5, 7, 8, 12, 14, 23, 35, 38, 39, 40: the compile-time pins
/// above build (and the absent methods really resolve to the fallbacks).
#[test]
fn the_type_level_rules_the_table_relies_on_hold() {
    let _serial = serial();
    pins::import_signatures();
    pins::mapping_signatures();
    pins::semaphore_signatures();
    let ctx = vulkan(None);
    let mut timeline = TimelineSemaphore::new_local(&ctx).unwrap();
    assert_eq!(
        pins::timeline_has_no_sync_fd(&mut timeline),
        [pins::Absent, pins::Absent]
    );
    assert_no_validation_errors(&ctx);
}

/// Case 2: a closed fd number handed to every Vulkan import (image, buffer,
/// semaphore) is refused before any driver call (`fstat` fails), comes back
/// in the error, and no other fd of the process is closed.
#[test]
fn a_closed_fd_number_is_refused_before_the_driver_and_closes_nothing() {
    let _serial = serial();
    let ctx = vulkan(None);
    let image = Image::new(&ctx, ImageDesc::new_2d(32, 32)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let timeline = TimelineSemaphore::new_local(&ctx).unwrap();
    let before = fd_table();
    let n = closed_fd_number();
    let outcomes = [
        (
            "image",
            // SAFETY: deliberately not: the fd is closed, which is the fault
            // under test; the import refuses it before any driver call.
            unsafe { Image::import_fd(&ctx, &image.record(), owned_closed_fd(n)) }.map(drop),
        ),
        (
            "buffer",
            // SAFETY: as above.
            unsafe { ExportableBuffer::import_fd(&ctx, &buffer.record(), owned_closed_fd(n)) }
                .map(drop),
        ),
        (
            "semaphore",
            // SAFETY: as above.
            unsafe { TimelineSemaphore::import_fd(&ctx, &timeline.record(), owned_closed_fd(n)) }
                .map(drop),
        ),
    ];
    for (what, outcome) in outcomes {
        let err = outcome.expect_err("a closed fd was imported");
        assert!(
            matches!(err.error, Error::Record(_)),
            "{what}: {}",
            err.error
        );
        assert!(err.error.to_string().contains("fstat"), "{}", err.error);
        assert_eq!(err.fd.into_raw_fd(), n, "{what}: the same number came back");
        println!("{what} from closed fd {n}: {}", err.error);
    }
    assert_eq!(fd_table(), before, "no fd was opened or closed");
    assert_no_validation_errors(&ctx);
}

/// Case 3: fds that are not exports (an eventfd, `/dev/null`, a pipe, a
/// regular file, a socket, a directory), received with a valid record or
/// handed to the `unsafe` import, are typed errors; each comes back open and
/// still the same file, and the fd table is as before (a debug build's std
/// aborts if an `OwnedFd` is closed twice).
#[test]
fn fds_that_are_not_exports_come_back_open_and_unchanged() {
    let _serial = serial();
    let ctx = vulkan(None);
    let image = Image::new(&ctx, ImageDesc::new_2d(64, 64)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let timeline = TimelineSemaphore::new_local(&ctx).unwrap();
    let file = std::env::temp_dir().join(format!("faults-regular-{}", std::process::id()));
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let before = fd_table();
    let mut refused_by_driver = 0;
    // Received with the image's own record: the safe path.
    for (what, fd) in not_exports(&file) {
        let sent = identity(&fd);
        let bytes = Message {
            tag: 3,
            resources: vec![Resource::Image(image.info().clone())],
        }
        .encode()
        .unwrap();
        let (tx, rx) = Connection::pair().unwrap();
        // SAFETY: a test of the receiver's refusals: the fd is not an
        // export, and the test asserts its import is refused.
        unsafe { tx.send_raw(&bytes, &[fd.as_fd()]) }.unwrap();
        let bundle = rx
            .recv(TIMEOUT)
            .unwrap()
            .take_image::<Rgba8Unorm, Optimal, Mem, usage::Storage>(0)
            .unwrap();
        let err = Image::import_received(&ctx, bundle).expect_err(what);
        assert_eq!(identity(&err.fd), sent, "{what}: the same file came back");
        refused_by_driver += u32::from(matches!(err.error, Error::Vulkan { .. }));
        println!("image from {what}: {}", err.error);
    }
    // The unsafe entry points, for a buffer and a semaphore.
    for (what, fd) in not_exports(&file) {
        let sent = identity(&fd);
        // SAFETY: deliberately not: the fd is not an export, which is the
        // fault under test; the import refuses it and hands it back.
        let err =
            unsafe { ExportableBuffer::import_fd(&ctx, &buffer.record(), fd) }.expect_err(what);
        assert_eq!(identity(&err.fd), sent, "{what}: the same file came back");
        refused_by_driver += u32::from(matches!(err.error, Error::Vulkan { .. }));
        println!("buffer from {what}: {}", err.error);
    }
    for (what, fd) in not_exports(&file) {
        let sent = identity(&fd);
        // SAFETY: as above, for a semaphore.
        let err =
            unsafe { TimelineSemaphore::import_fd(&ctx, &timeline.record(), fd) }.expect_err(what);
        assert_eq!(identity(&err.fd), sent, "{what}: the same file came back");
        println!("semaphore from {what}: {}", err.error);
    }
    std::fs::remove_file(&file).ok();
    assert_eq!(fd_table(), before, "every fd closed exactly once, by us");
    // The layer reports each refusal by the driver once (lavapipe: its own
    // message), never more.
    assert!(ctx.validation_errors() <= refused_by_driver, "see stderr");
}

/// Case 4: a successful import consumes the caller's fd: the number no
/// longer refers to the export afterwards (the driver holds its own
/// duplicate), and once the import is dropped the fd count is back.
#[test]
fn a_successful_import_takes_the_fd_and_closes_the_callers_number() {
    let _serial = serial();
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let image = Image::new(&a, ImageDesc::new_2d(32, 32)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&a, 4096).unwrap();
    let baseline = open_fd_count();
    let fd = image.export_fd().unwrap();
    let n = fd.as_raw_fd();
    let link = |n: i32| std::fs::read_link(format!("/proc/self/fd/{n}")).ok();
    let exported = link(n).expect("the export is open");
    // SAFETY: `fd` is a fresh export of `image`'s memory and the record is
    // the image's own.
    let imported = unsafe { Image::import_fd(&b, &image.record(), fd) }
        .map_err(|e| e.error)
        .unwrap();
    assert_ne!(
        link(n),
        Some(exported.clone()),
        "fd {n} ({exported:?}) is no longer the caller's"
    );
    let fd = buffer.export_fd().unwrap();
    let m = fd.as_raw_fd();
    // SAFETY: as above, for the buffer.
    let imported_buffer = unsafe { ExportableBuffer::import_fd(&b, &buffer.record(), fd) }
        .map_err(|e| e.error)
        .unwrap();
    assert!(link(m).is_none() || m == n, "fd {m} was closed");
    drop((imported, imported_buffer));
    assert_eq!(open_fd_count(), baseline, "nothing held on to an fd");
    assert_no_validation_errors(&a);
    assert_no_validation_errors(&b);
}

/// Case 5: one export, duplicated with `try_clone` (the only way to a
/// second fd), imports into two devices; both imports are the same payload:
/// what the exporter writes both read, and what one importer writes the
/// other reads.
#[test]
fn one_export_duplicated_imports_twice_as_one_payload() {
    let _serial = serial();
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let c = vulkan(Some(a.identity().device_uuid));
    let image = Image::new(&a, ImageDesc::new_2d(40, 24)).unwrap();
    let data = pattern(40 * 24 * 4, 5);
    a.write_image(&image, 0, 0, &data, SubmitSync::new())
        .unwrap();
    a.release_image(&image, SubmitSync::new()).unwrap();
    let fd = image.export_fd().unwrap();
    let dup = fd.try_clone().unwrap();
    // SAFETY: both fds are the same fresh export of `image`'s memory (one a
    // dup of the other), with the image's own record.
    let (on_b, on_c) = unsafe {
        (
            Image::import_fd(&b, &image.record(), fd),
            Image::import_fd(&c, &image.record(), dup),
        )
    };
    let (on_b, on_c) = (
        on_b.map_err(|e| e.error).unwrap(),
        on_c.map_err(|e| e.error).unwrap(),
    );
    for (ctx, imported) in [(&b, &on_b), (&c, &on_c)] {
        // SAFETY: `a` released the image in GENERAL and its helper waited
        // for the release before this call.
        unsafe { ctx.assume_image_released(imported, SharedLayout::General) }.unwrap();
        assert!(ctx.read_image(imported, 0, 0, SubmitSync::new()).unwrap() == data);
    }
    let data2 = pattern(40 * 24 * 4, 55);
    b.write_image(&on_b, 0, 0, &data2, SubmitSync::new())
        .unwrap();
    b.release_image(&on_b, SubmitSync::new()).unwrap();
    // SAFETY: `b` released it in GENERAL, and waited for the release.
    unsafe { c.assume_image_released(&on_c, SharedLayout::General) }.unwrap();
    assert!(
        c.read_image(&on_c, 0, 0, SubmitSync::new()).unwrap() == data2,
        "the second import reads what the first wrote"
    );
    for ctx in [&a, &b, &c] {
        assert_no_validation_errors(ctx);
    }
}

/// The image record of the wire samples (1920x1080 RGBA8), decoded.
fn sample_image() -> ImageInfo {
    match sample::message().resources.remove(0) {
        Resource::Image(i) => i,
        other => panic!("the sample's first resource is {other:?}"),
    }
}

/// The buffer record of the wire samples (1000 bytes in 4096), decoded.
fn sample_buffer() -> BufferInfo {
    match sample::message().resources.remove(1) {
        Resource::Buffer(b) => b,
        other => panic!("the sample's second resource is {other:?}"),
    }
}

/// The timeline semaphore record of the wire samples, decoded.
fn sample_semaphore() -> SemaphoreInfo {
    match sample::message().resources.remove(2) {
        Resource::Semaphore(s) => s,
        other => panic!("the sample's third resource is {other:?}"),
    }
}

/// The field the decoder names when it rejects `edit` of an image record's
/// `field`, or `None` if it accepts it.
fn image_rejection(
    info: &ImageInfo,
    field: &str,
    edit: impl FnOnce(&mut [u8]),
) -> Option<&'static str> {
    match tamper::edit(
        Resource::Image(info.clone()),
        tamper::IMAGE_FIELDS,
        field,
        edit,
    )
    .1
    {
        Err(WireError::InvalidValue { field, .. }) => Some(field),
        Err(e) => panic!("{field}: rejected, but not as an invalid value: {e}"),
        Ok(_) => None,
    }
}

/// Cases 6, 11, 15, 16, 19, 22: records that cannot describe a mappable
/// resource never exist: the decoder (the only way a peer's record is
/// made) rejects an allocation of 0 bytes, a buffer larger than its
/// allocation, 0 or too many mip levels, formats outside the whitelist
/// (three channels, sRGB, block-compressed, depth), cubes that are not
/// square or not a multiple of 6 layers, and an offset other than 0.
#[test]
fn records_that_cannot_describe_a_mappable_resource_are_rejected_by_the_decoder() {
    let _serial = serial();
    let image = sample_image();
    let reject = |field: &str, value: u64| image_rejection(&image, field, tamper::set(value));
    // Case 6: size 0.
    assert_eq!(reject("allocation_size", 0), Some("image.allocation_size"));
    let buffer = sample_buffer();
    for (field, value, named) in [
        ("allocation_size", 0, "buffer.allocation_size"),
        ("size", 0, "buffer.size"),
        // Case 11: a buffer larger than its allocation.
        ("size", 4097, "buffer.allocation_size"),
    ] {
        let decoded = tamper::edit(
            Resource::Buffer(buffer.clone()),
            tamper::BUFFER_FIELDS,
            field,
            tamper::set(value),
        )
        .1;
        assert!(
            matches!(decoded, Err(WireError::InvalidValue { field: f, .. }) if f == named),
            "buffer {field} = {value}: {decoded:?}"
        );
    }
    // Case 15: 0 levels, and one more than 1920 allows (1 + floor(log2) = 11).
    assert_eq!(reject("mip_levels", 0), Some("image.mip_levels"));
    assert_eq!(reject("mip_levels", 12), Some("image.mip_levels"));
    assert_eq!(reject("mip_levels", 11), None, "11 levels fit 1920 wide");
    // Case 16: formats outside the whitelist.
    for format in [
        vk::Format::R8G8B8_UNORM,
        vk::Format::R8G8B8A8_SRGB,
        vk::Format::BC1_RGBA_UNORM_BLOCK,
        vk::Format::D32_SFLOAT,
        vk::Format::R32G32B32_SFLOAT,
    ] {
        assert_eq!(
            reject("format", format.as_raw() as u64),
            Some("image.format"),
            "{format:?}"
        );
    }
    // Case 22: a non-zero offset.
    assert_eq!(reject("offset", 4096), Some("image.offset"));
    // Case 19: a cube that is not square, and one of 7 layers.
    let cube = vk::ImageCreateFlags::CUBE_COMPATIBLE.as_raw() as u64;
    assert_eq!(reject("flags", cube), Some("image.array_layers"));
    let square = ImageFields {
        format: vk::Format::R8G8B8A8_UNORM.as_raw() as u32,
        image_type: 1,
        extent: [64, 64, 1],
        mip_levels: 1,
        array_layers: 6,
        flags: vk::ImageCreateFlags::CUBE_COMPATIBLE.as_raw(),
        tiling: 0,
        usage: 0xf,
        allocation_size: 1 << 20,
        memory_type_index: 0,
        memory_flags: 1,
    }
    .decode();
    assert_eq!(
        image_rejection(&square, "array_layers", tamper::set(7)),
        Some("image.array_layers")
    );
    assert_eq!(
        image_rejection(&square, "array_layers", tamper::set(12)),
        None,
        "two cubes"
    );
}

/// Case 19: cube descriptions that are not square, not a multiple of 6
/// layers or 3D are refused before anything is created (the preflight and
/// the constructor agree, and the layer sees no Vulkan call to complain of).
#[test]
fn cube_descriptions_are_refused_before_anything_is_created() {
    let _serial = serial();
    let ctx = vulkan(None);
    for desc in [
        ImageDesc::new_2d(16, 8).cube(6),
        ImageDesc::new_2d(16, 16).cube(7),
        ImageDesc::new_2d(16, 16).cube(0),
        ImageDesc::new_3d(16, 16, 6).cube(6),
    ] {
        let err = Image::new(&ctx, desc).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{desc:?}: {err}");
        let again = Image::preflight(&ctx, &desc).unwrap_err();
        assert_eq!(again.to_string(), err.to_string());
        println!("{desc:?}: {err}");
    }
    let ok = Image::new(&ctx, ImageDesc::new_2d(16, 16).cube(12)).unwrap();
    assert!(ok.info().is_cube());
    assert_no_validation_errors(&ctx);
}

/// Case 25 (one process): the exporter's image, and its whole device, are
/// dropped before the import; the import still reads the pixels (the
/// payload is reference-counted), and its own drop is clean.
#[test]
fn an_import_outlives_the_exporting_image_and_device() {
    let _serial = serial();
    let b = vulkan(None);
    let data = pattern(48 * 16 * 4, 25);
    let imported = {
        let a = vulkan(Some(b.identity().device_uuid));
        let image = Image::new(&a, ImageDesc::new_2d(48, 16)).unwrap();
        a.write_image(&image, 0, 0, &data, SubmitSync::new())
            .unwrap();
        a.release_image(&image, SubmitSync::new()).unwrap();
        let imported = Image::import_from(&b, &image).unwrap();
        assert_no_validation_errors(&a);
        imported
        // `image` and `a` (its last clone) are dropped here: the exporter's
        // VkImage, VkDeviceMemory and VkDevice are gone.
    };
    // SAFETY: the exporter released the image in GENERAL and waited for it.
    unsafe { b.assume_image_released(&imported, SharedLayout::General) }.unwrap();
    assert!(
        b.read_image(&imported, 0, 0, SubmitSync::new()).unwrap() == data,
        "the import reads the exporter's pixels after the exporter is gone"
    );
    drop(imported);
    assert_eq!(vk_export::drop_errors(), 0);
    assert_no_validation_errors(&b);
}

/// Runs the ignored test `name` of this binary in a child process with
/// `envs`, bounded (a hang is killed and reported); prints its output,
/// asserts that it passed, and returns its stdout.
fn run_child(name: &str, envs: &[(&str, OsString)], keep: Option<OwnedFd>) -> String {
    let envs: Vec<(&str, &std::ffi::OsStr)> =
        envs.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    cuda_interop_testkit::child::run_child_test(name, &envs, keep)
}

/// A connected pair whose second end a child process inherits: the fd
/// (close-on-exec cleared) and the environment entry naming it.
fn socket_for_child() -> (Connection, OwnedFd, (&'static str, OsString)) {
    let (mine, theirs, number) = cuda_interop_testkit::child::socket_for_child();
    (mine, theirs, (cuda_interop_testkit::child::CHILD_SOCKET_ENV, number))
}

/// Case 25 (two processes): the exporting process sends its image and
/// buffer and exits before the importer even receives them; the importer
/// then imports and reads exactly what the exporter wrote and released.
#[test]
fn an_exporter_process_that_exits_first_leaves_its_payload_readable() {
    let _serial = serial();
    let (mine, theirs, env) = socket_for_child();
    let stdout = run_child(
        "child_exporter_that_exits_after_sending",
        &[env],
        Some(theirs),
    );
    assert!(stdout.contains("sent and exits"), "{stdout}");
    // The exporter is gone: its device, image and buffer were destroyed when
    // its process ended. Only the fds in flight in the socket remain.
    let ctx = vulkan(None);
    let mut received = mine.recv(TIMEOUT).unwrap();
    let image = Image::import_received(
        &ctx,
        received
            .take_image::<Rgba8Unorm, Optimal, Mem, usage::Storage>(0)
            .unwrap(),
    )
    .map_err(|e| e.error)
    .unwrap();
    let buffer = ExportableBuffer::import_received(&ctx, received.take_buffer::<Mem>(1).unwrap())
        .map_err(|e| e.error)
        .unwrap();
    // SAFETY: the exporter released the image in GENERAL before sending it.
    unsafe { ctx.assume_image_released(&image, SharedLayout::General) }.unwrap();
    assert!(ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap() == pattern(30 * 20 * 4, 250));
    assert_eq!(
        ctx.read_buffer(&buffer, 8192, SubmitSync::new()).unwrap(),
        pattern(8192, 251)
    );
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "entry point of a child process of faults.rs: run by an_exporter_process_that_exits_first_leaves_its_payload_readable"]
fn child_exporter_that_exits_after_sending() {
    let connection = cuda_interop_testkit::child::inherited_connection();
    let ctx = vulkan(None);
    let image = Image::new(&ctx, ImageDesc::new_2d(30, 20)).unwrap();
    ctx.write_image(&image, 0, 0, &pattern(30 * 20 * 4, 250), SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&ctx, 8192).unwrap();
    ctx.write_buffer(&buffer, &pattern(8192, 251), SubmitSync::new())
        .unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
    connection.send_exported(25, &[&image, &buffer]).unwrap();
    assert_no_validation_errors(&ctx);
    println!("exporter {} sent and exits", std::process::id());
}

/// Case 27 (the Vulkan side): an importing process is SIGKILLed while it
/// holds imports of this process's image and buffer; the exporter keeps
/// using both (writes and reads back exactly), drops them cleanly, and its
/// fd count is back at its baseline. (That the GPU memory is freed when the
/// last reference dies is `gpu_faults.rs`.)
#[test]
fn a_killed_importer_process_leaves_the_exporter_working() {
    let _serial = serial();
    let ctx = vulkan(None);
    let image = Image::new(&ctx, ImageDesc::new_2d(32, 32)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    ctx.write_image(&image, 0, 0, &pattern(32 * 32 * 4, 27), SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    ctx.write_buffer(&buffer, &pattern(4096, 270), SubmitSync::new())
        .unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
    let baseline = open_fd_count();
    let (mine, theirs, env) = socket_for_child();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_importer_that_is_killed",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env.0, env.1)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    drop(theirs);
    mine.send_exported(27, &[&image, &buffer]).unwrap();
    // Wait (bounded) until the child says it holds both imports.
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains("IMPORTED ") => break,
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the importer never reported its imports ({:?}); it said: {seen:?}",
                    child.wait()
                );
            }
        }
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    println!("importer killed while holding the imports: {status}");
    drop(mine);
    // The exporter is unaffected.
    let again = pattern(32 * 32 * 4, 2727);
    ctx.write_image(&image, 0, 0, &again, SubmitSync::new())
        .unwrap();
    assert!(ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap() == again);
    assert_eq!(
        ctx.read_buffer(&buffer, 4096, SubmitSync::new()).unwrap(),
        pattern(4096, 270)
    );
    assert_eq!(open_fd_count(), baseline, "fd count back at baseline");
    drop((image, buffer));
    assert_eq!(vk_export::drop_errors(), 0);
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "entry point of a child process of faults.rs: run by a_killed_importer_process_leaves_the_exporter_working"]
fn child_importer_that_is_killed() {
    let connection = cuda_interop_testkit::child::inherited_connection();
    let ctx = vulkan(None);
    let mut received = connection.recv(TIMEOUT).unwrap();
    let image = Image::import_received(
        &ctx,
        received
            .take_image::<Rgba8Unorm, Optimal, Mem, usage::Storage>(0)
            .unwrap(),
    )
    .map_err(|e| e.error)
    .unwrap();
    let buffer = ExportableBuffer::import_received(&ctx, received.take_buffer::<Mem>(1).unwrap())
        .map_err(|e| e.error)
        .unwrap();
    // SAFETY: the parent released the image in GENERAL before sending it.
    unsafe { ctx.assume_image_released(&image, SharedLayout::General) }.unwrap();
    assert!(ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap() == pattern(32 * 32 * 4, 27));
    assert_eq!(
        ctx.read_buffer(&buffer, 4096, SubmitSync::new()).unwrap(),
        pattern(4096, 270)
    );
    println!("IMPORTED {}", std::process::id());
    std::thread::sleep(Duration::from_secs(60));
}

/// What a refusal of a malformed message must be.
type Expected = fn(&WireError) -> bool;

/// Case 29: records that are missing, empty, of another version or cut
/// short, each with fds attached, are refused, and every fd that came with
/// them is closed exactly once (the fd count is back at its baseline; a
/// debug build's std aborts on a second close).
#[test]
fn messages_without_a_valid_record_close_their_fds_exactly_once() {
    let _serial = serial();
    let baseline = open_fd_count();
    {
        let (tx, rx) = Connection::pair().unwrap();
        let good = sample::message().encode().unwrap();
        let mut other_version = good.clone();
        other_version[4] = 2;
        let zero_resources = sample::frame(&{
            let mut p = 7u64.to_le_bytes().to_vec();
            p.extend_from_slice(&0u16.to_le_bytes());
            p
        });
        let mut header_only = Vec::new();
        header_only.extend_from_slice(&MAGIC);
        header_only.extend_from_slice(&1u16.to_le_bytes());
        header_only.extend_from_slice(&[0; 10]);
        let cut = sample::frame(&sample::message_bytes()[HEADER_LEN..HEADER_LEN + 40]);
        let cases: [(&str, Vec<u8>, Expected); 5] = [
            ("an empty payload", Vec::new(), |e| {
                matches!(e, WireError::TooShort(0))
            }),
            ("version 2", other_version, |e| {
                matches!(e, WireError::UnsupportedVersion { found: 2, .. })
            }),
            ("no resources", zero_resources, |e| {
                matches!(e, WireError::ResourceCount(0))
            }),
            ("a bare header", header_only, |e| {
                matches!(
                    e,
                    WireError::ResourceCount(_)
                        | WireError::Truncated(_)
                        | WireError::Checksum { .. }
                )
            }),
            ("a record cut short", cut, |e| {
                matches!(e, WireError::Truncated(_))
            }),
        ];
        for (what, bytes, expected) in cases {
            let fds: Vec<OwnedFd> = (0..3)
                .map(|_| std::fs::File::open("/dev/null").unwrap().into())
                .collect();
            let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
            // SAFETY: the receiver refuses these messages; nothing is imported.
            unsafe { tx.send_raw(&bytes, &borrowed) }.unwrap();
            drop(fds);
            let err = rx.recv(TIMEOUT).unwrap_err();
            println!("{what}: {err}");
            assert!(
                matches!(&err, Error::Wire(e) if expected(e)),
                "{what}: {err}"
            );
        }
    }
    assert_eq!(open_fd_count(), baseline, "every received fd closed once");
}

/// Case 33: the raw mistakes `ExportableImage` makes impossible are real
/// mistakes the validation layer reports (so the zero-error assertions of
/// every other test mean something): an external image created
/// PREINITIALIZED (01443), an image without `VkExternalMemoryImageCreateInfo`
/// bound to imported memory (02729; 02989 in newer layers) and to exportable
/// memory (02728). The crate's own image and import on the same device add
/// no error.
#[test]
fn the_layer_reports_the_raw_mistakes_the_constructors_make_impossible() {
    let _serial = serial();
    let ctx = vulkan(None);
    let device = ctx.device();
    let source = Image::new(&ctx, ImageDesc::new_2d(16, 16)).unwrap();
    let ids_after = |what: &str, ctx: &Context| {
        let ids = ctx.validation_error_ids();
        println!("after {what}: {ids:?}");
        ids
    };
    let base = vk::ImageCreateInfo::default()
        .image_type(vk::ImageType::TYPE_2D)
        .format(vk::Format::R8G8B8A8_UNORM)
        .extent(vk::Extent3D {
            width: 16,
            height: 16,
            depth: 1,
        })
        .mip_levels(1)
        .array_layers(1)
        .samples(vk::SampleCountFlags::TYPE_1)
        .sharing_mode(vk::SharingMode::EXCLUSIVE);
    // 1. External, PREINITIALIZED.
    let mut external = vk::ExternalMemoryImageCreateInfo::default()
        .handle_types(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
    let info = base
        .tiling(vk::ImageTiling::LINEAR)
        .usage(vk::ImageUsageFlags::TRANSFER_SRC)
        .initial_layout(vk::ImageLayout::PREINITIALIZED)
        .push_next(&mut external);
    // SAFETY: a valid create info (apart from the rule under test), living
    // across the call; the image is destroyed below and never used.
    let image = unsafe { device.create_image(&info, None) }.unwrap();
    // SAFETY: created above, unused.
    unsafe { device.destroy_image(image, None) };
    let ids = ids_after("a PREINITIALIZED external image", &ctx);
    assert!(
        ids.iter()
            .any(|i| i == "VUID-VkImageCreateInfo-pNext-01443"),
        "{ids:?}"
    );
    // 2. No external info, bound to memory imported from `source`.
    let plain = base
        .tiling(vk::ImageTiling::OPTIMAL)
        .usage(
            vk::ImageUsageFlags::TRANSFER_SRC
                | vk::ImageUsageFlags::TRANSFER_DST
                | vk::ImageUsageFlags::SAMPLED
                | vk::ImageUsageFlags::STORAGE,
        )
        .initial_layout(vk::ImageLayout::UNDEFINED);
    let record = source.info();
    let fd = source.export_fd().unwrap();
    let raw = fd.into_raw_fd();
    let mut import = vk::ImportMemoryFdInfoKHR::default()
        .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD)
        .fd(raw);
    let alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(record.allocation_size())
        .memory_type_index(record.memory_type_index())
        .push_next(&mut import);
    // SAFETY: the chain lives across the call; `raw` is a fresh export of
    // this device's memory with its own size and type, owned by the driver
    // on success (on failure it is left open and the test fails).
    let memory = unsafe { device.allocate_memory(&alloc, None) }.unwrap();
    // SAFETY: a valid create info without the external info (the mistake).
    let image = unsafe { device.create_image(&plain, None) }.unwrap();
    // SAFETY: fresh image and memory of this device; the bind is what the
    // layer checks. Both are destroyed below, unused.
    let bound = unsafe { device.bind_image_memory(image, memory, 0) };
    // SAFETY: created above; nothing uses them.
    unsafe {
        device.destroy_image(image, None);
        device.free_memory(memory, None);
    }
    println!("bind of imported memory without external info: {bound:?}");
    let ids = ids_after("binding imported memory", &ctx);
    assert!(
        ids.iter()
            .any(|i| i == "VUID-vkBindImageMemory-memory-02729"
                || i == "VUID-vkBindImageMemory-memory-02989"),
        "{ids:?}"
    );
    // 3. No external info, bound to exportable memory.
    let mut export = vk::ExportMemoryAllocateInfo::default()
        .handle_types(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
    // SAFETY: a valid create info without the external info (the mistake).
    let image = unsafe { device.create_image(&plain, None) }.unwrap();
    // SAFETY: a live image of this device.
    let reqs = unsafe { device.get_image_memory_requirements(image) };
    let alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(reqs.size)
        .memory_type_index(reqs.memory_type_bits.trailing_zeros())
        .push_next(&mut export);
    // SAFETY: the chain lives across the call.
    let memory = unsafe { device.allocate_memory(&alloc, None) }.unwrap();
    // SAFETY: fresh image and memory; destroyed below, unused.
    let bound = unsafe { device.bind_image_memory(image, memory, 0) };
    // SAFETY: created above; nothing uses them.
    unsafe {
        device.destroy_image(image, None);
        device.free_memory(memory, None);
    }
    println!("bind of exportable memory without external info: {bound:?}");
    let ids = ids_after("binding exportable memory", &ctx);
    assert!(
        ids.iter()
            .any(|i| i == "VUID-vkBindImageMemory-memory-02728"),
        "{ids:?}"
    );
    // The crate's own recipe on the same device: nothing more reported.
    let reported = ctx.validation_errors();
    let other = vulkan(Some(ctx.identity().device_uuid));
    let image = Image::new(&ctx, ImageDesc::new_2d(16, 16)).unwrap();
    let imported = Image::import_from(&other, &image).unwrap();
    drop((imported, image, source));
    assert_eq!(ctx.validation_errors(), reported, "see stderr");
    assert_no_validation_errors(&other);
}

/// Case 34 (what lavapipe can show): a request beyond the driver's limits
/// for an exportable image is `Unsupported` from the preflight, which
/// creates nothing, and the constructor gives the same answer before it
/// creates anything (the layer, which checks `vkCreateImage` against the
/// external-memory capabilities, reports nothing).
#[test]
fn requests_the_driver_cannot_export_are_refused_by_the_preflight() {
    let _serial = serial();
    let ctx = vulkan(None);
    let huge = ImageDesc::new_2d(1 << 20, 1 << 20);
    let by_preflight = ExportableImage::<Rgba16Sfloat, Optimal, Mem>::preflight(&ctx, &huge)
        .unwrap_err()
        .to_string();
    let by_new = ExportableImage::<Rgba16Sfloat, Optimal, Mem>::new(&ctx, huge)
        .unwrap_err()
        .to_string();
    assert_eq!(by_preflight, by_new);
    assert!(by_new.contains("not supported"), "{by_new}");
    let capability = Image::preflight(&ctx, &ImageDesc::new_2d(64, 64)).unwrap();
    println!(
        "{}: {by_new}; a 64x64 RGBA8 export is dedicated-only: {}",
        ctx.identity().name,
        capability.dedicated_only
    );
    assert_no_validation_errors(&ctx);
}

/// Case 37 (Vulkan host signals): a timeline signal of 0, of the current
/// value or below it is refused before it reaches the driver (the value
/// does not move and the layer reports nothing); a value above is signalled.
#[test]
fn timeline_host_signals_at_or_below_the_current_value_are_refused() {
    let _serial = serial();
    let ctx = vulkan(None);
    let timeline = TimelineSemaphore::new_local(&ctx).unwrap();
    let err = timeline.signal(0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    timeline.signal(5).unwrap();
    for value in [5, 4, 0] {
        let err = timeline.signal(value).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{value}: {err}");
        println!("signal({value}) at 5: {err}");
    }
    assert_eq!(timeline.value().unwrap(), 5);
    let max = ctx.max_timeline_difference();
    if let Some(beyond) = 5u64.checked_add(max).and_then(|v| v.checked_add(1)) {
        let err = timeline.signal(beyond).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    } else {
        println!(
            "{}: maxTimelineSemaphoreValueDifference is {max}: no value is too far above",
            ctx.identity().name
        );
    }
    timeline.signal(6).unwrap();
    assert_eq!(timeline.value().unwrap(), 6);
    assert_no_validation_errors(&ctx);
}

/// Case 48 (the Vulkan side): 10,000 cycles of export, import into a second
/// device and destroy, for an image and a buffer: the fd count is flat after
/// warm-up, no destroy is skipped, the time per cycle does not drift, and
/// the layer reports nothing.
#[test]
fn ten_thousand_vulkan_export_import_cycles_stay_flat() {
    let _serial = serial();
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let image = Image::new(&a, ImageDesc::new_2d(64, 64).mip_levels(3)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&a, 1 << 16).unwrap();
    let cycle = || {
        let i = Image::import_from(&b, &image).unwrap();
        let j = ExportableBuffer::import_from(&b, &buffer).unwrap();
        drop((i, j));
    };
    for _ in 0..100 {
        cycle();
    }
    let fds = open_fd_count();
    let errors = vk_export::drop_errors();
    let windows: Vec<Duration> = (0..10)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..1000 {
                cycle();
            }
            start.elapsed() / 1000
        })
        .collect();
    println!(
        "10000 image+buffer export/import/destroy cycles, per cycle by window of 1000: {windows:?}"
    );
    assert_eq!(open_fd_count(), fds, "fd count is flat");
    assert_eq!(vk_export::drop_errors(), errors, "no destroy was skipped");
    assert_no_drift(&windows);
    assert_no_validation_errors(&a);
    assert_no_validation_errors(&b);
}

/// A fake `libcuda.so.1` (see the module docs of this file): its C source,
/// how it is built and started, and how a child process reads what it saw.
mod fake {
    use super::*;

    /// The fake driver. Functions take cuda.h 12.9's arguments; descriptor
    /// sizes are checked against the header's at compile time.
    pub(crate) const SOURCE: &str = r##"/* A fake libcuda.so.1 for CPU-only tests of the safe crate's CUDA side.
 * It implements the driver functions cuda-interop calls, with cuda.h 12.9's
 * ABI, records every descriptor it is given (fake_cuda_log), enforces that a
 * context is current for calls that need one (and that a resource is used
 * in the context that made it), counts live objects (fake_cuda_live), keeps
 * an imported fd until its import is destroyed, and lets the test make
 * imports fail, make enqueued work take time, lower device limits, and
 * choose the devices and their UUIDs (fake_cuda_set*). No GPU is touched:
 * mapped "device" memory is host memory. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUsurfObject;
typedef unsigned long long CUtexObject;
typedef struct { char bytes[16]; } CUuuid;

enum {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    INVALID_CONTEXT = 201,
    INVALID_HANDLE = 400,
    NOT_READY = 600,
    NOT_PERMITTED = 800,
    NOT_SUPPORTED = 801,
    UNKNOWN = 999,
};

typedef struct {
    int type;
    union {
        int fd;
        struct { void *handle; const void *name; } win32;
        const void *nvSciBufObject;
    } handle;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} MemHandleDesc;
typedef struct {
    unsigned long long offset;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} BufferDesc;
typedef struct {
    size_t Width, Height, Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} Array3DDesc;
typedef struct {
    unsigned long long offset;
    Array3DDesc arrayDesc;
    unsigned int numLevels;
    unsigned int reserved[16];
} MipmappedDesc;
typedef struct {
    int type;
    union {
        int fd;
        struct { void *handle; const void *name; } win32;
        const void *nvSciSyncObj;
    } handle;
    unsigned int flags;
    unsigned int reserved[16];
} SemHandleDesc;
typedef struct {
    struct {
        struct { unsigned long long value; } fence;
        union { void *fence; unsigned long long reserved; } nvSciSync;
        struct { unsigned long long key; } keyedMutex;
        unsigned int reserved[12];
    } params;
    unsigned int flags;
    unsigned int reserved[16];
} SignalParams;
typedef struct {
    struct {
        struct { unsigned long long value; } fence;
        union { void *fence; unsigned long long reserved; } nvSciSync;
        struct { unsigned long long key; unsigned int timeoutMs; } keyedMutex;
        unsigned int reserved[10];
    } params;
    unsigned int flags;
    unsigned int reserved[16];
} WaitParams;
typedef struct {
    int resType;
    union {
        struct { void *hArray; } array;
        int reserved[32];
    } res;
    unsigned int flags;
} ResourceDesc;

_Static_assert(sizeof(MemHandleDesc) == 104, "CUDA_EXTERNAL_MEMORY_HANDLE_DESC");
_Static_assert(sizeof(BufferDesc) == 88, "CUDA_EXTERNAL_MEMORY_BUFFER_DESC");
_Static_assert(sizeof(Array3DDesc) == 40, "CUDA_ARRAY3D_DESCRIPTOR");
_Static_assert(sizeof(MipmappedDesc) == 120, "CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC");
_Static_assert(sizeof(SemHandleDesc) == 96, "CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC");
_Static_assert(sizeof(SignalParams) == 144, "CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS");
_Static_assert(sizeof(WaitParams) == 144, "CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS");
_Static_assert(sizeof(ResourceDesc) == 144, "CUDA_RESOURCE_DESC");

/* Objects: every handle is a pointer to one of these, tagged by kind. */
enum Kind { K_MEMORY = 1, K_BUFFER, K_ALLOC, K_ARRAY, K_LEVEL, K_SURFACE, K_TEXTURE, K_SEMAPHORE, K_STREAM, K_EVENT, K_KINDS };
static const char *kind_names[K_KINDS] = {
    "", "memory", "buffer", "alloc", "array", "level", "surface", "texture", "semaphore", "stream", "event",
};
typedef struct Obj {
    int kind;
    CUcontext ctx;
    int fd;                 /* memory, semaphore: the fd the import holds */
    unsigned long long size;
    unsigned char *bytes;   /* buffer, alloc: the "device" memory */
    unsigned int flags;     /* array: CUDA_ARRAY3D flags */
    unsigned int levels;    /* array */
    struct Obj *levelv;     /* array: its level views */
    struct Obj *parent;     /* level: its array */
    long long busy_until;   /* stream: when its enqueued work completes; event: when it does */
} Obj;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long live[K_KINDS];
static char *logbuf;
static size_t loglen, logcap;

static long long import_fail = 0;       /* CUresult the imports return (0: succeed) */
static long long close_on_fail = 0;     /* a failed import closes its fd (Mesa's habit) */
static long long latency_ms = 0;        /* enqueued work completes after this (-1: never) */
static long long max_surface2d = 131072;
static long long max_tex2d_mipmapped = 32768;
static int device_count = 1;
static unsigned char uuids[4][16] = {{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}};
static int retained[4];

static __thread CUcontext stack[64];
static __thread int depth;
/* Set while a host function (cuLaunchHostFunc) runs on this thread: CUDA calls are refused. */
static __thread int in_host_function;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void say(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof line - 2) n = sizeof line - 2;
    line[n++] = '\n';
    pthread_mutex_lock(&lock);
    if (loglen + n + 1 > logcap) {
        size_t cap = logcap ? logcap * 2 : 1 << 16;
        while (cap < loglen + n + 1) cap *= 2;
        logbuf = realloc(logbuf, cap);
        logcap = cap;
    }
    memcpy(logbuf + loglen, line, n);
    loglen += n;
    logbuf[loglen] = 0;
    pthread_mutex_unlock(&lock);
}

static CUcontext current(void) { return depth > 0 ? stack[depth - 1] : NULL; }
static CUcontext primary(int dev) { return (CUcontext)(uintptr_t)(0x1000 + 0x100 * dev); }

static Obj *make(int kind) {
    Obj *o = calloc(1, sizeof(Obj));
    o->kind = kind;
    o->ctx = current();
    o->fd = -1;
    pthread_mutex_lock(&lock);
    live[kind]++;
    pthread_mutex_unlock(&lock);
    return o;
}

static void unmake(Obj *o) {
    pthread_mutex_lock(&lock);
    live[o->kind]--;
    pthread_mutex_unlock(&lock);
    free(o->bytes);
    free(o);
}

/* Streams of the process, to report work still pending when something is destroyed. */
static Obj *streams[4096];
static int busy_streams(void) {
    long long t = now_ns();
    int n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 4096; i++)
        if (streams[i] && streams[i]->busy_until > t) n++;
    pthread_mutex_unlock(&lock);
    return n;
}

static int all_zero(const unsigned int *words, int n) {
    for (int i = 0; i < n; i++)
        if (words[i]) return 0;
    return 1;
}

/* A call that needs a current context, on an object of `kind` (or none). */
static CUresult need(Obj *o, int kind, const char *call) {
    if (in_host_function) {
        say("%s error=cuda-call-in-host-function", call);
        return NOT_PERMITTED;
    }
    if (!current()) {
        say("%s error=no-current-context", call);
        return INVALID_CONTEXT;
    }
    if (kind && (!o || o->kind != kind)) {
        say("%s error=bad-handle", call);
        return INVALID_HANDLE;
    }
    if (o && o->ctx != current()) {
        say("%s error=wrong-context ctx=%p made-in=%p", call, current(), o->ctx);
        return INVALID_CONTEXT;
    }
    return OK;
}

/* Pointers handed out (mapped buffers and allocations), to free by address. */
static Obj *pointers[65536];
static void remember(Obj *o) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 65536; i++)
        if (!pointers[i]) { pointers[i] = o; break; }
    pthread_mutex_unlock(&lock);
}
static Obj *forget_pointer(CUdeviceptr p) {
    Obj *found = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 65536; i++)
        if (pointers[i] && (CUdeviceptr)(uintptr_t)pointers[i]->bytes == p) {
            found = pointers[i];
            pointers[i] = NULL;
            break;
        }
    pthread_mutex_unlock(&lock);
    return found;
}

static void enqueue(Obj *stream) {
    long long until = latency_ms < 0 ? INT64_MAX : now_ns() + latency_ms * 1000000LL;
    if (until > stream->busy_until) stream->busy_until = until;
}

/* ---- controls, for the tests ---- */

size_t fake_cuda_log(char *out, size_t cap) {
    pthread_mutex_lock(&lock);
    size_t n = loglen;
    if (out && cap) {
        size_t m = n < cap - 1 ? n : cap - 1;
        memcpy(out, logbuf ? logbuf : "", m);
        out[m] = 0;
    }
    pthread_mutex_unlock(&lock);
    return n;
}

void fake_cuda_clear_log(void) {
    pthread_mutex_lock(&lock);
    loglen = 0;
    if (logbuf) logbuf[0] = 0;
    pthread_mutex_unlock(&lock);
}

int fake_cuda_set(const char *key, long long value) {
    if (!strcmp(key, "import_fail")) import_fail = value;
    else if (!strcmp(key, "close_on_fail")) close_on_fail = value;
    else if (!strcmp(key, "latency_ms")) latency_ms = value;
    else if (!strcmp(key, "max_surface2d")) max_surface2d = value;
    else if (!strcmp(key, "max_tex2d_mipmapped")) max_tex2d_mipmapped = value;
    else return -1;
    return 0;
}

int fake_cuda_set_devices(const unsigned char *ids, int count) {
    if (count < 0 || count > 4) return -1;
    memcpy(uuids, ids, 16 * (size_t)count);
    device_count = count;
    return 0;
}

long fake_cuda_live(const char *what) {
    for (int k = 1; k < K_KINDS; k++)
        if (!strcmp(what, kind_names[k])) {
            pthread_mutex_lock(&lock);
            long n = live[k];
            pthread_mutex_unlock(&lock);
            return n;
        }
    return -1;
}

void *fake_cuda_current(void) { return current(); }

/* ---- initialisation, errors, devices ---- */

CUresult cuInit(unsigned int flags) {
    say("cuInit flags=%u", flags);
    return flags ? INVALID_VALUE : OK;
}

CUresult cuDriverGetVersion(int *v) {
    *v = 12090;
    return OK;
}

static const char *name_of(CUresult r) {
    switch (r) {
    case OK: return "CUDA_SUCCESS";
    case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case NOT_READY: return "CUDA_ERROR_NOT_READY";
    case NOT_PERMITTED: return "CUDA_ERROR_NOT_PERMITTED";
    case NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: return NULL;
    }
}

CUresult cuGetErrorName(CUresult r, const char **s) {
    *s = name_of(r);
    return *s ? OK : INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
    *s = name_of(r) ? "fake driver error" : NULL;
    return *s ? OK : INVALID_VALUE;
}

CUresult cuDeviceGetCount(int *n) {
    *n = device_count;
    return OK;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal < 0 || ordinal >= device_count) return INVALID_VALUE;
    *d = ordinal;
    return OK;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    if (d < 0 || d >= device_count) return INVALID_VALUE;
    snprintf(name, (size_t)len, "Fake CUDA device %d", d);
    return OK;
}

#ifndef FAKE_OMIT_UUID_V2
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
    if (d < 0 || d >= device_count) return INVALID_VALUE;
    memcpy(u->bytes, uuids[d], 16);
    return OK;
}
#endif

CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d) {
    if (d < 0 || d >= device_count) return INVALID_VALUE;
    switch (attribute) {
    case 20: *v = 0; break; /* compute mode: default */
    case 56: case 57: *v = (int)max_surface2d; break;
    case 73: case 74: *v = (int)max_tex2d_mipmapped; break;
    default: *v = 0;
    }
    say("cuDeviceGetAttribute attribute=%d value=%d", attribute, *v);
    return OK;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (d < 0 || d >= device_count) return INVALID_VALUE;
    retained[d]++;
    *c = primary(d);
    say("cuDevicePrimaryCtxRetain device=%d ctx=%p", d, *c);
    return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d < 0 || d >= device_count || retained[d] == 0) return INVALID_CONTEXT;
    retained[d]--;
    say("cuDevicePrimaryCtxRelease device=%d", d);
    return OK;
}

CUresult cuCtxPushCurrent_v2(CUcontext c) {
    if (!c || depth == 64) return INVALID_VALUE;
    stack[depth++] = c;
    return OK;
}

CUresult cuCtxPopCurrent_v2(CUcontext *c) {
    if (depth == 0) return INVALID_CONTEXT;
    CUcontext top = stack[--depth];
    if (c) *c = top;
    return OK;
}

CUresult cuCtxGetCurrent(CUcontext *c) {
    *c = current();
    return OK;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    CUresult r = need(NULL, 0, "cuMemGetInfo");
    if (r) return r;
    *free_bytes = 1ull << 33;
    *total = 1ull << 34;
    return OK;
}

/* ---- external memory ---- */

CUresult cuImportExternalMemory(void **out, const MemHandleDesc *d) {
    CUresult r = need(NULL, 0, "cuImportExternalMemory");
    if (r) return r;
    int open = fcntl(d->handle.fd, F_GETFD) != -1;
    say("cuImportExternalMemory ctx=%p type=%d fd=%d fd_open=%d size=%llu flags=%u reserved_zero=%d",
        current(), d->type, d->handle.fd, open, d->size, d->flags, all_zero(d->reserved, 16));
    if (!open || d->size == 0 || (d->flags & ~1u) || !all_zero(d->reserved, 16)) return INVALID_VALUE;
    if (import_fail) {
        if (close_on_fail) close(d->handle.fd);
        return (CUresult)import_fail;
    }
    Obj *o = make(K_MEMORY);
    o->fd = d->handle.fd; /* the driver owns it now */
    o->size = d->size;
    *out = o;
    return OK;
}

CUresult cuDestroyExternalMemory(void *h) {
    Obj *o = h;
    CUresult r = need(o, K_MEMORY, "cuDestroyExternalMemory");
    if (r) return r;
    say("cuDestroyExternalMemory ctx=%p size=%llu busy_streams=%d", current(), o->size, busy_streams());
    close(o->fd);
    unmake(o);
    return OK;
}

CUresult cuExternalMemoryGetMappedBuffer(CUdeviceptr *ptr, void *h, const BufferDesc *d) {
    Obj *m = h;
    CUresult r = need(m, K_MEMORY, "cuExternalMemoryGetMappedBuffer");
    if (r) return r;
    say("cuExternalMemoryGetMappedBuffer ctx=%p offset=%llu size=%llu flags=%u reserved_zero=%d import_size=%llu",
        current(), d->offset, d->size, d->flags, all_zero(d->reserved, 16), m->size);
    if (d->flags || !all_zero(d->reserved, 16) || d->size == 0 || d->offset + d->size > m->size) return INVALID_VALUE;
    Obj *o = make(K_BUFFER);
    o->size = d->size;
    o->bytes = calloc(1, d->size);
    remember(o);
    *ptr = (CUdeviceptr)(uintptr_t)o->bytes;
    return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    CUresult r = need(NULL, 0, "cuMemAlloc");
    if (r) return r;
    if (!size) return INVALID_VALUE;
    Obj *o = make(K_ALLOC);
    o->size = size;
    o->bytes = calloc(1, size);
    remember(o);
    *ptr = (CUdeviceptr)(uintptr_t)o->bytes;
    return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    CUresult r = need(NULL, 0, "cuMemFree");
    if (r) return r;
    Obj *o = forget_pointer(p);
    if (!o) {
        say("cuMemFree error=unknown-pointer");
        return INVALID_VALUE;
    }
    if (o->ctx != current()) {
        say("cuMemFree error=wrong-context");
        return INVALID_CONTEXT;
    }
    say("cuMemFree ctx=%p kind=%s size=%llu busy_streams=%d", current(), kind_names[o->kind], o->size, busy_streams());
    unmake(o);
    return OK;
}

#ifndef FAKE_OMIT_MIPMAPPED
CUresult cuExternalMemoryGetMappedMipmappedArray(void **out, void *h, const MipmappedDesc *d) {
    Obj *m = h;
    CUresult r = need(m, K_MEMORY, "cuExternalMemoryGetMappedMipmappedArray");
    if (r) return r;
    const Array3DDesc *a = &d->arrayDesc;
    say("cuExternalMemoryGetMappedMipmappedArray ctx=%p offset=%llu width=%zu height=%zu depth=%zu format=%d "
        "channels=%u flags=%u levels=%u reserved_zero=%d",
        current(), d->offset, a->Width, a->Height, a->Depth, a->Format, a->NumChannels, a->Flags, d->numLevels,
        all_zero(d->reserved, 16));
    if (!all_zero(d->reserved, 16) || d->numLevels == 0 || d->numLevels > 16) return INVALID_VALUE;
    Obj *o = make(K_ARRAY);
    o->flags = a->Flags;
    o->levels = d->numLevels;
    o->levelv = calloc(d->numLevels, sizeof(Obj));
    for (unsigned i = 0; i < d->numLevels; i++) {
        o->levelv[i].kind = K_LEVEL;
        o->levelv[i].ctx = o->ctx;
        o->levelv[i].parent = o;
    }
    *out = o;
    return OK;
}
#endif

CUresult cuMipmappedArrayGetLevel(void **level, void *h, unsigned int i) {
    Obj *o = h;
    CUresult r = need(o, K_ARRAY, "cuMipmappedArrayGetLevel");
    if (r) return r;
    if (i >= o->levels) return INVALID_VALUE;
    *level = &o->levelv[i];
    return OK;
}

CUresult cuMipmappedArrayDestroy(void *h) {
    Obj *o = h;
    CUresult r = need(o, K_ARRAY, "cuMipmappedArrayDestroy");
    if (r) return r;
    say("cuMipmappedArrayDestroy ctx=%p busy_streams=%d", current(), busy_streams());
    free(o->levelv);
    unmake(o);
    return OK;
}

static CUresult level_of(const ResourceDesc *res, Obj **level) {
    Obj *l = res->res.array.hArray;
    if (res->resType != 0 || !l || l->kind != K_LEVEL) return INVALID_HANDLE;
    *level = l;
    return OK;
}

CUresult cuSurfObjectCreate(CUsurfObject *s, const ResourceDesc *res) {
    Obj *l;
    CUresult r = need(NULL, 0, "cuSurfObjectCreate");
    if (r || (r = level_of(res, &l))) return r;
    int ldst = (l->parent->flags & 2) != 0;
    say("cuSurfObjectCreate ctx=%p surface_ldst=%d", current(), ldst);
    if (!ldst) return INVALID_VALUE; /* as the driver: only arrays with SURFACE_LDST */
    Obj *o = make(K_SURFACE);
    *s = (CUsurfObject)(uintptr_t)o;
    return OK;
}

CUresult cuSurfObjectDestroy(CUsurfObject s) {
    Obj *o = (Obj *)(uintptr_t)s;
    CUresult r = need(o, K_SURFACE, "cuSurfObjectDestroy");
    if (r) return r;
    unmake(o);
    return OK;
}

CUresult cuTexObjectCreate(CUtexObject *t, const ResourceDesc *res, const void *tex, const void *view) {
    Obj *l;
    (void)tex;
    (void)view;
    CUresult r = need(NULL, 0, "cuTexObjectCreate");
    if (r || (r = level_of(res, &l))) return r;
    Obj *o = make(K_TEXTURE);
    *t = (CUtexObject)(uintptr_t)o;
    return OK;
}

CUresult cuTexObjectDestroy(CUtexObject t) {
    Obj *o = (Obj *)(uintptr_t)t;
    CUresult r = need(o, K_TEXTURE, "cuTexObjectDestroy");
    if (r) return r;
    unmake(o);
    return OK;
}

/* ---- external semaphores ---- */

CUresult cuImportExternalSemaphore(void **out, const SemHandleDesc *d) {
    CUresult r = need(NULL, 0, "cuImportExternalSemaphore");
    if (r) return r;
    int open = fcntl(d->handle.fd, F_GETFD) != -1;
    say("cuImportExternalSemaphore ctx=%p type=%d fd=%d fd_open=%d flags=%u reserved_zero=%d", current(), d->type,
        d->handle.fd, open, d->flags, all_zero(d->reserved, 16));
    if (!open || d->flags || !all_zero(d->reserved, 16)) return INVALID_VALUE;
    if (import_fail) {
        if (close_on_fail) close(d->handle.fd);
        return (CUresult)import_fail;
    }
    Obj *o = make(K_SEMAPHORE);
    o->fd = d->handle.fd;
    o->size = (unsigned long long)d->type;
    *out = o;
    return OK;
}

CUresult cuDestroyExternalSemaphore(void *h) {
    Obj *o = h;
    CUresult r = need(o, K_SEMAPHORE, "cuDestroyExternalSemaphore");
    if (r) return r;
    say("cuDestroyExternalSemaphore ctx=%p busy_streams=%d", current(), busy_streams());
    close(o->fd);
    unmake(o);
    return OK;
}

CUresult cuSignalExternalSemaphoresAsync(void *const *sems, const SignalParams *p, unsigned int n, void *stream) {
    CUresult r = need(stream, K_STREAM, "cuSignalExternalSemaphoresAsync");
    if (r) return r;
    for (unsigned i = 0; i < n; i++) {
        Obj *s = sems[i];
        if ((r = need(s, K_SEMAPHORE, "cuSignalExternalSemaphoresAsync"))) return r;
        say("cuSignalExternalSemaphoresAsync ctx=%p value=%llu flags=%u reserved_zero=%d", current(),
            p[i].params.fence.value, p[i].flags,
            all_zero(p[i].params.reserved, 12) && all_zero(p[i].reserved, 16) && !p[i].params.nvSciSync.reserved &&
                !p[i].params.keyedMutex.key);
    }
    enqueue(stream);
    return OK;
}

CUresult cuWaitExternalSemaphoresAsync(void *const *sems, const WaitParams *p, unsigned int n, void *stream) {
    CUresult r = need(stream, K_STREAM, "cuWaitExternalSemaphoresAsync");
    if (r) return r;
    for (unsigned i = 0; i < n; i++) {
        Obj *s = sems[i];
        if ((r = need(s, K_SEMAPHORE, "cuWaitExternalSemaphoresAsync"))) return r;
        say("cuWaitExternalSemaphoresAsync ctx=%p value=%llu flags=%u reserved_zero=%d", current(),
            p[i].params.fence.value, p[i].flags,
            all_zero(p[i].params.reserved, 10) && all_zero(p[i].reserved, 16) && !p[i].params.nvSciSync.reserved &&
                !p[i].params.keyedMutex.key && !p[i].params.keyedMutex.timeoutMs);
    }
    enqueue(stream);
    return OK;
}

/* ---- streams, events, copies ---- */

CUresult cuStreamCreate(void **out, unsigned int flags) {
    (void)flags;
    CUresult r = need(NULL, 0, "cuStreamCreate");
    if (r) return r;
    Obj *o = make(K_STREAM);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 4096; i++)
        if (!streams[i]) { streams[i] = o; break; }
    pthread_mutex_unlock(&lock);
    *out = o;
    return OK;
}

CUresult cuStreamDestroy_v2(void *h) {
    Obj *o = h;
    CUresult r = need(o, K_STREAM, "cuStreamDestroy");
    if (r) return r;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 4096; i++)
        if (streams[i] == o) streams[i] = NULL;
    pthread_mutex_unlock(&lock);
    unmake(o);
    return OK;
}

CUresult cuStreamQuery(void *h) {
    Obj *o = h;
    CUresult r = need(o, K_STREAM, "cuStreamQuery");
    if (r) return r;
    return now_ns() >= o->busy_until ? OK : NOT_READY;
}

CUresult cuEventCreate(void **out, unsigned int flags) {
    (void)flags;
    CUresult r = need(NULL, 0, "cuEventCreate");
    if (r) return r;
    *out = make(K_EVENT);
    return OK;
}

CUresult cuEventRecord(void *e, void *stream) {
    Obj *ev = e, *s = stream;
    CUresult r = need(ev, K_EVENT, "cuEventRecord");
    if (r || (r = need(s, K_STREAM, "cuEventRecord"))) return r;
    ev->busy_until = s->busy_until;
    return OK;
}

CUresult cuEventQuery(void *e) {
    Obj *ev = e;
    CUresult r = need(ev, K_EVENT, "cuEventQuery");
    if (r) return r;
    return now_ns() >= ev->busy_until ? OK : NOT_READY;
}

CUresult cuEventDestroy_v2(void *e) {
    Obj *ev = e;
    CUresult r = need(ev, K_EVENT, "cuEventDestroy");
    if (r) return r;
    say("cuEventDestroy ctx=%p pending=%d", current(), now_ns() < ev->busy_until);
    unmake(ev);
    return OK;
}

/* The stream waits for the event's record: its work completes no earlier. */
CUresult cuStreamWaitEvent(void *stream, void *e, unsigned int flags) {
    Obj *s = stream, *ev = e;
    CUresult r = need(s, K_STREAM, "cuStreamWaitEvent");
    if (r || (r = need(ev, K_EVENT, "cuStreamWaitEvent"))) return r;
    if (flags) return INVALID_VALUE;
    if (ev->busy_until > s->busy_until) s->busy_until = ev->busy_until;
    say("cuStreamWaitEvent ctx=%p", current());
    return OK;
}

/* Host functions: each runs on a thread of its own once the stream's work
 * enqueued before it has completed (its busy_until at the launch), with no
 * context current and CUDA calls refused; one behind work that never
 * completes is never called. */
typedef void (*HostFn)(void *);
typedef struct { HostFn fn; void *data; long long at; } HostCall;

static void *run_host_function(void *p) {
    HostCall *c = p;
    struct timespec at = { (time_t)(c->at / 1000000000LL), (long)(c->at % 1000000000LL) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR) {}
    say("host_function_ran late_us=%lld", (now_ns() - c->at) / 1000);
    in_host_function = 1;
    c->fn(c->data);
    in_host_function = 0;
    say("host_function_returned");
    free(c);
    return NULL;
}

CUresult cuLaunchHostFunc(void *stream, HostFn fn, void *data) {
    Obj *s = stream;
    CUresult r = need(s, K_STREAM, "cuLaunchHostFunc");
    if (r) return r;
    if (!fn) return INVALID_VALUE;
    long long at = s->busy_until;
    say("cuLaunchHostFunc ctx=%p never=%d", current(), at == INT64_MAX);
    if (at == INT64_MAX) return OK;
    HostCall *c = malloc(sizeof *c);
    c->fn = fn;
    c->data = data;
    c->at = at;
    pthread_attr_t attr;
    pthread_t thread;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&thread, &attr, run_host_function, c);
    pthread_attr_destroy(&attr);
    if (failed) {
        free(c);
        return UNKNOWN;
    }
    return OK;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *stream) {
    CUresult r = need(stream, K_STREAM, "cuMemcpyDtoDAsync");
    if (r) return r;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    say("cuMemcpyDtoDAsync ctx=%p bytes=%zu", current(), n);
    enqueue(stream);
    return OK;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *stream) {
    CUresult r = need(stream, K_STREAM, "cuMemcpyDtoHAsync");
    if (r) return r;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    say("cuMemcpyDtoHAsync ctx=%p bytes=%zu", current(), n);
    enqueue(stream);
    return OK;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *stream) {
    CUresult r = need(stream, K_STREAM, "cuMemcpyHtoDAsync");
    if (r) return r;
    memcpy((void *)(uintptr_t)dst, src, n);
    say("cuMemcpyHtoDAsync ctx=%p bytes=%zu", current(), n);
    enqueue(stream);
    return OK;
}

/* ---- modules, kernel launches, 3D copies (the level copies of copy.rs) ----
 * Modules and functions are not counted among the kinds: the log says what
 * was loaded, launched and unloaded. A launch logs its grid, block and its
 * first five parameters read as the copy kernels declare them (u64 x 3,
 * u32 x 2), and whether the surface parameter is a live surface of the
 * current context; nothing is copied. */
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} Memcpy3D;
_Static_assert(sizeof(Memcpy3D) == 200, "CUDA_MEMCPY3D");

#define MODULE_MAGIC 0x4d6f64756c65ULL
#define FUNCTION_MAGIC 0x46756e6374ULL
typedef struct { unsigned long long magic; CUcontext ctx; } FakeModule;
typedef struct { unsigned long long magic; CUcontext ctx; FakeModule *module; char name[64]; } FakeFunction;

CUresult cuModuleLoadData(void **out, const void *image) {
    CUresult r = need(NULL, 0, "cuModuleLoadData");
    if (r) return r;
    const char *text = image;
    int copy_kernels = strstr(text, ".entry array_to_linear_4b_r4") && strstr(text, ".entry linear_to_array_16b_r4");
    say("cuModuleLoadData ctx=%p copy_kernels=%d", current(), copy_kernels);
    FakeModule *m = calloc(1, sizeof *m);
    m->magic = MODULE_MAGIC;
    m->ctx = current();
    *out = m;
    return OK;
}

CUresult cuModuleGetFunction(void **out, void *module, const char *name) {
    FakeModule *m = module;
    CUresult r = need(NULL, 0, "cuModuleGetFunction");
    if (r) return r;
    if (!m || m->magic != MODULE_MAGIC || m->ctx != current()) return INVALID_HANDLE;
    FakeFunction *f = calloc(1, sizeof *f);
    f->magic = FUNCTION_MAGIC;
    f->ctx = current();
    f->module = m;
    snprintf(f->name, sizeof f->name, "%s", name);
    *out = f; /* never freed: a handful per module */
    return OK;
}

CUresult cuModuleUnload(void *module) {
    FakeModule *m = module;
    CUresult r = need(NULL, 0, "cuModuleUnload");
    if (r) return r;
    if (!m || m->magic != MODULE_MAGIC || m->ctx != current()) return INVALID_HANDLE;
    say("cuModuleUnload ctx=%p busy_streams=%d", current(), busy_streams());
    m->magic = 0;
    free(m);
    return OK;
}

CUresult cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    FakeFunction *f = function;
    CUresult r = need(stream, K_STREAM, "cuLaunchKernel");
    if (r) return r;
    if (!f || f->magic != FUNCTION_MAGIC || f->ctx != current() || f->module->magic != MODULE_MAGIC) {
        say("cuLaunchKernel error=bad-function");
        return INVALID_HANDLE;
    }
    unsigned long long a[3];
    for (int i = 0; i < 3; i++) a[i] = *(const unsigned long long *)params[i];
    unsigned w = *(const unsigned *)params[3], h = *(const unsigned *)params[4];
    int to_linear = !strncmp(f->name, "array_to_linear", 15);
    Obj *surface = (Obj *)(uintptr_t)(to_linear ? a[0] : a[2]);
    int surface_ok = surface && surface->kind == K_SURFACE && surface->ctx == current();
    say("cuLaunchKernel ctx=%p kernel=%s grid=%u,%u,%u block=%u,%u,%u shared=%u extra_null=%d "
        "a0=%llu a1=%llu a2=%llu width=%u height=%u surface_ok=%d",
        current(), f->name, gx, gy, gz, bx, by, bz, shared, extra == NULL, a[0], a[1], a[2], w, h, surface_ok);
    enqueue(stream);
    return OK;
}

CUresult cuMemcpy3DAsync_v2(const Memcpy3D *p, void *stream) {
    CUresult r = need(stream, K_STREAM, "cuMemcpy3DAsync");
    if (r) return r;
    say("cuMemcpy3DAsync ctx=%p src_type=%d dst_type=%d src_device=%llu dst_device=%llu src_pitch=%zu "
        "dst_pitch=%zu src_height=%zu dst_height=%zu width_bytes=%zu height=%zu depth=%zu array_is_level=%d",
        current(), p->srcMemoryType, p->dstMemoryType, p->srcDevice, p->dstDevice, p->srcPitch, p->dstPitch,
        p->srcHeight, p->dstHeight, p->WidthInBytes, p->Height, p->Depth,
        ((Obj *)(p->srcMemoryType == 3 ? p->srcArray : p->dstArray))->kind == K_LEVEL);
    enqueue(stream);
    return OK;
}
"##;

    /// Which fake: the whole API the crate uses, or one without a function.
    #[derive(Clone, Copy, Debug)]
    pub(crate) enum Variant {
        Full,
        WithoutUuidV2,
        WithoutMipmappedArrays,
    }

    /// Builds `variant` once per test process (with `$CC`, else `cc`) and
    /// returns the directory holding its `libcuda.so.1`.
    pub(crate) fn library(variant: Variant) -> &'static Path {
        static BUILT: [OnceLock<PathBuf>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        let (slot, name, defines): (usize, &str, &[&str]) = match variant {
            Variant::Full => (0, "full", &[]),
            Variant::WithoutUuidV2 => (1, "no-uuid-v2", &["-DFAKE_OMIT_UUID_V2"]),
            Variant::WithoutMipmappedArrays => (2, "no-mipmapped", &["-DFAKE_OMIT_MIPMAPPED"]),
        };
        BUILT[slot].get_or_init(|| {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("fake-libcuda-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let source = dir.join("fake_cuda.c");
            std::fs::write(&source, SOURCE).unwrap();
            let compiler = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
            let status = Command::new(&compiler)
                .args(["-shared", "-fPIC", "-O1", "-Wall"])
                .args(defines)
                .arg("-o")
                .arg(dir.join("libcuda.so.1"))
                .arg(&source)
                .arg("-lpthread")
                .status()
                .unwrap_or_else(|e| {
                    panic!("the fake libcuda needs a C compiler ({compiler:?}, as the loader fixtures do): {e}")
                });
            assert!(status.success(), "building the fake libcuda failed");
            dir
        })
    }

    /// Runs the child test `name` with the fake `variant` as its libcuda.
    pub(crate) fn run(name: &str, variant: Variant) -> String {
        let dir = library(variant);
        run_child(
            name,
            &[
                ("LD_LIBRARY_PATH", dir.as_os_str().to_owned()),
                ("CUDA_INTEROP_FAKE_CUDA", OsString::from("1")),
            ],
            None,
        )
    }

    /// The UUID of the fake's one device by default, and of the wire samples.
    pub(crate) const UUID: [u8; 16] = [7; 16];

    /// One call the fake logged: its `key=value` fields.
    #[derive(Debug)]
    pub(crate) struct Call(BTreeMap<String, String>);

    impl Call {
        pub(crate) fn get(&self, key: &str) -> &str {
            self.0
                .get(key)
                .unwrap_or_else(|| panic!("no {key} in {self:?}"))
        }
        pub(crate) fn num(&self, key: &str) -> u64 {
            self.get(key).parse().unwrap()
        }
    }

    /// The fake driver this process runs with.
    pub(crate) struct Fake(libloading::Library);

    impl Fake {
        /// The fake, loaded by name as the crate loads its driver; panics
        /// unless this process was started by [`run`].
        pub(crate) fn open() -> Fake {
            assert!(
                std::env::var_os("CUDA_INTEROP_FAKE_CUDA").is_some(),
                "started by the parent test, with the fake libcuda"
            );
            // SAFETY: `libcuda.so.1` on this process's LD_LIBRARY_PATH is the
            // fake built from SOURCE (the parent test set it), plain C with no
            // initialisers; the crate loads the same file by the same name.
            let library = unsafe { libloading::Library::new("libcuda.so.1") }.unwrap();
            let fake = Fake(library);
            // SAFETY: as in `log`: the fake exports this function.
            let is_fake = unsafe {
                fake.0
                    .get::<unsafe extern "C" fn(*mut c_char, usize) -> usize>(b"fake_cuda_log\0")
            };
            assert!(is_fake.is_ok(), "libcuda.so.1 is not the fake");
            fake
        }

        /// Everything logged so far.
        pub(crate) fn log(&self) -> String {
            // SAFETY: SOURCE defines `size_t fake_cuda_log(char *out, size_t
            // cap)`: it copies at most cap - 1 bytes and a NUL into `out` (or
            // nothing for a null `out`) and returns the log's length.
            unsafe {
                let f = self
                    .0
                    .get::<unsafe extern "C" fn(*mut c_char, usize) -> usize>(b"fake_cuda_log\0")
                    .unwrap();
                let len = f(std::ptr::null_mut(), 0);
                let mut buf = vec![0u8; len + 1];
                f(buf.as_mut_ptr().cast(), buf.len());
                buf.truncate(len);
                String::from_utf8(buf).unwrap()
            }
        }

        /// Forgets what was logged.
        pub(crate) fn clear(&self) {
            // SAFETY: SOURCE defines `void fake_cuda_clear_log(void)`.
            unsafe {
                self.0
                    .get::<unsafe extern "C" fn()>(b"fake_cuda_clear_log\0")
                    .unwrap()()
            }
        }

        /// Sets one of the fake's knobs (`import_fail`, `close_on_fail`,
        /// `latency_ms`, `max_surface2d`, `max_tex2d_mipmapped`).
        pub(crate) fn set(&self, key: &str, value: i64) {
            let key = CString::new(key).unwrap();
            // SAFETY: SOURCE defines `int fake_cuda_set(const char *key, long
            // long value)`; `key` is a NUL-terminated string living across
            // the call.
            let status = unsafe {
                self.0
                    .get::<unsafe extern "C" fn(*const c_char, c_longlong) -> c_int>(
                        b"fake_cuda_set\0",
                    )
                    .unwrap()(key.as_ptr(), value)
            };
            assert_eq!(status, 0, "unknown knob {key:?}");
        }

        /// The devices the fake lists, in ordinal order.
        pub(crate) fn set_devices(&self, uuids: &[[u8; 16]]) {
            let flat: Vec<u8> = uuids.iter().flatten().copied().collect();
            // SAFETY: SOURCE defines `int fake_cuda_set_devices(const unsigned
            // char *ids, int count)`, which reads 16 * count bytes (count at
            // most 4); `flat` holds exactly that.
            let status = unsafe {
                self.0
                    .get::<unsafe extern "C" fn(*const u8, c_int) -> c_int>(
                        b"fake_cuda_set_devices\0",
                    )
                    .unwrap()(flat.as_ptr(), uuids.len() as c_int)
            };
            assert_eq!(status, 0);
        }

        /// How many objects of a kind are alive (`memory`, `buffer`,
        /// `alloc`, `array`, `surface`, `texture`, `semaphore`, `stream`,
        /// `event`).
        pub(crate) fn live(&self, what: &str) -> i64 {
            let what = CString::new(what).unwrap();
            // SAFETY: SOURCE defines `long fake_cuda_live(const char *what)`;
            // `what` is a NUL-terminated string living across the call.
            let n = unsafe {
                self.0
                    .get::<unsafe extern "C" fn(*const c_char) -> c_long>(b"fake_cuda_live\0")
                    .unwrap()(what.as_ptr())
            };
            assert!(n >= 0, "unknown kind {what:?}");
            n
        }

        /// Every kind of object the fake counts, alive now.
        pub(crate) fn all_live(&self) -> Vec<(&'static str, i64)> {
            [
                "memory",
                "buffer",
                "alloc",
                "array",
                "surface",
                "texture",
                "semaphore",
                "stream",
                "event",
            ]
            .into_iter()
            .map(|k| (k, self.live(k)))
            .filter(|(_, n)| *n != 0)
            .collect()
        }

        /// The calling thread's current context, as the fake sees it.
        pub(crate) fn current(&self) -> usize {
            // SAFETY: SOURCE defines `void *fake_cuda_current(void)`.
            unsafe {
                self.0
                    .get::<unsafe extern "C" fn() -> *mut c_void>(b"fake_cuda_current\0")
                    .unwrap()() as usize
            }
        }

        /// The logged calls of the driver function `name`, in order.
        pub(crate) fn calls(&self, name: &str) -> Vec<Call> {
            self.log()
                .lines()
                .filter(|l| l.split_whitespace().next() == Some(name))
                .map(|l| {
                    Call(
                        l.split_whitespace()
                            .skip(1)
                            .filter_map(|kv| kv.split_once('='))
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    )
                })
                .collect()
        }

        /// The last logged call of `name`.
        pub(crate) fn last(&self, name: &str) -> Call {
            self.calls(name)
                .pop()
                .unwrap_or_else(|| panic!("no call of {name}; the log:\n{}", self.log()))
        }
    }

    /// A context handle as the fake prints it (`%p`).
    pub(crate) fn shown(context: sys::CUcontext) -> String {
        format!("{context:p}")
    }

    /// An fd for the fake to import: a memfd (the fake never reads it).
    pub(crate) fn some_fd() -> OwnedFd {
        rustix::fs::memfd_create("fake-export", rustix::fs::MemfdFlags::CLOEXEC).unwrap()
    }

    /// An optimal, device-local image record of format `F` and usage `U`
    /// on the fake's device, made by the decoder (dedicated).
    pub(crate) fn image<F: Format, U: Usage>(
        extent: [u32; 3],
        levels: u32,
        layers: u32,
        cube: bool,
    ) -> ImageRecord<F, Optimal, DeviceLocal, U> {
        let texels = u64::from(F::TEXEL_BYTES)
            * extent.iter().map(|&e| u64::from(e)).product::<u64>()
            * u64::from(layers);
        ImageFields {
            format: F::VK.as_raw() as u32,
            image_type: if extent[2] > 1 { 2 } else { 1 },
            extent,
            mip_levels: levels,
            array_layers: layers,
            flags: if cube {
                vk::ImageCreateFlags::CUBE_COMPATIBLE.as_raw()
            } else {
                0
            },
            tiling: 0,
            usage: U::VK.as_raw(),
            allocation_size: 2 * texels,
            memory_type_index: 0,
            memory_flags: vk::MemoryPropertyFlags::DEVICE_LOCAL.as_raw(),
        }
        .decode()
        .typed::<F, Optimal, DeviceLocal, U>()
        .unwrap()
    }

    /// `record` with its dedicated flag set to `dedicated`, on the wire.
    pub(crate) fn with_dedicated<F: Format, U: Usage>(
        record: &ImageRecord<F, Optimal, DeviceLocal, U>,
        dedicated: bool,
    ) -> ImageRecord<F, Optimal, DeviceLocal, U> {
        tamper::image(record.info(), "dedicated", |b| b[0] = u8::from(dedicated))
            .typed()
            .unwrap()
    }

    /// The wire sample's buffer record (1000 bytes in a 4096-byte
    /// allocation), with its dedicated flag set to `dedicated`.
    pub(crate) fn buffer(dedicated: bool) -> BufferRecord<DeviceLocal> {
        tamper::buffer(&sample_buffer(), "dedicated", |b| {
            b[0] = u8::from(dedicated)
        })
        .typed()
        .unwrap()
    }

    /// The wire sample's timeline semaphore record.
    pub(crate) fn timeline() -> SemaphoreRecord<Timeline> {
        sample_semaphore().typed().unwrap()
    }

    /// The wire sample's semaphore record as a binary semaphore.
    pub(crate) fn binary() -> SemaphoreRecord<Binary> {
        tamper::semaphore(&sample_semaphore(), "semaphore_type", tamper::set(0))
            .typed()
            .unwrap()
    }
}

/// Cases 6, 7, 8, 11, 12, 13, 15, 18, 20, 21, 22, 38, against the fake
/// driver: every descriptor the crate hands the driver is derived from the
/// record (size, dedicated flag, handle type, array format, extent, layers,
/// levels, offset 0, surface and colour-attachment flags), every reserved
/// word is zero, limits are checked before the call, and what the checks
/// refuse never reaches the driver.
#[test]
fn the_descriptors_the_driver_receives_come_from_the_record() {
    let _serial = serial();
    fake::run("child_fake_descriptors", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by the_descriptors_the_driver_receives_come_from_the_record"]
fn child_fake_descriptors() {
    use cuda_interop::sys::{
        CUarray_format, CUDA_ARRAY3D_COLOR_ATTACHMENT, CUDA_ARRAY3D_CUBEMAP, CUDA_ARRAY3D_LAYERED,
        CUDA_ARRAY3D_SURFACE_LDST,
    };
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let primary = fake::shown(cuda.raw_context());

    // Memory imports: OPAQUE_FD, the record's size, the flag from the
    // record's dedicated bit and nothing else, reserved words zero.
    let storage = fake::image::<Rgba8Unorm, usage::Storage>([64, 32, 1], 3, 2, false);
    let size = storage.info().allocation_size();
    for dedicated in [true, false] {
        let record = fake::with_dedicated(&storage, dedicated);
        // SAFETY: the driver is the fake (this process was started with it):
        // it records the descriptor and holds the fd, and nothing reads or
        // writes memory through the import, so the fd need not be the
        // record's export.
        let imported = unsafe { cuda.import_image_fd(record, fake::some_fd()) }
            .map_err(|e| e.error)
            .unwrap();
        let call = fake.last("cuImportExternalMemory");
        assert_eq!(call.get("type"), "1", "OPAQUE_FD");
        assert_eq!(call.num("size"), size);
        assert_eq!(
            call.num("flags"),
            u64::from(dedicated),
            "dedicated {dedicated}"
        );
        assert_eq!(call.get("reserved_zero"), "1");
        assert_eq!(call.get("fd_open"), "1");
        assert_eq!(call.get("ctx"), primary);
        drop(imported);
    }

    // The array: offset 0, extent, layers in Depth, format and channels of
    // the type, levels = mipLevels, SURFACE_LDST from storage usage.
    // SAFETY: as above.
    let imported = unsafe { cuda.import_image_fd(storage.clone(), fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array = imported.map_array().unwrap();
    let call = fake.last("cuExternalMemoryGetMappedMipmappedArray");
    assert_eq!(call.num("offset"), 0);
    assert_eq!(
        (call.num("width"), call.num("height"), call.num("depth")),
        (64, 32, 2)
    );
    assert_eq!(
        call.num("format"),
        u64::from(CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8.0)
    );
    assert_eq!(call.num("channels"), 4);
    assert_eq!(
        call.num("flags"),
        u64::from(CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST)
    );
    assert_eq!(call.num("levels"), 3, "numLevels is the image's mipLevels");
    assert_eq!(call.get("reserved_zero"), "1");
    {
        let level = array.level(2).unwrap();
        assert_eq!(level.extent(), [16, 8, 2]);
        let _surface = level.surface().unwrap();
        assert_eq!(fake.last("cuSurfObjectCreate").get("surface_ldst"), "1");
        let before = fake.log().len();
        assert!(matches!(array.level(3), Err(CudaError::InvalidArgument(_))));
        assert_eq!(
            fake.log().len(),
            before,
            "a level the image lacks: no driver call"
        );
    }
    drop(array);
    drop(imported);

    // A storage colour attachment cube: CUBEMAP, SURFACE_LDST and
    // COLOR_ATTACHMENT; one float channel.
    let cube = fake::image::<R32Sfloat, usage::StorageColorAttachment>([32, 32, 1], 1, 6, true);
    // SAFETY: as above.
    let imported = unsafe { cuda.import_image_fd(cube, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array = imported.map_array().unwrap();
    let call = fake.last("cuExternalMemoryGetMappedMipmappedArray");
    assert_eq!(
        call.num("flags"),
        u64::from(CUDA_ARRAY3D_CUBEMAP | CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_COLOR_ATTACHMENT)
    );
    assert_eq!(
        (call.num("depth"), call.num("channels"), call.num("format")),
        (6, 1, u64::from(CUarray_format::CU_AD_FORMAT_FLOAT.0))
    );
    drop(array);
    drop(imported);

    // A colour attachment without storage: COLOR_ATTACHMENT, no
    // SURFACE_LDST (so no surface compiles); a texture reads it.
    let attachment = fake::image::<Rgba16Sfloat, usage::ColorAttachment>([16, 16, 1], 2, 3, false);
    // SAFETY: as above.
    let imported = unsafe { cuda.import_image_fd(attachment, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array = imported.map_array().unwrap();
    let call = fake.last("cuExternalMemoryGetMappedMipmappedArray");
    assert_eq!(
        call.num("flags"),
        u64::from(CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_COLOR_ATTACHMENT)
    );
    assert_eq!(
        (call.num("format"), call.num("levels")),
        (u64::from(CUarray_format::CU_AD_FORMAT_HALF.0), 2)
    );
    {
        let level = array.level(0).unwrap();
        let _texture = level.texture().unwrap();
    }
    drop(array);
    drop(imported);

    // Limits are checked before the call: a surface array wider than the
    // device's SURFACE2D width, a texture array wider than its
    // TEXTURE2D_MIPMAPPED width, are Unsupported and reach no driver call.
    let maps = || fake.calls("cuExternalMemoryGetMappedMipmappedArray").len();
    fake.set("max_surface2d", 32);
    // SAFETY: as above.
    let imported = unsafe { cuda.import_image_fd(storage.clone(), fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let mapped_before = maps();
    let err = imported.map_array().unwrap_err();
    assert!(matches!(err, CudaError::Unsupported(_)), "{err}");
    assert!(
        err.to_string().contains("32x32 with surface access"),
        "{err}"
    );
    assert_eq!(maps(), mapped_before, "refused before the driver");
    drop(imported);
    fake.set("max_surface2d", 131_072);
    fake.set("max_tex2d_mipmapped", 8);
    let sampled = fake::image::<Rgba8Unorm, usage::Sampled>([16, 16, 1], 1, 1, false);
    // SAFETY: as above.
    let imported = unsafe { cuda.import_image_fd(sampled, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let err = imported.map_array().unwrap_err();
    assert!(matches!(err, CudaError::Unsupported(_)), "{err}");
    assert_eq!(maps(), mapped_before);
    println!("beyond the device's limits: {err}");
    drop(imported);
    fake.set("max_tex2d_mipmapped", 32_768);

    // Buffers: imported at the allocation size, mapped whole at offset 0
    // for the buffer's size; slices are bounds-checked without the driver.
    for dedicated in [false, true] {
        // SAFETY: as above.
        let mut imported =
            unsafe { cuda.import_buffer_fd(fake::buffer(dedicated), fake::some_fd()) }
                .map_err(|e| e.error)
                .unwrap();
        let call = fake.last("cuImportExternalMemory");
        assert_eq!(
            (call.num("size"), call.num("flags")),
            (4096, u64::from(dedicated))
        );
        let mapped = imported.map().unwrap();
        let call = fake.last("cuExternalMemoryGetMappedBuffer");
        assert_eq!((call.num("offset"), call.num("size")), (0, 1000));
        assert_eq!((call.num("flags"), call.get("reserved_zero")), (0, "1"));
        let before = fake.log().len();
        assert!(matches!(
            mapped.slice(990, 11),
            Err(CudaError::InvalidArgument(_))
        ));
        assert!(matches!(
            mapped.slice(u64::MAX, 2),
            Err(CudaError::InvalidArgument(_))
        ));
        assert_eq!(mapped.slice(990, 10).unwrap().len(), 10);
        assert_eq!(fake.log().len(), before, "slices are not driver calls");
    }

    // Semaphores: the handle type follows the record's kind.
    // SAFETY: as above, for semaphores (nothing waits on or signals them).
    let (timeline, binary) = unsafe {
        (
            cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()),
            cuda.import_semaphore_fd(fake::binary(), fake::some_fd()),
        )
    };
    let (timeline, binary) = (
        timeline.map_err(|e| e.error).unwrap(),
        binary.map_err(|e| e.error).unwrap(),
    );
    let calls = fake.calls("cuImportExternalSemaphore");
    let types: Vec<&str> = calls.iter().map(|c| c.get("type")).collect();
    assert_eq!(types, ["9", "1"], "TIMELINE_SEMAPHORE_FD, then OPAQUE_FD");
    assert!(calls
        .iter()
        .all(|c| c.get("reserved_zero") == "1" && c.num("flags") == 0));
    drop((timeline, binary));

    // Every descriptor of every call had its reserved words zero.
    for line in fake.log().lines().filter(|l| l.contains("reserved_zero=")) {
        assert!(line.contains("reserved_zero=1"), "{line}");
    }
    assert_eq!(fake.all_live(), [], "everything destroyed");
    println!("{}", fake.log());
}

/// Cases 35, 36, 37 (the CUDA side), against the fake driver: timeline
/// signals of 0, of the last value or below it are refused before anything
/// is enqueued; a binary semaphore's second signal while one is pending,
/// and a wait with another semaphore's token, are refused before the
/// driver; a wait consumes its token.
#[test]
fn semaphore_misuse_is_refused_before_anything_is_enqueued() {
    let _serial = serial();
    fake::run("child_fake_semaphore_rules", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by semaphore_misuse_is_refused_before_anything_is_enqueued"]
fn child_fake_semaphore_rules() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    // SAFETY: the driver is the fake: it records what is enqueued and holds
    // the fds; no GPU work exists.
    let (timeline, a, b) = unsafe {
        (
            cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()),
            cuda.import_semaphore_fd(fake::binary(), fake::some_fd()),
            cuda.import_semaphore_fd(fake::binary(), fake::some_fd()),
        )
    };
    let (timeline, a, b) = (
        timeline.map_err(|e| e.error).unwrap(),
        a.map_err(|e| e.error).unwrap(),
        b.map_err(|e| e.error).unwrap(),
    );
    let signals = || {
        fake.calls("cuSignalExternalSemaphoresAsync")
            .iter()
            .map(|c| c.num("value"))
            .collect::<Vec<_>>()
    };
    let err = timeline.signal(&stream, 0).unwrap_err();
    assert!(matches!(err, CudaError::InvalidArgument(_)), "{err}");
    timeline.signal(&stream, 5).unwrap();
    for value in [5, 4, 0] {
        let err = timeline.signal(&stream, value).unwrap_err();
        assert!(
            matches!(err, CudaError::InvalidArgument(_)),
            "{value}: {err}"
        );
    }
    timeline.signal(&stream, 6).unwrap();
    assert_eq!(signals(), [5, 6], "only the valid values were enqueued");
    timeline.wait(&stream, 6).unwrap();
    assert_eq!(fake.last("cuWaitExternalSemaphoresAsync").num("value"), 6);

    // Binary: another semaphore's token does not pay for a wait.
    let b_token = b.signal(&stream).unwrap();
    let waits = || fake.calls("cuWaitExternalSemaphoresAsync").len();
    let before = waits();
    let err = a.wait(&stream, b_token).unwrap_err();
    assert!(
        matches!(err, CudaError::Vulkan(Error::BinarySemaphore(_))),
        "{err}"
    );
    assert_eq!(waits(), before, "nothing enqueued");
    // A second signal while one is pending is refused, before the driver.
    let token = a.signal(&stream).unwrap();
    let signalled = signals().len();
    let err = a.signal(&stream).unwrap_err();
    assert!(
        matches!(err, CudaError::Vulkan(Error::BinarySemaphore(_))),
        "{err}"
    );
    assert_eq!(signals().len(), signalled, "nothing enqueued");
    // Its own token: one wait, and the semaphore can be signalled again.
    a.wait(&stream, token).unwrap();
    assert_eq!(waits(), before + 1);
    let again = a.signal(&stream).unwrap();
    a.wait(&stream, again).unwrap();
    for line in fake.log().lines().filter(|l| l.contains("reserved_zero=")) {
        assert!(line.contains("reserved_zero=1"), "{line}");
    }
    drop((timeline, a, b, stream));
    // The device keeps one event per external wait until the next check
    // or its own drop.
    drop(cuda);
    assert_eq!(fake.all_live(), [], "everything destroyed");
}

/// Cases 2, 3, 4 (the CUDA side), against the fake driver: an import the
/// driver refuses hands the caller's fd back open and unchanged (the driver
/// leaves its duplicate open, as the CUDA documentation says; a CUDA driver
/// that closed it would need the driver rule `import_with_duplicate` takes,
/// since the number is never inspected again after a failure); a closed
/// fd number is refused before the driver (it cannot be duplicated); a
/// successful import consumes the caller's fd (the driver holds its own
/// duplicate until the import is destroyed). The fd table is the same
/// before and after.
#[test]
fn cuda_imports_hand_back_or_consume_the_callers_fd_and_close_nothing_else() {
    let _serial = serial();
    fake::run("child_fake_fd_ownership", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by cuda_imports_hand_back_or_consume_the_callers_fd_and_close_nothing_else"]
fn child_fake_fd_ownership() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let image = fake::image::<Rgba8Unorm, usage::Storage>([64, 64, 1], 1, 1, false);
    let before = fd_table();
    let imports = || {
        fake.calls("cuImportExternalMemory").len() + fake.calls("cuImportExternalSemaphore").len()
    };

    // The driver refuses (CUDA_ERROR_UNKNOWN) and keeps its fd.
    fake.set("import_fail", 999);
    for close_on_fail in [0] {
        fake.set("close_on_fail", close_on_fail);
        for kind in ["image", "buffer", "semaphore"] {
            let fd = fake::some_fd();
            let (sent, n) = (identity(&fd), fd.as_raw_fd());
            // SAFETY: the driver is the fake, which refuses every import now.
            let err = unsafe {
                match kind {
                    "image" => cuda.import_image_fd(image.clone(), fd).map(drop),
                    "buffer" => cuda.import_buffer_fd(fake::buffer(false), fd).map(drop),
                    _ => cuda.import_semaphore_fd(fake::timeline(), fd).map(drop),
                }
            }
            .unwrap_err();
            assert_eq!(
                err.fd.as_raw_fd(),
                n,
                "{kind}: the caller's own fd came back"
            );
            assert_eq!(identity(&err.fd), sent, "{kind}: unchanged");
            assert!(
                err.error.to_string().contains("CUDA_ERROR_UNKNOWN"),
                "{}",
                err.error
            );
            let call = fake.log();
            let driver_fd: i32 = call
                .lines()
                .last()
                .and_then(|l| l.split_whitespace().find_map(|kv| kv.strip_prefix("fd=")))
                .unwrap()
                .parse()
                .unwrap();
            assert_ne!(driver_fd, n, "the driver was given a duplicate");
            println!(
                "{kind}, driver closes on failure {close_on_fail}: {}",
                err.error
            );
        }
    }
    fake.set("import_fail", 0);
    assert_eq!(fd_table(), before, "every fd closed exactly once");

    // A closed fd number: refused before the driver.
    let n = closed_fd_number();
    let calls = imports();
    for kind in ["image", "buffer", "semaphore"] {
        // SAFETY: deliberately not: the fd is closed, the fault under test;
        // the import refuses it before the (fake) driver.
        let err = unsafe {
            match kind {
                "image" => cuda
                    .import_image_fd(image.clone(), owned_closed_fd(n))
                    .map(drop),
                "buffer" => cuda
                    .import_buffer_fd(fake::buffer(false), owned_closed_fd(n))
                    .map(drop),
                _ => cuda
                    .import_semaphore_fd(fake::timeline(), owned_closed_fd(n))
                    .map(drop),
            }
        }
        .unwrap_err();
        let message = err.error.to_string();
        assert!(
            message.contains("not inspectable") || message.contains("cannot be duplicated"),
            "{message}"
        );
        assert_eq!(err.fd.into_raw_fd(), n);
    }
    assert_eq!(imports(), calls, "no driver call");
    assert_eq!(fd_table(), before);

    // A successful import takes the fd.
    let fd = fake::some_fd();
    let n = fd.as_raw_fd();
    let exported = std::fs::read_link(format!("/proc/self/fd/{n}")).unwrap();
    // SAFETY: the driver is the fake: it holds the fd and reads nothing.
    let imported = unsafe { cuda.import_image_fd(image.clone(), fd) }
        .map_err(|e| e.error)
        .unwrap();
    let driver_fd = fake.last("cuImportExternalMemory").num("fd") as i32;
    assert_ne!(driver_fd, n);
    assert!(
        std::fs::read_link(format!("/proc/self/fd/{n}")).ok() != Some(exported.clone())
            || driver_fd == n,
        "the caller's fd {n} was closed"
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/self/fd/{driver_fd}")).unwrap(),
        exported,
        "the driver holds the export"
    );
    drop(imported);
    assert_eq!(fd_table(), before, "the driver's fd went with the import");
    assert_eq!(fake.all_live(), []);
}

/// Cases 9, 10, against a fake driver with two devices: a resource of one
/// device given to the other is `DeviceMismatch` before any driver call
/// (import, or a stream of the other device); devices are found by UUID
/// whatever their ordinals (the order is swapped between two lookups); a
/// UUID no CUDA device has (what MIG or `CUDA_VISIBLE_DEVICES` cause) is
/// `NoMatchingDevice` listing every device and naming MIG.
#[test]
fn two_devices_are_told_apart_by_uuid_and_never_by_ordinal() {
    let _serial = serial();
    fake::run("child_fake_two_devices", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by two_devices_are_told_apart_by_uuid_and_never_by_ordinal"]
fn child_fake_two_devices() {
    let fake = fake::Fake::open();
    let (a_uuid, b_uuid) = (fake::UUID, [8; 16]);
    fake.set_devices(&[b_uuid, a_uuid]);
    let a = CudaDevice::for_uuid(a_uuid).unwrap();
    let b = CudaDevice::for_uuid(b_uuid).unwrap();
    assert_eq!((a.ordinal(), b.ordinal()), (1, 0));
    assert_ne!(a.raw_context(), b.raw_context());
    fake.clear();
    let image = fake::image::<Rgba8Unorm, usage::Storage>([16, 16, 1], 1, 1, false);
    for kind in ["image", "buffer", "semaphore"] {
        let fd = fake::some_fd();
        let sent = identity(&fd);
        // SAFETY: the driver is the fake; the import is refused before it.
        let err = unsafe {
            match kind {
                "image" => b.import_image_fd(image.clone(), fd).map(drop),
                "buffer" => b.import_buffer_fd(fake::buffer(false), fd).map(drop),
                _ => b.import_semaphore_fd(fake::timeline(), fd).map(drop),
            }
        }
        .unwrap_err();
        assert!(
            matches!(err.error, CudaError::DeviceMismatch { .. }),
            "{}",
            err.error
        );
        assert_eq!(identity(&err.fd), sent);
        println!("{kind} of device A on device B: {}", err.error);
    }
    assert_eq!(fake.log(), "", "no driver call at all");
    // On its own device it imports, in that device's context.
    // SAFETY: the driver is the fake: it records, holds the fd, reads nothing.
    let semaphore = unsafe { a.import_semaphore_fd(fake::timeline(), fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    assert_eq!(
        fake.last("cuImportExternalSemaphore").get("ctx"),
        fake::shown(a.raw_context())
    );
    let stream_b = Stream::new(&b).unwrap();
    let err = semaphore.signal(&stream_b, 1).unwrap_err();
    assert!(matches!(err, CudaError::DeviceMismatch { .. }), "{err}");
    assert!(fake.calls("cuSignalExternalSemaphoresAsync").is_empty());
    drop((semaphore, stream_b));

    // A UUID no device has.
    let err = CudaDevice::for_uuid([0x4d; 16]).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, CudaError::NoMatchingDevice { .. }), "{err}");
    for expected in [
        "MIG",
        "[0] Fake CUDA device 0 08080808",
        "[1] Fake CUDA device 1 07070707",
    ] {
        assert!(text.contains(expected), "{expected:?} in {text}");
    }
    // The same UUIDs in the other order: found by UUID, not by ordinal.
    fake.set_devices(&[a_uuid, b_uuid]);
    assert_eq!(CudaDevice::for_uuid(a_uuid).unwrap().ordinal(), 0);
    assert_eq!(CudaDevice::for_uuid(b_uuid).unwrap().ordinal(), 1);
    println!("{text}");
}

/// Case 47, against a fake driver without `cuDeviceGetUuid_v2`: pairing is
/// `MissingFunction` naming the symbol (no panic), and the Vulkan side
/// (export, import into a second device, read back) still works.
#[test]
fn a_driver_without_cu_device_get_uuid_v2_is_a_named_error_and_vulkan_still_works() {
    let _serial = serial();
    fake::run("child_fake_without_uuid_v2", fake::Variant::WithoutUuidV2);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by a_driver_without_cu_device_get_uuid_v2_is_a_named_error_and_vulkan_still_works"]
fn child_fake_without_uuid_v2() {
    let _fake = fake::Fake::open();
    for err in [
        CudaDevice::for_uuid(fake::UUID).unwrap_err(),
        cuda_interop::list_devices().unwrap_err(),
    ] {
        match &err {
            CudaError::MissingFunction(m) => assert_eq!(m.symbol, "cuDeviceGetUuid_v2"),
            other => panic!("not a missing function: {other}"),
        }
        assert!(
            err.to_string().contains("update the NVIDIA driver"),
            "{err}"
        );
        println!("{err}");
    }
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let image = Image::new(&a, ImageDesc::new_2d(16, 16)).unwrap();
    a.write_image(&image, 0, 0, &pattern(16 * 16 * 4, 47), SubmitSync::new())
        .unwrap();
    a.release_image(&image, SubmitSync::new()).unwrap();
    let imported = Image::import_from(&b, &image).unwrap();
    // SAFETY: `a` released the image in GENERAL and waited for it.
    unsafe { b.assume_image_released(&imported, SharedLayout::General) }.unwrap();
    assert!(b.read_image(&imported, 0, 0, SubmitSync::new()).unwrap() == pattern(16 * 16 * 4, 47));
    assert_no_validation_errors(&a);
    assert_no_validation_errors(&b);
}

/// Case 47, against a fake driver without
/// `cuExternalMemoryGetMappedMipmappedArray`: imports and buffer mappings
/// work, and mapping an array is `MissingFunction` naming the symbol.
#[test]
fn a_driver_without_mipmapped_array_mapping_is_a_named_error_at_that_call() {
    let _serial = serial();
    fake::run(
        "child_fake_without_mipmapped_arrays",
        fake::Variant::WithoutMipmappedArrays,
    );
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by a_driver_without_mipmapped_array_mapping_is_a_named_error_at_that_call"]
fn child_fake_without_mipmapped_arrays() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    // SAFETY: the driver is the fake: it records, holds the fds, reads nothing.
    let (image, buffer) = unsafe {
        (
            cuda.import_image_fd(
                fake::image::<Rgba8Unorm, usage::Storage>([16, 16, 1], 1, 1, false),
                fake::some_fd(),
            ),
            cuda.import_buffer_fd(fake::buffer(false), fake::some_fd()),
        )
    };
    let (image, mut buffer) = (
        image.map_err(|e| e.error).unwrap(),
        buffer.map_err(|e| e.error).unwrap(),
    );
    let err = image.map_array().unwrap_err();
    match &err {
        CudaError::MissingFunction(m) => {
            assert_eq!(m.symbol, "cuExternalMemoryGetMappedMipmappedArray")
        }
        other => panic!("not a missing function: {other}"),
    }
    println!("{err}");
    drop(buffer.map().unwrap());
    drop((image, buffer));
    assert_eq!(fake.all_live(), []);
}

extern "C" {
    fn fork() -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn _exit(status: c_int) -> !;
}

/// Case 46, against the fake driver: after `fork()`, a child that calls the
/// crate (a new device, a call on the parent's device, a stream) gets
/// `ForkedChild` naming both pids, before any driver call; the parent
/// carries on.
#[test]
fn cuda_in_a_forked_child_is_refused_before_any_driver_call() {
    let _serial = serial();
    fake::run("child_fake_forked", fake::Variant::Full);
}

/// What the forked child checks; its exit status (0: every call refused).
fn forked_child_checks(cuda: &CudaDevice, parent: u32) -> c_int {
    let me = std::process::id();
    let refused = |e: &CudaError| matches!(e, CudaError::ForkedChild { parent: p, child: c } if *p == parent && *c == me);
    if !matches!(CudaDevice::for_uuid(fake::UUID), Err(ref e) if refused(e)) {
        return 1;
    }
    if !matches!(cuda.memory_info(), Err(ref e) if refused(e)) {
        return 2;
    }
    if !matches!(Stream::new(cuda), Err(ref e) if refused(e)) {
        return 3;
    }
    0
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by cuda_in_a_forked_child_is_refused_before_any_driver_call"]
fn child_fake_forked() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    cuda.memory_info().unwrap();
    let parent = std::process::id();
    // SAFETY: fork in a process with other threads (the test harness's):
    // the child runs only `forked_child_checks`, whose calls all stop at the
    // crate's fork check (a pid comparison and atomic loads; the error
    // values allocate nothing), and leaves with `_exit`, running nothing of
    // the parent's (no destructors, no atexit handlers, no buffer flushes).
    let pid = unsafe { fork() };
    if pid == 0 {
        let status = forked_child_checks(&cuda, parent);
        // SAFETY: ends the forked child at once, as above.
        unsafe { _exit(status) }
    }
    assert!(pid > 0, "fork failed");
    let mut status: c_int = -1;
    // SAFETY: waits for the child forked above; writes one int.
    let waited = unsafe { waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert_eq!(
        status, 0,
        "the forked child's status (exit code 1, 2 or 3 names the call that was not refused)"
    );
    // The parent is unaffected.
    cuda.memory_info().unwrap();
    let _ = fake;
    println!("forked child {pid}: every call refused with ForkedChild");
}

/// Cases 43, 44, against the fake driver (which refuses any call without a
/// current context, and any call on a handle outside the context that made
/// it): handles used on a thread with no context, and on a thread where
/// another context is current, work in the device's primary context, and
/// afterwards the thread's previous context (none, or the other one) is
/// current again; imports, mappings and semaphores dropped on fresh threads
/// are destroyed in the right context, with no drop error.
#[test]
fn handles_work_and_drop_on_any_thread_whatever_context_is_current() {
    let _serial = serial();
    fake::run("child_fake_threads_and_contexts", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by handles_work_and_drop_on_any_thread_whatever_context_is_current"]
fn child_fake_threads_and_contexts() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let primary = fake::shown(cuda.raw_context());
    let errors = cuda_interop::drop_errors();
    assert_eq!(fake.current(), 0, "calls leave no context current");
    // SAFETY: the driver is the fake: it records, holds the fds, reads nothing.
    let (image, buffer, timeline) = unsafe {
        (
            cuda.import_image_fd(
                fake::image::<Rgba8Unorm, usage::Storage>([16, 16, 1], 1, 1, false),
                fake::some_fd(),
            ),
            cuda.import_buffer_fd(fake::buffer(false), fake::some_fd()),
            cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()),
        )
    };
    let (image, mut buffer, timeline) = (
        image.map_err(|e| e.error).unwrap(),
        buffer.map_err(|e| e.error).unwrap(),
        timeline.map_err(|e| e.error).unwrap(),
    );
    let driver = sys::Driver::global().unwrap();
    let push = driver.fns().cuCtxPushCurrent.unwrap();
    let pop = driver.fns().cuCtxPopCurrent.unwrap();
    // Another context, as another library would make current: the fake
    // accepts any non-null handle.
    let intruder = 0xdead_0000usize;
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(fake.current(), 0);
            let mapped = buffer.map().unwrap();
            assert_eq!(
                fake.last("cuExternalMemoryGetMappedBuffer").get("ctx"),
                primary
            );
            assert_eq!(fake.current(), 0, "no context left current");
            drop(mapped);
            assert_eq!(fake.last("cuMemFree").get("ctx"), primary);
            assert_eq!(fake.current(), 0);
        })
        .join()
        .unwrap();
        s.spawn(|| {
            // SAFETY: pushes a handle on this thread's (fake) context stack;
            // popped below.
            let pushed = unsafe { push(intruder as sys::CUcontext) };
            assert_eq!(pushed, sys::CUresult::CUDA_SUCCESS);
            let array = image.map_array().unwrap();
            assert_eq!(
                fake.last("cuExternalMemoryGetMappedMipmappedArray")
                    .get("ctx"),
                primary
            );
            assert_eq!(
                fake.current(),
                intruder,
                "the other context is current again"
            );
            let stream = Stream::new(&cuda).unwrap();
            timeline.signal(&stream, 1).unwrap();
            assert_eq!(
                fake.last("cuSignalExternalSemaphoresAsync").get("ctx"),
                primary
            );
            drop(array);
            drop(stream);
            assert_eq!(fake.last("cuMipmappedArrayDestroy").get("ctx"), primary);
            assert_eq!(fake.current(), intruder);
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops this thread's stack; writes one handle.
            assert_eq!(unsafe { pop(&mut popped) }, sys::CUresult::CUDA_SUCCESS);
            assert_eq!(popped as usize, intruder);
        })
        .join()
        .unwrap();
    });
    // Dropped on fresh threads, one with the other context current.
    std::thread::spawn(move || drop(timeline)).join().unwrap();
    assert_eq!(fake.last("cuDestroyExternalSemaphore").get("ctx"), primary);
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: as above; popped below.
            let pushed = unsafe { push(intruder as sys::CUcontext) };
            assert_eq!(pushed, sys::CUresult::CUDA_SUCCESS);
            drop(image);
            assert_eq!(fake.current(), intruder);
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops this thread's stack; writes one handle.
            assert_eq!(unsafe { pop(&mut popped) }, sys::CUresult::CUDA_SUCCESS);
        })
        .join()
        .unwrap();
    });
    assert_eq!(fake.last("cuDestroyExternalMemory").get("ctx"), primary);
    std::thread::spawn(move || drop(buffer)).join().unwrap();
    assert_eq!(fake.calls("cuDestroyExternalMemory").len(), 2);
    assert!(!fake.log().contains("error="), "{}", fake.log());
    assert_eq!(cuda_interop::drop_errors(), errors, "no destroy failed");
    assert_eq!(fake.all_live(), []);
}

/// Case 42 (and the last-use rule for memory), against the fake driver with
/// enqueued work that takes 300 ms: dropping a semaphore with a pending wait,
/// and a mapping and import with a pending copy, waits for that work and
/// destroys afterwards (no stream busy at the destroy, no drop error); a
/// wait that never completes makes the semaphore's drop give up after
/// `DROP_WAIT_LIMIT`, leak it and say so: never a hang, never a destroy
/// under a pending wait.
#[test]
fn drops_wait_for_pending_waits_and_copies_and_never_hang() {
    let _serial = serial();
    fake::run("child_fake_pending_work", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by drops_wait_for_pending_waits_and_copies_and_never_hang"]
fn child_fake_pending_work() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let errors = cuda_interop::drop_errors();
    let pending = Duration::from_millis(300);
    fake.set("latency_ms", pending.as_millis() as i64);
    let stream = Stream::new(&cuda).unwrap();
    // SAFETY: the driver is the fake: it records, holds the fds, reads nothing.
    let (semaphore, buffer) = unsafe {
        (
            cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()),
            cuda.import_buffer_fd(fake::buffer(false), fake::some_fd()),
        )
    };
    let (semaphore, mut buffer) = (
        semaphore.map_err(|e| e.error).unwrap(),
        buffer.map_err(|e| e.error).unwrap(),
    );
    let timed = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        start.elapsed()
    };
    semaphore.wait(&stream, 1).unwrap();
    let mut semaphore = Some(semaphore);
    let took = timed(&mut || drop(semaphore.take()));
    println!("semaphore with a 300 ms wait pending dropped in {took:?}");
    assert!(
        took >= pending - Duration::from_millis(50) && took < DROP_WAIT_LIMIT,
        "{took:?}"
    );
    assert_eq!(
        fake.last("cuDestroyExternalSemaphore").get("busy_streams"),
        "0"
    );

    let mut destination = DeviceBuffer::new(&cuda, 1000).unwrap();
    let took = {
        let mapped = buffer.map().unwrap();
        stream
            .copy_device(&mapped.slice(0, 1000).unwrap(), &mut destination)
            .unwrap();
        let mut mapped = Some(mapped);
        timed(&mut || drop(mapped.take()))
    };
    println!("mapping with a 300 ms copy pending dropped in {took:?}");
    assert!(took >= pending - Duration::from_millis(50), "{took:?}");
    assert_eq!(fake.last("cuMemFree").get("busy_streams"), "0");
    drop(buffer);
    assert_eq!(
        fake.last("cuDestroyExternalMemory").get("busy_streams"),
        "0"
    );
    drop((destination, stream));
    assert_eq!(cuda_interop::drop_errors(), errors, "nothing leaked so far");

    // A wait that never completes.
    fake.set("latency_ms", -1);
    let stuck = Stream::new(&cuda).unwrap();
    // SAFETY: as above.
    let semaphore = unsafe { cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    semaphore.wait(&stuck, 1).unwrap();
    let destroyed = fake.calls("cuDestroyExternalSemaphore").len();
    let mut semaphore = Some(semaphore);
    let took = timed(&mut || drop(semaphore.take()));
    println!("semaphore with a wait that never completes dropped in {took:?}");
    assert!(
        took >= DROP_WAIT_LIMIT && took < DROP_WAIT_LIMIT + Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(
        cuda_interop::drop_errors(),
        errors + 1,
        "the leak is reported"
    );
    assert_eq!(
        fake.calls("cuDestroyExternalSemaphore").len(),
        destroyed,
        "not destroyed under its pending wait"
    );
    // The stream stays stuck for ever; its drop would leak it as well
    // (gpu.rs shows that on the GPU).
    std::mem::forget(stuck);
}

/// Joining a foreign stream (a PyTorch or CuPy stream handed over as a raw
/// handle) to a semaphore wait or signal never blocks the host, whatever the
/// GPU is doing: the join's event is destroyed at once, pending or not, so a
/// wait nobody signals costs neither a bounded drop wait nor a leak. The
/// foreign stream really is ordered after the wait, and the signal after the
/// foreign stream's work.
#[test]
fn foreign_stream_joins_never_block_and_leak_nothing() {
    let _serial = serial();
    fake::run("child_fake_foreign_streams", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by foreign_stream_joins_never_block_and_leak_nothing"]
fn child_fake_foreign_streams() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let errors = cuda_interop::drop_errors();
    let pending = Duration::from_millis(300);
    let (via, foreign) = (Stream::new(&cuda).unwrap(), Stream::new(&cuda).unwrap());
    // SAFETY: the driver is the fake: it records, holds the fd, reads nothing.
    let semaphore = unsafe { cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    // Each join destroys its own event before it returns, pending or not.
    let destroyed = || fake.calls("cuEventDestroy");
    let before = destroyed().len();

    fake.set("latency_ms", pending.as_millis() as i64);
    let start = Instant::now();
    // SAFETY: `foreign` is a live stream of this device for the whole call.
    unsafe { semaphore.wait_raw_stream(foreign.raw(), 1, &via) }.unwrap();
    let took = start.elapsed();
    println!("wait joined to a foreign stream in {took:?}, the wait pending");
    assert!(took < Duration::from_millis(100), "{took:?}");
    assert!(!foreign.query().unwrap(), "the foreign stream waits too");
    assert_eq!(destroyed().len(), before + 1, "the join's event is gone");
    assert_eq!(destroyed()[before].get("pending"), "1");
    foreign.synchronize_with(HostWait::Poll, TIMEOUT).unwrap();
    assert!(start.elapsed() >= pending - Duration::from_millis(50));

    // The foreign stream's work orders the signal: a wait enqueued on it
    // keeps it busy, and the signal's stream must wait for that.
    semaphore.wait(&foreign, 1).unwrap();
    let start = Instant::now();
    // SAFETY: as above.
    unsafe { semaphore.signal_raw_stream(foreign.raw(), 2, &via) }.unwrap();
    let took = start.elapsed();
    println!("signal joined to a busy foreign stream in {took:?}");
    assert!(took < Duration::from_millis(100), "{took:?}");
    assert_eq!(fake.last("cuSignalExternalSemaphoresAsync").num("value"), 2);
    assert!(
        !via.query().unwrap(),
        "the signal waits for the foreign work"
    );
    assert_eq!(destroyed().len(), before + 2);
    via.synchronize_with(HostWait::Poll, TIMEOUT).unwrap();
    assert!(start.elapsed() >= pending - Duration::from_millis(100));

    // A wait that never completes: the join still returns at once, and
    // nothing is reported leaked (an `Event` dropped pending would wait up
    // to DROP_WAIT_LIMIT for the device, then leak).
    fake.set("latency_ms", -1);
    let (stuck_via, stuck_foreign) = (Stream::new(&cuda).unwrap(), Stream::new(&cuda).unwrap());
    let start = Instant::now();
    // SAFETY: as above.
    unsafe { semaphore.wait_raw_stream(stuck_foreign.raw(), 3, &stuck_via) }.unwrap();
    let took = start.elapsed();
    println!("wait joined behind a wait nobody signals in {took:?}");
    assert!(took < Duration::from_millis(100), "{took:?}");
    assert_eq!(destroyed().len(), before + 3);
    assert_eq!(destroyed()[before + 2].get("pending"), "1");
    assert_eq!(cuda_interop::drop_errors(), errors, "nothing leaked");
    // The semaphore and both streams stay stuck for ever (their drops would
    // leak them, after DROP_WAIT_LIMIT); the process ends here.
    std::mem::forget((semaphore, stuck_via, stuck_foreign, via, foreign));
}

/// How many eventfds this process has open (completions' signals).
fn eventfds() -> usize {
    fd_table()
        .values()
        .filter(|target| target.to_string_lossy() == "anon_inode:[eventfd]")
        .count()
}

/// Whether `fd` is readable within `within`.
fn readable_within(fd: impl AsFd, within: Duration) -> bool {
    let timeout = rustix::event::Timespec {
        tv_sec: within.as_secs() as i64,
        tv_nsec: within.subsec_nanos().into(),
    };
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    rustix::event::poll(&mut fds, Some(&timeout)).unwrap() == 1
}

/// Waits (bounded) until the fake has returned from `n` host functions.
fn host_functions_returned(fake: &fake::Fake, n: usize) {
    let start = Instant::now();
    while fake.calls("host_function_returned").len() < n {
        assert!(start.elapsed() < TIMEOUT, "{}", fake.log());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every host-wait strategy, the default first.
const STRATEGIES: [HostWait; 5] = [
    HostWait::ADAPTIVE,
    HostWait::Spin,
    HostWait::Block,
    HostWait::Adaptive {
        spin: Duration::from_millis(20),
    },
    HostWait::Poll,
];

/// Host waits against the fake driver, whose host functions
/// (`cuLaunchHostFunc`) run on a thread of their own when the stream's
/// earlier work completes, with CUDA calls refused: a completion's fd
/// becomes readable when its work completes and not before, `is_done`
/// agrees, every strategy returns `Ok` on completed work and waits for
/// pending work, from another thread too, and the eventfd is closed once
/// both the completion and its host function are done with it.
#[test]
fn a_completion_becomes_readable_when_its_work_completes_and_every_strategy_sees_it() {
    let _serial = serial();
    fake::run("child_fake_completions", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by a_completion_becomes_readable_when_its_work_completes_and_every_strategy_sees_it"]
fn child_fake_completions() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let errors = cuda_interop::drop_errors();
    let stream = Stream::new(&cuda).unwrap();
    // SAFETY: the driver is the fake: it records, holds the fd, reads nothing.
    let semaphore = unsafe { cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let mut value = 0;
    let mut enqueue = |latency: Duration| {
        fake.set("latency_ms", latency.as_millis() as i64);
        value += 1;
        semaphore.signal(&stream, value).unwrap();
    };
    let before = eventfds();

    // Readable when the work completes, and not before.
    let work = Duration::from_millis(300);
    let start = Instant::now();
    enqueue(work);
    let done = stream.completion().unwrap();
    assert_eq!(
        eventfds(),
        before + 2,
        "per completion: its eventfd and the host function's duplicate"
    );
    assert!(!done.is_done().unwrap());
    assert!(!readable_within(&done, Duration::from_millis(150)));
    assert!(
        !done.is_done().unwrap(),
        "still pending at {:?}",
        start.elapsed()
    );
    assert!(readable_within(&done, TIMEOUT));
    let seen = start.elapsed();
    println!("a completion behind {work:?} of work became readable after {seen:?}");
    assert!(seen >= work - Duration::from_millis(10), "{seen:?}");
    assert!(done.is_done().unwrap());
    assert!(readable_within(&done, Duration::ZERO), "it stays readable");

    // Every strategy returns Ok at once on completed work.
    for strategy in STRATEGIES {
        let start = Instant::now();
        done.wait_with(strategy, Duration::from_millis(100))
            .unwrap();
        stream
            .synchronize_with(strategy, Duration::from_millis(100))
            .unwrap();
        assert!(
            start.elapsed() < Duration::from_millis(50),
            "{strategy:?}: {:?}",
            start.elapsed()
        );
    }

    // Every strategy waits for pending work, on the stream or a completion,
    // and a completion can be waited for on another thread.
    let work = Duration::from_millis(100);
    for strategy in STRATEGIES {
        enqueue(work);
        let start = Instant::now();
        stream.synchronize_with(strategy, TIMEOUT).unwrap();
        let waited = start.elapsed();
        assert!(stream.query().unwrap());
        enqueue(work);
        let start = Instant::now();
        let completion = stream.completion().unwrap();
        let on_thread = std::thread::spawn(move || {
            completion.wait_with(strategy, TIMEOUT).unwrap();
            assert!(completion.is_done().unwrap());
        });
        on_thread.join().unwrap();
        let waited_elsewhere = start.elapsed();
        println!("{strategy:?}: {waited:?} on the stream, {waited_elsewhere:?} on another thread");
        for took in [waited, waited_elsewhere] {
            assert!(
                took >= work - Duration::from_millis(10) && took < work * 5,
                "{strategy:?}: {took:?}"
            );
        }
    }

    drop(done);
    let launched = fake.calls("cuLaunchHostFunc").len();
    assert!(launched >= 2, "{}", fake.log());
    host_functions_returned(&fake, launched);
    drop(stream);
    assert_eq!(eventfds(), before, "every eventfd is closed");
    let log = fake.log();
    assert!(
        !log.contains("error="),
        "no CUDA call in a host function:\n{log}"
    );
    assert_eq!(cuda_interop::drop_errors(), errors);
    drop(semaphore);
    assert_eq!(fake.all_live(), []);
}

/// Bounded waits against the fake driver: a wait on work that does not
/// complete in time returns `Error::Timeout` with every strategy; dropping a
/// completion before its host function runs is safe and closes both its fds
/// at once (the host function runs later and finds nothing to write to);
/// repeated timed-out stream waits share one pending completion; and a host
/// function that never runs (work behind a wait nobody signals) leaks no fd:
/// the completion's event and fds go with it.
#[test]
fn completion_waits_time_out_and_drops_before_the_host_function_are_safe() {
    let _serial = serial();
    fake::run("child_fake_completion_timeouts", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by completion_waits_time_out_and_drops_before_the_host_function_are_safe"]
fn child_fake_completion_timeouts() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let errors = cuda_interop::drop_errors();
    let stream = Stream::new(&cuda).unwrap();
    // SAFETY: as in child_fake_completions.
    let semaphore = unsafe { cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let before = eventfds();

    // Work that completes late: every strategy times out, within its bound.
    fake.set("latency_ms", 400);
    semaphore.signal(&stream, 1).unwrap();
    // With the event of the signal's last use, which the semaphore keeps.
    let events = fake.live("event");
    let done = stream.completion().unwrap();
    let bound = Duration::from_millis(30);
    for strategy in STRATEGIES {
        let start = Instant::now();
        let waited = done.wait_with(strategy, bound);
        assert!(
            matches!(waited, Err(CudaError::Timeout(t)) if t == bound),
            "{strategy:?}: {waited:?}"
        );
        let took = start.elapsed();
        assert!(took >= bound && took < bound * 4, "{strategy:?}: {took:?}");
    }
    // Two timed-out stream waits enqueue one host function between them.
    let launched = fake.calls("cuLaunchHostFunc").len();
    for _ in 0..2 {
        assert!(matches!(
            stream.synchronize_with(HostWait::Block, bound),
            Err(CudaError::Timeout(_))
        ));
    }
    assert_eq!(fake.calls("cuLaunchHostFunc").len(), launched + 1);
    assert!(!done.is_done().unwrap());
    // Dropped before its host function runs: both its fds close at once;
    // the host function still runs, later, and finds nothing to write to.
    drop(done);
    assert_eq!(
        eventfds(),
        before + 2,
        "only the stream's kept completion (its eventfd and duplicate)"
    );
    assert_eq!(fake.calls("host_function_returned").len(), 0);
    host_functions_returned(&fake, 2);
    assert_eq!(
        eventfds(),
        before + 2,
        "the stream keeps its last completion"
    );
    stream.synchronize(TIMEOUT).unwrap();
    drop(stream);
    assert_eq!(eventfds(), before);
    assert_eq!(fake.live("event"), events, "events destroyed");
    let log = fake.log();
    assert!(!log.contains("error="), "{log}");

    // Work that never completes: the host function is never called; the
    // completion's event is destroyed and its fds closed: no fd leaks.
    fake.set("latency_ms", -1);
    let stuck = Stream::new(&cuda).unwrap();
    semaphore.signal(&stuck, 2).unwrap();
    let done = stuck.completion().unwrap();
    assert_eq!(fake.last("cuLaunchHostFunc").get("never"), "1");
    let start = Instant::now();
    assert!(matches!(done.wait(bound), Err(CudaError::Timeout(_))));
    assert!(start.elapsed() < bound * 4);
    assert!(matches!(
        stuck.synchronize(bound),
        Err(CudaError::Timeout(_))
    ));
    drop(done);
    assert_eq!(
        fake.live("event"),
        events + 1,
        "the stream's kept completion"
    );
    assert_eq!(
        eventfds(),
        before + 2,
        "the stuck stream's kept completion, nothing of the dropped one"
    );
    assert_eq!(cuda_interop::drop_errors(), errors);
    // The semaphore's last use never completes (its drop would leak it
    // after DROP_WAIT_LIMIT); the stream is destroyed (no external wait).
    std::mem::forget(semaphore);
    drop(stuck);
    assert_eq!(fake.live("event"), events);
    assert_eq!(eventfds(), before, "no fd outlives its completion");
}

/// Case 48 (the crate's bookkeeping), against the fake driver: 10,000
/// cycles of image import, array mapping, level, surface, buffer import and
/// mapping, semaphore import, and destroy: every object the driver made is
/// destroyed, the fd count is flat, no drop fails, and the time per cycle
/// does not drift.
#[test]
fn ten_thousand_cuda_import_map_destroy_cycles_leave_nothing_behind() {
    let _serial = serial();
    fake::run("child_fake_soak", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by ten_thousand_cuda_import_map_destroy_cycles_leave_nothing_behind"]
fn child_fake_soak() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let image = fake::image::<Rgba8Unorm, usage::Storage>([64, 64, 1], 4, 1, false);
    let source = fake::some_fd();
    let cycle = || {
        // SAFETY: the driver is the fake: it records, holds the fds (dups of
        // one memfd), reads nothing.
        let (imported, buffer, semaphore) = unsafe {
            (
                cuda.import_image_fd(image.clone(), source.try_clone().unwrap()),
                cuda.import_buffer_fd(fake::buffer(false), source.try_clone().unwrap()),
                cuda.import_semaphore_fd(fake::timeline(), source.try_clone().unwrap()),
            )
        };
        let (imported, mut buffer, semaphore) = (
            imported.map_err(|e| e.error).unwrap(),
            buffer.map_err(|e| e.error).unwrap(),
            semaphore.map_err(|e| e.error).unwrap(),
        );
        let array = imported.map_array().unwrap();
        let level = array.level(1).unwrap();
        drop(level.surface().unwrap());
        drop(array);
        drop(buffer.map().unwrap());
        drop((imported, buffer, semaphore));
    };
    for _ in 0..100 {
        cycle();
    }
    fake.clear();
    let fds = open_fd_count();
    let errors = cuda_interop::drop_errors();
    let windows: Vec<Duration> = (0..10)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..1000 {
                cycle();
            }
            fake.clear();
            start.elapsed() / 1000
        })
        .collect();
    println!("10000 CUDA import/map/destroy cycles (fake driver), per cycle by window of 1000: {windows:?}");
    assert_eq!(open_fd_count(), fds, "fd count is flat");
    assert_eq!(cuda_interop::drop_errors(), errors);
    assert_eq!(fake.all_live(), [], "every driver object destroyed");
    assert_no_drift(&windows);
}

/// The time per cycle does not drift: the median of the last half of the
/// windows is at most twice that of the first half (medians, so that one
/// window slowed by another process on a shared machine does not count).
fn assert_no_drift(windows: &[Duration]) {
    let median = |w: &[Duration]| {
        let mut w = w.to_vec();
        w.sort();
        w[w.len() / 2]
    };
    let (first, last) = windows.split_at(windows.len() / 2);
    assert!(
        median(last) <= median(first) * 2 + Duration::from_micros(50),
        "time per cycle drifts: {windows:?}"
    );
}

// ---- Level <-> linear copies (cuda-interop/src/copy.rs), against the fake ----

/// Case 24, against the fake driver: a kernel launched with
/// `Stream::launch_tracked` keeps every resource it lists (device buffer,
/// level, surface) and its module alive: each drop waits for the pending
/// kernel before it destroys anything; a resource of another device is
/// refused before anything is enqueued; no destroy fails.
#[test]
fn tracked_kernel_launches_keep_their_resources_alive() {
    let _serial = serial();
    fake::run("child_fake_tracked_launches", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by tracked_kernel_launches_keep_their_resources_alive"]
fn child_fake_tracked_launches() {
    use cuda_interop::{KernelUses, Module};
    let fake = fake::Fake::open();
    let other_uuid = [8; 16];
    fake.set_devices(&[fake::UUID, other_uuid]);
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let other = CudaDevice::for_uuid(other_uuid).unwrap();
    let errors = cuda_interop::drop_errors();
    let stream = Stream::new(&cuda).unwrap();
    let storage = fake::image::<Rgba8Unorm, usage::Storage>([64, 32, 1], 1, 1, false);
    // SAFETY: the driver is the fake: it records, holds the fd, and nothing
    // reads or writes memory through the import.
    let imported = unsafe { cuda.import_image_fd(storage, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let module = Module::load_ptx(&cuda, cuda_interop::kernels::COPY_PTX).unwrap();
    let kernel = module.function("array_to_linear_4b_r4").unwrap();
    let pending = Duration::from_millis(300);
    let launch =
        |surface: &cuda_interop::Surface<'_>, buffer: &DeviceBuffer, uses: KernelUses<'_>| {
            let (mut s, mut d, mut p, mut w, mut h) =
                (surface.raw(), buffer.device_ptr(), 256u64, 64u32, 32u32);
            let mut args: [*mut c_void; 5] = [
                (&mut s as *mut u64).cast(),
                (&mut d as *mut u64).cast(),
                (&mut p as *mut u64).cast(),
                (&mut w as *mut u32).cast(),
                (&mut h as *mut u32).cast(),
            ];
            // SAFETY: the fake reads the five parameters of the copy kernel's
            // signature and runs nothing.
            unsafe { stream.launch_tracked(&kernel, [4, 1, 1], [16, 16, 1], 0, &mut args, uses) }
        };

    // Another device's buffer: refused before anything is enqueued.
    let surface = level.surface().unwrap();
    let elsewhere = DeviceBuffer::new(&other, 64 * 32 * 4).unwrap();
    let launches = fake.calls("cuLaunchKernel").len();
    let err = launch(&surface, &elsewhere, KernelUses::new().buffer(&elsewhere)).unwrap_err();
    assert!(matches!(err, CudaError::DeviceMismatch { .. }), "{err}");
    assert_eq!(
        fake.calls("cuLaunchKernel").len(),
        launches,
        "nothing enqueued"
    );

    // Each listed resource's drop waits for the pending kernel.
    fake.set("latency_ms", pending.as_millis() as i64);
    let buffer = DeviceBuffer::new(&cuda, 64 * 32 * 4).unwrap();
    let start = Instant::now();
    launch(
        &surface,
        &buffer,
        KernelUses::new()
            .buffer(&buffer)
            .level(&level)
            .surface(&surface),
    )
    .unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "the launch does not wait"
    );
    let start = Instant::now();
    drop(surface);
    let took = start.elapsed();
    println!("surface dropped {took:?} after a tracked launch of {pending:?} of work");
    assert!(took >= pending - Duration::from_millis(50), "{took:?}");
    let surface = level.surface().unwrap();
    launch(
        &surface,
        &buffer,
        KernelUses::new().buffer(&buffer).surface(&surface),
    )
    .unwrap();
    let start = Instant::now();
    drop(buffer);
    assert!(start.elapsed() >= pending - Duration::from_millis(50));
    assert_eq!(fake.last("cuMemFree").get("busy_streams"), "0");
    let spare = DeviceBuffer::new(&cuda, 64 * 32 * 4).unwrap();
    launch(
        &surface,
        &spare,
        KernelUses::new().buffer(&spare).surface(&surface),
    )
    .unwrap();
    let start = Instant::now();
    drop(module);
    assert!(
        start.elapsed() >= pending - Duration::from_millis(50),
        "the module is unloaded after its tracked kernel"
    );
    fake.set("latency_ms", 0);
    drop((surface, spare));
    drop(array);
    drop(imported);
    drop((elsewhere, stream, other));
    assert_eq!(cuda_interop::drop_errors(), errors, "no destroy failed");
}

/// Stream-ordered level copies, against the fake driver: layouts the level
/// cannot have (a pitch under one row, a range too short for the last row, a
/// buffer or stream of another device) are refused before any driver call;
/// a storage level with 4-, 8- or 16-byte texels is copied by the copy
/// kernel with the parameters, grid and block of `copy.cu` (module loaded
/// and surface made once); other levels, misaligned pitches and
/// `CopyEngine::Driver` go to `cuMemcpy3DAsync` with the pitch given; the
/// copies return before the work completes, and the buffer's, level's and
/// import's drops wait for it; the module is unloaded with the device.
#[test]
fn level_copies_are_checked_stream_ordered_and_tracked() {
    let _serial = serial();
    fake::run("child_fake_level_copies", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of faults.rs, with a fake libcuda: run by level_copies_are_checked_stream_ordered_and_tracked"]
fn child_fake_level_copies() {
    use cuda_interop::{CopyEngine, Pitched, PitchedMut};
    use vk_export::format::{R16Sfloat, Rgba32Sfloat};
    let fake = fake::Fake::open();
    let other_uuid = [8; 16];
    fake.set_devices(&[fake::UUID, other_uuid]);
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let other = CudaDevice::for_uuid(other_uuid).unwrap();
    let errors = cuda_interop::drop_errors();
    let stream = Stream::new(&cuda).unwrap();
    let storage = fake::image::<Rgba8Unorm, usage::Storage>([64, 32, 1], 1, 1, false);
    // SAFETY: the driver is the fake: it records, holds the fd, and nothing
    // reads or writes memory through the import.
    let imported = unsafe { cuda.import_image_fd(storage, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let (row, rows) = (64 * 4u64, 32u64);
    let mut tight = DeviceBuffer::new(&cuda, (row * rows) as usize).unwrap();
    let mut pitched = DeviceBuffer::new(&cuda, (512 * (rows - 1) + row) as usize).unwrap();
    let short = DeviceBuffer::new(&cuda, (row * rows - 1) as usize).unwrap();
    let mut elsewhere = DeviceBuffer::new(&other, (row * rows) as usize).unwrap();
    let stream_elsewhere = Stream::new(&other).unwrap();

    // Refused before the driver.
    let before = fake.log().len();
    let invalid = [
        (
            "pitch under a row",
            level.enqueue_copy_to(
                &stream,
                PitchedMut::buffer(&mut tight).with_row_pitch(row - 4),
            ),
        ),
        (
            "last row one byte past the end",
            level.enqueue_copy_to(
                &stream,
                PitchedMut::buffer(&mut pitched).with_row_pitch(513),
            ),
        ),
        (
            "tight source one byte short",
            level.enqueue_copy_from(&stream, Pitched::buffer(&short)),
        ),
        (
            "kernel with a pitch that is no multiple of the texel",
            level.enqueue_copy_to_with(
                &stream,
                PitchedMut::buffer(&mut pitched).with_row_pitch(row + 2),
                CopyEngine::Kernel,
            ),
        ),
    ];
    for (what, result) in invalid {
        let err = result.unwrap_err();
        assert!(
            matches!(err, CudaError::InvalidArgument(_)),
            "{what}: {err}"
        );
        println!("{what}: {err}");
    }
    let mut synchronous_short = DeviceBuffer::new(&cuda, 100).unwrap();
    let err = level
        .copy_to_device(&stream, &mut synchronous_short)
        .unwrap_err();
    assert!(matches!(err, CudaError::InvalidArgument(_)), "{err}");
    for (what, result) in [
        (
            "a buffer of another device",
            level.enqueue_copy_to(&stream, PitchedMut::buffer(&mut elsewhere)),
        ),
        (
            "a stream of another device",
            level.enqueue_copy_to(&stream_elsewhere, PitchedMut::buffer(&mut tight)),
        ),
    ] {
        let err = result.unwrap_err();
        assert!(
            matches!(err, CudaError::DeviceMismatch { .. }),
            "{what}: {err}"
        );
    }
    assert_eq!(fake.log().len(), before, "no driver call for a refusal");

    // The kernel: both directions, the grid and block of copy.cu (16 x 16
    // threads, 4 rows each), parameters in the kernel's order.
    let surfaces = fake.live("surface");
    let used = level
        .enqueue_copy_to(
            &stream,
            PitchedMut::buffer(&mut pitched).with_row_pitch(512),
        )
        .unwrap();
    assert_eq!(used, CopyEngine::Kernel);
    let call = fake.last("cuLaunchKernel");
    assert_eq!(call.get("kernel"), "array_to_linear_4b_r4");
    assert_eq!(
        (call.get("grid"), call.get("block"), call.num("shared")),
        ("4,1,1", "16,16,1", 0)
    );
    assert_eq!(
        (call.num("a1"), call.num("a2")),
        (pitched.device_ptr(), 512)
    );
    assert_eq!((call.num("width"), call.num("height")), (64, 32));
    assert_eq!((call.get("surface_ok"), call.get("extra_null")), ("1", "1"));
    let surface = call.num("a0");
    let used = level
        .enqueue_copy_from(&stream, Pitched::buffer(&tight))
        .unwrap();
    assert_eq!(used, CopyEngine::Kernel);
    let call = fake.last("cuLaunchKernel");
    assert_eq!(call.get("kernel"), "linear_to_array_4b_r4");
    assert_eq!(
        (call.num("a0"), call.num("a1"), call.num("a2")),
        (tight.device_ptr(), row, surface),
        "src, pitch, the same surface"
    );
    assert_eq!(call.get("surface_ok"), "1");
    // Foreign memory goes the same way.
    // SAFETY: the fake copies nothing; the buffer outlives the copy anyway.
    let foreign = unsafe { PitchedMut::foreign(tight.device_ptr(), tight.len() as u64) };
    level.enqueue_copy_to(&stream, foreign).unwrap();
    assert_eq!(fake.last("cuLaunchKernel").num("a1"), tight.device_ptr());
    assert_eq!(fake.calls("cuModuleLoadData").len(), 1, "loaded once");
    assert_eq!(fake.last("cuModuleLoadData").get("copy_kernels"), "1");
    assert_eq!(
        fake.live("surface"),
        surfaces + 1,
        "one surface for all copies"
    );

    // The driver: on request, and for a misaligned pitch under Auto.
    let used = level
        .enqueue_copy_to_with(
            &stream,
            PitchedMut::buffer(&mut pitched).with_row_pitch(512),
            CopyEngine::Driver,
        )
        .unwrap();
    assert_eq!(used, CopyEngine::Driver);
    let call = fake.last("cuMemcpy3DAsync");
    assert_eq!(
        (call.num("src_type"), call.num("dst_type")),
        (3, 2),
        "array to device"
    );
    assert_eq!(
        (
            call.num("dst_device"),
            call.num("dst_pitch"),
            call.num("dst_height")
        ),
        (pitched.device_ptr(), 512, 32)
    );
    assert_eq!(
        (
            call.num("width_bytes"),
            call.num("height"),
            call.num("depth")
        ),
        (row, 32, 1)
    );
    assert_eq!(call.get("array_is_level"), "1");
    let used = level
        .enqueue_copy_from(&stream, Pitched::buffer(&pitched).with_row_pitch(row + 2))
        .unwrap();
    assert_eq!(used, CopyEngine::Driver, "misaligned pitch: not the kernel");
    let call = fake.last("cuMemcpy3DAsync");
    assert_eq!((call.num("src_type"), call.num("dst_type")), (2, 3));
    assert_eq!(call.num("src_pitch"), row + 2);

    // 16-byte texels at an odd size: the 16-byte kernel, grid rounded up.
    let wide = fake::image::<Rgba32Sfloat, usage::Storage>([1000, 37, 1], 1, 1, false);
    // SAFETY: as for the first import.
    let imported_wide = unsafe { cuda.import_image_fd(wide, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array_wide = imported_wide.map_array().unwrap();
    let level_wide = array_wide.level(0).unwrap();
    let mut wide_buffer = DeviceBuffer::new(&cuda, 16_384 * 37).unwrap();
    level_wide
        .enqueue_copy_to(
            &stream,
            PitchedMut::buffer(&mut wide_buffer).with_row_pitch(16_384),
        )
        .unwrap();
    let call = fake.last("cuLaunchKernel");
    assert_eq!(
        (call.get("kernel"), call.get("grid")),
        ("array_to_linear_16b_r4", "63,1,1")
    );
    assert_eq!(
        (call.num("a2"), call.num("width"), call.num("height")),
        (16_384, 1000, 37)
    );

    // Without storage usage (no SURFACE_LDST), or with 2-byte texels: the
    // driver under Auto, Unsupported for the kernel; no surface is made.
    let surfaces = fake.live("surface");
    let sampled = fake::image::<Rgba8Unorm, usage::Sampled>([64, 32, 1], 1, 1, false);
    // SAFETY: as for the first import.
    let imported_sampled = unsafe { cuda.import_image_fd(sampled, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array_sampled = imported_sampled.map_array().unwrap();
    let level_sampled = array_sampled.level(0).unwrap();
    let launches = fake.calls("cuLaunchKernel").len();
    let used = level_sampled
        .enqueue_copy_to(&stream, PitchedMut::buffer(&mut tight))
        .unwrap();
    assert_eq!(used, CopyEngine::Driver);
    assert_eq!(fake.last("cuMemcpy3DAsync").num("dst_pitch"), row);
    let err = level_sampled
        .enqueue_copy_to_with(&stream, PitchedMut::buffer(&mut tight), CopyEngine::Kernel)
        .unwrap_err();
    assert!(matches!(err, CudaError::Unsupported(_)), "{err}");
    println!("kernel on a sampled image: {err}");
    let half = fake::image::<R16Sfloat, usage::Storage>([64, 32, 1], 1, 1, false);
    // SAFETY: as for the first import.
    let imported_half = unsafe { cuda.import_image_fd(half, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array_half = imported_half.map_array().unwrap();
    let level_half = array_half.level(0).unwrap();
    let used = level_half
        .enqueue_copy_from(&stream, Pitched::buffer(&tight))
        .unwrap();
    assert_eq!(used, CopyEngine::Driver, "2-byte texels");
    assert_eq!(fake.last("cuMemcpy3DAsync").num("width_bytes"), 128);
    assert_eq!(fake.calls("cuLaunchKernel").len(), launches);
    // A level of a 3-D image whose depth has shrunk to 1 (64x64x2, level 1:
    // 32x32x1) is still a level of a 3-D CUDA array, which the kernels' 2-D
    // surface accesses do not address: the driver under Auto, Unsupported
    // for the kernel (found by review: it launched the 2-D kernel).
    let volume = fake::image::<Rgba8Unorm, usage::Storage>([64, 64, 2], 2, 1, false);
    // SAFETY: as for the first import.
    let imported_volume = unsafe { cuda.import_image_fd(volume, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array_volume = imported_volume.map_array().unwrap();
    let level_volume = array_volume.level(1).unwrap();
    assert_eq!(level_volume.extent(), [32, 32, 1]);
    let mut small = DeviceBuffer::new(&cuda, 32 * 32 * 4).unwrap();
    let err = level_volume
        .enqueue_copy_to_with(&stream, PitchedMut::buffer(&mut small), CopyEngine::Kernel)
        .unwrap_err();
    assert!(matches!(err, CudaError::Unsupported(_)), "{err}");
    let used = level_volume
        .enqueue_copy_to(&stream, PitchedMut::buffer(&mut small))
        .unwrap();
    assert_eq!(used, CopyEngine::Driver, "a 3-D image's level");
    assert_eq!(fake.calls("cuLaunchKernel").len(), launches);
    drop((array_volume, small));
    drop(imported_volume);
    assert_eq!(fake.live("surface"), surfaces);
    drop(array_half);
    drop(imported_half);
    drop(array_sampled);
    drop(imported_sampled);
    drop(array_wide);
    drop((imported_wide, wide_buffer));
    stream.synchronize(TIMEOUT).unwrap();

    // Nothing waits for the copy; the destination's drop does.
    let pending = Duration::from_millis(300);
    fake.set("latency_ms", pending.as_millis() as i64);
    let mut destination = DeviceBuffer::new(&cuda, (row * rows) as usize).unwrap();
    let start = Instant::now();
    level
        .enqueue_copy_to(&stream, PitchedMut::buffer(&mut destination))
        .unwrap();
    let enqueued = start.elapsed();
    assert!(enqueued < Duration::from_millis(100), "{enqueued:?}");
    assert!(!stream.query().unwrap(), "the copy is still pending");
    let start = Instant::now();
    drop(destination);
    let took = start.elapsed();
    println!("copy enqueued in {enqueued:?}; its destination dropped in {took:?}");
    assert!(took >= pending - Duration::from_millis(50), "{took:?}");
    assert_eq!(fake.last("cuMemFree").get("busy_streams"), "0");
    // The blocking wrapper waits for its copy.
    let mut back = DeviceBuffer::new(&cuda, (row * rows) as usize).unwrap();
    let start = Instant::now();
    level.copy_to_device(&stream, &mut back).unwrap();
    assert!(start.elapsed() >= pending - Duration::from_millis(50));
    assert!(stream.query().unwrap());
    // The array's drop waits for the copies through its levels' surfaces
    // before it destroys them.
    level
        .enqueue_copy_from(&stream, Pitched::buffer(&back))
        .unwrap();
    let surfaces = fake.live("surface");
    let start = Instant::now();
    drop(array);
    let took = start.elapsed();
    assert!(took >= pending - Duration::from_millis(50), "{took:?}");
    assert_eq!(
        fake.live("surface"),
        surfaces - 1,
        "destroyed after the copy"
    );
    assert_eq!(
        fake.last("cuMipmappedArrayDestroy").get("busy_streams"),
        "0"
    );
    fake.set("latency_ms", 0);

    drop((imported, tight, pitched, short, back, synchronous_short));
    drop((elsewhere, stream_elsewhere, other, stream));
    assert!(fake.calls("cuModuleUnload").is_empty(), "the device lives");
    drop(cuda);
    assert_eq!(
        fake.calls("cuModuleUnload").len(),
        1,
        "unloaded with the device"
    );
    assert_eq!(cuda_interop::drop_errors(), errors, "no destroy failed");
    assert!(!fake.log().contains("error="), "{}", fake.log());
    assert_eq!(fake.all_live(), []);
}
