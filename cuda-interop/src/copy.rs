//! Stream-ordered copies between a mapped image level ([`LevelArray`]) and
//! pitched linear device memory ([`Pitched`]), at HBM speed where the level
//! allows a surface.
//!
//! # Contract
//!
//! * **Nothing waits.** [`LevelArray::enqueue_copy_to`] and
//!   [`LevelArray::enqueue_copy_from`] enqueue the copy on the stream and
//!   return; the caller orders later work on the stream, or waits with
//!   [`Stream::synchronize`] or an [`Event`](crate::Event).
//!   [`LevelArray::copy_to_device`] and [`LevelArray::copy_from_device`] are
//!   the blocking wrappers: enqueue, then a wait bounded by the stream's
//!   [timeout](Stream::timeout).
//! * **Both sides stay alive until the copy completes.** Every enqueued copy
//!   is recorded as a use of the level's import and of the linear memory (a
//!   [`DeviceBuffer`], or the import behind a [`MappedBuffer`] or
//!   [`DeviceSlice`]); their destructors wait for it (the crate's last-use
//!   rule). Foreign memory ([`Pitched::foreign`], `unsafe`) is the caller's
//!   to keep alive.
//! * **Arguments are checked before the driver sees them.** Both sides on the
//!   stream's device; row pitch at least one row of texels; the last row
//!   ending within the linear range (`pitch * (rows - 1) + row <= len`, with
//!   checked arithmetic); for the kernel, address and pitch aligned to the
//!   texel size (a misaligned store would poison the process).
//! * **Which engine.** [`CopyEngine::Kernel`] reads or writes the level
//!   through a surface object with the crate's copy kernels
//!   (`kernels/copy.cu`, PTX loaded once per device, on first use); it needs
//!   a level mapped with `SURFACE_LDST` (images with storage usage), texels
//!   of 4, 8 or 16 bytes and a single layer. [`CopyEngine::Driver`] is
//!   `cuMemcpy3DAsync`, which takes any level. [`CopyEngine::Auto`] takes the
//!   kernel where it applies and the driver otherwise; the copy methods
//!   return the engine they used.
//! * **The kernels' resources outlive the kernels.** The level's surface
//!   object for copies is created on the first kernel copy and destroyed when
//!   the level is dropped, after the import's recorded uses (every kernel
//!   copy among them) have completed; if they do not complete within
//!   [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT) it is leaked and reported
//!   through [`drop_errors`](crate::drop_errors). The module stays loaded
//!   until the last clone of the [`CudaDevice`] is dropped, after every
//!   import (each holds a clone) has waited for its uses; an import whose
//!   wait gave up keeps the module loaded for good.

use std::ffi::{c_void, CString};
use std::sync::PoisonError;

use cuda_interop_sys::{CUdeviceptr, CUmodule, CUsurfObject};
use vk_export::format::Format;
use vk_export::markers::Usage;

use crate::array::{Direction, LevelArray, Linear};
use crate::context::{CopyKernels, CudaDevice, Kernels, Loaded};
use crate::driver::{cu, record_drop_error};
use crate::error::{Error, Result};
use crate::generated::copy_ptx::COPY_PTX;
use crate::last_use::LastUse;
use crate::linear::{DeviceBuffer, DeviceSlice, MappedBuffer};
use crate::stream::Stream;

/// Which implementation copies between a level and linear memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CopyEngine {
    /// The kernel where the level allows it (storage usage, 4-, 8- or
    /// 16-byte texels, one layer, aligned linear side), else the driver.
    #[default]
    Auto,
    /// The crate's copy kernel through a surface object; an
    /// [`Error::Unsupported`] (or [`Error::InvalidArgument`] for a
    /// misaligned address or pitch) where it does not apply.
    Kernel,
    /// The driver's `cuMemcpy3DAsync` (the copy engines).
    Driver,
}

/// Who keeps the linear memory of a copy alive.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Owner<'a> {
    /// Memory of this crate, freed after its recorded uses.
    Tracked {
        device: &'a CudaDevice,
        last_use: &'a LastUse,
    },
    /// Memory the caller keeps alive ([`Pitched::foreign`]).
    Foreign,
}

