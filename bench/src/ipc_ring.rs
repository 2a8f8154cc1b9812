//! S9's CUDA-only peer: what a user without Vulkan would share frames with.
//! A producer process allocates a ring of `cuMemAlloc` slots and one
//! interprocess event per slot, shares them with CUDA IPC
//! (`cuIpcGetMemHandle`, `cuIpcGetEventHandle`) over a `SOCK_SEQPACKET`
//! socket per consumer, and then sends one 48-byte packet per frame (and
//! gets one per release: the frame protocol's packet costs).
//!
//! # Contract
//!
//! * Both sides are child processes of the bench (`--s9-ipc-producer`,
//!   `--s9-ipc-consumer`); each gets its socket's number in an environment
//!   variable ([`FDS_ENV`], [`FD_ENV`]) and the frame count in
//!   [`FRAMES_ENV`]. Every receive has a timeout ([`RECV`]).
//! * Setup: the producer sends each consumer `"S9SU"`, the slot count, the
//!   slot size and the slots' memory handles and "produced" event handles;
//!   the consumer opens them and answers `"S9SR"` with one "released"
//!   interprocess event handle per slot of its own.
//! * Per frame (lossless: every consumer gets every frame): the producer
//!   waits for every consumer's release of the slot's previous frame (its
//!   packet, then `cuStreamWaitEvent` on that consumer's "released" event),
//!   writes the slot (`cuMemsetD32Async` of the whole slot), records the
//!   slot's "produced" event, waits for it on the host (as the frame
//!   ring's sender waits for its submission before it announces a frame),
//!   and sends the packet with three timestamps. A consumer, on the packet:
//!   `cuStreamWaitEvent` on "produced" and `cuStreamSynchronize` (the
//!   *hand-off*, what `frame_client --no-check` times for the frame ring),
//!   then records its "released" event and sends the release packet.
//! * A consumer prints one `s9_wire::FrameLine` per frame, after the last
//!   one (printing does not perturb the timing). The consumer closes its
//!   IPC mappings before it exits; the producer frees the slots only after
//!   every consumer's socket has hung up.
//! * The driver calls are resolved here with `dlsym` from `libcuda.so.1`
//!   (`cuda-interop-sys` binds no `cuIpc*` function); device ordinal 0 (or
//!   `BENCH_S9_DEVICE`), its primary context.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use cuda_interop_frames::sender::monotonic_ns;

use crate::s9_wire::{FrameLine, Kind, Packet, PACKET_LEN};
use crate::Res;

pub(crate) const PRODUCER_FLAG: &str = "--s9-ipc-producer";
pub(crate) const CONSUMER_FLAG: &str = "--s9-ipc-consumer";
/// The producer's sockets, comma-separated.
pub(crate) const FDS_ENV: &str = "BENCH_S9_FDS";
/// A consumer's socket.
pub(crate) const FD_ENV: &str = "BENCH_S9_FD";
pub(crate) const FRAMES_ENV: &str = "BENCH_S9_FRAMES";
/// The slots of both rings.
pub(crate) const SLOTS: usize = 4;
/// 1080p RGBA8, as the frame ring's slots.
pub(crate) const WIDTH: u32 = 1920;
pub(crate) const HEIGHT: u32 = 1080;
const BYTES: usize = WIDTH as usize * HEIGHT as usize * 4;
const RECV: Duration = Duration::from_secs(20);
const SETUP: [u8; 4] = *b"S9SU";
const SETUP_REPLY: [u8; 4] = *b"S9SR";

type R = c_int;
type Handle = *mut c_void;

/// `CUipcMemHandle` and `CUipcEventHandle`: 64 opaque bytes, by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct IpcHandle([u8; 64]);

