//! Exportable buffers, and buffers imported from records.
//!
//! # Contract
//!
//! As for images ([`crate::ExportableImage`]): an exact memory class, a
//! dedicated allocation where required or preferred, imports that re-derive
//! size, memory type, alignment and the dedicated requirement on this device
//! before the driver sees the fd, fds handed back on failure, safe imports
//! only for a buffer of this process or a received bundle, and a bounded
//! `Drop` that leaks rather than frees memory the GPU may still use.

use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use ash::vk;

use crate::context::{record_drop_error, Context, DROP_WAIT};
use crate::error::{unsupported, vk_error, Error, Result};
use crate::memory::{
    allocate_imported, allocation_differences, check_fits_heap, check_memory_type,
    check_record_fits_heap, check_same_device, export_memory_fd, import_dup,
};
use crate::ownership::Owner;
use crate::submit::LastUse;
use crate::MEMORY_HANDLE_TYPE;
use interop_share::fd::{check_export_fd, ImportError, ImportFailure, KeepAlive};
use interop_share::markers::{DeviceLocal, HostVisible, MemoryLocation};
use interop_share::received::ReceivedBuffer;
use interop_share::record::{BufferFields, BufferInfo, BufferRecord};

pub use interop_share::record::BUFFER_USAGE;

pub(crate) struct BufferInner {
    pub(crate) ctx: Context,
    pub(crate) buffer: vk::Buffer,
    pub(crate) memory: vk::DeviceMemory,
    pub(crate) info: BufferInfo,
    pub(crate) owner: Mutex<Owner>,
    /// Per queue, the progress value of this crate's last submission that used the buffer.
    pub(crate) last_use: LastUse,
    /// The host mapping of the whole memory (host-visible buffers only),
    /// made on first use and kept until the memory is freed (which unmaps
    /// it); 0 while unmapped. An address, as a pointer is neither `Send`
    /// nor `Sync`.
    pub(crate) mapping: Mutex<usize>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.wait_used(&self.last_use, DROP_WAIT) {
            record_drop_error(format_args!(
                "a buffer and its memory are leaked: the submission that last used them did not complete ({e})"
            ));
            return;
        }
        let device = &self.ctx.inner.device;
        // SAFETY: created here; CUDA imports hold a KeepAlive, so none is
        // left; this crate's last use completed.
        unsafe {
            device.destroy_buffer(self.buffer, None);
            device.free_memory(self.memory, None);
        }
    }
}

/// A buffer whose memory can be exported as an OPAQUE_FD.
pub struct ExportableBuffer<M = DeviceLocal> {
    pub(crate) inner: Arc<BufferInner>,
    /// The typed record, checked once when the buffer was made.
    record: BufferRecord<M>,
}

impl<M> fmt::Debug for ExportableBuffer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportableBuffer")
            .field("size", &self.inner.info.size())
            .field("allocation_size", &self.inner.info.allocation_size())
            .finish()
    }
}

fn preflight(ctx: &Context, size: u64) -> Result<bool> {
    if size == 0 {
        return Err(Error::InvalidArgument("a buffer of 0 bytes".into()));
    }
    let info = vk::PhysicalDeviceExternalBufferInfo::default()
        .usage(BUFFER_USAGE)
        .handle_type(MEMORY_HANDLE_TYPE);
    let mut props = vk::ExternalBufferProperties::default();
    // SAFETY: plain query.
    unsafe {
        ctx.inner
            .instance
            .get_physical_device_external_buffer_properties(ctx.inner.physical, &info, &mut props)
    };
    let features = props.external_memory_properties.external_memory_features;
    let need =
        vk::ExternalMemoryFeatureFlags::EXPORTABLE | vk::ExternalMemoryFeatureFlags::IMPORTABLE;
    if !features.contains(need) {
        return Err(unsupported(
            "an exportable storage buffer (OPAQUE_FD)",
            format!("the driver reports external memory features {features:?}"),
        ));
    }
    Ok(features.contains(vk::ExternalMemoryFeatureFlags::DEDICATED_ONLY))
}

