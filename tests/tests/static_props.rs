//! Thread-safety, ownership and type-level facts the design relies on,
//! checked at compile time: `Send`/`Sync` bounds, and the signatures and
//! absent methods the fault table's "cannot compile" and "impossible through
//! the safe API" verdicts rest on ([`pins`]).

use cuda_interop::*;
use cuda_interop_testkit::{assert_no_validation_errors, vulkan};
use static_assertions::{assert_impl_all, assert_not_impl_any, assert_type_eq_all};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, DeviceLocal, Optimal};
use vk_export::semaphore_kinds::{Binary, Timeline};
use vk_export::{Error, TimelineSemaphore};

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

// Every call pushes its own context, so these may move and be shared across threads.
assert_impl_all!(CudaDevice: Send, Sync, Clone);
assert_impl_all!(ExternalMemory: Send, Sync);
assert_impl_all!(ImportedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>: Send, Sync);
assert_impl_all!(ImportedBuffer<DeviceLocal>: Send, Sync);
// Two-plane images (issue 31): shared across threads like images.
assert_impl_all!(vk_export::ExportablePlanarImage<vk_export::format::Nv12Planes>: Send, Sync);
assert_impl_all!(ImportedPlanarImage<vk_export::format::P010Planes, DeviceLocal>: Send, Sync);
// A planar record is no single-plane record: the types stay apart.
assert_not_impl_any!(vk_export::format::Nv12Planes: vk_export::format::Format);
assert_not_impl_any!(vk_export::format::P010Planes: vk_export::format::Format);
assert_impl_all!(MappedBuffer<'static>: Send, Sync);
assert_impl_all!(MappedArray<'static, Rgba8Unorm, usage::Storage>: Send, Sync);
assert_impl_all!(ExternalSemaphore<Timeline>: Send, Sync);
assert_impl_all!(DeviceBuffer: Send, Sync);
assert_impl_all!(cuda_interop_sys::Driver: Send, Sync);
assert_impl_all!(vk_export::Context: Send, Sync, Clone);
assert_impl_all!(vk_export::ExportableImage<Rgba8Unorm>: Send, Sync);
assert_impl_all!(vk_export::TimelineSemaphore: Send, Sync);

// A completion holds the device, an event and its eventfd, not the stream:
// it may be waited for, polled and dropped on any thread. Strategies are
// plain values.
assert_impl_all!(Completion: Send, Sync, std::os::fd::AsFd, std::fmt::Debug);
assert_not_impl_any!(Completion: Clone);
assert_impl_all!(HostWait: Send, Sync, Copy, Default, std::fmt::Debug);

// Streams order work: one owner enqueues.
assert_impl_all!(Stream: Send);
assert_not_impl_any!(Stream: Sync, Clone);

// Owned handles are not duplicable.
assert_not_impl_any!(ExternalMemory: Clone, Copy);
assert_not_impl_any!(ImportedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>: Clone);
assert_not_impl_any!(ExternalSemaphore<Binary>: Clone);
assert_not_impl_any!(BinarySignal: Clone, Copy);

// A context guard belongs to the thread whose context stack it pushed.
assert_not_impl_any!(ContextGuard<'static>: Send, Sync);

// Records and received bundles are made only by the crate, never cloned
// into a second fd owner.
assert_not_impl_any!(vk_export::ReceivedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>: Clone);
assert_not_impl_any!(vk_export::SubmitSync<'static>: Clone);
assert_not_impl_any!(vk_export::ExportableImage<Rgba8Unorm>: Clone);

// A receiver names what the sender made with the same defaults (issue 21):
// optimal, device-local, storage images; device-local buffers.
assert_type_eq_all!(
    vk_export::ReceivedImage<Rgba8Unorm>,
    vk_export::ReceivedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>
);
assert_type_eq_all!(
    vk_export::ReceivedBuffer,
    vk_export::ReceivedBuffer<DeviceLocal>
);

#[test]
fn error_types_are_reportable() {
    fn is_error<E: std::error::Error + Send + Sync + 'static>() {}
    is_error::<Error>();
    is_error::<ImportError>();
    is_error::<vk_export::Error>();
    is_error::<vk_export::ImportError>();
    is_error::<cuda_interop_sys::LoadError>();
}