/// Linear device memory seen as the rows of a level: an address range, the
/// row pitch, and what keeps the range alive while a copy uses it. This is a
/// copy's *source* (a shared borrow is enough to be read); a destination is
/// a [`PitchedMut`], made from an exclusive borrow.
///
/// Tightly packed unless [`Pitched::with_row_pitch`] says otherwise. The
/// layout is checked against the level when a copy is enqueued: the pitch is
/// at least one row (`width * texel bytes`), and the last row ends within
/// the range (`pitch * (height * layers - 1) + row <= len`); layers follow
/// each other `pitch * height` bytes apart.
///
/// ```no_run
/// # fn demo(level: &cuda_interop::LevelArray<'_, vk_export::format::Rgba8Unorm, vk_export::markers::usage::Storage>,
/// #         stream: &cuda_interop::Stream, buffer: &cuda_interop::DeviceBuffer) -> cuda_interop::Result<()> {
/// use cuda_interop::Pitched;
/// // Rows 256-byte aligned, as many producers write them.
/// let pitch = (u64::from(level.extent()[0]) * 4).next_multiple_of(256);
/// level.enqueue_copy_from(stream, Pitched::buffer(buffer).with_row_pitch(pitch))?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Pitched<'a> {
    pub(crate) ptr: CUdeviceptr,
    pub(crate) len: u64,
    pub(crate) row_pitch: Option<u64>,
    pub(crate) owner: Owner<'a>,
}

impl<'a> Pitched<'a> {
    /// A crate-owned device buffer, tightly packed.
    pub fn buffer(buffer: &'a DeviceBuffer) -> Pitched<'a> {
        Pitched {
            ptr: buffer.device_ptr(),
            // usize is at most 64 bits on every supported target.
            len: buffer.len() as u64,
            row_pitch: None,
            owner: Owner::Tracked {
                device: buffer.device(),
                last_use: buffer.last_use(),
            },
        }
    }

    /// A whole mapping of imported memory; for a linear image's mapping, its
    /// [row pitch](MappedBuffer::row_pitch), else tightly packed.
    pub fn mapped(mapping: &'a MappedBuffer<'_>) -> Pitched<'a> {
        let memory = mapping.external();
        Pitched {
            ptr: mapping.device_ptr(),
            len: mapping.len(),
            row_pitch: mapping.row_pitch(),
            owner: Owner::Tracked {
                device: memory.device(),
                last_use: memory.last_use(),
            },
        }
    }

    /// A bounds-checked range of a mapping, tightly packed.
    pub fn slice(slice: &DeviceSlice<'a>) -> Pitched<'a> {
        let memory = slice.external_memory();
        Pitched {
            ptr: slice.device_ptr(),
            len: slice.len(),
            row_pitch: None,
            owner: Owner::Tracked {
                device: memory.device(),
                last_use: memory.last_use(),
            },
        }
    }

    /// Device memory this crate does not own (a video decoder's frame, an
    /// allocation of another library), `len` bytes at `ptr`, tightly packed
    /// unless [`Pitched::with_row_pitch`] says otherwise.
    ///
    /// ```no_run
    /// # fn demo(level: &cuda_interop::LevelArray<'_, vk_export::format::Rgba8Unorm, vk_export::markers::usage::Storage>,
    /// #         stream: &cuda_interop::Stream, frame: u64, pitch: u64, len: u64) -> cuda_interop::Result<()> {
    /// use cuda_interop::Pitched;
    /// // SAFETY: the decoder's frame stays mapped and untouched until the
    /// // stream is synchronized below.
    /// let frame = unsafe { Pitched::foreign(frame, len) }.with_row_pitch(pitch);
    /// level.enqueue_copy_from(stream, frame)?;
    /// stream.synchronize(stream.timeout())?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// `len` bytes at `ptr` are device memory that the stream's context can
    /// access, and the caller keeps them valid (not freed, unmapped or
    /// reused) and unaliased (nothing else writes them, nor reads them while a
    /// copy into them runs) until every copy enqueued with this value has
    /// completed: no last use is recorded for them.
    pub unsafe fn foreign(ptr: CUdeviceptr, len: u64) -> Pitched<'a> {
        Pitched {
            ptr,
            len,
            row_pitch: None,
            owner: Owner::Foreign,
        }
    }