/// The driver functions S9 calls, by their exported symbols.
struct Cu {
    init: unsafe extern "C" fn(c_uint) -> R,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> R,
    primary_retain: unsafe extern "C" fn(*mut Handle, c_int) -> R,
    set_current: unsafe extern "C" fn(Handle) -> R,
    stream_create: unsafe extern "C" fn(*mut Handle, c_uint) -> R,
    stream_synchronize: unsafe extern "C" fn(Handle) -> R,
    stream_wait_event: unsafe extern "C" fn(Handle, Handle, c_uint) -> R,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> R,
    mem_free: unsafe extern "C" fn(u64) -> R,
    memset_d32_async: unsafe extern "C" fn(u64, c_uint, usize, Handle) -> R,
    event_create: unsafe extern "C" fn(*mut Handle, c_uint) -> R,
    event_record: unsafe extern "C" fn(Handle, Handle) -> R,
    event_synchronize: unsafe extern "C" fn(Handle) -> R,
    ipc_get_mem: unsafe extern "C" fn(*mut IpcHandle, u64) -> R,
    ipc_open_mem: unsafe extern "C" fn(*mut u64, IpcHandle, c_uint) -> R,
    ipc_close_mem: unsafe extern "C" fn(u64) -> R,
    ipc_get_event: unsafe extern "C" fn(*mut IpcHandle, Handle) -> R,
    ipc_open_event: unsafe extern "C" fn(*mut Handle, IpcHandle) -> R,
    error_name: unsafe extern "C" fn(R, *mut *const std::ffi::c_char) -> R,
}

/// `CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS`.
const IPC_EVENT: c_uint = 2 | 4;
/// `CU_STREAM_NON_BLOCKING`.
const NON_BLOCKING: c_uint = 1;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
const LAZY_PEER: c_uint = 1;

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: `$lib` is a live dlopen handle and the name is
        // NUL-terminated.
        let p = unsafe { libc::dlsym($lib, concat!($name, "\0").as_ptr().cast()) };
        if p.is_null() {
            return Err(format!("libcuda.so.1 has no {}", $name).into());
        }
        // SAFETY: the symbol is the driver's export of that name, whose C
        // signature (cuda.h, CUDA 12/13) is the field's type: handles as
        // pointers, CUdeviceptr as u64, the IPC handles as 64-byte structs
        // passed by value.
        unsafe { fn_pointer(p) }
    }};
}

/// `p` as the function pointer type `F`.
///
/// # Safety
///
/// `F` is an `extern "C"` function pointer type whose signature is that of
/// the function at `p`.
unsafe fn fn_pointer<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked); the caller vouches for the signature.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

impl Cu {
    fn load() -> Res<Cu> {
        // SAFETY: opens the NVIDIA driver's library by its soname; its
        // initialisers are the driver's. The handle is never closed (the
        // process keeps the library, as `Driver::global` does).
        let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            return Err("cannot open libcuda.so.1 (no NVIDIA driver)".into());
        }
        Ok(Cu {
            init: sym!(lib, "cuInit"),
            device_get: sym!(lib, "cuDeviceGet"),
            primary_retain: sym!(lib, "cuDevicePrimaryCtxRetain"),
            set_current: sym!(lib, "cuCtxSetCurrent"),
            stream_create: sym!(lib, "cuStreamCreate"),
            stream_synchronize: sym!(lib, "cuStreamSynchronize"),
            stream_wait_event: sym!(lib, "cuStreamWaitEvent"),
            mem_alloc: sym!(lib, "cuMemAlloc_v2"),
            mem_free: sym!(lib, "cuMemFree_v2"),
            memset_d32_async: sym!(lib, "cuMemsetD32Async"),
            event_create: sym!(lib, "cuEventCreate"),
            event_record: sym!(lib, "cuEventRecord"),
            event_synchronize: sym!(lib, "cuEventSynchronize"),
            ipc_get_mem: sym!(lib, "cuIpcGetMemHandle"),
            ipc_open_mem: sym!(lib, "cuIpcOpenMemHandle_v2"),
            ipc_close_mem: sym!(lib, "cuIpcCloseMemHandle"),
            ipc_get_event: sym!(lib, "cuIpcGetEventHandle"),
            ipc_open_event: sym!(lib, "cuIpcOpenEventHandle"),
            error_name: sym!(lib, "cuGetErrorName"),
        })
    }

    /// `Err` naming `what` and the driver's error name unless `r` is success.
    fn ck(&self, r: R, what: &str) -> Res<()> {
        if r == 0 {
            return Ok(());
        }
        let mut name: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: writes a pointer to a static string, or fails.
        let named = unsafe { (self.error_name)(r, &mut name) } == 0 && !name.is_null();
        let name = if named {
            // SAFETY: cuGetErrorName gave a static NUL-terminated string.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("error {r}")
        };
        Err(format!("{what}: {name}").into())
    }

    /// cuInit, the device's primary context made current, a non-blocking
    /// stream.
    fn start(&self) -> Res<Handle> {
        let ordinal: c_int = match std::env::var("BENCH_S9_DEVICE") {
            Ok(v) => v.parse()?,
            Err(_) => 0,
        };
        // SAFETY: each call writes only through the out-pointer it is given
        // (locals); the context is current on this thread for every later
        // call, and retained for the life of the process.
        unsafe {
            self.ck((self.init)(0), "cuInit")?;
            let mut device = 0;
            self.ck((self.device_get)(&mut device, ordinal), "cuDeviceGet")?;
            let mut ctx = std::ptr::null_mut();
            self.ck(
                (self.primary_retain)(&mut ctx, device),
                "cuDevicePrimaryCtxRetain",
            )?;
            self.ck((self.set_current)(ctx), "cuCtxSetCurrent")?;
            let mut stream = std::ptr::null_mut();
            self.ck(
                (self.stream_create)(&mut stream, NON_BLOCKING),
                "cuStreamCreate",
            )?;
            Ok(stream)
        }
    }

    /// A new interprocess event and its handle.
    fn ipc_event(&self) -> Res<(Handle, IpcHandle)> {
        let mut event = std::ptr::null_mut();
        let mut handle = IpcHandle([0; 64]);
        // SAFETY: the context is current (`start`); both calls write only
        // through their out-pointers; the event lives as long as the process.
        unsafe {
            self.ck((self.event_create)(&mut event, IPC_EVENT), "cuEventCreate")?;
            self.ck(
                (self.ipc_get_event)(&mut handle, event),
                "cuIpcGetEventHandle",
            )?;
        }
        Ok((event, handle))
    }

    /// Opens an interprocess event handle.
    fn open_event(&self, handle: IpcHandle) -> Res<Handle> {
        let mut event = std::ptr::null_mut();
        // SAFETY: the context is current; writes the opened event.
        self.ck(
            unsafe { (self.ipc_open_event)(&mut event, handle) },
            "cuIpcOpenEventHandle",
        )?;
        Ok(event)
    }
}

