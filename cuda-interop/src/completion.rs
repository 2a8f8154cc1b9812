//! [`Completion`]: a mark behind the work enqueued on a stream so far, that
//! the host can query, wait for with any [`HostWait`], or watch as an fd.
//!
//! # Contract
//!
//! * [`Stream::completion`](crate::Stream::completion) records an event
//!   (`DISABLE_TIMING`) on the stream and enqueues a host function
//!   (`cuLaunchHostFunc`) behind it that writes 1 to an eventfd. The event
//!   answers queries and spins; the eventfd wakes sleepers and event loops.
//! * **The host function's data is owned by the host function.** It gets one
//!   strong reference of an `Arc` ([`Arc::into_raw`]) and takes it back when
//!   it runs ([`Arc::from_raw`]), so however and whenever the [`Completion`]
//!   is dropped, the callback touches live memory. The `Arc` holds a
//!   duplicate of the eventfd under a mutex: the callback writes through it
//!   if it is still there; dropping the [`Completion`] (or a failed
//!   `cuLaunchHostFunc`) closes it under the same mutex. So no fd outlives
//!   its [`Completion`]: if the stream never reaches the host function
//!   (stuck behind a semaphore wait nobody signals), or the driver failed
//!   the launch but may still hold the function, only the `Arc`'s small
//!   allocation is leaked, never an fd, and never a use after free.
//! * The host function calls no CUDA function (the driver forbids it): it
//!   only writes the eventfd and drops its reference (closing the fd when it
//!   is the last one).
//! * Every wait is bounded by its timeout ([`Error::Timeout`]); none calls
//!   `cuEventSynchronize`. Dropping a [`Completion`] never waits: a pending
//!   event is released by the driver once it completes.
//! * The fd becomes readable once the work is done and the driver has run
//!   the host function behind it (on the H200, tens of µs after the event
//!   completes: a wait that spins on the event can return before the fd is
//!   readable), and stays readable (the crate never reads it):
//!   level-triggered `poll`/`epoll` report it every time, edge-triggered
//!   ones once. Do not read from it.
//! * With the `tokio` feature, [`Completion::wait_async`] consumes the
//!   completion into a future that registers its eventfd with tokio's
//!   reactor (`AsyncFd`). The future owns the completion, so dropping it
//!   unfinished is dropping the completion (above): the host function's
//!   state stays owned by the host function, and its write goes to a closed
//!   slot, never into freed memory or a reused fd number.

use std::ffi::c_void;
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cuda_interop_sys::CUevent;
use rustix::event::{eventfd, EventfdFlags};

use cuda_interop_sys::CUstream;

use crate::context::CudaDevice;
use crate::driver::{create_untimed_event, cu, cu_query, record_drop_error};
use crate::error::{Error, Result};
#[cfg(feature = "tokio")]
use crate::wait::BLOCK_SLICE;
use crate::wait::{block_until, poll_until, readable, spin_until, HostWait};

/// The work enqueued on a [`Stream`](crate::Stream) up to the moment
/// [`Stream::completion`](crate::Stream::completion) was called: query it,
/// wait for it, or watch its fd.
///
/// * [`is_done`](Completion::is_done) never blocks;
/// * [`wait`](Completion::wait) waits with [`HostWait::default()`] (spin
///   50 µs, then sleep on the fd), [`wait_with`](Completion::wait_with) with
///   any strategy, both bounded ([`Error::Timeout`]);
/// * it is [`AsFd`]: the eventfd becomes readable when the work is done
///   (once the driver's host function behind it has run, a little after
///   [`is_done`](Completion::is_done) turns true), so
///   it can join a `poll`/`epoll` set, a `mio` registry or a tokio `AsyncFd`
///   (do not read from it: it stays readable once done).
///
/// `Send + Sync` and `'static`: it holds a clone of the device, not the
/// stream, and may be waited for or dropped on any thread, before or after
/// the stream. Dropping it never waits.
///
/// ```no_run
/// use std::os::fd::AsFd;
/// use std::time::Duration;
/// use cuda_interop::{CudaDevice, HostWait, Stream};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let ctx = vk_export::Context::headless(&Default::default())?;
/// let cuda = CudaDevice::for_vulkan(&ctx)?;
/// let stream = Stream::new(&cuda)?;
/// // ... enqueue work on `stream` ...
/// let done = stream.completion()?;
/// // Wait the default way (spin 50 µs, then sleep on the eventfd) ...
/// done.wait(Duration::from_secs(1))?;
/// // ... or another way, or hand `done.as_fd()` to an event loop.
/// done.wait_with(HostWait::Block, Duration::from_secs(1))?;
/// assert!(done.is_done()?);
/// # Ok(()) }
/// ```
pub struct Completion {
    device: CudaDevice,
    /// Recorded on the stream just before the host function was enqueued.
    event: CUevent,
    /// The eventfd, read (polled) here.
    fd: OwnedFd,
    /// The host function holds another reference until it runs.
    signal: Arc<Signal>,
}