    /// The same memory with rows `bytes` apart (checked against the level
    /// when a copy is enqueued).
    pub fn with_row_pitch(self, bytes: u64) -> Pitched<'a> {
        Pitched {
            row_pitch: Some(bytes),
            ..self
        }
    }

    /// The device address.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The row pitch given, if any (`None`: tightly packed).
    pub fn row_pitch(&self) -> Option<u64> {
        self.row_pitch
    }
}

/// The linear side of a copy *into* linear memory: like [`Pitched`], but
/// made from an exclusive borrow, so that safe code cannot name memory as a
/// copy's destination while it is borrowed elsewhere (a shared
/// [`DeviceSlice`] of the same buffer, say) *at the time the copy is
/// enqueued*.
///
/// That is all the borrow covers. The copy is stream-ordered: the borrow
/// ends when `enqueue_copy_to` returns, while the GPU may write until the
/// copy completes, so a later copy, a kernel or a read of the same memory
/// on another stream is ordered (or not) by the caller, as for any GPU
/// work. The lifetime side needs no borrow: the memory cannot be freed
/// before the copy completes (its last use is recorded). And it is about
/// the linear side only: a level is written through `&self`
/// ([`LevelArray::enqueue_copy_from`]), because an image is GPU memory that
/// Vulkan may use at the same time too; ordering those writes is the
/// semaphores' job.
///
/// ```no_run
/// # fn demo(level: &cuda_interop::LevelArray<'_, vk_export::format::Rgba8Unorm, vk_export::markers::usage::Storage>,
/// #         stream: &cuda_interop::Stream, buffer: &mut cuda_interop::DeviceBuffer) -> cuda_interop::Result<()> {
/// use cuda_interop::PitchedMut;
/// let pitch = (u64::from(level.extent()[0]) * 4).next_multiple_of(256);
/// level.enqueue_copy_to(stream, PitchedMut::buffer(buffer).with_row_pitch(pitch))?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PitchedMut<'a>(pub(crate) Pitched<'a>);

impl<'a> PitchedMut<'a> {
    /// A crate-owned device buffer, tightly packed.
    pub fn buffer(buffer: &'a mut DeviceBuffer) -> PitchedMut<'a> {
        PitchedMut(Pitched::buffer(buffer))
    }

    /// A whole mapping of imported memory; for a linear image's mapping, its
    /// [row pitch](MappedBuffer::row_pitch), else tightly packed.
    pub fn mapped(mapping: &'a mut MappedBuffer<'_>) -> PitchedMut<'a> {
        PitchedMut(Pitched::mapped(mapping))
    }

    /// Device memory this crate does not own, as [`Pitched::foreign`].
    ///
    /// # Safety
    /// As for [`Pitched::foreign`]: `len` bytes at `ptr` are device memory
    /// the stream's context can access, kept valid and unaliased (nothing
    /// else reads or writes them) until every copy into them has completed.
    pub unsafe fn foreign(ptr: CUdeviceptr, len: u64) -> PitchedMut<'a> {
        // SAFETY: the caller's contract is the same.
        PitchedMut(unsafe { Pitched::foreign(ptr, len) })
    }

    /// The same memory with rows `bytes` apart.
    pub fn with_row_pitch(self, bytes: u64) -> PitchedMut<'a> {
        PitchedMut(self.0.with_row_pitch(bytes))
    }

    /// The device address.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.0.ptr
    }
    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.0.len
    }
    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
    /// The row pitch given, if any (`None`: tightly packed).
    pub fn row_pitch(&self) -> Option<u64> {
        self.0.row_pitch
    }
}

/// A copy's layout, checked against the level and the linear range.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// Bytes from one row start to the next.
    pub(crate) pitch: usize,
}

