//! PTX modules and their kernels: a [`Module`] loaded in the device's
//! primary context, and a [`Function`] borrowed from it.
//!
//! # Contract
//!
//! * A module is unloaded only after the launches made through
//!   [`Stream::launch_tracked`](crate::Stream::launch_tracked) have
//!   completed (its own last-use record), at most
//!   [`DROP_WAIT_LIMIT`]; past that it is leaked and reported. An untracked
//!   launch ([`Stream::launch`](crate::Stream::launch)) is its launcher's
//!   concern.
//! * A [`Function`] borrows its module, so none is left to launch once the
//!   module is dropped.

use std::ffi::CString;

use cuda_interop_sys::{CUfunction, CUmodule};

use crate::context::CudaDevice;
use crate::driver::{cu, record_drop_error};
use crate::error::{Error, Result};
use crate::events::{report_leak, DROP_WAIT_LIMIT};
use crate::last_use::LastUse;

/// A loaded module (PTX, JIT-compiled by the driver).
#[derive(Debug)]
pub struct Module {
    device: CudaDevice,
    module: CUmodule,
    /// Launches made through
    /// [`Stream::launch_tracked`](crate::Stream::launch_tracked): the module is
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
