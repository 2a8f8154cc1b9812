//! The sender's receivers: one state machine per connection (pending,
//! then lossless or latest), which slots each holds or has promised a GPU
//! release of, the limits on connections, and the drops.
//!
//! # Contract
//!
//! * A connection is *pending* until it subscribes; nothing is sent to it
//!   and it holds nothing. One that has not subscribed within
//!   [`Limits::subscribe_timeout`] is closed. Connections beyond
//!   [`Limits::max_receivers`] (pending ones included), or from a process
//!   that connected more than [`Limits::connects_per_second`] times in the
//!   last second, are refused at once with a goodbye that says why, before
//!   anything is made for them.
//! * The subscribe is answered with the hello and the ring's setup message
//!   (the per-receiver "released" timelines are made then).
//! * A latest receiver holds at most one frame: a request made while it
//!   holds one is answered after its release (so `L` latest receivers never
//!   hold more than `L` slots, whatever they send).
//! * A slot is *free* when no receiver holds it and every GPU release
//!   promised for it has been reached. Otherwise it is blocked by lossless
//!   receivers alone (worth waiting for: their back-pressure) or by a
//!   latest receiver or a departed one's promise (skipped: the sender never
//!   waits for those). Promised values stay in the slot's GPU waits until
//!   the slot is written again.
//! * A receiver that holds a frame, or leaves a promise unreached, longer
//!   than [`Limits::hold_timeout`] is dropped; so is one that breaks the
//!   protocol or whose socket is full when a frame is due. Every drop sends
//!   a goodbye with the reason (when its socket has room) and shuts the
//!   socket down before anything it held can be written: the receiving
//!   side's guarantee that no frame from before a drop is handed out
//!   rests on this order (see `crate::protocol`).
//! * A receiver that leaves with promises unreached leaves them behind
//!   (an orphan): its slots stay blocked, skipped, until the values are
//!   reached or the hold timeout passes.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender as EventSender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vk_export::socket::{Connection, Exported};
use vk_export::{Context, TimelineSemaphore};

use super::service::{drain, read_messages, refuse, send_now, Counted, Event, ReaderFlags, POLL};
use crate::protocol::{Delivery, DropReason, Fault, Message, PartLayout, RingLayout, SETUP_TAG};

/// Log lines the sender keeps until they are taken.
pub const LOG_LINES: usize = 1000;

/// What the sender allows its receivers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) hold_timeout: Duration,
    pub(crate) subscribe_timeout: Duration,
    pub(crate) max_receivers: u32,
    pub(crate) connects_per_second: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Pending,
    Subscribed(Delivery),
}

/// A GPU release a receiver promised for a slot.
#[derive(Clone, Copy, Debug)]
struct Promise {
    value: u64,
    since: Instant,
    reached: bool,
}

struct Peer {
    id: u64,
    pid: Option<i32>,
    conn: Connection,
    stream: UnixStream,
    mode: Mode,
    connected_at: Instant,
    /// Latest: it asked for a frame.
    wants: bool,
    last_sent: u64,
    released: Vec<TimelineSemaphore>,
    /// Per slot: the frame it holds and since when.
    held: Vec<Option<(u64, Instant)>>,
    promised: Vec<Option<Promise>>,
    reader: Option<JoinHandle<()>>,
    closed: Arc<AtomicBool>,
    acquire_queued: Arc<AtomicBool>,
    frames_sent: u64,
    /// Counts the connection in the acceptor's tally until it is closed.
    _counted: Counted,
}

impl Peer {
    /// Whether it holds a frame (a latest receiver holds one at a time).
    fn holds_any(&self) -> bool {
        self.held.iter().any(Option::is_some)
    }
}

/// The promises of a receiver that left.
struct Orphan {
    released: Vec<TimelineSemaphore>,
    promised: Vec<Option<Promise>>,
    since: Instant,
}

/// Refreshes slot `s`'s promise from its timeline; whether it is still
/// unreached. (A ring without semaphores has no timelines and no
/// promises.)
fn unreached(promised: &mut [Option<Promise>], released: &[TimelineSemaphore], s: usize) -> bool {
    match (promised.get_mut(s), released.get(s)) {
        (Some(Some(p)), Some(semaphore)) if !p.reached => {
            // An unreadable counter counts as unreached: the hold timeout
            // ends it.
            p.reached = semaphore.value().is_ok_and(|v| v >= p.value);
            !p.reached
        }
        _ => false,
    }
}

