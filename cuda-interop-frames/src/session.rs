//! The one receiver session: connect, subscribe, take frames, give them
//! back, count what was missed. Every receiver of this crate (CUDA,
//! Vulkan, host) and the Python module is a thin layer over it.
//!
//! # Contract
//!
//! * [`Session::connect`] (or [`Session::connect_named`], which waits up to
//!   its timeout for the name to appear) subscribes in the chosen
//!   [`Delivery`], then waits (bounded) for the ring's layout and its setup
//!   message; the setup message is the caller's to import.
//! * [`Session::next`] waits at most its timeout, in every delivery and
//!   whatever the sender sends meanwhile. Latest: it asks for the newest
//!   frame (a request that timed out stays asked: the frame it brings is
//!   the next call's); the frames between two it got are counted in
//!   [`ReceiverStats::dropped`]. Lossless: every frame, in order.
//! * A [`Frame`] is a value only a session makes: its fields are private,
//!   it is neither `Clone` nor `Copy`, and it is released once, by value
//!   ([`Session::release`]) or by being dropped (then as a release whose
//!   reads have completed). A frame of another session is refused
//!   ([`ConsumerError::NotThisReceiver`]) and released on its own.
//! * No frame from before a drop is handed out after it: the sender shuts
//!   a receiver's socket down before it writes a slot that receiver held,
//!   and the session checks for that hang-up after taking a frame message
//!   and before returning it ([`crate::transport::hung_up`]). Once dropped,
//!   every call returns [`ConsumerError::Dropped`] with the sender's
//!   reason (held too long, GPU release missing, protocol fault, ...) or
//!   [`ConsumerError::Closed`] when the sender vanished without one.
//!   [`Session::check_held`] repeats the check after a read, so a reader
//!   can tell its pixels are the frame's: see `crate::host_receiver` and
//!   `crate::vulkan_receiver`. One drop is not a fault: a sender that stops
//!   ([`DropReason::SenderStopping`]) writes no slot after its goodbye, so
//!   the frames held or queued before it are still theirs: `next` hands out
//!   the queued ones first, reads of held ones succeed, releases are done
//!   locally, and only then does `next` return the goodbye.
//! * Thread-safe: every method takes `&self`; one thread receives at a
//!   time (another's `next` waits for it within its own timeout and then
//!   returns [`ConsumerError::Busy`]); frames may be released from any
//!   thread.
//! * Multi-image rings (`crate::protocol`: a slot of several named images
//!   sharing one frame): [`Session::connect`], [`Session::connect_named`]
//!   and [`Session::start`] refuse them ([`ConsumerError::MultiImage`]),
//!   so a receiver of one image per slot never mistakes part 1 of slot 0
//!   for slot 1; their `_any` twins take them, after checking the part
//!   messages ([`check_parts`]: count, order, names, formats) and every
//!   image record of the setup message (each part's format, the hello's
//!   size). A frame of such a ring is every part of its slot: one
//!   sequence number, one "produced" value, one release.
//! * A sender that breaks the protocol (a frame for a slot out of range or
//!   still held, sequence numbers that do not go up, a message only
//!   receivers send) is given up on: the session shuts its socket down,
//!   which gives every held slot back, and says why from then on.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use vk_export::socket::Connection;
use vk_export::wire::Received;

use crate::discovery::{Directory, DiscoveryError};
use crate::protocol::{
    check_parts, Delivery, DropReason, Message, PartLayout, RingLayout, SETUP_TAG,
};
use crate::transport::{
    self, deadline_after, hung_up, left, poll_readable, recv_message, send_message_until,
    try_recv_message, ConsumerError, SendError,
};

/// Why connecting by name failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The name could not be resolved or connected to.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// The conversation after connecting failed.
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
}

/// How long a release waits for room in the socket: a sender that reads
/// nothing for this long has stopped serving this receiver (its reader reads
/// continuously), and the session gives up.
pub const RELEASE_BOUND: Duration = Duration::from_secs(1);

/// What a receiver has had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Frames received.
    pub received: u64,
    /// Frames presented between received ones that it did not get (frames
    /// before its first are not counted).
    pub dropped: u64,
}

