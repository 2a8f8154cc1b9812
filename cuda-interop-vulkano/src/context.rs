//! [`Interop`]: a vulkano device and its queues wrapped as a
//! [`vk_export::Context`].
//!
//! # Contract
//!
//! * [`Interop::new`] checks the device first ([`check_device`]: API 1.2,
//!   `khr_external_memory_fd`, `khr_external_semaphore_fd` where offered,
//!   `timeline_semaphore`), then wraps vulkano's raw handles as ash ones and
//!   hands them to [`Context::from_raw_with_owner`] with an owner that holds
//!   the vulkano `Device` and the queues: vulkano never destroys the device,
//!   and never waits a queue idle (a `Queue`'s drop does, unlocked), while
//!   the context or anything made from it lives.
//! * The context submits to the queues it was given, under its own lock per
//!   queue. A queue it shares with the application's vulkano work is
//!   submitted to only inside [`Interop::with_queue`] (vulkano's futures:
//!   [`Interop::locked`]): the caller's promise, hence `unsafe`.

use std::fmt;
use std::sync::Arc;

use ash::vk;
use vk_export::{Context, QueueChoice, QueueRole, Queues};
use vulkano::device::{Device, Queue, QueueGuard};
use vulkano::VulkanObject;

use crate::error::{Error, Result};
use crate::requirements::check_device;

/// What the context keeps until it and everything made from it are gone.
struct Owner {
    _device: Arc<Device>,
    _queues: Vec<Arc<Queue>>,
}

/// A vulkano device and queues, and the [`vk_export::Context`] on them.
pub struct Interop {
    context: Context,
    device: Arc<Device>,
    main: Arc<Queue>,
    transfer: Option<Arc<Queue>>,
}

impl fmt::Debug for Interop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interop")
            .field("context", &self.context)
            .field("main_family", &self.main.queue_family_index())
            .field("transfer", &self.transfer.is_some())
            .finish()
    }
}

fn choice(queue: &Queue) -> QueueChoice {
    QueueChoice {
        family: queue.queue_family_index(),
        index: queue.queue_index(),
    }
}

impl Interop {
    /// Wraps `device` as a vk-export context that submits to `main` (a
    /// queue of a graphics or compute family) and, if given, `transfer`
    /// (copies, uploads, readbacks). Refused: a device without what
    /// vk-export needs ([`Error::Missing`] names the vulkano field to set:
    /// see [`device_extensions`](crate::device_extensions) and
    /// [`device_features`](crate::device_features)), a queue of another
    /// device, one queue named twice.
    ///
    /// # Safety
    /// While the returned [`Interop`] or anything made from its context
    /// lives, the application submits to `main` only inside
    /// [`Interop::with_queue`] / [`Interop::locked`] / [`Interop::submit`]
    /// (the context submits under the same lock), or not at all, and to
    /// `transfer` not at all (give the context a queue of its own for
    /// that role); it calls no vulkano function
    /// that uses every queue of the device (`Device::wait_idle`) outside
    /// them. vulkano's `GpuFuture`s submit when they are flushed, and in
    /// their `Drop` (an unflushed future flushes and waits there): such a
    /// future on `main` is created, flushed and dropped inside
    /// [`Interop::locked`], or not used at all ([`Interop::submit`] needs
    /// none). Work the application submits that uses vk-export resources
    /// (through this crate's images, or their raw handles) completes
    /// before the last handle to such a resource goes ([`InteropImage`]
    /// keeps its image alive while vulkano holds it).
    ///
    /// [`InteropImage`]: crate::InteropImage
    pub unsafe fn new(
        device: &Arc<Device>,
        main: &Arc<Queue>,
        transfer: Option<&Arc<Queue>>,
    ) -> Result<Interop> {
        let semaphore_fd = check_device(device)?;
        for (what, queue) in
            std::iter::once(("main", main)).chain(transfer.map(|t| ("transfer", t)))
        {
            if queue.device().handle() != device.handle() {
                return Err(Error::Refused(format!(
                    "the {what} queue belongs to another vulkano device"
                )));
            }
        }
        let queues = Queues {
            main: choice(main),
            transfer: transfer.map(|t| choice(t)),
        };
        // SAFETY: loading the system's Vulkan loader runs its initialisers;
        // it is the loader vulkano loaded (libvulkan.so.1).
        let entry = unsafe { ash::Entry::load() }
            .map_err(|e| Error::Vulkano(format!("the Vulkan loader: {e}")))?;
        let instance_handle: vk::Instance = device.instance().handle();
        // SAFETY: vulkano's live instance, kept alive by the device (which
        // the owner holds) for as long as the context lives.
        let instance = unsafe { ash::Instance::load(entry.static_fn(), instance_handle) };
        // SAFETY: vulkano's live device of that instance, kept alive by the owner.
        let ash_device = unsafe { ash::Device::load(instance.fp_v1_0(), device.handle()) };
        let physical = device.physical_device().handle();
        let owner = Owner {
            _device: device.clone(),
            _queues: std::iter::once(main.clone())
                .chain(transfer.cloned())
                .collect(),
        };
        // SAFETY: the device was created from `physical` of `instance` with
        // Vulkan 1.2, `timelineSemaphore` and VK_KHR_external_memory_fd
        // (checked above; VK_KHR_external_semaphore_fd with
        // `semaphore_fd`); the queues were created with it (vulkano made
        // them: their indices exist). The caller submits to them only under
        // the context's locks. The owner keeps the vulkano device (so the
        // instance) and the queues until the context and its resources
        // are gone.
        let context = unsafe {
            Context::from_raw_with_owner(
                entry,
                instance,
                physical,
                ash_device,
                queues,
                semaphore_fd,
                Box::new(owner),
            )
        }?;
        Ok(Interop {
            context,
            device: device.clone(),
            main: main.clone(),
            transfer: transfer.cloned(),
        })
    }

    /// The vk-export context on the vulkano device.
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// The vulkano device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The context's main queue, as vulkano's.
    pub fn queue(&self) -> &Arc<Queue> {
        &self.main
    }

    /// The context's transfer queue, if it was given one.
    pub fn transfer_queue(&self) -> Option<&Arc<Queue>> {
        self.transfer.as_ref()
    }

    /// Runs `f` with the main queue locked twice over: the context's lock
    /// (vk-export's submissions) and vulkano's ([`QueueGuard`]). Submit
    /// through the guard here. A call from inside another of this
    /// context's locked calls on the same thread is refused
    /// ([`vk_export::Error::InvalidArgument`]: it would wait for itself).
    pub fn with_queue<R>(&self, f: impl FnOnce(QueueGuard<'_>) -> R) -> Result<R> {
        Ok(self
            .context
            .with_queue_of(QueueRole::Main, |_| self.main.with(f))?)
    }

    /// Runs `f` under the context's lock of the main queue only: for
    /// vulkano calls that lock vulkano's queue themselves (a future's
    /// `flush`, `then_signal_fence_and_flush`), which would wait for
    /// themselves inside [`Interop::with_queue`].
    pub fn locked<R>(&self, f: impl FnOnce() -> R) -> Result<R> {
        Ok(self.context.with_queue_of(QueueRole::Main, |_| f())?)
    }
}