/// The layout of `linear` for a `width x height x layers` level of
/// `texel`-byte texels: pitch at least a row, last row within the range.
fn check_layout(extent: [u32; 3], texel: u32, linear: &Pitched<'_>) -> Result<Layout> {
    let [width, height, layers] = extent;
    let overflow = || {
        Error::InvalidArgument(format!(
            "a {width}x{height}x{layers} level of {texel}-byte texels with row pitch {:?} has more \
             bytes than this platform can address",
            linear.row_pitch
        ))
    };
    let row = u64::from(width)
        .checked_mul(u64::from(texel))
        .ok_or_else(overflow)?;
    let pitch = linear.row_pitch.unwrap_or(row);
    if pitch < row {
        return Err(Error::InvalidArgument(format!(
            "row pitch {pitch} is less than a row of the level ({width} texels of {texel} bytes = {row} bytes)"
        )));
    }
    let rows = u64::from(height)
        .checked_mul(u64::from(layers))
        .ok_or_else(overflow)?;
    let needed = match rows.checked_sub(1) {
        None => 0,
        Some(before_last) => before_last
            .checked_mul(pitch)
            .and_then(|b| b.checked_add(row))
            .ok_or_else(overflow)?,
    };
    if needed > linear.len {
        return Err(Error::InvalidArgument(format!(
            "{} bytes of linear memory for a {width}x{height}x{layers} level of {texel}-byte texels \
             with row pitch {pitch}: it needs {needed}",
            linear.len
        )));
    }
    usize::try_from(needed).map_err(|_| overflow())?;
    Ok(Layout {
        pitch: usize::try_from(pitch).map_err(|_| overflow())?,
    })
}

/// Threads per block of the copy kernels (16 x 16), and texels each thread
/// moves (one column, rows a block height apart): the fastest shape measured
/// on an H200 (docs/gpu-runs/2026-12-02-h200-copy-kernel-exploration.txt).
const BLOCK: [u32; 2] = [16, 16];
const ROWS_PER_THREAD: u32 = 4;

/// The texel sizes the kernels move, in the order of [`Kernels::functions`].
const TEXEL_SIZES: [u32; 3] = [4, 8, 16];

impl CopyKernels {
    /// The kernels, loading the module on first use; `Ok(Err(why))` when the
    /// driver could not load them (cached: not retried).
    fn get(&self, device: &CudaDevice) -> Result<std::result::Result<Kernels, String>> {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        match &*loaded {
            Loaded::Ready(kernels) => return Ok(Ok(*kernels)),
            Loaded::Failed(why) => return Ok(Err(why.clone())),
            Loaded::NotYet => {}
        }
        let _guard = device.enter()?;
        let source = CString::new(COPY_PTX)
            .map_err(|_| Error::InvalidArgument("the copy PTX contains a NUL byte".into()))?;
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: `source` is a NUL-terminated PTX image that outlives the
        // call; the device's context is current; writes one module handle,
        // unloaded by `unload` (or on failure below).
        if let Err(e) = unsafe { cu!(cuModuleLoadData(&mut module, source.as_ptr().cast())) } {
            let why = format!("the copy kernels could not be loaded: {e}");
            *loaded = Loaded::Failed(why.clone());
            return Ok(Err(why));
        }
        let mut functions = [[std::ptr::null_mut(); 3]; 2];
        let mut found = Ok(());
        for (d, prefix) in ["array_to_linear", "linear_to_array"].iter().enumerate() {
            for (t, bytes) in TEXEL_SIZES.iter().enumerate() {
                let name = CString::new(format!("{prefix}_{bytes}b_r{ROWS_PER_THREAD}"))
                    .map_err(|_| Error::InvalidArgument("a kernel name with NUL".into()))?;
                // SAFETY: a live module of the current context and a
                // NUL-terminated name that outlives the call; writes one
                // function handle.
                let got = unsafe {
                    cu!(cuModuleGetFunction(
                        &mut functions[d][t],
                        module,
                        name.as_ptr()
                    ))
                };
                found = found.and(got);
            }
        }
        if let Err(e) = found {
            // SAFETY: the module loaded above in the current context, unloaded
            // once; none of its functions was ever launched.
            record_drop_error(unsafe { cu!(cuModuleUnload(module)) });
            let why = format!("the copy kernels are missing from their module: {e}");
            *loaded = Loaded::Failed(why.clone());
            return Ok(Err(why));
        }
        let kernels = Kernels { module, functions };
        *loaded = Loaded::Ready(kernels);
        Ok(Ok(kernels))
    }
}