/// Why the connection is over.
#[derive(Clone, Debug)]
enum Ended {
    Dropped(DropReason),
    Closed,
    GivenUp(String),
}

impl Ended {
    /// A sender that stopped: it writes no slot after its goodbye, so the
    /// frames held or queued before it are still theirs.
    fn is_graceful(&self) -> bool {
        matches!(self, Ended::Dropped(DropReason::SenderStopping))
    }

    fn error(&self) -> ConsumerError {
        match self {
            Ended::Dropped(reason) => ConsumerError::Dropped(*reason),
            Ended::Closed => ConsumerError::Closed,
            Ended::GivenUp(why) => ConsumerError::GivenUp(why.clone()),
        }
    }
}

struct State {
    /// Per slot, the frame held there.
    held: Vec<Option<u64>>,
    /// The last frame number received.
    last: u64,
    /// Latest: a request is out.
    asked: bool,
    stats: ReceiverStats,
    ended: Option<Ended>,
    /// Frames queued before a stopping sender's goodbye: still the frames
    /// they name (a stopping sender writes nothing after it), handed out
    /// before the goodbye's error.
    pending: VecDeque<(u32, u64, u64)>,
}

struct Inner {
    conn: Connection,
    layout: RingLayout,
    /// A multi-image ring's parts (empty otherwise).
    parts: Vec<PartLayout>,
    delivery: Delivery,
    state: Mutex<State>,
    /// Held while receiving, so that frames are accepted in the order they
    /// arrived.
    receiving: Mutex<()>,
    /// Held across each read of the socket (never across a wait): `next`
    /// and a drain after a hang-up (which a release on another thread may
    /// start) take messages one at a time, in order.
    reading: Mutex<()>,
}

/// A receiver's session with a sender (see the module contract).
pub struct Session {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("layout", &self.inner.layout)
            .field("delivery", &self.inner.delivery)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// One frame a session handed out (see the module contract).
#[must_use = "a frame holds its slot until it is released"]
pub struct Frame {
    session: Arc<Inner>,
    slot: u32,
    sequence: u64,
    timestamp_ns: u64,
    dropped_before: u64,
    released: bool,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("slot", &self.slot)
            .field("sequence", &self.sequence)
            .field("timestamp_ns", &self.timestamp_ns)
            .field("dropped_before", &self.dropped_before)
            .finish()
    }
}

impl Frame {
    /// Its slot.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Its sequence number (from 1, one per presented frame).
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// When it was presented: nanoseconds of `CLOCK_MONOTONIC`.
    pub fn timestamp_ns(&self) -> u64 {
        self.timestamp_ns
    }

    /// Frames presented since the previous one this receiver got, which it
    /// did not get (0 for its first frame).
    pub fn dropped_before(&self) -> u64 {
        self.dropped_before
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        if !self.released {
            self.released = true;
            let _ = self.session.release(self.slot, self.sequence, false);
        }
    }
}

