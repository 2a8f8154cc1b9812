//! Streams, device buffers, events and PTX modules: the stream-ordered side
//! of the crate.
//!
//! # Contract
//!
//! * **Every host wait is bounded.** [`Stream::synchronize`] and
//!   [`Event::synchronize`] take a timeout; a [`Stream`]'s blocking helpers
//!   use the stream's own [`Stream::timeout`]. Nothing here calls
//!   `cuCtxSynchronize`, `cuStreamSynchronize` or `cuEventSynchronize`.
//! * **Stream waits use a [`HostWait`]**, [`HostWait::ADAPTIVE`] unless told
//!   ([`Stream::synchronize_with`]): spin 50 µs on `cuStreamQuery`, then
//!   sleep on the eventfd of a [`Completion`] enqueued behind the work. A
//!   stream keeps its last such completion while it is pending and waits on
//!   it again rather than enqueueing another, so repeated timed-out waits
//!   on a stuck stream hold one eventfd, not one each.
//! * **Copies to or from host memory drain the stream first.** For pageable
//!   host memory, `cuMemcpyDtoHAsync` blocks inside the driver until the copy
//!   is done, so a copy queued behind a semaphore wait nobody signals would
//!   block forever. Every synchronous helper that copies host memory first
//!   waits (bounded by the stream's timeout) for the stream's earlier work,
//!   returns [`Error::Timeout`] with nothing enqueued if it does not drain,
//!   and only then enqueues the copy and waits for it. **The one wait
//!   without a bound** is this last one, past the timeout: the copy reads or
//!   writes the caller's borrowed host memory, so returning before it is
//!   done would let the GPU touch memory the caller may free. The stream was
//!   drained first, so nothing but the copy itself (or a driver fault, which
//!   ends the wait with an error) stands before it.
//! * **Device-side operations are tracked, not waited for.** Each operation
//!   on imported memory, a semaphore or a [`DeviceBuffer`] records its last
//!   use on that resource, whose destructor waits for it (see the crate's
//!   last-use rule), so a stream-ordered copy cannot outlive its memory.
//!   Kernel launches are tracked the same way through
//!   [`Stream::launch_tracked`] and the resources it lists
//!   ([`KernelUses`](crate::KernelUses)); the bare [`Stream::launch`]
//!   leaves what the kernel uses to its caller.
//! * A stream is used only with resources of its own device; another
//!   device's is refused with [`Error::DeviceMismatch`] before any call.

use std::cell::{Cell, RefCell};
use std::ffi::{c_void, CString};
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use cuda_interop_sys::{
    CUdeviceptr, CUevent, CUevent_flags, CUfunction, CUmodule, CUstream, CUstream_flags,
};

use crate::completion::Completion;
use crate::device::CudaDevice;
use crate::driver::{create_event, create_untimed_event, cu, cu_query, record_drop_error};
use crate::error::{Error, Result};
use crate::last_use::{device_settled, report_leak, LastUse, DROP_WAIT_LIMIT};
use crate::memory::DeviceSlice;
use crate::wait::{poll_until, spin_until, HostWait};

/// A CUDA stream in the paired device's primary context.
///
/// `Send` but not `Sync`: work enqueued from two threads at once would have no
/// defined order, so enqueueing needs the one owner (or a lock).
///
/// It carries a [`timeout`](Stream::timeout) ([`Stream::DEFAULT_TIMEOUT`]
/// unless [set](Stream::set_timeout)) that bounds every wait its blocking
/// helpers make.
#[derive(Debug)]
pub struct Stream {
    device: CudaDevice,
    stream: CUstream,
    timeout: Duration,
    /// The completion the last blocked wait enqueued, while it may be
    /// pending: the next wait waits on it before enqueueing another.
    marker: RefCell<Option<Completion>>,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: a stream handle may be used from any thread with its context current
// (every method enters the context first).
unsafe impl Send for Stream {}

impl Stream {
    /// The timeout of a new stream's blocking helpers.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// A new non-blocking stream, with [`Stream::DEFAULT_TIMEOUT`].
    pub fn new(device: &CudaDevice) -> Result<Stream> {
        let _guard = device.enter()?;
        let mut stream: CUstream = std::ptr::null_mut();
        // SAFETY: the device's context is current; writes one stream handle.
        unsafe {
            cu!(cuStreamCreate(
                &mut stream,
                CUstream_flags::CU_STREAM_NON_BLOCKING.0
            ))
        }?;
        Ok(Stream {
            device: device.clone(),
            stream,
            timeout: Stream::DEFAULT_TIMEOUT,
            marker: RefCell::new(None),
            _not_sync: PhantomData,
        })
    }