/// A socket number from the environment variable `name`, owned from here.
fn inherited(value: &str) -> Res<OwnedFd> {
    let fd: RawFd = value.trim().parse()?;
    // SAFETY: the parent passed this socket's number, inherited open by this
    // process (FD_CLOEXEC cleared for it alone); nothing else here owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    set_timeout(&fd, RECV)?;
    Ok(fd)
}

/// `SO_RCVTIMEO` on `fd`.
pub(crate) fn set_timeout(fd: &OwnedFd, timeout: Duration) -> Res<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a live socket; the option value is a timeval of its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(format!(
            "setsockopt(SO_RCVTIMEO): {}",
            std::io::Error::last_os_error()
        )
        .into());
    }
    Ok(())
}

/// Sends one message whole.
fn send(fd: &OwnedFd, bytes: &[u8]) -> Res<()> {
    // SAFETY: a live socket and a readable buffer of that length.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n != bytes.len() as isize {
        return Err(format!("send: {}", std::io::Error::last_os_error()).into());
    }
    Ok(())
}

/// Receives one message into `buf`: its length (0: the peer hung up).
fn recv(fd: &OwnedFd, buf: &mut [u8]) -> Res<usize> {
    // SAFETY: a live socket and a writable buffer of that length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.kind() {
            std::io::ErrorKind::WouldBlock => format!("no message within {RECV:?}").into(),
            _ => format!("recv: {e}").into(),
        });
    }
    Ok(n as usize)
}

fn recv_packet(fd: &OwnedFd) -> Res<Packet> {
    let mut b = [0u8; 64];
    let n = recv(fd, &mut b)?;
    if n == 0 {
        return Err("the peer hung up".into());
    }
    Ok(Packet::decode(&b[..n])?)
}

fn frames_from_env() -> Res<u64> {
    Ok(std::env::var(FRAMES_ENV)?.parse()?)
}

