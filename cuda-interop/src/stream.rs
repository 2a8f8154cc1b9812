use std::cell::Cell;
use std::ffi::{c_void, CString};
use std::marker::PhantomData;

use cuda_interop_sys::{
    CUdeviceptr, CUevent, CUevent_flags, CUfunction, CUmodule, CUstream, CUstream_flags,
};

use crate::device::CudaDevice;
use crate::driver::cu;
use crate::error::{Error, Result};
use crate::memory::DeviceSlice;

/// A CUDA stream in the paired device's primary context.
///
/// `Send` but not `Sync`: work enqueued from two threads at once would have no
/// defined order, so enqueueing needs the one owner (or a lock).
#[derive(Debug)]
pub struct Stream {
    device: CudaDevice,
    stream: CUstream,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: a stream handle may be used from any thread with its context current
// (every method enters the context first).
unsafe impl Send for Stream {}

impl Stream {
    /// A new non-blocking stream.
    pub fn new(device: &CudaDevice) -> Result<Stream> {
        let _guard = device.enter()?;
        let mut stream: CUstream = std::ptr::null_mut();
        // SAFETY: the context is current; writes the handle.
        cu!(cuStreamCreate(
            &mut stream,
            CUstream_flags::CU_STREAM_NON_BLOCKING.0
        ))?;
        Ok(Stream {
            device: device.clone(),
            stream,
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

    /// Blocks until all work enqueued so far is done.
    pub fn synchronize(&self) -> Result<()> {
        let _guard = self.device.enter()?;
        // SAFETY: a live stream of the current context.
        cu!(cuStreamSynchronize(self.stream))
    }

    /// Launches a kernel.
    ///
    /// # Safety
    /// `args` must point to one value per kernel parameter, of exactly the
    /// parameter's type, and the kernel must only access memory that stays
    /// valid until the stream reaches it (mapped imports and buffers outlive
    /// the launch when they are borrowed until a `synchronize`).
    pub unsafe fn launch(
        &self,
        function: &Function<'_>,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let _guard = self.device.enter()?;
        // SAFETY: the caller guarantees the arguments; the function belongs to
        // a module loaded in this context.
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

    /// Copies device memory to the host, synchronously.
    pub fn copy_to_host(&self, src: &DeviceBuffer, dst: &mut [u8]) -> Result<()> {
        if dst.len() > src.len {
            return Err(Error::InvalidArgument(format!(
                "{} bytes from a buffer of {}",
                dst.len(),
                src.len
            )));
        }
        let _guard = self.device.enter()?;
        // SAFETY: both ranges are valid for dst.len() bytes; synchronised below.
        cu!(cuMemcpyDtoHAsync(
            dst.as_mut_ptr().cast(),
            src.ptr,
            dst.len(),
            self.stream
        ))?;
        // SAFETY: a live stream.
        cu!(cuStreamSynchronize(self.stream))
    }

    /// Copies host memory to the device, synchronously.
    pub fn copy_from_host(&self, src: &[u8], dst: &mut DeviceBuffer) -> Result<()> {
        if src.len() > dst.len {
            return Err(Error::InvalidArgument(format!(
                "{} bytes into a buffer of {}",
                src.len(),
                dst.len
            )));
        }
        let _guard = self.device.enter()?;
        // SAFETY: both ranges are valid for src.len() bytes; synchronised below.
        cu!(cuMemcpyHtoDAsync(
            dst.ptr,
            src.as_ptr().cast(),
            src.len(),
            self.stream
        ))?;
        // SAFETY: a live stream.
        cu!(cuStreamSynchronize(self.stream))
    }

    /// Copies a mapped range into `dst` on this stream and waits for it (so
    /// the mapping cannot be unmapped while the copy reads it).
    pub fn copy_device(&self, src: &DeviceSlice<'_>, dst: &mut DeviceBuffer) -> Result<()> {
        let len = src.len() as usize;
        if len > dst.len {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes into a buffer of {}",
                dst.len
            )));
        }
        let _guard = self.device.enter()?;
        // SAFETY: dst holds len bytes; the slice was bounds-checked against the
        // mapping it borrows, and unmapping (cuMemFree) waits for this copy.
        cu!(cuMemcpyDtoDAsync(
            dst.ptr,
            src.device_ptr(),
            len,
            self.stream
        ))
    }

    /// Records an event (for timing and host waits).
    pub fn record(&self, event: &Event) -> Result<()> {
        let _guard = self.device.enter()?;
        // SAFETY: both live in the current context.
        cu!(cuEventRecord(event.event, self.stream))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(_guard) = self.device.enter() {
            // Streams are destroyed asynchronously; pending work still completes.
            crate::driver::record_drop_error((|| -> Result<()> {
                // SAFETY: a live stream, not used again.
                cu!(cuStreamDestroy(self.stream))
            })());
        }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    device: CudaDevice,
    ptr: CUdeviceptr,
    len: usize,
}

// SAFETY: a device address, usable from any thread with the context current.
unsafe impl Send for DeviceBuffer {}
// SAFETY: shared access only reads the handle.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// `len` bytes of uninitialised device memory.
    pub fn new(device: &CudaDevice, len: usize) -> Result<DeviceBuffer> {
        if len == 0 {
            return Err(Error::InvalidArgument("a device buffer of 0 bytes".into()));
        }
        let _guard = device.enter()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: the context is current; writes the address.
        cu!(cuMemAlloc(&mut ptr, len))?;
        Ok(DeviceBuffer {
            device: device.clone(),
            ptr,
            len,
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
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: allocated by cuMemAlloc in this context, freed once.
            crate::driver::record_drop_error((|| -> Result<()> { cu!(cuMemFree(self.ptr)) })());
        }
    }
}

/// A CUDA event.
#[derive(Debug)]
pub struct Event {
    device: CudaDevice,
    event: CUevent,
}

// SAFETY: an event handle is usable from any thread with the context current.
unsafe impl Send for Event {}
// SAFETY: queries and waits are thread-safe in the driver.
unsafe impl Sync for Event {}

impl Event {
    /// A new timing event.
    pub fn new(device: &CudaDevice) -> Result<Event> {
        let _guard = device.enter()?;
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: the context is current.
        cu!(cuEventCreate(&mut event, CUevent_flags::CU_EVENT_DEFAULT.0))?;
        Ok(Event {
            device: device.clone(),
            event,
        })
    }
    /// Blocks until the event completes.
    pub fn synchronize(&self) -> Result<()> {
        let _guard = self.device.enter()?;
        // SAFETY: a live event.
        cu!(cuEventSynchronize(self.event))
    }
    /// Milliseconds between `start` and this event (both recorded and complete).
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        let _guard = self.device.enter()?;
        let mut ms = 0f32;
        // SAFETY: two live events of this context.
        cu!(cuEventElapsedTime(&mut ms, start.event, self.event))?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: a live event, destroyed once.
            crate::driver::record_drop_error((|| -> Result<()> {
                cu!(cuEventDestroy(self.event))
            })());
        }
    }
}

/// A loaded module (PTX, JIT-compiled by the driver).
#[derive(Debug)]
pub struct Module {
    device: CudaDevice,
    module: CUmodule,
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
        // SAFETY: a NUL-terminated image; the context is current.
        cu!(cuModuleLoadData(&mut module, source.as_ptr().cast()))?;
        Ok(Module {
            device: device.clone(),
            module,
        })
    }

    /// A kernel by name.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let name_c = CString::new(name)
            .map_err(|_| Error::InvalidArgument("kernel name contains NUL".into()))?;
        let _guard = self.device.enter()?;
        let mut function: CUfunction = std::ptr::null_mut();
        // SAFETY: a live module and a NUL-terminated name.
        cu!(cuModuleGetFunction(
            &mut function,
            self.module,
            name_c.as_ptr()
        ))?;
        Ok(Function {
            function,
            _module: PhantomData,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: a live module, unloaded once; functions borrow it.
            crate::driver::record_drop_error((|| -> Result<()> {
                cu!(cuModuleUnload(self.module))
            })());
        }
    }
}

/// A kernel of a [`Module`], borrowed from it.
#[derive(Debug)]
pub struct Function<'m> {
    function: CUfunction,
    _module: PhantomData<&'m Module>,
}
