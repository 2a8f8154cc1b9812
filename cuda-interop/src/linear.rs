//! Linear device memory: a [`MappedBuffer`] mapped from an import (a buffer,
//! or a linear image), the [`DeviceSlice`]s of it, and a [`DeviceBuffer`]
//! from `cuMemAlloc`; the host and device copies between them; the DLPack
//! hand-off of a whole buffer.
//!
//! # Contract
//!
//! * Every copy through a [`MappedBuffer`] or a [`DeviceSlice`] is recorded
//!   as a use of the import behind it, every copy through a
//!   [`DeviceBuffer`] as a use of the buffer; their destructors wait for
//!   those uses (the last-use rule) before `cuMemFree`.
//! * Copies to or from host memory wait for the stream to drain first
//!   (bounded by the stream's timeout), by the rule of the `last_use`
//!   module (`Stream::copy_with_host_memory`).

use cuda_interop_sys::{self as sys, CUdeviceptr};

use crate::context::CudaDevice;
use crate::driver::{cu, record_drop_error};
use crate::error::{Error, Result};
use crate::events::report_leak;
use crate::external::ExternalMemory;
use crate::last_use::LastUse;
use crate::stream::Stream;

pub(crate) fn map_buffer(
    memory: &ExternalMemory,
    offset: u64,
    size: u64,
    row_pitch: Option<u64>,
) -> Result<MappedBuffer<'_>> {
    let _guard = memory.device.enter()?;
    let desc = sys::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
        offset,
        size,
        ..Default::default()
    };
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: a zeroed descriptor (flags 0) whose range lies within the live
    // import (callers pass the record's sizes); the context is current;
    // writes one device address, freed by MappedBuffer::drop.
    unsafe {
        cu!(cuExternalMemoryGetMappedBuffer(
            &mut ptr,
            memory.handle,
            &desc
        ))
    }?;
    Ok(MappedBuffer {
        memory,
        ptr,
        len: size,
        row_pitch,
    })
}

/// A mapped range of imported memory: ordinary device memory; freed with
/// `cuMemFree` before the import is destroyed (it borrows the import), after
/// the copies recorded on the import have completed.
#[derive(Debug)]
pub struct MappedBuffer<'i> {
    memory: &'i ExternalMemory,
    pub(crate) ptr: CUdeviceptr,
    len: u64,
    row_pitch: Option<u64>,
}

// SAFETY: a device address; usable from any thread with the context current.
unsafe impl Send for MappedBuffer<'_> {}
// SAFETY: shared access only reads the address, or records uses on the
// import (under the record's mutex).
unsafe impl Sync for MappedBuffer<'_> {}

impl Drop for MappedBuffer<'_> {
    fn drop(&mut self) {
        free_mapping(self.memory, self.ptr, self.len);
    }
}

/// Frees a mapping of `memory` (`cuMemFree`) once every recorded use of the
/// import has completed and no external wait could make the free block;
/// otherwise leaks it and reports the leak.
pub(crate) fn free_mapping(memory: &ExternalMemory, ptr: CUdeviceptr, len: u64) {
    let idle = memory.last_use.settle_before_device_wide_release();
    if let Err(why) = idle {
        report_leak(
            &format!("a mapping of {len} bytes of imported memory"),
            &why,
        );
        return;
    }
    if let Ok(_guard) = memory.device.enter() {
        // SAFETY: the address cuExternalMemoryGetMappedBuffer returned in
        // the current context, freed once, before the import is destroyed
        // (the mapping borrows it, or owns it and drops it afterwards) and
        // after every copy recorded on the import completed.
        record_drop_error(unsafe { cu!(cuMemFree(ptr)) });
    }
}

/// A bounds-checked range of a [`MappedBuffer`]; copies through it are
/// recorded as uses of the import behind it.
#[derive(Clone, Copy, Debug)]
pub struct DeviceSlice<'b> {
    memory: &'b ExternalMemory,
    ptr: CUdeviceptr,
    len: u64,
}

impl<'b> DeviceSlice<'b> {
    /// The device address.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The import the slice's mapping belongs to.
    pub fn external_memory(&self) -> &'b ExternalMemory {
        self.memory
    }
}

