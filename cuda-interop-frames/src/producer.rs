//! The frame producer: Vulkan writes frames into a small ring of exportable
//! buffers and serves them to any number of consumers over a Unix socket
//! with the frame-ring protocol ([`crate::protocol`]). The `frame_server`
//! example is its command line; [`run`] is the whole server.
//!
//! # Contract
//!
//! * Each frame `f` (from 1) is written with transfer commands only: the whole
//!   buffer filled with the `u32` `f` (little-endian RGBA bytes), then a band
//!   of `height / 16` rows at a row moving 8 rows a frame filled with `!f`
//!   ([`protocol::band_rows`]). Rows are [`ProducerOptions::row_pitch`] bytes
//!   apart.
//! * Each consumer that connects gets a hello (the layout), then one message
//!   with the ring's buffers, the "produced" timeline (signalled with `f`
//!   when frame `f` is written) and one "released" timeline per slot of its
//!   own. Then every frame: a frame packet (slot, `f`), sent after the
//!   submission that writes it and signals "produced".
//! * A slot is written again only when no consumer holds it; before writing
//!   it, the producer waits (bounded) for each consumer's "released" value
//!   of the slot when its release said its GPU signals it, and the
//!   submission waits for the same values on the GPU.
//! * A consumer that disconnects or dies gives its slots back; one that holds
//!   a slot longer than [`ProducerOptions::hold_timeout`], or whose GPU
//!   release does not arrive within it, is disconnected. The others keep
//!   being served.
//! * Bounded: accepts, reads and writes have timeouts, and the whole run
//!   ends after [`ProducerOptions::seconds`] (or
//!   [`ProducerOptions::frames`]). Progress goes to stdout, each line
//!   starting `[frame_server]`: every change in the number of consumers
//!   prints the process's fd count and, when a CUDA driver is there,
//!   `cuMemGetInfo`'s free memory, next to the values before the first
//!   consumer.
//! * [`ProducerOptions::host_visible`] puts the ring in host-visible memory
//!   instead, for Vulkan drivers without device-local-only memory (lavapipe:
//!   the CPU tests); CUDA consumers need the default, device-local.
//!   [`ProducerOptions::no_semaphores`] (also for lavapipe, which exports
//!   none) shares only the buffers: frames are announced after their writes
//!   completed, and a release with a GPU signal is a protocol error. CUDA
//!   consumers refuse such a ring.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::protocol::{self, Kind, Packet, PacketError, PACKET_LEN, SETUP_TAG};
use vk_export::ash::vk;
use vk_export::markers::{DeviceLocal, HostVisible, MemoryLocation};
use vk_export::socket::{Connection, Exported, Listener};
use vk_export::{
    Context, ExportableBuffer, HeadlessOptions, SubmitSync, TimelineSemaphore, WaitStrategy,
};

type Res<T> = Result<T, ProducerError>;

/// How long socket reads wait before checking whether to stop.
const POLL: Duration = Duration::from_millis(200);
/// Bound on writing one packet to a consumer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// What to serve, and for how long.
#[derive(Clone, Debug)]
pub struct ProducerOptions {
    /// The socket path (an existing file there is removed first).
    pub socket: String,
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Bytes from one row to the next (at least `width * 4`, a multiple of 4).
    pub row_pitch: u64,
    /// Slots in the ring (2 to [`protocol::MAX_SLOTS`]).
    pub slots: u32,
    /// How long the whole run lasts.
    pub seconds: f64,
    /// Stop after this many frames, if given.
    pub frames: Option<u64>,
    /// Frames a second at most (0: as fast as the consumers release).
    pub fps: f64,
    /// How long a consumer may hold a slot (or keep its GPU release waiting).
    pub hold_timeout: Duration,
    /// The Vulkan device's `deviceUUID` (default: the first device).
    pub device: Option<vk_export::DeviceUuid>,
    /// Host-visible ring memory instead of device-local.
    pub host_visible: bool,
    /// Share only the buffers, no timelines.
    pub no_semaphores: bool,
}