    /// The device.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// The `CUstream`.
    pub fn raw(&self) -> CUstream {
        self.stream
    }

    /// The bound on every wait this stream's blocking helpers make (host
    /// copies, level copies).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the bound on the waits of this stream's blocking helpers.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Whether all work enqueued so far is done (`cuStreamQuery`); never blocks.
    pub fn query(&self) -> Result<bool> {
        let _guard = self.device.enter()?;
        // SAFETY: a live stream of the current context.
        unsafe { cu_query!(cuStreamQuery(self.stream)) }
    }

    /// Waits until all work enqueued so far is done, at most `timeout`
    /// ([`Error::Timeout`]; the work stays enqueued), with the default
    /// strategy [`HostWait::ADAPTIVE`]: spins 50 µs on `cuStreamQuery`, then
    /// enqueues a [`Completion`] and sleeps in `poll()` on its eventfd
    /// (waking every 100 ms to query the driver). See
    /// [`Stream::synchronize_with`].
    pub fn synchronize(&self, timeout: Duration) -> Result<()> {
        self.synchronize_with(HostWait::default(), timeout)
    }

    /// Waits until all work enqueued so far is done, at most `timeout`
    /// ([`Error::Timeout`]; the work stays enqueued), the way `strategy`
    /// says.
    ///
    /// Work that is already done returns at once, with nothing enqueued.
    /// [`HostWait::Block`] (and [`HostWait::Adaptive`] once its spin is
    /// over) enqueues a [`Completion`] behind the work and sleeps on its
    /// eventfd; if that one is still pending when the wait times out, the
    /// stream keeps it and the next wait sleeps on it again, so a stuck
    /// stream holds one eventfd however often it is waited for. If no
    /// eventfd can be made (the fd limit), a blocking wait falls back to
    /// [`HostWait::Poll`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_interop::{CudaDevice, HostWait, Stream};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = vk_export::Context::headless(&Default::default())?;
    /// let stream = Stream::new(&CudaDevice::for_vulkan(&ctx)?)?;
    /// // ... enqueue a long kernel ...
    /// stream.synchronize_with(HostWait::Block, Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn synchronize_with(&self, strategy: HostWait, timeout: Duration) -> Result<()> {
        let _guard = self.device.enter()?;
        let start = Instant::now();
        let query = || {
            // SAFETY: a live stream of the current context (the guard above
            // lives across the whole wait, on this thread).
            unsafe { cu_query!(cuStreamQuery(self.stream)) }
        };
        match strategy {
            HostWait::Spin => spin_until(timeout, query),
            HostWait::Poll => poll_until(timeout, query),
            HostWait::Block => self.block(start, timeout, query),
            HostWait::Adaptive { spin } => match spin_until(spin.min(timeout), query) {
                Err(Error::Timeout(_)) => self.block(start, timeout, query),
                other => other,
            },
        }
    }