/// The refusal of a multi-image ring by a receiver of one image a slot.
fn multi_image_refusal(parts: &[PartLayout]) -> ConsumerError {
    ConsumerError::MultiImage {
        parts: parts.iter().map(|p| p.name.to_string()).collect(),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // What the locks guard stays consistent at every unlock: a panic
    // elsewhere leaves nothing half-done here.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Session {
    /// Connects to the sender at socket `path`, subscribes in `delivery`
    /// and takes the ring's layout and setup message, all within
    /// `timeout`. A multi-image ring is refused
    /// ([`ConsumerError::MultiImage`]; [`Session::connect_any`] takes it).
    pub fn connect(
        path: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<(Session, Received), ConsumerError> {
        let deadline = deadline_after(timeout);
        let conn = transport::connect(path, timeout)?;
        Session::start(conn, delivery, left(deadline))
    }

    /// [`Session::connect`] that takes multi-image rings too
    /// ([`Session::parts`]).
    pub fn connect_any(
        path: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<(Session, Received), ConsumerError> {
        let deadline = deadline_after(timeout);
        let conn = transport::connect(path, timeout)?;
        Session::start_any(conn, delivery, left(deadline))
    }

    /// Connects to the sender named `name` in `directory`, waiting up to
    /// `timeout` for it to appear, as [`Session::connect`].
    pub fn connect_named(
        directory: &Directory,
        name: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<(Session, Received), ConnectError> {
        let deadline = deadline_after(timeout);
        let conn = directory.connect(name, timeout)?;
        Ok(Session::start(conn, delivery, left(deadline))?)
    }

    /// [`Session::connect_named`] that takes multi-image rings too.
    pub fn connect_named_any(
        directory: &Directory,
        name: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<(Session, Received), ConnectError> {
        let deadline = deadline_after(timeout);
        let conn = directory.connect(name, timeout)?;
        Ok(Session::start_any(conn, delivery, left(deadline))?)
    }

    /// Subscribes on `conn` and takes the layout and the setup message; a
    /// multi-image ring is refused ([`ConsumerError::MultiImage`]).
    pub fn start(
        conn: Connection,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<(Session, Received), ConsumerError> {
        Session::start_with(conn, delivery, timeout, false)
    }

    /// [`Session::start`] that takes multi-image rings too.
    pub fn start_any(
        conn: Connection,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<(Session, Received), ConsumerError> {
        Session::start_with(conn, delivery, timeout, true)
    }

    fn start_with(
        conn: Connection,
        delivery: Delivery,
        timeout: Duration,
        multi: bool,
    ) -> Result<(Session, Received), ConsumerError> {
        let deadline = deadline_after(timeout);
        if let Err(e) = send_message_until(&conn, &Message::Subscribe(delivery), deadline) {
            // Refused at once (a limit)? Its goodbye says why.
            if let Ok(Some(Message::Goodbye(reason))) = try_recv_message(&conn) {
                return Err(ConsumerError::Dropped(reason));
            }
            return Err(match e {
                SendError::Timeout => ConsumerError::Timeout(timeout),
                e => ConsumerError::Protocol(format!("cannot subscribe: {e}")),
            });
        }
        let layout = match recv_message(&conn, deadline, timeout) {
            Ok(Message::Hello(layout)) => layout,
            Ok(Message::Goodbye(reason)) => return Err(ConsumerError::Dropped(reason)),
            Ok(other) => {
                return Err(ConsumerError::Protocol(format!(
                    "the sender's first message must be a hello, not a {}",
                    other.kind_name()
                )))
            }
            Err(e) => return Err(e),
        };
        let mut parts = Vec::with_capacity(layout.parts as usize);
        for index in 0..layout.parts {
            match recv_message(&conn, deadline, timeout)? {
                Message::Part { index: i, part } if i == index => parts.push(part),
                other => {
                    return Err(ConsumerError::Protocol(format!(
                        "after a hello of {} parts the sender must send part {index}, not a {} \
                         ({other:?})",
                        layout.parts,
                        other.kind_name()
                    )))
                }
            }
        }
        check_parts(&layout, &parts)?;
        if layout.is_multi_image() && !multi {
            return Err(multi_image_refusal(&parts));
        }
        let setup = conn.recv(left(deadline))?;
        check_setup_shape(&layout, &setup)?;
        check_setup_parts(&layout, &parts, &setup)?;
        let n = layout.slots as usize;
        let session = Session {
            inner: Arc::new(Inner {
                conn,
                layout,
                parts,
                delivery,
                state: Mutex::new(State {
                    held: vec![None; n],
                    last: 0,
                    asked: false,
                    stats: ReceiverStats::default(),
                    ended: None,
                    pending: VecDeque::new(),
                }),
                receiving: Mutex::new(()),
                reading: Mutex::new(()),
            }),
        };
        Ok((session, setup))
    }

    /// The ring's layout.
    pub fn layout(&self) -> &RingLayout {
        &self.inner.layout
    }

    /// A multi-image ring's parts, in slot order (empty for any other
    /// ring).
    pub fn parts(&self) -> &[PartLayout] {
        &self.inner.parts
    }

    /// `Ok` for a ring of one image or buffer a slot; a multi-image ring
    /// is [`ConsumerError::MultiImage`] naming its parts: what a receiver
    /// of one image a slot says when handed a session of
    /// [`Session::connect_any`] (its slot `i` would be another part).
    pub fn refuse_multi_image(&self) -> Result<(), ConsumerError> {
        if self.layout().is_multi_image() {
            return Err(multi_image_refusal(self.parts()));
        }
        Ok(())
    }

    /// The index of the part named `name`, if the ring has one.
    pub fn part_index(&self, name: &str) -> Option<usize> {
        self.inner
            .parts
            .iter()
            .position(|p| p.name.as_str() == name)
    }

    /// The delivery it subscribed in.
    pub fn delivery(&self) -> Delivery {
        self.inner.delivery
    }

    /// What it has had so far.
    pub fn stats(&self) -> ReceiverStats {
        lock(&self.inner.state).stats
    }

    /// How many slots it holds.
    pub fn held(&self) -> usize {
        lock(&self.inner.state).held.iter().flatten().count()
    }

    /// Why the connection is over, if it is (without asking the kernel).
    pub fn ended(&self) -> Option<ConsumerError> {
        lock(&self.inner.state).ended.as_ref().map(Ended::error)
    }

    /// The next frame, waiting at most `timeout` (see the module contract).
    pub fn next(&self, timeout: Duration) -> Result<Frame, ConsumerError> {
        let deadline = deadline_after(timeout);
        let _receiving = lock_within(&self.inner.receiving, deadline, timeout)?;
        if let Some(ended) = self.inner.ended_now()? {
            return self.after_end(ended);
        }
        if self.inner.delivery == Delivery::Latest {
            let (ask, holding) = {
                let state = lock(&self.inner.state);
                (!state.asked, state.held.iter().flatten().next().copied())
            };
            // The sender gives a latest receiver one frame at a time (the
            // ring-size rule rests on it): say so rather than wait.
            if let Some(sequence) = holding {
                return Err(ConsumerError::LatestHoldsOne { sequence });
            }
            if ask {
                match send_message_until(&self.inner.conn, &Message::Acquire, deadline) {
                    Ok(()) => lock(&self.inner.state).asked = true,
                    // The sender is not reading: this call's time is up.
                    Err(SendError::Timeout) => return Err(ConsumerError::Timeout(timeout)),
                    Err(e) => {
                        let ended = self.inner.lost(format!("cannot ask for a frame: {e}"));
                        return self.after_end(ended);
                    }
                }
            }
        }
        let message = match self.inner.recv(deadline, timeout) {
            Ok(message) => message,
            // A sender closing with this receiver's messages unread resets
            // the connection: a hang-up as well (its goodbye still queued).
            Err(ConsumerError::Closed) => return self.after_end(self.inner.learn_end()),
            Err(ConsumerError::Recv(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return self.after_end(self.inner.learn_end())
            }
            Err(e @ (ConsumerError::Timeout(_) | ConsumerError::Poll(_))) => return Err(e),
            Err(e) => return Err(self.inner.give_up(e.to_string()).error()),
        };
        match message {
            Message::Frame {
                slot,
                sequence,
                timestamp_ns,
            } => {
                let dropped_before = self.inner.accept(slot, sequence, false)?;
                // Queued before a drop? The hang-up is visible now if so,
                // and the slot may be written already (unless the sender
                // is stopping: then it writes nothing more).
                if hung_up(&self.inner.conn)? {
                    let ended = self.inner.learn_end();
                    if !ended.is_graceful() {
                        return Err(ended.error());
                    }
                }
                Ok(self.frame(slot, sequence, timestamp_ns, dropped_before))
            }
            Message::Goodbye(reason) => self.after_end(self.inner.end(Ended::Dropped(reason))),
            other => Err(self
                .inner
                .give_up(format!(
                    "the sender sent a {} message, which only receivers send",
                    other.kind_name()
                ))
                .error()),
        }
    }

    /// After the connection ended: a frame a stopping sender left queued,
    /// else the end's error.
    fn after_end(&self, ended: Ended) -> Result<Frame, ConsumerError> {
        let next = lock(&self.inner.state).pending.pop_front();
        match next {
            Some((slot, sequence, timestamp_ns)) if ended.is_graceful() => {
                let dropped_before = self.inner.accept(slot, sequence, true)?;
                Ok(self.frame(slot, sequence, timestamp_ns, dropped_before))
            }
            _ => Err(ended.error()),
        }
    }

    fn frame(&self, slot: u32, sequence: u64, timestamp_ns: u64, dropped_before: u64) -> Frame {
        Frame {
            session: self.inner.clone(),
            slot,
            sequence,
            timestamp_ns,
            dropped_before,
            released: false,
        }
    }

    /// Gives `frame` back; `gpu_signalled`: this receiver signalled (or
    /// enqueued the signal of) the slot's "released" timeline with the
    /// frame's sequence number after its GPU reads. An error says the
    /// frame was not this receiver's to give back, or that the sender
    /// dropped this receiver while it held the frame (its slot may have
    /// been written since: anything read from it after the drop is not the
    /// frame's).
    pub fn release(&self, mut frame: Frame, gpu_signalled: bool) -> Result<(), ConsumerError> {
        if !Arc::ptr_eq(&frame.session, &self.inner) {
            return Err(ConsumerError::NotThisReceiver {
                sequence: frame.sequence,
            });
        }
        frame.released = true;
        self.inner
            .release(frame.slot, frame.sequence, gpu_signalled)
    }

    /// Whether `frame` is still this receiver's, with its slot untouched by
    /// the sender: not released, and the connection not dropped (asking
    /// the kernel now). A reader calls it after its read completed: `Ok`
    /// then means the bytes it read are the frame's.
    pub fn check_held(&self, frame: &Frame) -> Result<(), ConsumerError> {
        if !Arc::ptr_eq(&frame.session, &self.inner) {
            return Err(ConsumerError::NotThisReceiver {
                sequence: frame.sequence,
            });
        }
        self.inner.check_live()?;
        let held = lock(&self.inner.state).held[frame.slot as usize];
        if held != Some(frame.sequence) {
            return Err(ConsumerError::NotHeld {
                slot: frame.slot,
                sequence: frame.sequence,
            });
        }
        Ok(())
    }

    /// Gives the connection up: shuts the socket down (the sender takes
    /// every slot back) and keeps `why` for later calls.
    pub fn close(&self, why: &str) {
        self.inner.give_up(why.to_string());
    }
}

impl Inner {
    /// The next message, waiting at most until `deadline` (the socket read
    /// under the `reading` lock, the wait outside it).
    fn recv(&self, deadline: Instant, timeout: Duration) -> Result<Message, ConsumerError> {
        loop {
            if poll_readable(&self.conn, deadline)? {
                let _reading = lock(&self.reading);
                if let Some(message) = try_recv_message(&self.conn)? {
                    return Ok(message);
                }
            }
            if left(deadline).is_zero() {
                return Err(ConsumerError::Timeout(timeout));
            }
        }
    }

    /// How the connection ended, if it did (asking the kernel).
    fn ended_now(&self) -> Result<Option<Ended>, ConsumerError> {
        if let Some(ended) = &lock(&self.state).ended {
            return Ok(Some(ended.clone()));
        }
        if hung_up(&self.conn)? {
            return Ok(Some(self.learn_end()));
        }
        Ok(None)
    }

    /// An error if the frames this session holds may no longer be theirs:
    /// the connection ended other than by the sender stopping.
    fn check_live(&self) -> Result<(), ConsumerError> {
        match self.ended_now()? {
            Some(ended) if !ended.is_graceful() => Err(ended.error()),
            _ => Ok(()),
        }
    }

    /// The sender hung up: its goodbye (if it said one, among the queued
    /// messages) is the reason. Every held slot is the sender's again,
    /// unless it is stopping: then the frames queued before its goodbye
    /// are kept for [`Session::next`].
    fn learn_end(&self) -> Ended {
        if let Some(ended) = &lock(&self.state).ended {
            return ended.clone();
        }
        // The queue is bounded by the socket's buffer: a few hundred
        // packets at most; the count bounds a misbehaving kernel too.
        let mut reason = Ended::Closed;
        let mut frames = VecDeque::new();
        let _reading = lock(&self.reading);
        for _ in 0..100_000 {
            match try_recv_message(&self.conn) {
                Ok(Some(Message::Goodbye(r))) => {
                    reason = Ended::Dropped(r);
                    break;
                }
                Ok(Some(Message::Frame {
                    slot,
                    sequence,
                    timestamp_ns,
                })) => frames.push_back((slot, sequence, timestamp_ns)),
                Ok(Some(_)) => continue,
                // A reset is reported once, before what is still queued.
                Err(ConsumerError::Recv(_)) => continue,
                Ok(None) | Err(_) => break,
            }
        }
        if reason.is_graceful() {
            lock(&self.state).pending = frames;
        }
        self.end(reason)
    }

    /// Marks the connection over for `why` (the first reason given stays);
    /// how it ended.
    fn end(&self, why: Ended) -> Ended {
        let mut state = lock(&self.state);
        let ended = state.ended.get_or_insert(why).clone();
        if !ended.is_graceful() {
            state.held.iter_mut().for_each(|h| *h = None);
            state.pending.clear();
        }
        drop(state);
        let _ = rustix::net::shutdown(&self.conn, rustix::net::Shutdown::Both);
        ended
    }

    /// Gives up on a sender that broke the protocol or a socket that failed.
    fn give_up(&self, why: String) -> Ended {
        self.end(Ended::GivenUp(why))
    }

    /// A send failed: the sender left (learn why) or the socket is broken.
    fn lost(&self, why: String) -> Ended {
        if hung_up(&self.conn).unwrap_or(true) {
            self.learn_end()
        } else {
            self.give_up(why)
        }
    }

    /// Checks a frame message and marks its slot held; the frames dropped
    /// before it.
    fn accept(&self, slot: u32, sequence: u64, queued: bool) -> Result<u64, ConsumerError> {
        let mut state = lock(&self.state);
        let n = state.held.len();
        let fault = if slot as usize >= n {
            Some(format!(
                "frame {sequence} names slot {slot} of a ring of {n}"
            ))
        } else if sequence <= state.last {
            Some(format!(
                "frame number {sequence} after {}: frame numbers must go up",
                state.last
            ))
        } else if let Some(old) = state.held[slot as usize] {
            Some(format!(
                "the sender sent frame {sequence} into slot {slot}, which still holds frame \
                 {old}: a sender bug"
            ))
        } else if self.delivery == Delivery::Latest && !state.asked && !queued {
            Some(format!(
                "frame {sequence} came unasked to a latest receiver"
            ))
        } else {
            None
        };
        if let Some(why) = fault {
            drop(state);
            return Err(self.give_up(why).error());
        }
        // Frames presented before this receiver's first are not dropped.
        let dropped_before = if state.last == 0 {
            0
        } else {
            sequence - state.last - 1
        };
        state.held[slot as usize] = Some(sequence);
        state.last = sequence;
        state.asked = false;
        state.stats.received += 1;
        state.stats.dropped += dropped_before;
        Ok(dropped_before)
    }

    /// Sends the release of `sequence` in `slot`, if this session holds it.
    fn release(&self, slot: u32, sequence: u64, gpu_signalled: bool) -> Result<(), ConsumerError> {
        let mut state = lock(&self.state);
        let graceful = match &state.ended {
            Some(ended) if ended.is_graceful() => true,
            Some(ended) => return Err(ended.error()),
            None => false,
        };
        if state.held.get(slot as usize).copied().flatten() != Some(sequence) {
            return Err(ConsumerError::NotHeld { slot, sequence });
        }
        if graceful {
            // The sender is gone: nobody to tell.
            state.held[slot as usize] = None;
            return Ok(());
        }
        // Dropped while holding it? Then its slot may have been written:
        // the caller must hear of it.
        if hung_up(&self.conn)? {
            drop(state);
            let ended = self.learn_end();
            if !ended.is_graceful() {
                return Err(ended.error());
            }
            lock(&self.state).held[slot as usize] = None;
            return Ok(());
        }
        state.held[slot as usize] = None;
        drop(state);
        let release = Message::Release {
            slot,
            sequence,
            gpu_signalled,
        };
        match send_message_until(&self.conn, &release, deadline_after(RELEASE_BOUND)) {
            Ok(()) => Ok(()),
            Err(SendError::Timeout) => Err(self
                .give_up(format!(
                    "the sender did not take a release within {RELEASE_BOUND:?}: it stopped \
                     reading"
                ))
                .error()),
            Err(e) => match self.lost(format!("cannot send a release: {e}")) {
                // It stopped meanwhile: the slot is its no more.
                ended if ended.is_graceful() => Ok(()),
                ended => Err(ended.error()),
            },
        }
    }
}

/// `mutex`'s guard, waiting at most until `deadline`; `Busy(timeout)`
/// otherwise (also when this thread holds it already).
fn lock_within<'m>(
    mutex: &'m Mutex<()>,
    deadline: Instant,
    timeout: Duration,
) -> Result<MutexGuard<'m, ()>, ConsumerError> {
    loop {
        match mutex.try_lock() {
            Ok(guard) => return Ok(guard),
            Err(TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(TryLockError::WouldBlock) => return Err(ConsumerError::Busy(timeout)),
        }
    }
}

/// Checks that `setup` is the ring `layout` announces: tagged
/// [`SETUP_TAG`], with its images or buffers (`slots` times
/// [`RingLayout::images_per_slot`]) alone (no semaphores) or followed by
/// "produced" and `slots` "released" timelines.
pub fn check_setup_shape(layout: &RingLayout, setup: &Received) -> Result<(), ConsumerError> {
    layout.check()?;
    let n = layout.slots as usize;
    let images = layout.produced_index();
    let (tag, count) = (setup.message().tag, setup.message().resources.len());
    if tag != SETUP_TAG || (count != images && count != images + n + 1) {
        return Err(ConsumerError::Protocol(format!(
            "after a hello for {n} slots of {} the sender must send the ring: a message tagged \
             {SETUP_TAG:#x} with {images} resources, or {} with the semaphores; got tag {tag:#x} \
             with {count}",
            layout.images_per_slot(),
            images + n + 1
        )));
    }
    Ok(())
}

/// Checks a multi-image ring's setup message against its parts: each part
/// of a known format has its texel size, and resource
/// [`RingLayout::resource_of`] `(slot, part)` is an image record of the
/// part's format and the hello's size (nothing to check for other rings:
/// their receivers check their own records). The records are the peer's
/// claims; importing verifies them against the device too.
fn check_setup_parts(
    layout: &RingLayout,
    parts: &[PartLayout],
    setup: &Received,
) -> Result<(), ConsumerError> {
    let resources = &setup.message().resources;
    for part in parts {
        // A format the receivers know must have the texel size it says.
        let format = vk_export::ash::vk::Format::from_raw(part.vk_format as i32);
        if let Some((_, channels, channel)) = vk_export::format::describe(format) {
            let bytes = channels * channel.bytes();
            if bytes != part.texel_bytes {
                return Err(ConsumerError::Protocol(format!(
                    "part {} is VkFormat {} ({bytes}-byte texels) announced with {}-byte texels",
                    part.name, part.vk_format, part.texel_bytes
                )));
            }
        }
    }
    for slot in 0..layout.slots {
        for (p, part) in parts.iter().enumerate() {
            let i = layout.resource_of(slot, p as u32);
            let why = match resources.get(i) {
                Some(vk_export::wire::Resource::Image(info)) => {
                    if info.format().as_raw() as u32 != part.vk_format {
                        format!(
                            "is VkFormat {}, the part message says {}",
                            info.format().as_raw(),
                            part.vk_format
                        )
                    } else if info.extent() != [layout.width, layout.height, 1] {
                        let e = info.extent();
                        format!(
                            "is {}x{}x{}, the hello says {}x{}",
                            e[0], e[1], e[2], layout.width, layout.height
                        )
                    } else {
                        continue;
                    }
                }
                Some(_) => "is not an image".to_string(),
                None => "is missing".to_string(),
            };
            return Err(ConsumerError::Protocol(format!(
                "slot {slot}'s image of part {} (resource {i}) {why}",
                part.name
            )));
        }
    }
    Ok(())
}

/// Whether the setup message shares the ring's semaphores.
pub fn has_semaphores(layout: &RingLayout, setup: &Received) -> bool {
    setup.message().resources.len() == layout.produced_index() + layout.slots as usize + 1
}
