//! Thread-safety and ownership facts the design relies on, checked at compile time.

use cuda_interop::*;
use static_assertions::{assert_impl_all, assert_not_impl_any};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, DeviceLocal, Optimal};
use vk_export::semaphore_kinds::{Binary, Timeline};

// Every call pushes its own context, so these may move and be shared across threads.
assert_impl_all!(CudaDevice: Send, Sync, Clone);
assert_impl_all!(ExternalMemory: Send, Sync);
assert_impl_all!(ImportedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>: Send, Sync);
assert_impl_all!(ImportedBuffer<DeviceLocal>: Send, Sync);
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

#[test]
fn error_types_are_reportable() {
    fn is_error<E: std::error::Error + Send + Sync + 'static>() {}
    is_error::<Error>();
    is_error::<ImportError>();
    is_error::<vk_export::Error>();
    is_error::<vk_export::ImportError>();
    is_error::<cuda_interop_sys::LoadError>();
}