impl Default for ProducerOptions {
    /// The `frame_server` defaults: `/tmp/cuda-interop-frames.sock`, 4 slots
    /// of 1920x1080 with unpadded rows, 300 s, no frame limit, no rate
    /// limit, a 5 s hold timeout, the first device, device-local memory,
    /// with semaphores.
    fn default() -> ProducerOptions {
        ProducerOptions {
            socket: "/tmp/cuda-interop-frames.sock".into(),
            width: 1920,
            height: 1080,
            row_pitch: 1920 * 4,
            slots: 4,
            seconds: 300.0,
            frames: None,
            fps: 0.0,
            hold_timeout: Duration::from_secs(5),
            device: None,
            host_visible: false,
            no_semaphores: false,
        }
    }
}

impl ProducerOptions {
    /// Checks the options [`run`] needs: at least 2 slots, a valid ring
    /// layout, a positive finite run time.
    pub fn validate(&self) -> Result<(), ProducerError> {
        if self.slots < 2 {
            return Err(ProducerError::Options("at least 2 slots are needed".into()));
        }
        self.hello().check_layout()?;
        if !(self.seconds > 0.0 && self.seconds.is_finite()) {
            return Err(ProducerError::Options(
                "the run time must be a positive number of seconds".into(),
            ));
        }
        Ok(())
    }

    /// The hello every consumer gets.
    pub fn hello(&self) -> Packet {
        Packet::hello(self.slots, self.width, self.height, self.row_pitch)
    }
}

/// Why the producer stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// [`ProducerOptions::validate`] refused the options.
    #[error("bad options: {0}")]
    Options(String),
    /// The ring layout is not a valid one.
    #[error(transparent)]
    Layout(#[from] PacketError),
    /// A Vulkan call failed (setup, a submission, the socket).
    #[error(transparent)]
    Vulkan(#[from] vk_export::Error),
    /// A socket call of a consumer's setup failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Open fds of this process.
fn fd_count() -> usize {
    // The directory's own fd is one of the entries.
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1))
}

/// `cuMemGetInfo`'s free bytes on the producer's GPU, if a CUDA driver is there.
struct CudaProbe(Option<cuda_interop::CudaDevice>);

impl CudaProbe {
    fn new(ctx: &Context) -> CudaProbe {
        match cuda_interop::CudaDevice::for_vulkan(ctx) {
            Ok(d) => CudaProbe(Some(d)),
            Err(e) => {
                println!("[frame_server] no CUDA for the memory report: {e}");
                CudaProbe(None)
            }
        }
    }

    fn free_mib(&self) -> Option<u64> {
        let device = self.0.as_ref()?;
        let get = cuda_interop::sys::Driver::global()
            .ok()?
            .fns()
            .cuMemGetInfo?;
        let _guard = device.enter().ok()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the device's primary context is current (the guard); the
        // call writes two sizes.
        let status = unsafe { get(&mut free, &mut total) };
        (status == cuda_interop::sys::CUresult::CUDA_SUCCESS).then_some(free as u64 >> 20)
    }
}

/// What the socket threads tell the render loop.
enum Event {
    Connected(Connection),
    Released {
        id: u64,
        slot: u32,
        frame: u64,
        gpu: bool,
    },
    Gone {
        id: u64,
        why: String,
    },
}

/// One consumer: its socket, its "released" timelines, what it holds.
struct Consumer {
    id: u64,
    /// Keeps the connection open (the packets go through `stream`, a dup).
    _conn: Connection,
    stream: UnixStream,
    released: Vec<TimelineSemaphore>,
    /// Per slot: the frame it holds and since when.
    held: Vec<Option<(u64, Instant)>>,
    /// Per slot: the "released" value its GPU signals, to wait for before
    /// the next write of the slot.
    gpu_wait: Vec<Option<u64>>,
    reader: Option<JoinHandle<()>>,
    frames_sent: u64,
}