/// What keeps a slot from being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Blocked {
    /// Lossless receivers alone: their releases are worth waiting for.
    ByLossless,
    /// A latest receiver or a departed one's promise: skip the slot.
    Otherwise,
}

/// The counts the sender reports.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    pub(crate) connected: u64,
    pub(crate) dropped: u64,
    pub(crate) refused: u64,
}

/// The receivers of one sender (see the module contract).
pub(crate) struct Receivers {
    peers: Vec<Peer>,
    orphans: Vec<Orphan>,
    next_id: u64,
    /// Per process: the start of its window and its connections in it.
    connects: HashMap<i32, (Instant, u32)>,
    limits: Limits,
    slots: usize,
    pub(crate) counts: Counts,
    log: Vec<String>,
}

impl Receivers {
    pub(crate) fn new(limits: Limits, slots: usize) -> Receivers {
        Receivers {
            peers: Vec::new(),
            orphans: Vec::new(),
            next_id: 1,
            connects: HashMap::new(),
            limits,
            slots,
            counts: Counts::default(),
            log: Vec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.peers.len()
    }

    /// Receivers that subscribed (pending connections not counted).
    pub(crate) fn subscribed(&self) -> usize {
        self.peers
            .iter()
            .filter(|p| p.mode != Mode::Pending)
            .count()
    }

    pub(crate) fn note(&mut self, line: String) {
        if self.log.len() >= LOG_LINES {
            self.log.remove(0);
        }
        self.log.push(line);
    }

    pub(crate) fn take_log(&mut self) -> Vec<String> {
        std::mem::take(&mut self.log)
    }

    /// Whether `pid` may connect now (and counts the connection).
    fn admit_rate(&mut self, pid: Option<i32>) -> bool {
        // A peer in another pid namespace has no pid here: they share key
        // 0, so the limit still bounds them (together).
        let key = pid.unwrap_or(0);
        let now = Instant::now();
        if self.connects.len() > 4096 {
            self.connects
                .retain(|_, (start, _)| now.duration_since(*start) < Duration::from_secs(1));
        }
        let entry = self.connects.entry(key).or_insert((now, 0));
        if now.duration_since(entry.0) >= Duration::from_secs(1) {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
        entry.1 <= self.limits.connects_per_second
    }

    /// A new connection: refused at once over a limit, else pending.
    pub(crate) fn connected(
        &mut self,
        conn: Connection,
        counted: Counted,
        events: &EventSender<Event>,
        stop: &Arc<AtomicBool>,
    ) {
        let pid = conn.peer().pid;
        let refusal = if !self.admit_rate(pid) {
            Some(DropReason::TooManyConnects {
                per_second: self.limits.connects_per_second,
            })
        } else if self.peers.len() >= self.limits.max_receivers as usize {
            Some(DropReason::TooManyReceivers {
                limit: self.limits.max_receivers,
            })
        } else {
            None
        };
        if let Some(reason) = refusal {
            self.counts.refused += 1;
            refuse(conn.as_fd(), reason);
            // Dropping `conn` closes it.
            return;
        }
        if let Err(e) = self.add(conn, counted, pid, events, stop) {
            self.counts.refused += 1;
            self.note(format!("a receiver could not be set up: {e}"));
        }
    }

    fn add(
        &mut self,
        conn: Connection,
        counted: Counted,
        pid: Option<i32>,
        events: &EventSender<Event>,
        stop: &Arc<AtomicBool>,
    ) -> std::io::Result<()> {
        let id = self.next_id;
        self.next_id += 1;
        let stream = UnixStream::from(conn.as_fd().try_clone_to_owned()?);
        stream.set_read_timeout(Some(POLL))?;
        let closed = Arc::new(AtomicBool::new(false));
        let acquire_queued = Arc::new(AtomicBool::new(false));
        let reader = {
            let (stream, events) = (stream.try_clone()?, events.clone());
            let flags = ReaderFlags {
                stop: stop.clone(),
                closed: closed.clone(),
                acquire_queued: acquire_queued.clone(),
            };
            std::thread::Builder::new()
                .name(format!("cif-receiver-{id}"))
                .spawn(move || read_messages(id, stream, events, flags))?
        };
        self.peers.push(Peer {
            id,
            pid,
            conn,
            stream,
            mode: Mode::Pending,
            connected_at: Instant::now(),
            wants: false,
            last_sent: 0,
            released: Vec::new(),
            held: vec![None; self.slots],
            promised: vec![None; self.slots],
            reader: Some(reader),
            closed,
            acquire_queued,
            frames_sent: 0,
            _counted: counted,
        });
        self.counts.connected += 1;
        Ok(())
    }

    /// Drops receiver `id` for `reason` (`None`: it left on its own);
    /// `why` is the log's wording.
    pub(crate) fn remove(&mut self, id: u64, reason: Option<DropReason>, why: &str) {
        let Some(i) = self.peers.iter().position(|p| p.id == id) else {
            return;
        };
        let mut peer = self.peers.swap_remove(i);
        peer.closed.store(true, Ordering::Relaxed);
        if let Some(reason) = reason {
            let _ = send_now(&peer.stream, &Message::Goodbye(reason));
        }
        // Before anything it held can be written again (module contract).
        let _ = peer.stream.shutdown(std::net::Shutdown::Both);
        if let Some(r) = peer.reader.take() {
            let _ = r.join();
        }
        drain(&peer.stream);
        let pending = (0..self.slots).any(|s| unreached(&mut peer.promised, &peer.released, s));
        if pending {
            self.orphans.push(Orphan {
                released: std::mem::take(&mut peer.released),
                promised: std::mem::take(&mut peer.promised),
                since: Instant::now(),
            });
        }
        let fault = !matches!(reason, None | Some(DropReason::SenderStopping));
        if fault {
            self.counts.dropped += 1;
        }
        let frames = peer.frames_sent;
        let who = peer.pid.map_or(String::new(), |p| format!(" (pid {p})"));
        self.note(format!(
            "receiver {id}{who} left after {frames} frames ({why})"
        ));
        drop(peer.conn);
    }

    /// Receiver `id`'s frame could not be sent: `reason` (`None`: it left).
    fn unsent(&mut self, id: u64, reason: Option<DropReason>) {
        let why = reason.map_or("disconnected".to_string(), |r| r.to_string());
        self.remove(id, reason, &why);
    }

    /// Drops every receiver: the sender stops.
    pub(crate) fn remove_all(&mut self) {
        let ids: Vec<u64> = self.peers.iter().map(|p| p.id).collect();
        for id in ids {
            self.remove(id, Some(DropReason::SenderStopping), "the sender stops");
        }
    }

    /// A message from receiver `id`. `newest` is the newest presented
    /// frame `(slot, sequence, timestamp)`; `ring` what a subscribe is
    /// answered with.
    pub(crate) fn on_message(
        &mut self,
        id: u64,
        message: Message,
        newest: Option<(u32, u64, u64)>,
        ring: &Ring<'_>,
    ) {
        let Some(peer) = self.peers.iter_mut().find(|p| p.id == id) else {
            return;
        };
        let fault = match (peer.mode, message) {
            (Mode::Pending, Message::Subscribe(delivery)) => {
                match subscribe(peer, delivery, ring) {
                    Ok(()) => {
                        let who = peer.pid.map_or(String::new(), |p| format!(" (pid {p})"));
                        let line = format!("receiver {id}{who} connected ({})", delivery.name());
                        self.note(line);
                        None
                    }
                    Err(e) => {
                        let why = format!("its ring could not be shared: {e}");
                        self.remove(id, None, &why);
                        return;
                    }
                }
            }
            (Mode::Pending, _) => Some(Fault::NotSubscribedFirst),
            (Mode::Subscribed(_), Message::Subscribe(_)) => Some(Fault::SubscribedTwice),
            (Mode::Subscribed(Delivery::Latest), Message::Acquire) => {
                peer.acquire_queued.store(false, Ordering::Release);
                peer.wants = true;
                // One frame at a time: the request waits for its release.
                match newest.filter(|n| n.1 > peer.last_sent && !peer.holds_any()) {
                    Some((slot, f, ts)) => match send_frame(peer, slot, f, ts) {
                        Ok(()) => None,
                        Err(reason) => {
                            self.unsent(id, reason);
                            return;
                        }
                    },
                    None => None,
                }
            }
            (Mode::Subscribed(Delivery::Lossless), Message::Acquire) => {
                Some(Fault::AcquireWhenLossless)
            }
            (
                Mode::Subscribed(_),
                Message::Release {
                    slot,
                    sequence,
                    gpu_signalled,
                },
            ) => {
                let s = slot as usize;
                match peer.held.get(s).copied().flatten() {
                    Some((held, _)) if held == sequence => {
                        if gpu_signalled && peer.released.is_empty() {
                            Some(Fault::GpuSignalWithoutSemaphores)
                        } else {
                            peer.held[s] = None;
                            if gpu_signalled {
                                peer.promised[s] = Some(Promise {
                                    value: sequence,
                                    since: Instant::now(),
                                    reached: false,
                                });
                            }
                            // A latest request that waited for this release.
                            let due = peer.mode == Mode::Subscribed(Delivery::Latest)
                                && peer.wants
                                && !peer.holds_any();
                            match newest.filter(|n| due && n.1 > peer.last_sent) {
                                Some((slot, f, ts)) => match send_frame(peer, slot, f, ts) {
                                    Ok(()) => None,
                                    Err(reason) => {
                                        self.unsent(id, reason);
                                        return;
                                    }
                                },
                                None => None,
                            }
                        }
                    }
                    _ => Some(Fault::NotHeld { sequence }),
                }
            }
            (
                _,
                Message::Hello(_)
                | Message::Part { .. }
                | Message::Frame { .. }
                | Message::Goodbye(_),
            ) => Some(Fault::SenderMessage),
        };
        if let Some(fault) = fault {
            let why = format!("protocol fault: {fault}");
            self.remove(id, Some(DropReason::ProtocolFault(fault)), &why);
        }
    }

    /// Drops receivers past their bounds: a frame held or a promise left
    /// unreached longer than the hold timeout, no subscribe within its
    /// bound. Forgets orphans whose promises were kept or expired.
    pub(crate) fn expire(&mut self) {
        let limit = self.limits.hold_timeout;
        let mut late = Vec::new();
        for p in &mut self.peers {
            if p.mode == Mode::Pending {
                if p.connected_at.elapsed() > self.limits.subscribe_timeout {
                    let limit = self.limits.subscribe_timeout;
                    late.push((p.id, DropReason::NotSubscribed { limit }));
                }
                continue;
            }
            // The oldest frame it holds is the one it held too long.
            if let Some((sequence, _)) = p
                .held
                .iter()
                .flatten()
                .filter(|(_, since)| since.elapsed() > limit)
                .min_by_key(|(_, since)| *since)
            {
                late.push((
                    p.id,
                    DropReason::HeldTooLong {
                        sequence: *sequence,
                        limit,
                    },
                ));
                continue;
            }
            for s in 0..p.promised.len() {
                let since = p.promised[s].map(|x| (x.value, x.since));
                if let Some((value, since)) = since {
                    if since.elapsed() > limit && unreached(&mut p.promised, &p.released, s) {
                        late.push((
                            p.id,
                            DropReason::GpuReleaseMissing {
                                sequence: value,
                                limit,
                            },
                        ));
                        break;
                    }
                }
            }
        }
        for (id, reason) in late {
            let why = reason.to_string();
            self.remove(id, Some(reason), &why);
        }
        self.orphans.retain_mut(|o| {
            o.since.elapsed() < limit
                && (0..o.promised.len()).any(|s| unreached(&mut o.promised, &o.released, s))
        });
    }

    /// What keeps `slot` from being written, if anything.
    pub(crate) fn blocked(&mut self, slot: usize) -> Option<Blocked> {
        let mut by_lossless = false;
        let mut otherwise = self
            .orphans
            .iter_mut()
            .any(|o| unreached(&mut o.promised, &o.released, slot));
        for p in &mut self.peers {
            let blocks = p.held[slot].is_some() || unreached(&mut p.promised, &p.released, slot);
            if blocks {
                match p.mode {
                    Mode::Subscribed(Delivery::Lossless) => by_lossless = true,
                    _ => otherwise = true,
                }
            }
        }
        if otherwise {
            Some(Blocked::Otherwise)
        } else if by_lossless {
            Some(Blocked::ByLossless)
        } else {
            None
        }
    }

    /// Whether some promise is still unreached (a slot may free up without
    /// any message: worth polling for).
    pub(crate) fn promises_pending(&self) -> bool {
        self.peers
            .iter()
            .any(|p| p.promised.iter().flatten().any(|x| !x.reached))
    }

    /// The GPU waits a write of `slot` needs: every promised value (all
    /// reached once the slot is free; the waits order the receivers' reads
    /// before the write on the GPU).
    pub(crate) fn release_waits(&self, slot: usize) -> Vec<(&TimelineSemaphore, u64)> {
        let peers = self
            .peers
            .iter()
            .filter_map(|p| Some((p.released.get(slot)?, p.promised.get(slot)?.as_ref()?.value)));
        let orphans = self
            .orphans
            .iter()
            .filter_map(|o| Some((o.released.get(slot)?, o.promised.get(slot)?.as_ref()?.value)));
        peers.chain(orphans).collect()
    }

    /// After a write of `slot` was submitted: its promises are spent.
    pub(crate) fn written(&mut self, slot: usize) {
        for p in &mut self.peers {
            if let Some(x) = p.promised.get_mut(slot) {
                *x = None;
            }
        }
        for o in &mut self.orphans {
            if let Some(x) = o.promised.get_mut(slot) {
                *x = None;
            }
        }
    }

    /// Frame `f` of `slot` is out: to every lossless receiver, and to each
    /// latest one that asked.
    pub(crate) fn announce(&mut self, slot: u32, f: u64, timestamp_ns: u64) {
        let mut faults = Vec::new();
        for p in &mut self.peers {
            let due = match p.mode {
                Mode::Pending => false,
                Mode::Subscribed(Delivery::Lossless) => true,
                Mode::Subscribed(Delivery::Latest) => p.wants && !p.holds_any(),
            };
            if due {
                if let Err(reason) = send_frame(p, slot, f, timestamp_ns) {
                    faults.push((p.id, reason));
                }
            }
        }
        for (id, reason) in faults {
            self.unsent(id, reason);
        }
    }
}

/// What a subscribe is answered with: the layout and the ring's resources
/// (slots, then "produced" if the ring has semaphores).
pub(crate) struct Ring<'a> {
    pub(crate) ctx: &'a Context,
    pub(crate) layout: RingLayout,
    /// A multi-image ring's parts, announced after the hello.
    pub(crate) parts: &'a [PartLayout],
    pub(crate) resources: Vec<&'a dyn Exported>,
    pub(crate) semaphores: bool,
}

/// Answers `peer`'s subscribe: its "released" timelines, the hello, the
/// setup message.
fn subscribe(peer: &mut Peer, delivery: Delivery, ring: &Ring<'_>) -> Result<(), String> {
    let n = ring.layout.slots as usize;
    let released = if ring.semaphores {
        (0..n)
            .map(|_| TimelineSemaphore::new(ring.ctx))
            .collect::<vk_export::Result<Vec<_>>>()
            .map_err(|e| e.to_string())?
    } else {
        Vec::new()
    };
    send_now(&peer.stream, &Message::Hello(ring.layout)).map_err(|e| e.to_string())?;
    for (index, part) in (0u32..).zip(ring.parts) {
        let message = Message::Part { index, part: *part };
        send_now(&peer.stream, &message).map_err(|e| e.to_string())?;
    }
    let mut resources = ring.resources.clone();
    resources.extend(released.iter().map(|s| s as &dyn Exported));
    // Bounded by the connection's send timeout; nothing was sent before
    // but the hello, so only a peer gone wrong waits here.
    peer.conn
        .set_send_timeout(Duration::from_secs(1))
        .map_err(|e| e.to_string())?;
    peer.conn
        .send_exported(SETUP_TAG, &resources)
        .map_err(|e| e.to_string())?;
    peer.released = released;
    peer.mode = Mode::Subscribed(delivery);
    Ok(())
}

/// Sends frame `frame` of `slot` to `peer` and marks it held there; on
/// failure, the drop reason (`None`: it left).
fn send_frame(peer: &mut Peer, slot: u32, frame: u64, ts: u64) -> Result<(), Option<DropReason>> {
    let message = Message::Frame {
        slot,
        sequence: frame,
        timestamp_ns: ts,
    };
    send_now(&peer.stream, &message).map_err(|e| match e.kind() {
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => None,
        _ => Some(DropReason::StoppedReading),
    })?;
    peer.held[slot as usize] = Some((frame, Instant::now()));
    peer.frames_sent += 1;
    peer.last_sent = frame;
    peer.wants = false;
    Ok(())
}
