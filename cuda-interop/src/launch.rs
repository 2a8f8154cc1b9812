//! Kernel launches that keep what they use alive: [`Stream::launch_tracked`]
//! and the list of resources a kernel uses, [`KernelUses`].
//!
//! # Contract
//!
//! * A tracked launch records its completion as a use of the kernel's
//!   [`Module`](crate::Module) and of every resource in its [`KernelUses`]
//!   (device buffers, mappings, slices, levels, surfaces, textures). Their
//!   destructors wait for it, bounded by
//!   [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT), and leak rather than free
//!   anything the kernel may still use, exactly as for the crate's copies
//!   (the last-use rule). So a safe caller can drop a mapping, its import,
//!   the surface or the module right after the launch.
//! * Resources of another device are refused before anything is enqueued
//!   ([`Error::DeviceMismatch`](crate::Error::DeviceMismatch)).
//! * A launch the driver refuses records nothing: it was not enqueued. (A
//!   sticky fault of an earlier kernel fails every later call of the
//!   context, so the destructors' bounded waits fail too, and they leak
//!   rather than free.)
//! * What stays `unsafe` is what no type can check: that `args` match the
//!   kernel's parameters, and that the kernel touches only memory listed in
//!   its uses (or memory the caller keeps alive itself).

use std::ffi::c_void;

use vk_export::format::Format;
use vk_export::markers::Usage;

use crate::array::{LevelArray, Surface, Texture};
use crate::context::CudaDevice;
use crate::driver::cu;
use crate::error::Result;
use crate::last_use::LastUse;
use crate::linear::{DeviceBuffer, DeviceSlice, MappedBuffer};
use crate::module::Function;
use crate::stream::Stream;

/// The resources a kernel launched with [`Stream::launch_tracked`] uses:
/// each is kept alive (its destructor waits) until the kernel completes.
///
/// ```no_run
/// # use std::ffi::c_void;
/// # use cuda_interop::{KernelUses, Module, Stream};
/// # fn demo(stream: &Stream, module: &Module, mapped: &cuda_interop::MappedBuffer<'_>)
/// #     -> cuda_interop::Result<()> {
/// let xor = module.function("xor_bytes")?;
/// let (mut ptr, mut len, mut key) = (mapped.device_ptr(), mapped.len(), 0xffu32);
/// let mut args: [*mut c_void; 3] = [
///     (&mut ptr as *mut u64).cast(),
///     (&mut len as *mut u64).cast(),
///     (&mut key as *mut u32).cast(),
/// ];
/// // SAFETY: xor_bytes(u64 ptr, u64 len, u32 key) touches `len` bytes at
/// // `ptr`: the mapping, listed in the uses.
/// unsafe {
///     stream.launch_tracked(
///         &xor,
///         [(len as u32).div_ceil(256), 1, 1],
///         [256, 1, 1],
///         0,
///         &mut args,
///         KernelUses::new().mapped(mapped),
///     )
/// }?;
/// // Dropping the mapping (or its import) now waits for the kernel.
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct KernelUses<'a> {
    uses: Vec<(&'a CudaDevice, &'a LastUse)>,
}

impl<'a> KernelUses<'a> {
    /// No resource yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A device buffer the kernel reads or writes.
    pub fn buffer(mut self, buffer: &'a DeviceBuffer) -> Self {
        self.uses.push((buffer.device(), buffer.last_use()));
        self
    }

    /// A mapping of imported memory (the import is kept alive).
    pub fn mapped(mut self, mapping: &'a MappedBuffer<'_>) -> Self {
        let memory = mapping.external();
        self.uses.push((memory.device(), memory.last_use()));
        self
    }

    /// A slice of a mapping (the import is kept alive).
    pub fn slice(mut self, slice: &DeviceSlice<'a>) -> Self {
        let memory = slice.external_memory();
        self.uses.push((memory.device(), memory.last_use()));
        self
    }