/// Reads one consumer's release packets until it goes away or `stop`.
fn read_releases(id: u64, mut stream: UnixStream, events: Sender<Event>, stop: Arc<AtomicBool>) {
    let why = loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut buf = [0u8; PACKET_LEN + 16];
        match stream.read(&mut buf) {
            Ok(0) => break "disconnected".to_string(),
            Ok(n) => match Packet::decode(&buf[..n]) {
                Ok(p) if p.kind == Kind::Release => {
                    let event = Event::Released {
                        id,
                        slot: p.slot,
                        frame: p.frame,
                        gpu: p.flags & protocol::RELEASE_GPU_SIGNALLED != 0,
                    };
                    if events.send(event).is_err() {
                        return;
                    }
                }
                Ok(p) => break format!("sent a {:?} packet; consumers only send releases", p.kind),
                Err(e) => break e.to_string(),
            },
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                break "disconnected (connection reset: it died with data unread)".to_string()
            }
            Err(e) => break format!("read failed: {e}"),
        }
    };
    let _ = events.send(Event::Gone { id, why });
}

struct Server<M> {
    ctx: Context,
    opts: ProducerOptions,
    buffers: Vec<ExportableBuffer<M>>,
    /// `None` with `--no-semaphores`.
    produced: Option<TimelineSemaphore>,
    consumers: Vec<Consumer>,
    next_id: u64,
    events_tx: Sender<Event>,
    stop: Arc<AtomicBool>,
    /// Per slot: whether a submission released it to the external family.
    released_to_external: Vec<bool>,
    baseline: (usize, Option<u64>),
    cuda: CudaProbe,
}

impl<M: MemoryLocation> Server<M> {
    fn report(&self, what: &str) {
        let free = self.cuda.free_mib();
        let show = |m: Option<u64>| m.map_or("n/a".to_string(), |m| m.to_string());
        println!(
            "[frame_server] {what}: consumers={} fds={} cuda_free_mib={} (before any consumer: fds={} cuda_free_mib={})",
            self.consumers.len(),
            fd_count(),
            show(free),
            self.baseline.0,
            show(self.baseline.1),
        );
    }

    /// Sends the hello and the ring to a new consumer and starts its reader.
    fn add(&mut self, conn: Connection) -> Res<()> {
        let id = self.next_id;
        self.next_id += 1;
        let n = self.opts.slots as usize;
        let released = (0..if self.produced.is_some() { n } else { 0 })
            .map(|_| TimelineSemaphore::new(&self.ctx))
            .collect::<vk_export::Result<Vec<_>>>()?;
        let mut stream = UnixStream::from(conn.as_fd().try_clone_to_owned()?);
        stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
        stream.set_read_timeout(Some(POLL))?;
        let hello = Packet::hello(
            self.opts.slots,
            self.opts.width,
            self.opts.height,
            self.opts.row_pitch,
        );
        stream.write_all(&hello.encode())?;
        let mut resources: Vec<&dyn Exported> = Vec::with_capacity(2 * n + 1);
        resources.extend(self.buffers.iter().map(|b| b as &dyn Exported));
        if let Some(produced) = &self.produced {
            resources.push(produced);
        }
        resources.extend(released.iter().map(|s| s as &dyn Exported));
        conn.send_exported(SETUP_TAG, &resources)?;
        let reader = {
            let (stream, events, stop) = (
                stream.try_clone()?,
                self.events_tx.clone(),
                self.stop.clone(),
            );
            std::thread::spawn(move || read_releases(id, stream, events, stop))
        };
        self.consumers.push(Consumer {
            id,
            _conn: conn,
            stream,
            released,
            held: vec![None; n],
            gpu_wait: vec![None; n],
            reader: Some(reader),
            frames_sent: 0,
        });
        self.report(&format!("consumer {id} connected"));
        Ok(())
    }