impl<F: Format, U: Usage> LevelArray<'_, F, U> {
    /// Enqueues a copy of the whole level into `dst` and returns without
    /// waiting for it; returns the engine it used ([`CopyEngine::Auto`]).
    ///
    /// The copy is recorded as a use of the level's import and of `dst`, so
    /// neither is freed before it completes. Work enqueued later on the
    /// stream sees the copied texels; the host sees them after a wait on the
    /// stream.
    ///
    /// ```no_run
    /// # use cuda_interop::{CudaDevice, DeviceBuffer, PitchedMut, Stream};
    /// # fn demo(cuda: &CudaDevice, level: &cuda_interop::LevelArray<'_, vk_export::format::Rgba8Unorm, vk_export::markers::usage::Storage>)
    /// #     -> cuda_interop::Result<()> {
    /// let stream = Stream::new(cuda)?;
    /// let mut frame = DeviceBuffer::new(cuda, level.byte_len()?)?;
    /// level.enqueue_copy_to(&stream, PitchedMut::buffer(&mut frame))?;
    /// // ... enqueue kernels reading `frame` on the same stream ...
    /// stream.synchronize(stream.timeout())?;
    /// # Ok(()) }
    /// ```
    pub fn enqueue_copy_to(&self, stream: &Stream, dst: PitchedMut<'_>) -> Result<CopyEngine> {
        self.enqueue_copy(stream, Direction::OutOfLevel, dst.0, CopyEngine::Auto)
    }

    /// Enqueues a copy of `src` into the whole level and returns without
    /// waiting for it; returns the engine it used ([`CopyEngine::Auto`]).
    /// Recorded as a use of both sides, as [`LevelArray::enqueue_copy_to`].
    ///
    /// ```no_run
    /// # use cuda_interop::{Pitched, Stream};
    /// # fn demo(level: &cuda_interop::LevelArray<'_, vk_export::format::Rgba8Unorm, vk_export::markers::usage::Storage>,
    /// #         stream: &Stream, mapped: &cuda_interop::MappedBuffer<'_>) -> cuda_interop::Result<()> {
    /// // A linear image's mapping, with the row pitch Vulkan chose.
    /// level.enqueue_copy_from(stream, Pitched::mapped(mapped))?;
    /// # Ok(()) }
    /// ```
    pub fn enqueue_copy_from(&self, stream: &Stream, src: Pitched<'_>) -> Result<CopyEngine> {
        self.enqueue_copy(stream, Direction::IntoLevel, src, CopyEngine::Auto)
    }

    /// [`LevelArray::enqueue_copy_to`] with the engine chosen (to compare
    /// them, or to insist on one).
    ///
    /// ```no_run
    /// # use cuda_interop::{CopyEngine, PitchedMut, Stream};
    /// # fn demo(level: &cuda_interop::LevelArray<'_, vk_export::format::Rgba8Unorm, vk_export::markers::usage::Storage>,
    /// #         stream: &Stream, buffer: &mut cuda_interop::DeviceBuffer) -> cuda_interop::Result<()> {
    /// level.enqueue_copy_to_with(stream, PitchedMut::buffer(buffer), CopyEngine::Driver)?;
    /// # Ok(()) }
    /// ```
    pub fn enqueue_copy_to_with(
        &self,
        stream: &Stream,
        dst: PitchedMut<'_>,
        engine: CopyEngine,
    ) -> Result<CopyEngine> {
        self.enqueue_copy(stream, Direction::OutOfLevel, dst.0, engine)
    }

    /// [`LevelArray::enqueue_copy_from`] with the engine chosen.
    pub fn enqueue_copy_from_with(
        &self,
        stream: &Stream,
        src: Pitched<'_>,
        engine: CopyEngine,
    ) -> Result<CopyEngine> {
        self.enqueue_copy(stream, Direction::IntoLevel, src, engine)
    }

    /// Copies the level into the start of `dst`, tightly packed, and waits
    /// for it, bounded by the stream's [timeout](Stream::timeout): an
    /// [`LevelArray::enqueue_copy_to`] and a [`Stream::synchronize`]. On
    /// [`Error::Timeout`] the copy stays enqueued; it is recorded as a use of
    /// the import and of `dst`, so neither is freed before it completes.
    pub fn copy_to_device(&self, stream: &Stream, dst: &mut DeviceBuffer) -> Result<()> {
        self.enqueue_copy_to(stream, PitchedMut::buffer(dst))?;
        stream.synchronize(stream.timeout())
    }

    /// Copies tightly packed `src` into the level and waits for it, bounded
    /// by the stream's [timeout](Stream::timeout), as
    /// [`LevelArray::copy_to_device`].
    pub fn copy_from_device(&self, stream: &Stream, src: &DeviceBuffer) -> Result<()> {
        self.enqueue_copy_from(stream, Pitched::buffer(src))?;
        stream.synchronize(stream.timeout())
    }

    /// Why the kernel cannot copy this level with `linear`'s layout, if it
    /// cannot (`Unsupported` for the level, `InvalidArgument` for the
    /// linear side).
    fn kernel_refusal(&self, linear: &Pitched<'_>, layout: Layout) -> Option<Error> {
        let texel = F::TEXEL_BYTES;
        if !self.surface_ldst() {
            return Some(Error::Unsupported(format!(
                "the copy kernel reads and writes through a surface: the image needs storage usage \
                 (usage {:?})",
                U::VK
            )));
        }
        if !TEXEL_SIZES.contains(&texel) {
            return Some(Error::Unsupported(format!(
                "the copy kernel moves 4-, 8- or 16-byte texels, not the {texel} bytes of {}",
                F::NAME
            )));
        }
        if !self.is_plain_2d() {
            return Some(Error::Unsupported(format!(
                "the copy kernel addresses a plain 2-D array (a 2-D image of one layer), not a \
                 level of a 3-D, layered or cube image (extent {:?})",
                self.extent()
            )));
        }
        let align = u64::from(texel);
        if !linear.ptr.is_multiple_of(align) || !(layout.pitch as u64).is_multiple_of(align) {
            return Some(Error::InvalidArgument(format!(
                "the copy kernel needs the address ({:#x}) and the row pitch ({}) to be multiples of \
                 the texel size ({texel})",
                linear.ptr, layout.pitch
            )));
        }
        None
    }

    fn enqueue_copy(
        &self,
        stream: &Stream,
        direction: Direction,
        linear: Pitched<'_>,
        engine: CopyEngine,
    ) -> Result<CopyEngine> {
        let memory = self.external();
        if matches!(direction, Direction::IntoLevel) {
            self.check_writable()?;
        }
        stream.check_device(memory.device())?;
        if let Owner::Tracked { device, .. } = linear.owner {
            stream.check_device(device)?;
        }
        let layout = check_layout(self.extent(), F::TEXEL_BYTES, &linear)?;
        let kernels = match (engine, self.kernel_refusal(&linear, layout)) {
            (CopyEngine::Driver, _) | (CopyEngine::Auto, Some(_)) => None,
            (CopyEngine::Kernel, Some(why)) => return Err(why),
            (CopyEngine::Auto | CopyEngine::Kernel, None) => {
                match memory.device().inner.copy_kernels.get(memory.device())? {
                    Ok(kernels) => Some(kernels),
                    Err(_) if engine == CopyEngine::Auto => None,
                    Err(why) => return Err(Error::Unsupported(why)),
                }
            }
        };
        let used = match kernels {
            Some(kernels) => {
                self.launch_copy(stream, direction, &linear, layout, kernels)?;
                CopyEngine::Kernel
            }
            None => {
                let params =
                    self.copy_params(direction, Linear::Device(linear.ptr), layout.pitch)?;
                let _guard = memory.device().enter()?;
                // SAFETY: `params` copies the whole live level to or from the
                // linear range, which holds every row at `layout.pitch` bytes
                // apart (check_layout); the level's import and tracked linear
                // memory are freed only after the uses recorded below
                // complete, foreign memory is kept by the caller
                // (Pitched::foreign); the stream and both sides belong to the
                // current context (checked above).
                unsafe { cu!(cuMemcpy3DAsync(&params, stream.raw())) }?;
                CopyEngine::Driver
            }
        };
        let recorded_level = memory.last_use().record(stream);
        let recorded_linear = match linear.owner {
            Owner::Tracked { last_use, .. } => last_use.record(stream),
            Owner::Foreign => Ok(()),
        };
        recorded_level.and(recorded_linear).map(|()| used)
    }

    /// Launches the copy kernel for this level's texel size.
    fn launch_copy(
        &self,
        stream: &Stream,
        direction: Direction,
        linear: &Pitched<'_>,
        layout: Layout,
        kernels: Kernels,
    ) -> Result<()> {
        let slot = TEXEL_SIZES
            .iter()
            .position(|&t| t == F::TEXEL_BYTES)
            .ok_or_else(|| Error::Unsupported(format!("{}-byte texels", F::TEXEL_BYTES)))?;
        let function = match direction {
            Direction::OutOfLevel => kernels.functions[0][slot],
            Direction::IntoLevel => kernels.functions[1][slot],
        };
        let mut surface: CUsurfObject = self.copy_surface()?;
        let mut ptr: u64 = linear.ptr;
        let mut pitch: u64 = layout.pitch as u64;
        let [mut width, mut height, _] = self.extent();
        let grid = [
            width.div_ceil(BLOCK[0]),
            height.div_ceil(BLOCK[1] * ROWS_PER_THREAD),
        ];
        if grid[0] == 0 || grid[1] == 0 {
            return Ok(());
        }
        let (surface, ptr, pitch, width, height): (*mut c_void, _, _, _, _) = (
            (&mut surface as *mut u64).cast(),
            (&mut ptr as *mut u64).cast(),
            (&mut pitch as *mut u64).cast(),
            (&mut width as *mut u32).cast(),
            (&mut height as *mut u32).cast(),
        );
        // The parameters of array_to_linear_* (surface, dst, pitch, width,
        // height) and linear_to_array_* (src, pitch, surface, width, height).
        let mut args: [*mut c_void; 5] = match direction {
            Direction::OutOfLevel => [surface, ptr, pitch, width, height],
            Direction::IntoLevel => [ptr, pitch, surface, width, height],
        };
        let _guard = self.external().device().enter()?;
        // SAFETY: `function` is a copy kernel of the module loaded in this
        // (current) context, which stays loaded while the device lives (see
        // CopyKernels::unload); `args` points to one value per parameter of
        // exactly its type (u64 surface, u64 address, u64 pitch, u32 width,
        // u32 height, in the kernel's order), alive across the call. The
        // kernel touches `width` texels of each of `height` rows: in the level
        // through its surface object (created on this level with
        // SURFACE_LDST, destroyed only after the import's recorded uses,
        // this one among them, complete), and in the linear range at `pitch`
        // bytes apart, which holds them (check_layout) at addresses aligned to
        // the texel size (kernel_refusal); tracked memory is freed only after
        // the use recorded by the caller, foreign memory is kept by the
        // caller of Pitched::foreign.
        unsafe {
            cu!(cuLaunchKernel(
                function,
                grid[0],
                grid[1],
                1,
                BLOCK[0],
                BLOCK[1],
                1,
                0,
                stream.raw(),
                args.as_mut_ptr(),
                std::ptr::null_mut()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn foreign(len: u64, pitch: Option<u64>) -> Pitched<'static> {
        Pitched {
            ptr: 0x1000,
            len,
            row_pitch: pitch,
            owner: Owner::Foreign,
        }
    }

    #[test]
    fn layouts_are_checked_against_the_level() {
        let l = check_layout([1000, 37, 1], 4, &foreign(148_000, None)).unwrap();
        assert_eq!(l.pitch, 4000);
        assert!(check_layout([1000, 37, 1], 4, &foreign(147_999, None)).is_err());
        // The last row needs only its own bytes, not a whole pitch.
        let len = 4096 * 36 + 4000;
        let l = check_layout([1000, 37, 1], 4, &foreign(len, Some(4096))).unwrap();
        assert_eq!(l.pitch, 4096);
        assert!(check_layout([1000, 37, 1], 4, &foreign(len - 1, Some(4096))).is_err());
        assert!(check_layout([1000, 37, 1], 4, &foreign(1 << 40, Some(3999))).is_err());
        // Layers follow each other.
        assert!(check_layout([4, 4, 2], 4, &foreign(16 * 8 - 1, None)).is_err());
        assert!(check_layout([4, 4, 2], 4, &foreign(16 * 8, None)).is_ok());
        assert!(matches!(
            check_layout([4, 4, 1], 4, &foreign(u64::MAX, Some(u64::MAX))),
            Err(Error::InvalidArgument(_))
        ));
    }
}
