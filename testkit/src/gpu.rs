//! The real CUDA driver, for the tests that need an NVIDIA GPU: a Vulkan
//! context and the CUDA device paired with it, the driver table, versioned
//! driver symbols and the calling thread's current context.
//!
//! # Contract
//!
//! Every function here panics (with what is missing) where there is no CUDA
//! driver or no CUDA device with the Vulkan device's UUID: callers are GPU
//! tests, `#[ignore]`d where there is no GPU.

use std::ffi::{c_void, CStr};
use std::time::{Duration, Instant};

use cuda_interop::{sys, CudaDevice};
use vk_export::Context;

/// A Vulkan context (validation on) and the CUDA device with its UUID.
pub fn pair() -> (Context, CudaDevice) {
    let ctx = crate::vulkan(None);
    let cuda = CudaDevice::for_vulkan(&ctx).expect("a CUDA device with the Vulkan device's UUID");
    (ctx, cuda)
}

/// The process's CUDA driver table.
pub fn driver() -> &'static sys::Driver {
    sys::Driver::global().expect("the CUDA driver")
}

/// A versioned driver symbol (not in the bindings' table) by its exact
/// exported name, so that the ABI is the one the name fixes (`cuCtxCreate`
/// through `cuGetProcAddress` resolves to another ABI on CUDA 13 drivers).
pub fn driver_function(name: &CStr) -> *mut c_void {
    static LIBRARY: std::sync::OnceLock<libloading::Library> = std::sync::OnceLock::new();
    // SAFETY: libcuda is already loaded by this process (the driver table);
    // loading it again runs no initialisers twice.
    let library =
        LIBRARY.get_or_init(|| unsafe { libloading::Library::new("libcuda.so.1") }.unwrap());
    // SAFETY: only the address is read here; the caller transmutes it to the
    // symbol's documented signature.
    let symbol = unsafe { library.get::<*mut c_void>(name.to_bytes_with_nul()) }
        .unwrap_or_else(|e| panic!("{name:?}: {e}"));
    let pointer = *symbol;
    assert!(!pointer.is_null(), "{name:?}");
    pointer
}

/// The calling thread's current context.
pub fn current() -> sys::CUcontext {
    let get = driver().fns().cuCtxGetCurrent.unwrap();
    let mut context: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle.
    assert_eq!(unsafe { get(&mut context) }, sys::CUresult::CUDA_SUCCESS);
    context
}

/// How long `f` takes (for bounds on waits and drops, never for speed).
pub fn time(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}