/// Creates the buffer and returns it with its requirements and whether it
/// must or should be dedicated (`dedicated_only`: the handle type demands it).
fn create_buffer(
    ctx: &Context,
    size: u64,
    dedicated_only: bool,
) -> Result<(vk::Buffer, vk::MemoryRequirements, bool)> {
    let device = &ctx.inner.device;
    let mut external =
        vk::ExternalMemoryBufferCreateInfo::default().handle_types(MEMORY_HANDLE_TYPE);
    let info = vk::BufferCreateInfo::default()
        .size(size)
        .usage(BUFFER_USAGE)
        .sharing_mode(vk::SharingMode::EXCLUSIVE)
        .push_next(&mut external);
    // SAFETY: the create info lives across the call.
    let buffer = unsafe { device.create_buffer(&info, None) }
        .map_err(vk_error("vkCreateBuffer", "out of memory"))?;
    let mut dedicated = vk::MemoryDedicatedRequirements::default();
    let mut reqs = vk::MemoryRequirements2::default().push_next(&mut dedicated);
    // SAFETY: the buffer was just created.
    unsafe {
        device.get_buffer_memory_requirements2(
            &vk::BufferMemoryRequirementsInfo2::default().buffer(buffer),
            &mut reqs,
        )
    };
    let memory_requirements = reqs.memory_requirements;
    let wants = dedicated_only
        || dedicated.requires_dedicated_allocation == vk::TRUE
        || dedicated.prefers_dedicated_allocation == vk::TRUE;
    Ok((buffer, memory_requirements, wants))
}

/// The checks a received buffer record must pass on `ctx`, leaving the
/// buffer created from it.
fn verified_buffer(ctx: &Context, info: &BufferInfo) -> Result<vk::Buffer> {
    check_same_device(ctx, &info.device_uuid(), &info.driver_uuid())?;
    check_memory_type(ctx, info.memory_type_index(), info.memory_flags())?;
    if info.usage() != BUFFER_USAGE {
        return Err(Error::Record(format!(
            "buffer usage {:?}: this crate exports {BUFFER_USAGE:?}",
            info.usage()
        )));
    }
    let dedicated_only = preflight(ctx, info.size())?;
    let (buffer, reqs, dedicated) = create_buffer(ctx, info.size(), dedicated_only)?;
    let differences = allocation_differences(
        &reqs,
        dedicated,
        info.allocation_size(),
        info.memory_type_index(),
        info.alignment(),
        info.dedicated(),
    );
    if differences.is_empty() {
        return Ok(buffer);
    }
    // SAFETY: the buffer was created above and is unused.
    unsafe { ctx.inner.device.destroy_buffer(buffer, None) };
    Err(Error::Record(format!(
        "the record does not describe the buffer it claims: for {} bytes, {} derives {}; not the same buffer \
         (or another driver)",
        info.size(),
        ctx.identity().name,
        differences.join(", ")
    )))
}

impl Context {
    /// Checks a buffer record against this device as an import would (both
    /// UUIDs, memory type and flags, and the size, memory type bits,
    /// alignment and dedicated requirement this device derives), creating
    /// nothing that outlives the call.
    pub fn verify_buffer<M>(&self, record: &BufferRecord<M>) -> Result<()> {
        let buffer = verified_buffer(self, record.info())?;
        // SAFETY: created for this check and unused.
        unsafe { self.inner.device.destroy_buffer(buffer, None) };
        Ok(())
    }
}

