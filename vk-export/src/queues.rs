//! Which queues of a device the crate submits to: [`QueueChoice`] (a
//! family and an index), [`Queues`] (a main queue and an optional transfer
//! queue) and [`QueueRole`] (which of the two).
//!
//! # Contract
//!
//! * Plain values, checked where they are used: `Context::from_raw` refuses
//!   queues the device cannot have; `DeviceRequirements` chooses them for a
//!   device the application creates; the context submits to them.

/// A queue of a device: its family and its index in the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueueChoice {
    /// `queueFamilyIndex`.
    pub family: u32,
    /// The index of the queue in its family (`vkGetDeviceQueue`'s `queueIndex`).
    pub index: u32,
}

/// The queues a [`Context`](crate::Context) submits to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queues {
    /// A queue of a family with `GRAPHICS` or `COMPUTE`: clears, and
    /// [`Context::submit_and_wait`](crate::Context::submit_and_wait)'s commands.
    pub main: QueueChoice,
    /// A second queue for the work that needs only `TRANSFER` (copies,
    /// uploads, readbacks, releases, semaphore-only signals); `None`: the
    /// main queue does it. Best a queue of a transfer-only family: work
    /// there does not switch the graphics engine between Vulkan and CUDA
    /// (about 155 µs each way on an H200; `docs/performance.md`, S8).
    pub transfer: Option<QueueChoice>,
}

/// Which of a context's queues (see [`Queues`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueRole {
    /// The main queue.
    Main,
    /// The transfer queue, or the main queue where the context has none.
    Transfer,
}