    fn remove(&mut self, id: u64, why: &str) {
        let Some(i) = self.consumers.iter().position(|c| c.id == id) else {
            return;
        };
        let mut c = self.consumers.swap_remove(i);
        // The reader stops on its own (EOF, or the stop flag within POLL).
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
        if let Some(r) = c.reader.take() {
            let _ = r.join();
        }
        let frames = c.frames_sent;
        drop(c);
        self.report(&format!("consumer {id} left after {frames} frames ({why})"));
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Connected(conn) => {
                if let Err(e) = self.add(conn) {
                    println!("[frame_server] a consumer could not be set up: {e}");
                }
            }
            Event::Released {
                id,
                slot,
                frame,
                gpu,
            } => {
                let Some(c) = self.consumers.iter_mut().find(|c| c.id == id) else {
                    return;
                };
                match c.held.get(slot as usize).copied().flatten() {
                    Some(_) if gpu && c.released.is_empty() => {
                        let why = "released with a GPU signal, but this ring has no semaphores";
                        self.remove(id, why);
                    }
                    Some((held, _)) if held == frame => {
                        c.held[slot as usize] = None;
                        c.gpu_wait[slot as usize] = gpu.then_some(frame);
                    }
                    _ => {
                        let why = format!(
                            "released frame {frame} of slot {slot}, which it does not hold"
                        );
                        self.remove(id, &why);
                    }
                }
            }
            Event::Gone { id, why } => self.remove(id, &why),
        }
    }

    /// A slot no consumer holds, trying from `from` round the ring.
    fn free_slot(&self, from: u32) -> Option<u32> {
        let n = self.opts.slots;
        (0..n)
            .map(|i| (from + i) % n)
            .find(|&s| self.consumers.iter().all(|c| c.held[s as usize].is_none()))
    }

    /// Disconnects consumers that held a slot longer than the hold timeout.
    fn drop_stuck(&mut self) {
        let limit = self.opts.hold_timeout;
        let stuck: Vec<(u64, u64)> = self
            .consumers
            .iter()
            .filter_map(|c| {
                c.held
                    .iter()
                    .flatten()
                    .find(|(_, since)| since.elapsed() > limit)
                    .map(|(frame, _)| (c.id, *frame))
            })
            .collect();
        for (id, frame) in stuck {
            self.remove(id, &format!("held frame {frame} longer than {limit:?}"));
        }
    }

    /// Writes frame `f` into `slot` and signals "produced" with `f`.
    fn render(&mut self, slot: u32, f: u64) -> Res<()> {
        let s = slot as usize;
        // Host-wait (bounded) for each GPU release of the slot first: a
        // consumer whose GPU never signals is dropped here instead of
        // leaving a submission stuck on the queue.
        let mut late = Vec::new();
        for c in &self.consumers {
            if let Some(v) = c.gpu_wait[s] {
                if let Err(e) =
                    c.released[s].wait(v, self.opts.hold_timeout, WaitStrategy::ADAPTIVE)
                {
                    late.push((
                        c.id,
                        format!("its GPU release of frame {v} did not arrive: {e}"),
                    ));
                }
            }
        }
        for (id, why) in late {
            self.remove(id, &why);
        }
        let mut sync = SubmitSync::new().timeout(Duration::from_secs(5));
        for c in &self.consumers {
            if let Some(v) = c.gpu_wait[s] {
                sync = sync.wait_timeline(&c.released[s], v);
            }
        }
        if let Some(produced) = &self.produced {
            sync = sync.signal_timeline(produced, f);
        }
        let buffer = self.buffers[s].raw();
        let (size, pitch, width, height) = (
            self.buffers[s].size(),
            self.opts.row_pitch,
            u64::from(self.opts.width),
            self.opts.height,
        );
        let family = self.ctx.queue_family();
        let acquire = self.released_to_external[s];
        let (band_start, band_end) = protocol::band_rows(f, height);
        self.ctx.submit_and_wait(sync, |device, cmd| {
            let barrier = |src_family, dst_family, src_access, dst_access| {
                vk::BufferMemoryBarrier::default()
                    .src_access_mask(src_access)
                    .dst_access_mask(dst_access)
                    .src_queue_family_index(src_family)
                    .dst_queue_family_index(dst_family)
                    .buffer(buffer)
                    .offset(0)
                    .size(vk::WHOLE_SIZE)
            };
            let band_offset = u64::from(band_start) * pitch;
            let band_size = u64::from(band_end - band_start - 1) * pitch + width * 4;
            // SAFETY: recording into the command buffer submit_and_wait
            // gave; the buffer lives in `self.buffers` for the whole run and
            // submit_and_wait waits for the commands (on a timeout the run
            // stops, and the buffers' Drop waits for their last use). Fill
            // offsets and sizes are multiples of 4 inside the buffer.
            unsafe {
                if acquire {
                    device.cmd_pipeline_barrier(
                        cmd,
                        vk::PipelineStageFlags::TOP_OF_PIPE,
                        vk::PipelineStageFlags::TRANSFER,
                        vk::DependencyFlags::empty(),
                        &[],
                        &[barrier(
                            vk::QUEUE_FAMILY_EXTERNAL,
                            family,
                            vk::AccessFlags::empty(),
                            vk::AccessFlags::TRANSFER_WRITE,
                        )],
                        &[],
                    );
                }
                device.cmd_fill_buffer(cmd, buffer, 0, size & !3, protocol::background(f));
                device.cmd_pipeline_barrier(
                    cmd,
                    vk::PipelineStageFlags::TRANSFER,
                    vk::PipelineStageFlags::TRANSFER,
                    vk::DependencyFlags::empty(),
                    &[],
                    &[barrier(
                        vk::QUEUE_FAMILY_IGNORED,
                        vk::QUEUE_FAMILY_IGNORED,
                        vk::AccessFlags::TRANSFER_WRITE,
                        vk::AccessFlags::TRANSFER_WRITE,
                    )],
                    &[],
                );
                device.cmd_fill_buffer(
                    cmd,
                    buffer,
                    band_offset,
                    band_size,
                    protocol::band_value(f),
                );
                device.cmd_pipeline_barrier(
                    cmd,
                    vk::PipelineStageFlags::TRANSFER,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    vk::DependencyFlags::empty(),
                    &[],
                    &[barrier(
                        family,
                        vk::QUEUE_FAMILY_EXTERNAL,
                        vk::AccessFlags::TRANSFER_WRITE,
                        vk::AccessFlags::empty(),
                    )],
                    &[],
                );
            }
        })?;
        self.released_to_external[s] = true;
        Ok(())
    }

    /// Tells every consumer that frame `f` is in `slot`.
    fn announce(&mut self, slot: u32, f: u64) {
        let packet = Packet::frame(slot, f).encode();
        let mut gone = Vec::new();
        for c in &mut self.consumers {
            match c.stream.write_all(&packet) {
                Ok(()) => {
                    c.held[slot as usize] = Some((f, Instant::now()));
                    c.frames_sent += 1;
                }
                Err(e) => gone.push((c.id, format!("a frame packet could not be sent: {e}"))),
            }
        }
        for (id, why) in gone {
            self.remove(id, &why);
        }
    }
}