impl<M: MemoryLocation> ExportableBuffer<M> {
    /// Creates, allocates (exportable, in a memory type of the exact class
    /// `M`) and binds a buffer of `size` bytes.
    pub fn new(ctx: &Context, size: u64) -> Result<Self> {
        let dedicated_only = preflight(ctx, size)?;
        let (buffer, reqs, dedicated) = create_buffer(ctx, size, dedicated_only)?;
        let device = &ctx.inner.device;
        let Some(memory_type_index) =
            ctx.memory_type(reqs.memory_type_bits, M::REQUIRED, M::EXCLUDED)
        else {
            // SAFETY: unused buffer.
            unsafe { device.destroy_buffer(buffer, None) };
            return Err(unsupported(
                "an exportable buffer",
                crate::memory::no_memory_type::<M>(reqs.memory_type_bits),
            ));
        };
        if let Err(why) = check_fits_heap(ctx, reqs.size, memory_type_index) {
            // SAFETY: unused buffer.
            unsafe { device.destroy_buffer(buffer, None) };
            return Err(Error::InvalidArgument(format!(
                "an exportable buffer of {size} bytes needs {why}"
            )));
        }
        let mut export = vk::ExportMemoryAllocateInfo::default().handle_types(MEMORY_HANDLE_TYPE);
        let mut dedicated_info = vk::MemoryDedicatedAllocateInfo::default().buffer(buffer);
        let mut alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(reqs.size)
            .memory_type_index(memory_type_index)
            .push_next(&mut export);
        if dedicated {
            alloc = alloc.push_next(&mut dedicated_info);
        }
        // SAFETY: the chain lives across the call.
        let memory = unsafe { device.allocate_memory(&alloc, None) }.map_err(|e| {
            // SAFETY: unused buffer.
            unsafe { device.destroy_buffer(buffer, None) };
            Error::Vulkan {
                call: "vkAllocateMemory",
                result: e,
                hint: "out of device memory for the exportable allocation",
            }
        })?;
        let identity = &ctx.inner.identity;
        let info = BufferInfo::from_fields(BufferFields {
            size,
            usage: BUFFER_USAGE,
            allocation_size: reqs.size,
            memory_type_index,
            memory_flags: ctx.memory_type_flags(memory_type_index).unwrap_or_default(),
            dedicated,
            alignment: reqs.alignment,
            device_uuid: identity.device_uuid,
            driver_uuid: identity.driver_uuid,
        })
        .map_err(|e| {
            Error::Record(format!(
                "this driver produced a record outside the wire rules: {e}"
            ))
        });
        Self::bind(ctx, buffer, memory, info)
    }

    /// Binds `memory` to `buffer` and wraps them; on failure destroys both.
    fn bind(
        ctx: &Context,
        buffer: vk::Buffer,
        memory: vk::DeviceMemory,
        info: Result<BufferInfo>,
    ) -> Result<Self> {
        let device = &ctx.inner.device;
        let bound = info.and_then(|info| {
            let record = info.typed::<M>()?;
            // SAFETY: fresh objects; offset 0.
            unsafe { device.bind_buffer_memory(buffer, memory, 0) }.map_err(vk_error(
                "vkBindBufferMemory",
                "the memory does not fit the buffer",
            ))?;
            Ok(record)
        });
        let record = match bound {
            Ok(record) => record,
            Err(e) => {
                // SAFETY: neither is in use.
                unsafe {
                    device.destroy_buffer(buffer, None);
                    device.free_memory(memory, None);
                }
                return Err(e);
            }
        };
        Ok(ExportableBuffer {
            inner: Arc::new(BufferInner {
                ctx: ctx.clone(),
                buffer,
                memory,
                info: record.info().clone(),
                owner: Mutex::new(Owner::Unused),
                last_use: LastUse::default(),
                mapping: Mutex::new(0),
            }),
            record,
        })
    }

    /// Imports `exporter` (a buffer of this process) into `ctx`.
    pub fn import_from(ctx: &Context, exporter: &ExportableBuffer<M>) -> Result<Self> {
        let fd = exporter.export_fd()?;
        // SAFETY: a fresh export of `exporter`, with its own record.
        unsafe { Self::import_fd(ctx, &exporter.record(), fd) }.map_err(ImportError::into_error)
    }

    /// Imports a buffer received over a socket (record and fd arrived
    /// together from a peer), verified on this device first; on
    /// failure the fd comes back in the error.
    pub fn import_received(
        ctx: &Context,
        received: ReceivedBuffer<M>,
    ) -> Result<Self, ImportError> {
        let (record, fd, _peer) = received.into_parts();
        // SAFETY: as for images (not the peer's honesty: the shape rules,
        // import_fd's checks, and the driver refusing memory smaller than
        // the record; the contents are the peer's word).
        unsafe { Self::import_fd(ctx, &record, fd) }
    }