/// What the host function writes: a duplicate of the eventfd, closed (taken
/// out) when the [`Completion`] drops or its launch failed.
struct Signal {
    writer: Mutex<Option<OwnedFd>>,
}

impl Signal {
    fn writer(&self) -> MutexGuard<'_, Option<OwnedFd>> {
        // Whatever panicked while holding it, the Option is whole.
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// SAFETY: the event is a driver handle, usable from any thread with its
// context current (every use enters the device first); the eventfd and the
// device are Send.
unsafe impl Send for Completion {}
// SAFETY: `&self` methods only query the event (thread-safe in the driver)
// and poll the eventfd; nothing is mutated after construction.
unsafe impl Sync for Completion {}

/// The host function: signals the eventfd and drops its reference.
///
/// # Safety
/// `data` must come from `Arc::<Signal>::into_raw` and carry one strong
/// reference that this call owns (each pointer is handed to the driver once,
/// which calls this once).
unsafe extern "C" fn signal_done(data: *mut c_void) {
    // SAFETY: by this function's contract, `data` is one strong reference of
    // an `Arc<Signal>` that nothing else will take back.
    let signal = unsafe { Arc::from_raw(data.cast_const().cast::<Signal>()) };
    // An eventfd's counter cannot overflow from one write of 1, and the fd is
    // non-blocking: the write cannot fail or block. No CUDA call here. The
    // lock keeps the fd open for the write; gone means nobody listens.
    let writer = signal.writer();
    if let Some(fd) = writer.as_ref() {
        let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
    }
    drop(writer);
}

impl Completion {
    /// Marks the work enqueued on `stream` so far (see
    /// [`Stream::completion`](crate::Stream::completion)).
    ///
    /// # Safety
    /// `stream` is a live stream of `device`'s context, alive for the
    /// duration of the call.
    pub(crate) unsafe fn new(device: &CudaDevice, stream: CUstream) -> Result<Completion> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(|e| {
            Error::Unsupported(format!(
                "could not create an eventfd for a completion ({e}): close fds or raise the \
                 limit (ulimit -n), or wait with HostWait::Spin or HostWait::Poll"
            ))
        })?;
        let writer = fd.try_clone().map_err(|e| {
            Error::Unsupported(format!(
                "could not duplicate a completion's eventfd ({e}): close fds or raise the limit \
                 (ulimit -n), or wait with HostWait::Spin or HostWait::Poll"
            ))
        })?;
        let signal = Arc::new(Signal {
            writer: Mutex::new(Some(writer)),
        });
        let _guard = device.enter()?;
        let event = create_untimed_event()?;
        // From here the event is destroyed by the Completion's drop.
        let completion = Completion {
            device: device.clone(),
            event,
            fd,
            signal,
        };
        // SAFETY: a live event and a live stream, both of the current context.
        unsafe { cu!(cuEventRecord(event, stream)) }?;
        let data = Arc::into_raw(Arc::clone(&completion.signal))
            .cast_mut()
            .cast::<c_void>();
        // SAFETY: a live stream of the current context; `signal_done` calls
        // no CUDA function, and `data` is one strong reference of the Arc,
        // owned by the host function from now on (signal_done's contract).
        let launched = unsafe { cu!(cuLaunchHostFunc(stream, Some(signal_done), data)) };
        match launched {
            Ok(()) => Ok(completion),
            // The driver was called and failed: it may have kept the host
            // function (an error of earlier asynchronous work is reported
            // here too), so its reference is left to it: leaked if it never
            // runs, never freed under it. The duplicate fd is closed when
            // `completion` drops here, so only the allocation can leak.
            Err(e @ Error::Driver(_)) => Err(e),
            // Refused before the driver was called (poisoned, forked child,
            // no cuLaunchHostFunc): the reference is still ours.
            Err(e) => {
                // SAFETY: `data` came from Arc::into_raw above and the driver
                // never saw it: this takes back the one reference it carries.
                drop(unsafe { Arc::from_raw(data.cast_const().cast::<Signal>()) });
                Err(e)
            }
        }
    }

    /// The device.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Whether the marked work is done; never blocks. `true` once the fd is
    /// readable, else asks the driver (`cuEventQuery`), which may know a few
    /// µs before the host function has run.
    pub fn is_done(&self) -> Result<bool> {
        if self.is_signalled()? {
            return Ok(true);
        }
        let _guard = self.device.enter()?;
        self.query()
    }

    /// Whether the host function has written the eventfd (no driver call).
    pub(crate) fn is_signalled(&self) -> Result<bool> {
        readable(self.fd.as_fd(), Duration::ZERO)
    }

    /// `cuEventQuery`; the device's context must be current.
    fn query(&self) -> Result<bool> {
        // SAFETY: a live event of the current context (the caller's contract).
        unsafe { cu_query!(cuEventQuery(self.event)) }
    }