impl MappedBuffer<'_> {
    /// The device address of the whole mapping.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the mapping is empty (never: imports are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// A linear image's row pitch in bytes (`None` for buffers).
    pub fn row_pitch(&self) -> Option<u64> {
        self.row_pitch
    }
    /// The import the mapping belongs to.
    pub(crate) fn external(&self) -> &ExternalMemory {
        self.memory
    }
    /// `len` bytes at `offset`, checked against the mapping.
    pub fn slice(&self, offset: u64, len: u64) -> Result<DeviceSlice<'_>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(DeviceSlice {
                memory: self.memory,
                ptr: self.ptr + offset,
                len,
            }),
            _ => Err(Error::InvalidArgument(format!(
                "{len} bytes at offset {offset} of a {}-byte mapping",
                self.len
            ))),
        }
    }

    fn host_range(&self, len: usize) -> Result<DeviceSlice<'_>> {
        let len = u64::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("a host range of {len} bytes")))?;
        self.slice(0, len)
    }

    /// Copies the first `dst.len()` bytes of the mapping to the host and
    /// waits for the copy.
    ///
    /// First waits, bounded by the stream's [timeout](Stream::timeout), for
    /// the work already on the stream: a copy into pageable memory blocks
    /// inside the driver until it is done, so one queued behind a semaphore
    /// wait nobody signals would never return. If the stream does not drain
    /// in time this returns [`Error::Timeout`] and enqueues nothing. Then it
    /// enqueues the copy, records it as a use of the import, and waits for
    /// it until it is done (it has nothing ahead of it; `dst` is not handed
    /// back while the copy may still write it).
    pub fn copy_to_host(&self, stream: &Stream, dst: &mut [u8]) -> Result<()> {
        let source = self.host_range(dst.len())?;
        stream.check_device(&self.memory.device)?;
        stream.copy_with_host_memory(&[&self.memory.last_use], || {
            let _guard = self.memory.device.enter()?;
            // SAFETY: the mapped range holds dst.len() bytes (checked against
            // the mapping) and `dst` is a writable host range of that length,
            // kept borrowed until the copy is done; the stream and the mapping
            // belong to the current context.
            unsafe {
                cu!(cuMemcpyDtoHAsync(
                    dst.as_mut_ptr().cast(),
                    source.ptr,
                    dst.len(),
                    stream.raw()
                ))
            }
        })
    }

    /// Copies `src` to the start of the mapping and waits for the copy.
    ///
    /// Waits for the stream to drain first, bounded by its
    /// [timeout](Stream::timeout) ([`Error::Timeout`], nothing enqueued), as
    /// [`MappedBuffer::copy_to_host`] does; then enqueues the copy, records
    /// it as a use of the import, and waits for it.
    pub fn copy_from_host(&self, stream: &Stream, src: &[u8]) -> Result<()> {
        let destination = self.host_range(src.len())?;
        stream.check_device(&self.memory.device)?;
        stream.copy_with_host_memory(&[&self.memory.last_use], || {
            let _guard = self.memory.device.enter()?;
            // SAFETY: the mapped range holds src.len() bytes (checked against
            // the mapping) and `src` is a readable host range of that length,
            // kept borrowed until the copy is done; the stream and the mapping
            // belong to the current context.
            unsafe {
                cu!(cuMemcpyHtoDAsync(
                    destination.ptr,
                    src.as_ptr().cast(),
                    src.len(),
                    stream.raw()
                ))
            }
        })
    }
}

impl Stream {
    /// Copies the first `dst.len()` bytes of `src` to the host and waits for
    /// the copy.
    ///
    /// First waits, bounded by the stream's [timeout](Stream::timeout), for
    /// the work already on the stream: a copy into pageable memory blocks
    /// inside the driver until it is done, so one queued behind a semaphore
    /// wait nobody signals would never return. If the stream does not drain
    /// in time this returns [`Error::Timeout`] and enqueues nothing. The
    /// copy itself is then waited for until it is done (it has nothing ahead
    /// of it; `dst` is not handed back while the copy may still write it).
    pub fn copy_to_host(&self, src: &DeviceBuffer, dst: &mut [u8]) -> Result<()> {
        if dst.len() > src.len {
            return Err(Error::InvalidArgument(format!(
                "{} bytes from a buffer of {}",
                dst.len(),
                src.len
            )));
        }
        self.check_device(&src.device)?;
        self.copy_with_host_memory(&[&src.last_use], || {
            let _guard = self.device().enter()?;
            // SAFETY: `src` holds at least dst.len() bytes (checked above) and
            // `dst` is a live, writable host range of dst.len() bytes, which
            // copy_with_host_memory keeps borrowed until the copy is done; the
            // stream and the buffer belong to the current context.
            unsafe {
                cu!(cuMemcpyDtoHAsync(
                    dst.as_mut_ptr().cast(),
                    src.ptr,
                    dst.len(),
                    self.raw()
                ))
            }
        })
    }

    /// Copies `src` to the start of `dst` and waits for the copy.
    ///
    /// Waits for the stream to drain first, bounded by its
    /// [timeout](Stream::timeout) ([`Error::Timeout`], nothing enqueued), as
    /// [`Stream::copy_to_host`] does, then for the copy itself.
    pub fn copy_from_host(&self, src: &[u8], dst: &mut DeviceBuffer) -> Result<()> {
        if src.len() > dst.len {
            return Err(Error::InvalidArgument(format!(
                "{} bytes into a buffer of {}",
                src.len(),
                dst.len
            )));
        }
        self.check_device(&dst.device)?;
        self.copy_with_host_memory(&[&dst.last_use], || {
            let _guard = self.device().enter()?;
            // SAFETY: `dst` holds at least src.len() bytes (checked above) and
            // `src` is a live host range of src.len() bytes, kept borrowed
            // until the copy is done; the stream and the buffer belong to the
            // current context.
            unsafe {
                cu!(cuMemcpyHtoDAsync(
                    dst.ptr,
                    src.as_ptr().cast(),
                    src.len(),
                    self.raw()
                ))
            }
        })
    }

