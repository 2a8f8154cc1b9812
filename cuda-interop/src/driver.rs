//! The one place that turns driver calls into `Result`s: loading, `cuInit`
//! once, the fork check, error names and hints, and the poisoned state.
//!
//! # Contract
//!
//! * Every driver call of the crate goes through [`cu!`] or [`cu_query!`]
//!   inside the caller's own `unsafe { }` block with a `// SAFETY:` comment;
//!   the macros hold no `unsafe` of their own.
//! * [`api`] refuses calls in a poisoned process or a forked child;
//!   [`loaded_for_cleanup`] skips those checks and is used only to undo what
//!   this process already did (popping a pushed context). The fork check is
//!   an atomic load, set in the child by a `pthread_atfork` handler
//!   registered before `cuInit`, not a `getpid` per call (a system call:
//!   0.4 µs on CI's machines, several per semaphore signal and wait); if
//!   the handler cannot be registered, every call compares the pid as
//!   before. A child made without libc's `fork()` (glibc's `_Fork`, a raw
//!   `clone` or `fork` system call), which runs no fork handlers, is not
//!   seen.
//! * Destructors cannot return errors: they report them through
//!   [`record_drop_error`], counted by [`drop_errors`].
//! * [`create_event`] is the crate's one `cuEventCreate`: events, last-use
//!   records, completions and stream joins all make theirs through it.

use std::ffi::{c_char, CStr};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;

use cuda_interop_sys::{CUevent, CUevent_flags, CUresult, Driver, DriverFns};

use crate::error::{DriverError, Error, Result};

struct Initialised {
    pid: u32,
    /// The fork handler could not be registered (`pthread_atfork` ran out
    /// of memory): every call compares the pid instead, as before it.
    compare_pids: bool,
}

static INIT: OnceLock<std::result::Result<Initialised, DriverError>> = OnceLock::new();
/// The sticky error code that poisoned the process, or 0.
static POISONED: AtomicU32 = AtomicU32::new(0);
/// Set in every child forked after `api` registered its fork handler
/// (right before `cuInit`; a child of a process whose `cuInit` failed is
/// marked too, and refused like any other).
static FORKED: AtomicBool = AtomicBool::new(false);

/// Runs in the child of every `fork()` once the handler is registered: one
/// atomic store, which is async-signal-safe.
extern "C" fn mark_forked_child() {
    FORKED.store(true, Ordering::Relaxed);
}

/// The process-wide driver, initialised (`cuInit(0)`) once.
pub(crate) fn api() -> Result<&'static Driver> {
    let driver =
        Driver::global().map_err(|e| Error::Unsupported(format!("no CUDA driver: {e}")))?;
    let init = INIT.get_or_init(|| {
        let pid = std::process::id();
        let Some(cu_init) = driver.fns().cuInit else {
            return Err(error_for(driver, "cuInit", CUresult::CUDA_ERROR_NOT_FOUND));
        };
        // Before cuInit, so that no child forked after it can miss the mark.
        // SAFETY: registers a handler for the child side only, a function
        // that makes one atomic store (allowed between fork and exec).
        let registered = unsafe { libc::pthread_atfork(None, None, Some(mark_forked_child)) };
        // SAFETY: cuInit takes a flags word that must be 0.
        let status = unsafe { cu_init(0) };
        if status == CUresult::CUDA_SUCCESS {
            Ok(Initialised {
                pid,
                compare_pids: registered != 0,
            })
        } else {
            Err(error_for(driver, "cuInit", status))
        }
    });
    let init = init.as_ref().map_err(|e| Error::Driver(e.clone()))?;
    if FORKED.load(Ordering::Relaxed) || (init.compare_pids && std::process::id() != init.pid) {
        return Err(Error::ForkedChild {
            parent: init.pid,
            child: std::process::id(),
        });
    }
    let poisoned = POISONED.load(Ordering::Relaxed);
    if poisoned != 0 {
        return Err(Error::Poisoned(error_name(driver, CUresult(poisoned))));
    }
    Ok(driver)
}