/// The producer process's main.
pub(crate) fn producer_main() -> Res<()> {
    let frames = frames_from_env()?;
    let sockets = std::env::var(FDS_ENV)?
        .split(',')
        .map(inherited)
        .collect::<Res<Vec<_>>>()?;
    let cu = Cu::load()?;
    let stream = cu.start()?;
    let mut slots = [0u64; SLOTS];
    let mut setup = Vec::with_capacity(16 + 128 * SLOTS);
    setup.extend_from_slice(&SETUP);
    setup.extend_from_slice(&(SLOTS as u32).to_le_bytes());
    setup.extend_from_slice(&(BYTES as u64).to_le_bytes());
    for slot in &mut slots {
        let mut handle = IpcHandle([0; 64]);
        // SAFETY: the context is current; writes the allocation and its
        // handle. Freed at the end, after every consumer hung up.
        unsafe {
            cu.ck((cu.mem_alloc)(slot, BYTES), "cuMemAlloc")?;
            cu.ck((cu.ipc_get_mem)(&mut handle, *slot), "cuIpcGetMemHandle")?;
        }
        setup.extend_from_slice(&handle.0);
    }
    let mut produced = Vec::with_capacity(SLOTS);
    for _ in 0..SLOTS {
        let (event, handle) = cu.ipc_event()?;
        produced.push(event);
        setup.extend_from_slice(&handle.0);
    }
    for s in &sockets {
        send(s, &setup)?;
    }
    // Each consumer's "released" events.
    let mut released = Vec::with_capacity(sockets.len());
    for s in &sockets {
        let mut b = vec![0u8; 8 + 64 * SLOTS + 1];
        let n = recv(s, &mut b)?;
        if n != 8 + 64 * SLOTS || b[0..4] != SETUP_REPLY {
            return Err(format!("a consumer's setup reply of {n} bytes is not one").into());
        }
        let events = (0..SLOTS)
            .map(|i| {
                let mut h = IpcHandle([0; 64]);
                h.0.copy_from_slice(&b[8 + 64 * i..8 + 64 * (i + 1)]);
                cu.open_event(h)
            })
            .collect::<Res<Vec<_>>>()?;
        released.push(events);
    }
    let mut last_release = vec![0u64; sockets.len()];
    let mut await_releases = |upto: u64, slot: Option<usize>| -> Res<()> {
        for (c, s) in sockets.iter().enumerate() {
            while last_release[c] < upto {
                let p = recv_packet(s)?;
                if p.kind != Kind::Release || p.sequence != last_release[c] + 1 {
                    return Err(format!(
                        "consumer {c} sent {:?} {} after release {}",
                        p.kind, p.sequence, last_release[c]
                    )
                    .into());
                }
                last_release[c] = p.sequence;
            }
            if let Some(slot) = slot {
                // SAFETY: a live stream and an opened event of this context.
                cu.ck(
                    unsafe { (cu.stream_wait_event)(stream, released[c][slot], 0) },
                    "cuStreamWaitEvent (released)",
                )?;
            }
        }
        Ok(())
    };
    for n in 0..frames {
        let s = (n % SLOTS as u64) as usize;
        let sequence = n + 1;
        if sequence > SLOTS as u64 {
            await_releases(sequence - SLOTS as u64, Some(s))?;
        }
        let called = monotonic_ns();
        // SAFETY: the slot's allocation of BYTES bytes (a multiple of 4) on
        // this context's stream; the consumers' reads of its last frame
        // are ordered before it (the waits above).
        unsafe {
            cu.ck(
                (cu.memset_d32_async)(slots[s], n as c_uint, BYTES / 4, stream),
                "cuMemsetD32Async",
            )?;
            cu.ck((cu.event_record)(produced[s], stream), "cuEventRecord")?;
            cu.ck((cu.event_synchronize)(produced[s]), "cuEventSynchronize")?;
        }
        let gpu_done = monotonic_ns();
        for sock in &sockets {
            let packet = Packet {
                kind: Kind::Frame,
                slot: s as u32,
                sequence,
                times: [called, gpu_done, monotonic_ns()],
            };
            send(sock, &packet.encode())?;
        }
    }
    await_releases(frames, None)?;
    // SAFETY: a live stream of the current context.
    cu.ck(
        unsafe { (cu.stream_synchronize)(stream) },
        "cuStreamSynchronize",
    )?;
    // Every consumer closes its mappings before it hangs up.
    for s in &sockets {
        let mut b = [0u8; 64];
        if recv(s, &mut b)? != 0 {
            return Err("a consumer sent more after its last release".into());
        }
    }
    for slot in slots {
        // SAFETY: allocated above; no work uses it (the stream drained) and
        // no consumer maps it any more.
        cu.ck(unsafe { (cu.mem_free)(slot) }, "cuMemFree")?;
    }
    Ok(())
}