    /// Enqueues a copy of a mapped range into the start of `dst`, and returns
    /// without waiting for it.
    ///
    /// Both sides stay alive until the copy has completed, by the last-use
    /// rule: the copy is recorded as a use of the import behind `src` and of
    /// `dst`, and their destructors wait for it (bounded by
    /// [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT); past that they leak
    /// rather than free memory the copy may still touch), even when the
    /// mapping itself is dropped or forgotten first. To see the result on the
    /// host, wait on the stream ([`Stream::synchronize`]) or copy on it.
    pub fn copy_device(&self, src: &DeviceSlice<'_>, dst: &mut DeviceBuffer) -> Result<()> {
        let len = usize::try_from(src.len())
            .map_err(|_| Error::InvalidArgument(format!("a slice of {} bytes", src.len())))?;
        if len > dst.len {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes into a buffer of {}",
                dst.len
            )));
        }
        let memory = src.external_memory();
        self.check_device(memory.device())?;
        self.check_device(&dst.device)?;
        {
            let _guard = self.device().enter()?;
            // SAFETY: `dst` holds at least len bytes (checked above) and the
            // slice was bounds-checked against its mapping; both are freed only
            // after the uses recorded below have completed; the stream and
            // both ranges belong to the current context.
            unsafe {
                cu!(cuMemcpyDtoDAsync(
                    dst.ptr,
                    src.device_ptr(),
                    len,
                    self.raw()
                ))
            }?;
        }
        let recorded_source = memory.last_use().record(self);
        let recorded_destination = dst.last_use.record(self);
        recorded_source.and(recorded_destination)
    }
}

/// Device memory from `cuMemAlloc`, freed on drop after its last recorded use
/// (copies through [`Stream`] and level arrays) has completed.
#[derive(Debug)]
pub struct DeviceBuffer {
    device: CudaDevice,
    ptr: CUdeviceptr,
    len: usize,
    last_use: LastUse,
}

// SAFETY: a device address, usable from any thread with the context current;
// the last-use record is Send.
unsafe impl Send for DeviceBuffer {}
// SAFETY: shared access only reads the address and length, or records a use
// (under the record's mutex).
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// `len` bytes of uninitialised device memory.
    pub fn new(device: &CudaDevice, len: usize) -> Result<DeviceBuffer> {
        if len == 0 {
            return Err(Error::InvalidArgument("a device buffer of 0 bytes".into()));
        }
        let _guard = device.enter()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: the device's context is current; writes one device address.
        unsafe { cu!(cuMemAlloc(&mut ptr, len)) }?;
        Ok(DeviceBuffer {
            device: device.clone(),
            ptr,
            len,
            last_use: LastUse::new(device),
        })
    }
    /// The device address.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false (buffers are never empty).
    pub fn is_empty(&self) -> bool {
        false
    }
    pub(crate) fn device(&self) -> &CudaDevice {
        &self.device
    }
    pub(crate) fn last_use(&self) -> &LastUse {
        &self.last_use
    }
}

impl DeviceBuffer {
    /// Hands the buffer to a DLPack consumer as a tensor of `dtype` with
    /// `shape` and element `strides` (row-major when `None`); the tensor keeps
    /// the buffer until the consumer's deleter runs. For an image level,
    /// copy it here first ([`LevelArray::copy_to_device`](crate::LevelArray::copy_to_device)):
    /// a block-linear CUDA array is not a strided tensor.
    pub fn into_dlpack(
        self,
        dtype: crate::dlpack::DLDataType,
        shape: &[i64],
        strides: Option<&[i64]>,
        read_only: bool,
    ) -> Result<crate::dlpack::ManagedTensor> {
        let device = crate::dlpack::DLDevice {
            device_type: crate::dlpack::DL_CUDA,
            device_id: self.device.ordinal(),
        };
        let (ptr, len) = (self.ptr, self.len as u64);
        // SAFETY: `ptr` is this buffer's `len` bytes on this CUDA device,
        // valid while the buffer (the owner handed over) lives.
        unsafe {
            crate::dlpack::ManagedTensor::new(
                Box::new(self),
                ptr,
                len,
                device,
                dtype,
                shape,
                strides,
                read_only,
            )
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let idle = self.last_use.settle_before_device_wide_release();
        if let Err(why) = idle {
            // A conversion kernel may still run: its module must stay loaded.
            self.device.inner.convert_kernels.keep_loaded();
            report_leak(&format!("a device buffer of {} bytes", self.len), &why);
            return;
        }
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: allocated by cuMemAlloc in the current context, freed
            // once, after every recorded use of it has completed.
            record_drop_error(unsafe { cu!(cuMemFree(self.ptr)) });
        }
    }
}