    /// Imports a buffer from a record and an fd that did not travel together
    /// through this crate, verified like [`Context::verify_buffer`]. `fd`
    /// is consumed on success and comes back in the error on failure.
    ///
    /// # Safety
    /// `fd` is an OPAQUE_FD export of the memory of the buffer `record`
    /// describes, and `record` is that buffer's own, unmodified record.
    pub unsafe fn import_fd(
        ctx: &Context,
        record: &BufferRecord<M>,
        fd: OwnedFd,
    ) -> Result<Self, ImportError> {
        let info = record.info();
        let buffer = match check_export_fd(&fd, "memory")
            .and_then(|()| {
                check_record_fits_heap(ctx, info.allocation_size(), info.memory_type_index())
            })
            .and_then(|()| verified_buffer(ctx, info))
        {
            Ok(b) => b,
            Err(error) => return Err(ImportError { error, fd }),
        };
        let dedicated_to = info
            .dedicated()
            .then(|| vk::MemoryDedicatedAllocateInfo::default().buffer(buffer));
        import_dup(ctx, fd, |raw| {
            let memory = allocate_imported(
                ctx,
                raw,
                info.allocation_size(),
                info.memory_type_index(),
                dedicated_to,
            )
            .inspect_err(|_| {
                // SAFETY: the buffer was created above and is unused.
                unsafe { ctx.inner.device.destroy_buffer(buffer, None) }
            })?;
            Self::bind(ctx, buffer, memory, Ok(info.clone())).map_err(|error| ImportFailure {
                error,
                driver_took_fd: true,
            })
        })
    }

    /// Exports the memory as a new OPAQUE_FD, owned by the caller.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        export_memory_fd(&self.inner.ctx, self.inner.memory)
    }

    /// What an importer needs, typed.
    pub fn record(&self) -> BufferRecord<M> {
        self.record.clone()
    }

    /// The plain record.
    pub fn info(&self) -> &BufferInfo {
        &self.inner.info
    }

    /// The size in bytes.
    pub fn size(&self) -> u64 {
        self.inner.info.size()
    }

    /// The context this buffer belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The `VkBuffer`, for the application's own command buffers (see
    /// [`Context::from_raw`]'s contract on tracking).
    pub fn raw(&self) -> vk::Buffer {
        self.inner.buffer
    }

    /// A handle that keeps this buffer (and its device) alive.
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive::new(self.inner.clone())
    }
}

/// Host access to a host-visible buffer's memory through a mapping of its
/// own (made once, on first use).
impl ExportableBuffer<HostVisible> {
    /// The start of the mapping of the whole allocation.
    fn mapped(&self) -> Result<*mut u8> {
        let mut address = self.inner.mapping.lock().unwrap_or_else(|p| p.into_inner());
        if *address == 0 {
            // SAFETY: the memory is HOST_VISIBLE (the type `HostVisible`
            // was checked at creation and import) and not mapped (the lock
            // held, 0 recorded); offset 0, the whole size. The mapping lives
            // until vkFreeMemory in the drop unmaps it.
            let ptr = unsafe {
                self.inner.ctx.inner.device.map_memory(
                    self.inner.memory,
                    0,
                    vk::WHOLE_SIZE,
                    vk::MemoryMapFlags::empty(),
                )
            }
            .map_err(vk_error(
                "vkMapMemory",
                "the host-visible memory could not be mapped (out of address space?)",
            ))?;
            *address = ptr as usize;
        }
        Ok(*address as *mut u8)
    }

    /// The start of the host mapping of the buffer's memory (made on first
    /// use, like [`ExportableBuffer::write_mapped`]'s), valid for
    /// [`ExportableBuffer::size`] bytes while the buffer lives: for a
    /// writer that cannot take a slice (GStreamer's memory over a frame
    /// slot). Getting it is safe; every access through it is the caller's
    /// `unsafe`, under `write_mapped`'s rules, and, since `write_mapped` and
    /// this crate's mapped reads use atomic accesses, no other thread of
    /// this process accesses the same bytes meanwhile.
    pub fn mapped_ptr(&self) -> Result<std::ptr::NonNull<u8>> {
        let base = self.mapped()?;
        std::ptr::NonNull::new(base)
            .ok_or_else(|| Error::InvalidArgument("vkMapMemory returned a null mapping".into()))
    }