/// Serves frames as the module contract says until the run time or the
/// frame count is reached: binds `opts.socket`, renders into the ring while
/// consumers are connected, and stops cleanly (every consumer disconnected,
/// the socket file removed by the listener).
pub fn run(opts: &ProducerOptions) -> Result<(), ProducerError> {
    opts.validate()?;
    let ctx = Context::headless(&HeadlessOptions {
        device_uuid: opts.device,
        ..HeadlessOptions::default()
    })?;
    if opts.host_visible {
        run_with::<HostVisible>(ctx, opts)
    } else {
        run_with::<DeviceLocal>(ctx, opts)
    }
}

fn run_with<M: MemoryLocation>(ctx: Context, opts: &ProducerOptions) -> Res<()> {
    println!(
        "[frame_server] {} ({}), {} slots of {}x{} RGBA8, row pitch {} bytes",
        ctx.identity().name,
        ctx.identity().device_uuid_string(),
        opts.slots,
        opts.width,
        opts.height,
        opts.row_pitch
    );
    let frame_bytes = Packet::hello(opts.slots, opts.width, opts.height, opts.row_pitch)
        .frame_bytes()
        .expect("a checked layout");
    let size = (u64::from(opts.height) * opts.row_pitch).max(frame_bytes);
    let buffers = (0..opts.slots)
        .map(|_| ExportableBuffer::<M>::new(&ctx, size))
        .collect::<vk_export::Result<Vec<_>>>()?;
    let produced = if opts.no_semaphores {
        None
    } else {
        Some(TimelineSemaphore::new(&ctx)?)
    };
    let _ = std::fs::remove_file(&opts.socket);
    let listener = Listener::bind(&opts.socket)?;
    let (events_tx, events) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let (tx, stop) = (events_tx.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept(POLL) {
                    Ok(conn) => {
                        if tx.send(Event::Connected(conn)).is_err() {
                            return;
                        }
                    }
                    Err(vk_export::Error::Timeout(_)) => {}
                    Err(e) => println!("[frame_server] a connection was refused: {e}"),
                }
            }
        })
    };
    let cuda = CudaProbe::new(&ctx);
    let mut server = Server {
        baseline: (fd_count(), cuda.free_mib()),
        cuda,
        ctx,
        buffers,
        produced,
        consumers: Vec::new(),
        next_id: 1,
        events_tx,
        stop: stop.clone(),
        released_to_external: vec![false; opts.slots as usize],
        opts: opts.clone(),
    };
    server.report(&format!("listening on {}", opts.socket));
    let result = serve(&mut server, &events);
    stop.store(true, Ordering::Relaxed);
    let ids: Vec<u64> = server.consumers.iter().map(|c| c.id).collect();
    for id in ids {
        server.remove(id, "the server stops");
    }
    let _ = acceptor.join();
    server.report("stopped");
    result
}