    /// Waits until the marked work is done, at most `timeout`
    /// ([`Error::Timeout`]; the work stays enqueued), with the default
    /// strategy, [`HostWait::ADAPTIVE`]: spin 50 µs on `cuEventQuery`, then
    /// sleep in `poll()` on the eventfd.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        self.wait_with(HostWait::default(), timeout)
    }

    /// Waits until the marked work is done, at most `timeout`
    /// ([`Error::Timeout`]), the way `strategy` says. A driver error
    /// (`cuEventQuery`) ends the wait with that error.
    pub fn wait_with(&self, strategy: HostWait, timeout: Duration) -> Result<()> {
        let _guard = self.device.enter()?;
        let fd = self.fd.as_fd();
        let query = || self.query();
        match strategy {
            HostWait::Spin => spin_until(timeout, query),
            HostWait::Poll => poll_until(timeout, query),
            HostWait::Block => block_until(fd, timeout, query),
            HostWait::Adaptive { spin } => {
                let start = Instant::now();
                match spin_until(spin.min(timeout), query) {
                    Err(Error::Timeout(_)) => {
                        block_until(fd, timeout.saturating_sub(start.elapsed()), query).map_err(
                            |e| match e {
                                Error::Timeout(_) => Error::Timeout(timeout),
                                other => other,
                            },
                        )
                    }
                    other => other,
                }
            }
        }
    }
}

#[cfg(feature = "tokio")]
impl Completion {
    /// Waits for the marked work as a future on tokio's reactor, at most
    /// `timeout` ([`Error::Timeout`]; the work stays enqueued): the future
    /// sleeps until the eventfd is readable, asking the driver
    /// (`cuEventQuery`) first and at least every 100 ms, as
    /// [`HostWait::Block`] does, so a driver error (a poisoned context) ends
    /// it with that error instead of the timeout.
    ///
    /// It takes the completion: the future owns it (and its eventfd, which
    /// it registers with tokio), and drops it when it completes or is
    /// dropped. **Cancellation-safe:** a future dropped unfinished drops the
    /// completion, whose host function still owns its own state (see the
    /// module's contract) and finds its eventfd closed, so nothing can later
    /// write into freed memory or into a reused fd; the work stays enqueued.
    ///
    /// Needs a tokio runtime with I/O and time enabled (`Builder::enable_all`,
    /// as `#[tokio::main]` does); tokio panics when it is polled outside one.
    ///
    /// ```no_run
    /// # async fn example(stream: &cuda_interop::Stream) -> Result<(), cuda_interop::Error> {
    /// use std::time::Duration;
    /// // ... enqueue work on `stream` ...
    /// stream.completion()?.wait_async(Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    pub fn wait_async(
        self,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        use tokio::io::unix::AsyncFd;
        use tokio::io::Interest;

        /// The completion as tokio's reactor sees it: its eventfd.
        struct Watched(Completion);
        impl std::os::fd::AsRawFd for Watched {
            fn as_raw_fd(&self) -> std::os::fd::RawFd {
                std::os::fd::AsRawFd::as_raw_fd(&self.0.fd)
            }
        }

        async move {
            let deadline = tokio::time::Instant::now().checked_add(timeout);
            if self.is_done()? {
                return Ok(());
            }
            // SAFETY: the AsyncFd owns the completion, which owns the eventfd
            // and never closes or replaces it while it lives: the fd stays
            // open, the same file, until the AsyncFd drops (tokio's condition).
            let watched =
                unsafe { AsyncFd::register_with_interest(Watched(self), Interest::READABLE) }
                    .map_err(|e| {
                        Error::Unsupported(format!(
                        "could not register a completion's eventfd with the tokio reactor ({}); \
                         wait with Completion::wait in spawn_blocking instead",
                        std::io::Error::from(e)
                    ))
                    })?;
            let completion = &watched.get_ref().0;
            loop {
                let slice = match deadline {
                    Some(deadline) => {
                        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                        if left.is_zero() {
                            return Err(Error::Timeout(timeout));
                        }
                        left.min(BLOCK_SLICE)
                    }
                    // A bound too far to add to now: only the work ends it.
                    None => BLOCK_SLICE,
                };
                // Elapsed: a slice has passed; ask the driver below.
                if let Ok(ready) = tokio::time::timeout(slice, watched.readable()).await {
                    let mut ready = ready.map_err(|e| {
                        Error::Unsupported(format!(
                            "tokio could not watch a completion's eventfd ({e}); wait with \
                             Completion::wait in spawn_blocking instead"
                        ))
                    })?;
                    if completion.is_signalled()? {
                        return Ok(());
                    }
                    ready.clear_ready();
                }
                if completion.is_done()? {
                    return Ok(());
                }
            }
        }
    }
}

impl AsFd for Completion {
    /// The eventfd: readable once the marked work is done and the host
    /// function behind it has run (and for ever after). Do not read from it.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("device", &self.device)
            .field("event", &self.event)
            .field("fd", &self.fd)
            .finish()
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: a live event of the current context, destroyed once; a
            // pending one is released by the driver when it completes, as
            // cuEventDestroy documents. The host function does not use it.
            record_drop_error(unsafe { cu!(cuEventDestroy(self.event)) });
        }
        // Closes the host function's duplicate under the lock it writes
        // under: if it has not run, it will find nothing to write to, and
        // only its `Arc` (no fd) waits for it.
        drop(self.signal.writer().take());
    }
}