    /// The mapping's length: the whole allocation (`mapped` maps
    /// `VK_WHOLE_SIZE` at offset 0).
    fn mapped_len(&self) -> usize {
        self.inner.info.allocation_size() as usize
    }

    /// Checks that `len` bytes at `offset` lie in the buffer (and that
    /// there is at least one).
    pub(crate) fn check_span(&self, offset: u64, len: usize) -> Result<()> {
        let end = offset.checked_add(len as u64);
        if len == 0 || end.is_none_or(|end| end > self.size()) {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes at {offset} of a buffer of {}",
                self.size()
            )));
        }
        Ok(())
    }

    /// Copies `data` into the buffer at `offset` through a host mapping:
    /// no device copy. Host writes to `HOST_COHERENT` memory are visible
    /// to every submission made after this returns. The copy is made of
    /// relaxed atomic stores (each 8-byte word of the mapping whole, by
    /// address): a host read or write of this buffer on another thread at
    /// the same time, over any span, sees some bytes old and some new, never
    /// undefined behaviour.
    ///
    /// # Safety
    /// No device work that accesses the buffer (in any process that
    /// imported it) runs or is pending, and its earlier device writes were
    /// made available to the host (a barrier whose destination is
    /// `HOST_WRITE`, then a completed wait); device work that reads the
    /// bytes is submitted after this returns. (Broken, the device reads or
    /// writes a frame torn between two: what is promised here is that the
    /// bytes are what they claim to be.)
    pub unsafe fn write_mapped(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_span(offset, data.len())?;
        let base = self.mapped()?;
        // SAFETY: the mapping of the whole allocation (at least the
        // buffer's size, page-aligned) lives as long as `self`; the span
        // lies in the buffer (checked).
        unsafe { copy_to_shared(base, self.mapped_len(), offset as usize, data) };
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` out of the buffer through a
    /// host mapping: no device copy. The bytes are the device's writes
    /// only where those were made visible to the host first (a barrier
    /// whose destination is `HOST_READ`, then a completed wait: as
    /// [`Context::read_buffer_mapped`] records, or
    /// [`Context::make_buffer_host_readable`]). Relaxed atomic loads, as
    /// [`ExportableBuffer::write_mapped`] stores: a write of the same bytes
    /// on another thread is no undefined behaviour.
    pub fn read_mapped(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check_span(offset, out.len())?;
        let base = self.mapped()?;
        // SAFETY: as in `write_mapped`; `out` is ours, never the mapping.
        unsafe { copy_from_shared(base, self.mapped_len(), offset as usize, out) };
        Ok(())
    }
}

/// How the shared mapping is accessed, by address alone: the 8-byte word
/// at a multiple of 8 from the mapping's start is read and written whole,
/// by `AtomicU64`, wherever it lies inside the mapping, also when a copy
/// covers only part of it (its other bytes are kept: a compare-exchange);
/// a word that would reach past the mapping is accessed byte by byte. So
/// two copies racing in this process, over any spans, always access a
/// byte with atomics of one size: no data race and no mixed-size race. A
/// writer outside the program (the device, another process) can only tear
/// the bytes.
const WORD: usize = 8;

/// Whether word `w` (bytes `w * 8 ..`) lies inside a mapping of `mapped`
/// bytes.
fn whole_word(w: usize, mapped: usize) -> bool {
    (w + 1) * WORD <= mapped
}

/// Copies `src` to byte `at` of the mapping at `base` (`mapped` bytes;
/// the access rule above): whole words in a tight loop, the partial words
/// at either end merged.
///
/// # Safety
/// `base` is the start of a live mapping of `mapped` bytes, aligned to 8,
/// and `at + src.len() <= mapped`.
unsafe fn copy_to_shared(base: *mut u8, mapped: usize, at: usize, src: &[u8]) {
    let end = at + src.len();
    let (first, last) = (at.div_ceil(WORD), end / WORD);
    if first >= last {
        // SAFETY: the caller's.
        unsafe { copy_to_partial(base, mapped, at, end, src) };
        return;
    }
    // SAFETY: the caller's; the range lies in `at..end`.
    unsafe { copy_to_partial(base, mapped, at, first * WORD, &src[..first * WORD - at]) };
    let middle = &src[first * WORD - at..last * WORD - at];
    let words = base.wrapping_add(first * WORD).cast::<u64>();
    // SAFETY: words `first..last` lie inside the span, so inside the
    // mapping, and are 8-aligned; `middle` holds `last - first` words.
    unsafe { store_words(words, middle) };
    // SAFETY: the caller's; the range lies in `at..end`.
    unsafe { copy_to_partial(base, mapped, last * WORD, end, &src[last * WORD - at..]) };
}

/// Stores `src` (a whole number of words) to the 8-aligned words at
/// `words`, each as one relaxed atomic 8-byte store (the access rule
/// above).
///
/// On x86-64 (not under Miri) the stores are non-temporal (`movnti`, followed by `sfence`):
/// a frame written once and read by another process or the device gains
/// nothing from the cache, and a plain store first reads each line it
/// writes (a 1080p frame took twice as long as a `memcpy` in a profile).
/// The asm block is, to the program, what a loop of relaxed
/// `AtomicU64::store`s followed by a fence is: each `movnti` of an aligned
/// word is a single-copy-atomic 8-byte store, and the `sfence` orders them
/// before every later store of this thread, as plain stores are ordered.
///
/// # Safety
/// `words` is 8-aligned and the `src.len() / 8` words from it lie in a live
/// mapping; `src.len()` is a multiple of 8.
unsafe fn store_words(words: *mut u64, src: &[u8]) {
    let n = src.len() / WORD;
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: the caller's: `n` aligned words at `words` are writable
    // memory of the mapping; `src` holds `n * 8` readable bytes. The block
    // touches no stack and only the named registers and flags.
    unsafe {
        std::arch::asm!(
            "test {n}, {n}",
            "jz 3f",
            "2:",
            "mov {t}, qword ptr [{s}]",
            "movnti qword ptr [{d}], {t}",
            "add {s}, 8",
            "add {d}, 8",
            "dec {n}",
            "jnz 2b",
            "3:",
            "sfence",
            d = inout(reg) words => _,
            s = inout(reg) src.as_ptr() => _,
            n = inout(reg) n => _,
            t = out(reg) _,
            options(nostack),
        );
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        // Raw pointers in the hot loop: no bounds or overflow checks per
        // word, which test builds keep (1080p is a million words).
        let from = src.as_ptr().cast::<[u8; WORD]>();
        for i in 0..n {
            // SAFETY: the caller's; `src` holds `n` words (read unaligned:
            // a byte slice).
            unsafe {
                let bytes = from.add(i).read_unaligned();
                AtomicU64::from_ptr(words.add(i))
                    .store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
            }
        }
    }
}

/// [`copy_to_shared`] of `src` to bytes `from..to` (within at most one
/// word, or none), each word merged by a compare-exchange, or bytes past
/// the mapping's last whole word.
///
/// # Safety
/// As [`copy_to_shared`] for `from..to`; `src.len() == to - from`.
unsafe fn copy_to_partial(base: *mut u8, mapped: usize, from: usize, to: usize, src: &[u8]) {
    let mut pos = from;
    while pos < to {
        let w = pos / WORD;
        let word_start = w * WORD;
        let upto = (word_start + WORD).min(to);
        let part = &src[pos - from..upto - from];
        if whole_word(w, mapped) {
            // SAFETY: the word lies in the mapping (checked), 8-aligned.
            let word = unsafe { AtomicU64::from_ptr(base.add(word_start).cast::<u64>()) };
            let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                let mut bytes = old.to_ne_bytes();
                bytes[pos - word_start..upto - word_start].copy_from_slice(part);
                Some(u64::from_ne_bytes(bytes))
            });
        } else {
            for (i, &b) in (pos..upto).zip(part) {
                // SAFETY: inside the mapping (`i < to <= mapped`).
                unsafe { AtomicU8::from_ptr(base.add(i)) }.store(b, Ordering::Relaxed);
            }
        }
        pos = upto;
    }
}

/// Copies `dst.len()` bytes from byte `at` of the mapping at `base`
/// (`mapped` bytes; the access rule above) into `dst`.
///
/// # Safety
/// As [`copy_to_shared`], with `at + dst.len() <= mapped`.
unsafe fn copy_from_shared(base: *mut u8, mapped: usize, at: usize, dst: &mut [u8]) {
    let end = at + dst.len();
    let (first, last) = (at.div_ceil(WORD), end / WORD);
    if first >= last {
        // SAFETY: the caller's.
        unsafe { copy_from_partial(base, mapped, at, end, dst) };
        return;
    }
    let (head, rest) = dst.split_at_mut(first * WORD - at);
    let (middle, tail) = rest.split_at_mut((last - first) * WORD);
    // SAFETY: the caller's; the range lies in `at..end`.
    unsafe { copy_from_partial(base, mapped, at, first * WORD, head) };
    // Raw pointers in the hot loop, as in `copy_to_shared`.
    let words = base.wrapping_add(first * WORD).cast::<u64>();
    let to = middle.as_mut_ptr().cast::<[u8; WORD]>();
    for i in 0..last - first {
        // SAFETY: word `first + i` lies inside the span, so inside the
        // mapping, and is 8-aligned (a load only); `middle` holds
        // `last - first` words (written unaligned: a byte slice).
        unsafe {
            let word = AtomicU64::from_ptr(words.add(i)).load(Ordering::Relaxed);
            to.add(i).write_unaligned(word.to_ne_bytes());
        }
    }
    // SAFETY: the caller's; the range lies in `at..end`.
    unsafe { copy_from_partial(base, mapped, last * WORD, end, tail) };
}

/// [`copy_from_shared`] of bytes `from..to` (within at most one word, or
/// none) into `dst`.
///
/// # Safety
/// As [`copy_from_shared`] for `from..to`; `dst.len() == to - from`.
unsafe fn copy_from_partial(base: *mut u8, mapped: usize, from: usize, to: usize, dst: &mut [u8]) {
    let mut pos = from;
    while pos < to {
        let w = pos / WORD;
        let word_start = w * WORD;
        let upto = (word_start + WORD).min(to);
        if whole_word(w, mapped) {
            // SAFETY: the word lies in the mapping (checked), 8-aligned; a
            // load only.
            let word = unsafe { AtomicU64::from_ptr(base.add(word_start).cast::<u64>()) }
                .load(Ordering::Relaxed)
                .to_ne_bytes();
            dst[pos - from..upto - from]
                .copy_from_slice(&word[pos - word_start..upto - word_start]);
        } else {
            for i in pos..upto {
                // SAFETY: inside the mapping; a load only.
                dst[i - from] = unsafe { AtomicU8::from_ptr(base.add(i)) }.load(Ordering::Relaxed);
            }
        }
        pos = upto;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every span of a 45-byte mapping (the last word partial: bytes):
    /// written bytes land where they should and nowhere else, and read back
    /// exact.
    #[test]
    fn shared_copies_touch_exactly_their_span() {
        const MAPPED: usize = 45;
        for at in 0..MAPPED {
            for len in 0..=MAPPED - at {
                let mut memory = [0u64; 6];
                let base = memory.as_mut_ptr().cast::<u8>();
                let src: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7) | 1).collect();
                // SAFETY: `memory` holds 48 >= MAPPED bytes, 8-aligned, ours.
                unsafe { copy_to_shared(base, MAPPED, at, &src) };
                let mut back = vec![0u8; len];
                // SAFETY: as above.
                unsafe { copy_from_shared(base, MAPPED, at, &mut back) };
                assert_eq!(back, src, "at {at}, len {len}");
                // SAFETY: plain reads of our own array, no copy running.
                let all = unsafe { std::slice::from_raw_parts(base, 48) };
                for (i, &b) in all.iter().enumerate() {
                    if !(at..at + len).contains(&i) {
                        assert_eq!(b, 0, "byte {i} outside {at}..{} written", at + len);
                    }
                }
            }
        }
    }
}