fn serve<M: MemoryLocation>(server: &mut Server<M>, events: &Receiver<Event>) -> Res<()> {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(server.opts.seconds);
    let period = (server.opts.fps > 0.0).then(|| Duration::from_secs_f64(1.0 / server.opts.fps));
    let mut f: u64 = 0;
    let mut next_slot = 0u32;
    let mut last_stats = Instant::now();
    let mut rendered_since = 0u64;
    loop {
        if Instant::now() >= end || server.opts.frames.is_some_and(|n| f >= n) {
            println!(
                "[frame_server] done: {f} frames in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        while let Ok(event) = events.try_recv() {
            server.handle(event);
        }
        if server.consumers.is_empty() {
            match events.recv_timeout(POLL) {
                Ok(event) => server.handle(event),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            continue;
        }
        let Some(slot) = server.free_slot(next_slot) else {
            // Every slot is held: wait (bounded) for a release.
            match events.recv_timeout(POLL) {
                Ok(event) => server.handle(event),
                Err(RecvTimeoutError::Timeout) => server.drop_stuck(),
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            continue;
        };
        let frame_start = Instant::now();
        f += 1;
        server.render(slot, f)?;
        server.announce(slot, f);
        next_slot = (slot + 1) % server.opts.slots;
        rendered_since += 1;
        if last_stats.elapsed() >= Duration::from_secs(5) {
            println!(
                "[frame_server] frame {f}: {:.0} frames/s to {} consumer(s)",
                rendered_since as f64 / last_stats.elapsed().as_secs_f64(),
                server.consumers.len()
            );
            last_stats = Instant::now();
            rendered_since = 0;
        }
        if let Some(p) = period {
            std::thread::sleep(p.saturating_sub(frame_start.elapsed()));
        }
    }
}