fn error_name(driver: &Driver, code: CUresult) -> String {
    let mut p: *const c_char = std::ptr::null();
    if let Some(get) = driver.fns().cuGetErrorName {
        // SAFETY: writes a pointer to a static string or leaves it null.
        unsafe { get(code, &mut p) };
    }
    if p.is_null() {
        format!("CUDA error {}", code.0)
    } else {
        // SAFETY: a NUL-terminated static string from the driver.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn error_description(driver: &Driver, code: CUresult) -> String {
    let mut p: *const c_char = std::ptr::null();
    if let Some(get) = driver.fns().cuGetErrorString {
        // SAFETY: as in error_name.
        unsafe { get(code, &mut p) };
    }
    if p.is_null() {
        "no description".into()
    } else {
        // SAFETY: as in error_name.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Known causes, named after the invariant to check.
fn hint(call: &str, code: CUresult) -> Option<&'static str> {
    match (call, code) {
        ("cuExternalMemoryGetMappedMipmappedArray", CUresult::CUDA_ERROR_INVALID_VALUE) => Some(
            "check that the image is OPTIMAL-tiled in DEVICE_LOCAL memory, was imported with its \
             VkMemoryRequirements.size, and that format, channels, extent, levels and flags match the VkImage",
        ),
        ("cuImportExternalMemory", CUresult::CUDA_ERROR_INVALID_VALUE | CUresult::CUDA_ERROR_INVALID_HANDLE) => Some(
            "the fd must be a fresh OPAQUE_FD export of memory on this GPU, with size = allocationSize and \
             the dedicated flag matching the Vulkan allocation",
        ),
        (
            "cuImportExternalMemory" | "cuImportExternalSemaphore",
            CUresult::CUDA_ERROR_OPERATING_SYSTEM | CUresult::CUDA_ERROR_UNKNOWN,
        ) => Some("the fd is not a GPU export of this kind (a regular file, pipe or closed fd?)"),
        ("cuDevicePrimaryCtxRetain", CUresult::CUDA_ERROR_UNKNOWN) => {
            Some("the device's compute mode may be PROHIBITED")
        }
        (_, CUresult::CUDA_ERROR_OUT_OF_MEMORY) => Some("the GPU is out of memory"),
        _ => None,
    }
}

fn is_sticky(code: CUresult) -> bool {
    matches!(
        code,
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
            | CUresult::CUDA_ERROR_LAUNCH_FAILED
            | CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUresult::CUDA_ERROR_MISALIGNED_ADDRESS
            | CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUresult::CUDA_ERROR_INVALID_PC
            | CUresult::CUDA_ERROR_ECC_UNCORRECTABLE
    )
}

fn error_for(driver: &Driver, call: &'static str, code: CUresult) -> DriverError {
    DriverError {
        call,
        code,
        name: error_name(driver, code),
        description: error_description(driver, code),
        hint: hint(call, code),
    }
}

/// `Ok` for `CUDA_SUCCESS`, else an error naming `call`; sticky errors
/// poison the process.
pub(crate) fn check(driver: &Driver, call: &'static str, code: CUresult) -> Result<()> {
    if code == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    if is_sticky(code) {
        POISONED.store(code.0, Ordering::Relaxed);
    }
    Err(Error::Driver(error_for(driver, call, code)))
}

/// Looks `function` up in the driver's table, calls it through `invoke`, and
/// turns its status into a `Result` (what [`cu!`] expands to).
pub(crate) fn call<F>(
    function: &'static str,
    pick: impl FnOnce(&DriverFns) -> Option<F>,
    invoke: impl FnOnce(F) -> CUresult,
) -> Result<()> {
    let driver = api()?;
    let pointer = driver.get(pick, function)?;
    check(driver, function, invoke(pointer))
}

/// As [`call`], for a query that answers `CUDA_SUCCESS` (done, `true`) or
/// `CUDA_ERROR_NOT_READY` (not yet, `false`); anything else is an error.
pub(crate) fn call_query<F>(
    function: &'static str,
    pick: impl FnOnce(&DriverFns) -> Option<F>,
    invoke: impl FnOnce(F) -> CUresult,
) -> Result<bool> {
    let driver = api()?;
    let pointer = driver.get(pick, function)?;
    match invoke(pointer) {
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        status => check(driver, function, status).map(|()| true),
    }
}

/// Calls a driver function by its API name and checks the result, as a
/// `Result<()>`: `unsafe { cu!(cuMemAlloc(&mut ptr, size)) }?`.
///
/// The macro contains no `unsafe`: the call of the driver function is only
/// allowed inside the caller's `unsafe { }` block, whose `// SAFETY:` comment
/// states why the arguments meet the function's contract (valid pointers,
/// live handles, the right context current). Without that block it does not
/// compile.
macro_rules! cu {
    ($name:ident ( $($arg:expr),* $(,)? )) => {
        $crate::driver::call(
            stringify!($name),
            |table| table.$name,
            |function| function($($arg),*),
        )
    };
}
pub(crate) use cu;

/// As [`cu!`], for `cuStreamQuery` and `cuEventQuery`: `Ok(true)` when the
/// work is done, `Ok(false)` while it is not (`CUDA_ERROR_NOT_READY`). Needs
/// the caller's `unsafe { }` block in the same way.
macro_rules! cu_query {
    ($name:ident ( $($arg:expr),* $(,)? )) => {
        $crate::driver::call_query(
            stringify!($name),
            |table| table.$name,
            |function| function($($arg),*),
        )
    };
}
pub(crate) use cu_query;

/// The loaded driver, without the poisoned and forked-child checks of
/// [`api`]: **for cleanup only** (a `ContextGuard` popping what it pushed
/// must still pop after a sticky error poisoned the process). `None` when no
/// driver was ever loaded.
pub(crate) fn loaded_for_cleanup() -> Option<&'static Driver> {
    Driver::global().ok()
}

static DROP_ERRORS: AtomicU32 = AtomicU32::new(0);

/// `Drop` cannot return errors; a failed destroy or free (an interposed
/// allocator refusing `cuMemFree`, a lost device) is counted and printed
/// instead of being lost.
pub(crate) fn record_drop_error(result: Result<()>) {
    if let Err(e) = result {
        DROP_ERRORS.fetch_add(1, Ordering::Relaxed);
        // Not `eprintln!`, which panics when stderr is gone (EPIPE): this
        // runs in destructors, DLPack deleters (extern "C") among them.
        let _ = writeln!(std::io::stderr(), "cuda-interop: a destructor failed: {e}");
    }
}

/// A new event with `flags` in the current context; the caller destroys it
/// (`cuEventDestroy`). Without a current context the driver refuses it
/// (`CUDA_ERROR_INVALID_CONTEXT`).
pub(crate) fn create_event(flags: u32) -> Result<CUevent> {
    let mut event: CUevent = std::ptr::null_mut();
    // SAFETY: writes one event handle into a live local; the driver checks
    // the current context and the flags.
    unsafe { cu!(cuEventCreate(&mut event, flags)) }?;
    Ok(event)
}

/// [`create_event`] without timing, for events only waited on or queried.
pub(crate) fn create_untimed_event() -> Result<CUevent> {
    create_event(CUevent_flags::CU_EVENT_DISABLE_TIMING.0)
}

/// How many destroy or free calls made by `Drop` implementations have failed
/// in this process (each was also printed to stderr).
pub fn drop_errors() -> u32 {
    DROP_ERRORS.load(Ordering::Relaxed)
}

/// The driver's version, if a driver is present.
pub fn driver_version() -> Result<cuda_interop_sys::DriverVersion> {
    let driver = api()?;
    driver
        .version()
        .ok_or_else(|| Error::Unsupported("cuDriverGetVersion failed".into()))
}