    /// The blocking part of a stream wait that began at `start`: sleep on a
    /// completion behind the stream's work (the pending one kept from an
    /// earlier wait, else a new one) until the stream is idle.
    fn block(
        &self,
        start: Instant,
        timeout: Duration,
        mut query: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        loop {
            if query()? {
                return Ok(());
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::Timeout(timeout));
            }
            // Only the stream's own query may end this wait with an error: a
            // marker that cannot be made or waited on (no eventfd, a failed
            // cuLaunchHostFunc, a poll error) says nothing about the work, so
            // the wait goes on by polling the stream.
            let poll_rest = |query| {
                poll_until(left, query).map_err(|e| match e {
                    Error::Timeout(_) => Error::Timeout(timeout),
                    other => other,
                })
            };
            let kept = self.marker.take();
            let marker = match kept {
                // Still pending, so it is not behind anything newer than the
                // stream's current work: a lower bound worth waiting for.
                Some(marker) if matches!(marker.is_signalled(), Ok(false)) => marker,
                _ => match Completion::new(self) {
                    Ok(marker) => marker,
                    Err(_) => return poll_rest(&mut query),
                },
            };
            match marker.wait_with(HostWait::Block, left) {
                // The stream may hold work enqueued after the marker: query again.
                Ok(()) => continue,
                Err(Error::Timeout(_)) => {
                    self.marker.replace(Some(marker));
                    return Err(Error::Timeout(timeout));
                }
                Err(_) => return poll_rest(&mut query),
            }
        }
    }

    /// Marks the work enqueued on this stream so far: a [`Completion`] to
    /// query, wait for (bounded, with any [`HostWait`]) or watch as an fd,
    /// on any thread.
    ///
    /// Enqueues an event record and a host function (`cuLaunchHostFunc`)
    /// that writes the completion's eventfd. If the stream never gets there
    /// (stuck behind a semaphore wait nobody signals), the host function's
    /// small shared allocation is leaked; its fd is closed with the
    /// completion.
    pub fn completion(&self) -> Result<Completion> {
        Completion::new(self)
    }

    /// Refuses resources of another device.
    pub(crate) fn check_device(&self, device: &CudaDevice) -> Result<()> {
        device.check_resource_device(&self.device.uuid())
    }

    /// How every synchronous copy to or from host memory runs: wait (bounded
    /// by the stream's timeout) for the stream to drain, so that the copy
    /// waits for nothing else (a pageable copy blocks inside the driver until
    /// it is done); then `enqueue` the copy, record it as a use of each of
    /// `used`, and wait for the copy.
    ///
    /// The wait for the copy itself is not cut short at the timeout: the
    /// host memory is the caller's borrow, and a copy from or to page-locked
    /// memory runs asynchronously and may still access it, so this returns
    /// only when the copy is done or the driver reports an error. With the
    /// stream drained first, that wait is the copy's own time.
    pub(crate) fn copy_with_host_memory(
        &self,
        used: &[&LastUse],
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.synchronize(self.timeout)?;
        enqueue()?;
        let recorded = used.iter().try_for_each(|last_use| last_use.record(self));
        // Whatever ends the first wait early (its timeout, or a failure of
        // its wake-up machinery), the copy may still be running on the
        // caller's memory: only the stream's own query (done, or a sticky
        // driver error) may end the wait for it.
        let copied = match self.synchronize(self.timeout) {
            Ok(()) => Ok(()),
            Err(_) => self.synchronize_with(HostWait::Poll, Duration::MAX),
        };
        copied.and(recorded)
    }

    /// Launches a kernel, untracked: prefer [`Stream::launch_tracked`],
    /// which keeps what the kernel uses alive until it completes.
    ///
    /// # Safety
    /// `args` must point to one value per kernel parameter, of exactly the
    /// parameter's type, and the kernel must only access memory that stays
    /// valid until the kernel has run: launches are not tracked as last uses,
    /// so keep every mapping, buffer, surface or texture the kernel uses, and
    /// the kernel's [`Module`], alive until a [`Stream::synchronize`] or an
    /// event says the kernel is done.
    pub unsafe fn launch(
        &self,
        function: &Function<'_>,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let _guard = self.device.enter()?;
        // SAFETY: the caller guarantees the arguments and the lifetime of the
        // memory the kernel uses; the function belongs to a module loaded in
        // this context, which is current; the stream is live.
        unsafe {
            cu!(cuLaunchKernel(
                function.function,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                self.stream,
                args.as_mut_ptr(),
                std::ptr::null_mut()
            ))
        }
    }

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
            let _guard = self.device.enter()?;
            // SAFETY: `src` holds at least dst.len() bytes (checked above) and
            // `dst` is a live, writable host range of dst.len() bytes, which
            // copy_with_host_memory keeps borrowed until the copy is done; the
            // stream and the buffer belong to the current context.
            unsafe {
                cu!(cuMemcpyDtoHAsync(
                    dst.as_mut_ptr().cast(),
                    src.ptr,
                    dst.len(),
                    self.stream
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
            let _guard = self.device.enter()?;
            // SAFETY: `dst` holds at least src.len() bytes (checked above) and
            // `src` is a live host range of src.len() bytes, kept borrowed
            // until the copy is done; the stream and the buffer belong to the
            // current context.
            unsafe {
                cu!(cuMemcpyHtoDAsync(
                    dst.ptr,
                    src.as_ptr().cast(),
                    src.len(),
                    self.stream
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
            let _guard = self.device.enter()?;
            // SAFETY: `dst` holds at least len bytes (checked above) and the
            // slice was bounds-checked against its mapping; both are freed only
            // after the uses recorded below have completed; the stream and
            // both ranges belong to the current context.
            unsafe {
                cu!(cuMemcpyDtoDAsync(
                    dst.ptr,
                    src.device_ptr(),
                    len,
                    self.stream
                ))
            }?;
        }
        let recorded_source = memory.last_use().record(self);
        let recorded_destination = dst.last_use.record(self);
        recorded_source.and(recorded_destination)
    }

    /// Records `event` on this stream (for timing and host waits).
    pub fn record(&self, event: &Event) -> Result<()> {
        self.check_device(&event.device)?;
        let _guard = self.device.enter()?;
        // SAFETY: a live event and a live stream, both of the current context.
        unsafe { cu!(cuEventRecord(event.event, self.stream)) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // A stream behind an external-semaphore wait that is not completing
        // is leaked rather than destroyed: the driver may wait for it.
        if !self.query().unwrap_or(true) {
            if let Err(why) = device_settled(&self.device) {
                report_leak("a stream with pending work", &why);
                return;
            }
        }
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: a live stream of the current context, destroyed once.
            // Destruction does not wait: pending work still completes, and the
            // driver releases the stream afterwards.
            record_drop_error(unsafe { cu!(cuStreamDestroy(self.stream)) });
        }
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

/// A CUDA event.
#[derive(Debug)]
pub struct Event {
    device: CudaDevice,
    event: CUevent,
    timing: bool,
}

// SAFETY: an event handle is usable from any thread with the context current.
unsafe impl Send for Event {}
// SAFETY: queries and records are thread-safe in the driver.
unsafe impl Sync for Event {}

impl Event {
    fn create(device: &CudaDevice, flags: u32, timing: bool) -> Result<Event> {
        let _guard = device.enter()?;
        let event = create_event(flags)?;
        Ok(Event {
            device: device.clone(),
            event,
            timing,
        })
    }

    /// A new timing event (for [`Event::elapsed_ms_since`]).
    pub fn new(device: &CudaDevice) -> Result<Event> {
        Event::create(device, CUevent_flags::CU_EVENT_DEFAULT.0, true)
    }

    /// A new event without timing, created with `CU_EVENT_BLOCKING_SYNC`, for
    /// handing to other CUDA code that waits on it with
    /// `cuEventSynchronize` (which then sleeps instead of spinning). This
    /// crate's [`Event::synchronize`] polls either way.
    pub fn new_blocking_sync(device: &CudaDevice) -> Result<Event> {
        let flags =
            CUevent_flags::CU_EVENT_BLOCKING_SYNC.0 | CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        Event::create(device, flags, false)
    }

    /// The `CUevent`.
    pub fn raw(&self) -> CUevent {
        self.event
    }

    /// Whether the work before the event's last record is done (also `true`
    /// for an event never recorded); never blocks.
    pub fn query(&self) -> Result<bool> {
        let _guard = self.device.enter()?;
        // SAFETY: a live event of the current context.
        unsafe { cu_query!(cuEventQuery(self.event)) }
    }

    /// Waits until the event completes, at most `timeout` ([`Error::Timeout`]).
    /// Polls `cuEventQuery` the [`HostWait::Poll`] way (spin, yield, then
    /// sleeps of up to 1 ms); for a wait that sleeps until the work is done,
    /// take a [`Stream::completion`] where the event is recorded.
    pub fn synchronize(&self, timeout: Duration) -> Result<()> {
        let _guard = self.device.enter()?;
        poll_until(timeout, || {
            // SAFETY: a live event of the current context (the guard above
            // lives across the whole wait, on this thread).
            unsafe { cu_query!(cuEventQuery(self.event)) }
        })
    }

    /// Milliseconds between `start` and this event (both timing events,
    /// recorded and complete).
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        if !(self.timing && start.timing) {
            return Err(Error::InvalidArgument(
                "elapsed time needs two timing events (Event::new)".into(),
            ));
        }
        self.device.check_resource_device(&start.device.uuid())?;
        let _guard = self.device.enter()?;
        let mut ms = 0f32;
        // SAFETY: two live events of the current context; writes one float.
        unsafe { cu!(cuEventElapsedTime(&mut ms, start.event, self.event)) }?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // As for streams: a pending event behind a stuck external wait is
        // leaked rather than destroyed.
        if !self.query().unwrap_or(true) {
            if let Err(why) = device_settled(&self.device) {
                report_leak("a pending event", &why);
                return;
            }
        }
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: a live event of the current context, destroyed once; a
            // pending one is released by the driver when it completes.
            record_drop_error(unsafe { cu!(cuEventDestroy(self.event)) });
        }
    }
}

/// Makes `later` wait for the work enqueued so far on `earlier`, through an
/// event made for this one join and destroyed at once.
///
/// The event is destroyed with `cuEventDestroy` while it may be pending,
/// which the driver allows (it releases the event when it completes, and
/// the wait has captured its record already). An [`Event`] would instead
/// wait in its `Drop` for the device to settle, which can take up to
/// [`DROP_WAIT_LIMIT`] behind an external wait and is no place for a join
/// that must not block.
///
/// # Safety
/// `earlier` and `later` are each `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`
/// or a live stream of `device`'s context, alive for the duration of the
/// call.
pub(crate) unsafe fn order_streams(
    device: &CudaDevice,
    earlier: CUstream,
    later: CUstream,
) -> Result<()> {
    let _guard = device.enter()?;
    let event = create_untimed_event()?;
    // SAFETY: a live event of the current context; the caller vouches for
    // `earlier`.
    let mut joined = unsafe { cu!(cuEventRecord(event, earlier)) };
    if joined.is_ok() {
        // SAFETY: a live event of the current context, just recorded; the
        // caller vouches for `later`. The wait captures that record now.
        joined = unsafe { cu!(cuStreamWaitEvent(later, event, 0)) };
    }
    // SAFETY: a live event of the current context, destroyed once, after
    // its last use; pending, it is released by the driver when it completes.
    let destroyed = unsafe { cu!(cuEventDestroy(event)) };
    joined.and(destroyed)
}

/// A loaded module (PTX, JIT-compiled by the driver).
#[derive(Debug)]
pub struct Module {
    device: CudaDevice,
    module: CUmodule,
    /// Launches made through [`Stream::launch_tracked`]: the module is
    /// unloaded only after they completed.
    last_use: LastUse,
}

// SAFETY: a module handle is usable from any thread with the context current.
unsafe impl Send for Module {}
// SAFETY: getting functions is thread-safe.
unsafe impl Sync for Module {}

impl Module {
    /// Loads PTX source text.
    pub fn load_ptx(device: &CudaDevice, ptx: &str) -> Result<Module> {
        let source = CString::new(ptx)
            .map_err(|_| Error::InvalidArgument("PTX contains a NUL byte".into()))?;
        let _guard = device.enter()?;
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: `source` is a NUL-terminated PTX image that outlives the
        // call; the device's context is current; writes one module handle.
        unsafe { cu!(cuModuleLoadData(&mut module, source.as_ptr().cast())) }?;
        Ok(Module {
            device: device.clone(),
            module,
            last_use: LastUse::new(device),
        })
    }

    /// A kernel by name.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let name_c = CString::new(name)
            .map_err(|_| Error::InvalidArgument("kernel name contains NUL".into()))?;
        let _guard = self.device.enter()?;
        let mut function: CUfunction = std::ptr::null_mut();
        // SAFETY: a live module of the current context and a NUL-terminated
        // name that outlives the call; writes one function handle.
        unsafe {
            cu!(cuModuleGetFunction(
                &mut function,
                self.module,
                name_c.as_ptr()
            ))
        }?;
        Ok(Function {
            function,
            module: self,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // Tracked launches of its kernels must have completed first; an
        // untracked one (`Stream::launch`) is its launcher's concern.
        if let Err(why) = self.last_use.wait_before_release(DROP_WAIT_LIMIT) {
            report_leak("a module with kernels in flight", &why);
            return;
        }
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: a live module of the current context, unloaded once;
            // its functions borrow it, so none is left to launch, and its
            // tracked launches have completed.
            record_drop_error(unsafe { cu!(cuModuleUnload(self.module)) });
        }
    }
}

impl Module {
    /// The device the module is loaded on.
    pub(crate) fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Its tracked launches.
    pub(crate) fn last_use(&self) -> &LastUse {
        &self.last_use
    }
}

/// A kernel of a [`Module`], borrowed from it.
#[derive(Debug)]
pub struct Function<'m> {
    function: CUfunction,
    module: &'m Module,
}

impl<'m> Function<'m> {
    /// The driver handle (`CUfunction`), valid while its [`Module`] lives.
    pub fn raw(&self) -> CUfunction {
        self.function
    }

    /// The module the kernel belongs to.
    pub(crate) fn module(&self) -> &'m Module {
        self.module
    }
}