    /// A level of a mapped image (the import is kept alive).
    pub fn level<F: Format, U: Usage>(mut self, level: &'a LevelArray<'_, F, U>) -> Self {
        let memory = level.external();
        self.uses.push((memory.device(), memory.last_use()));
        self
    }

    /// A surface object (kept alive, with the import behind its level).
    pub fn surface(mut self, surface: &'a Surface<'_>) -> Self {
        let (memory, own) = surface.tracking();
        self.uses.push((memory.device(), memory.last_use()));
        self.uses.push((memory.device(), own));
        self
    }

    /// A texture object (kept alive, with the import behind its level).
    pub fn texture(mut self, texture: &'a Texture<'_>) -> Self {
        let (memory, own) = texture.tracking();
        self.uses.push((memory.device(), memory.last_use()));
        self.uses.push((memory.device(), own));
        self
    }

    /// How many uses are listed (a surface or texture counts twice: itself
    /// and its import).
    pub fn len(&self) -> usize {
        self.uses.len()
    }

    /// Whether none is listed.
    pub fn is_empty(&self) -> bool {
        self.uses.is_empty()
    }
}

impl std::fmt::Debug for KernelUses<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelUses")
            .field("uses", &self.uses.len())
            .finish()
    }
}

impl Stream {
    /// Launches a kernel and records its completion as a use of its module
    /// and of each resource in `uses`, whose destructors then wait for it
    /// (see the module contract). Resources or a module of another device
    /// are refused before anything is enqueued.
    ///
    /// # Safety
    /// `args` must point to one value per kernel parameter, of exactly the
    /// parameter's type, and the kernel may access only memory of the
    /// resources listed in `uses`, or memory the caller keeps valid until
    /// the kernel has completed.
    pub unsafe fn launch_tracked(
        &self,
        function: &Function<'_>,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        args: &mut [*mut c_void],
        uses: KernelUses<'_>,
    ) -> Result<()> {
        let module = function.module();
        self.check_device(module.device())?;
        for (device, _) in &uses.uses {
            self.check_device(device)?;
        }
        // SAFETY: the caller's contract covers the arguments and the memory
        // the kernel touches; what it uses is recorded below, so none of it
        // is freed before the kernel completes.
        unsafe { self.launch(function, grid, block, shared_bytes, args) }?;
        // An error above returned before recording: a launch the driver
        // refuses is not enqueued (and after a sticky fault the context is
        // lost, so every later call, the destructors' waits included,
        // fails and leaks rather than frees). The same holds for copies.
        // Every record is made even if one fails (a failed one makes its
        // resource leak rather than trust an incomplete record).
        let mut recorded = module.last_use().record(self);
        for (_, last_use) in &uses.uses {
            recorded = recorded.and(last_use.record(self));
        }
        recorded
    }
}

impl Stream {
    /// Launches a kernel, untracked: prefer [`Stream::launch_tracked`],
    /// which keeps what the kernel uses alive until it completes.
    ///
    /// # Safety
    /// `args` must point to one value per kernel parameter, of exactly the
    /// parameter's type, and the kernel must only access memory that stays
    /// valid until the kernel has run: launches are not tracked as last uses,
    /// so keep every mapping, buffer, surface or texture the kernel uses, and
    /// the kernel's [`Module`](crate::Module), alive until a [`Stream::synchronize`] or an
    /// event says the kernel is done.
    pub unsafe fn launch(
        &self,
        function: &Function<'_>,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        // A function of another device's module is no function of this
        // context: refused before the driver sees it.
        self.check_device(function.module().device())?;
        let _guard = self.device().enter()?;
        // SAFETY: the caller guarantees the arguments and the lifetime of the
        // memory the kernel uses; the function belongs to a module loaded in
        // this context (checked above), which is current; the stream is live.
        unsafe {
            cu!(cuLaunchKernel(
                function.raw(),
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                self.raw(),
                args.as_mut_ptr(),
                std::ptr::null_mut()
            ))
        }
    }
}