/// A consumer process's main.
pub(crate) fn consumer_main() -> Res<()> {
    let frames = frames_from_env()?;
    let socket = inherited(&std::env::var(FD_ENV)?)?;
    let cu = Cu::load()?;
    let stream = cu.start()?;
    let mut b = vec![0u8; 16 + 128 * SLOTS + 1];
    let n = recv(&socket, &mut b)?;
    if n != 16 + 128 * SLOTS
        || b[0..4] != SETUP
        || b[4..8] != (SLOTS as u32).to_le_bytes()
        || b[8..16] != (BYTES as u64).to_le_bytes()
    {
        return Err(format!("a setup message of {n} bytes is not this bench's").into());
    }
    let handle = |i: usize| {
        let mut h = IpcHandle([0; 64]);
        h.0.copy_from_slice(&b[16 + 64 * i..16 + 64 * (i + 1)]);
        h
    };
    let mut mapped = Vec::with_capacity(SLOTS);
    for i in 0..SLOTS {
        let mut ptr = 0u64;
        // SAFETY: the context is current; writes the mapping's address.
        cu.ck(
            unsafe { (cu.ipc_open_mem)(&mut ptr, handle(i), LAZY_PEER) },
            "cuIpcOpenMemHandle",
        )?;
        mapped.push(ptr);
    }
    let produced = (0..SLOTS)
        .map(|i| cu.open_event(handle(SLOTS + i)))
        .collect::<Res<Vec<_>>>()?;
    let mut reply = Vec::with_capacity(8 + 64 * SLOTS);
    reply.extend_from_slice(&SETUP_REPLY);
    reply.extend_from_slice(&(SLOTS as u32).to_le_bytes());
    let mut released = Vec::with_capacity(SLOTS);
    for _ in 0..SLOTS {
        let (event, handle) = cu.ipc_event()?;
        released.push(event);
        reply.extend_from_slice(&handle.0);
    }
    send(&socket, &reply)?;
    let mut lines = Vec::with_capacity(frames as usize);
    for expected in 1..=frames {
        let p = recv_packet(&socket)?;
        let received = monotonic_ns();
        if p.kind != Kind::Frame || p.sequence != expected || p.slot as usize >= SLOTS {
            return Err(format!(
                "got {:?} {} (slot {}), not frame {expected}",
                p.kind, p.sequence, p.slot
            )
            .into());
        }
        let s = p.slot as usize;
        // SAFETY: a live stream and an opened event of this context.
        unsafe {
            cu.ck(
                (cu.stream_wait_event)(stream, produced[s], 0),
                "cuStreamWaitEvent (produced)",
            )?;
            cu.ck((cu.stream_synchronize)(stream), "cuStreamSynchronize")?;
        }
        let waited = monotonic_ns();
        lines.push(FrameLine {
            sequence: p.sequence,
            called: p.times[0],
            gpu_done: p.times[1],
            sent: p.times[2],
            received,
            waited,
        });
        // SAFETY: a live event of this context on its live stream.
        cu.ck(
            unsafe { (cu.event_record)(released[s], stream) },
            "cuEventRecord (released)",
        )?;
        let release = Packet {
            kind: Kind::Release,
            slot: p.slot,
            sequence: p.sequence,
            times: [0; 3],
        };
        send(&socket, &release.encode()[..PACKET_LEN])?;
    }
    // SAFETY: a live stream; then the mappings this process opened, no work
    // using them left.
    unsafe {
        cu.ck((cu.stream_synchronize)(stream), "cuStreamSynchronize")?;
        for ptr in mapped {
            cu.ck((cu.ipc_close_mem)(ptr), "cuIpcCloseMemHandle")?;
        }
    }
    let mut out = String::with_capacity(lines.len() * 64);
    for l in &lines {
        out.push_str(&l.line());
        out.push('\n');
    }
    print!("{out}");
    drop(socket);
    Ok(())
}
