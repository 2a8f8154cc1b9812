//! A receiver's protocol handle: connects (by name or path), says its
//! delivery mode, receives the ring's layout and setup message, then hands
//! out frame announcements ([`FrameInfo`]: slot, sequence number,
//! timestamp) and sends their releases, counting the frames it missed.
//!
//! # Contract
//!
//! * [`FrameReceiver::connect`] sends [`Packet::subscribe`] first, then
//!   waits (bounded) for the hello and the setup message; the setup
//!   message is the caller's to import ([`FrameReceiver::take_setup`]):
//!   into CUDA ([`crate::consumer::Ring::import`], the `frame_client`
//!   example), or into a Vulkan device of its own.
//! * [`Delivery::Latest`] (the default): [`FrameReceiver::next_frame`]
//!   asks for the newest frame and waits for it; the frames between two
//!   it got are counted in [`ReceiverStats::dropped`]. [`Delivery::Lossless`]:
//!   every frame, in order; the sender waits for this receiver's releases.
//! * A frame is held until [`FrameReceiver::release`] takes it back (a
//!   [`FrameInfo`] is not `Clone`, so a frame is released once); frame
//!   numbers that do not go up, or a frame for a slot still held, are
//!   protocol errors. Dropping the receiver closes the connection, which
//!   gives every held slot back.
//! * Every wait is bounded by the caller's timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vk_export::socket::Connection;

use crate::consumer::{self, check_setup, deadline_after, left, ConsumerError, SendError};
use crate::discovery::{Directory, DiscoveryError};
use crate::protocol::{self, Kind, Packet};

/// How a receiver wants its frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Delivery {
    /// The newest frame when it asks; the sender never waits for it.
    #[default]
    Latest,
    /// Every frame, in order; the sender waits (bounded) for its releases.
    Lossless,
}

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

/// One frame this receiver holds.
#[derive(Debug, PartialEq, Eq)]
pub struct FrameInfo {
    /// Its slot.
    pub slot: u32,
    /// Its sequence number (from 1, one per presented frame).
    pub sequence: u64,
    /// When it was presented: nanoseconds of `CLOCK_MONOTONIC`.
    pub timestamp_ns: u64,
    /// Frames presented since the previous one this receiver got, which it
    /// did not get (0 for its first frame).
    pub dropped_before: u64,
}

/// What this receiver has had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Frames received.
    pub received: u64,
    /// Frames presented between received ones that it did not get (frames
    /// before its first are not counted).
    pub dropped: u64,
}

/// A receiver's connection to a sender (see the module contract).
#[derive(Debug)]
pub struct FrameReceiver {
    conn: Arc<Connection>,
    delivery: Delivery,
    layout: Packet,
    setup: Option<vk_export::wire::Received>,
    held: Vec<Option<u64>>,
    last: u64,
    asked: bool,
    stats: ReceiverStats,
}

impl FrameReceiver {
    /// Connects to the sender at socket `path`.
    pub fn connect(
        path: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<FrameReceiver, ConsumerError> {
        let conn = consumer::connect(path, timeout)?;
        FrameReceiver::start(conn, delivery, timeout)
    }

    /// Connects to the live sender named `name` in `directory`.
    pub fn connect_named(
        directory: &Directory,
        name: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<FrameReceiver, ConnectError> {
        let conn = directory.connect(name, timeout)?;
        Ok(FrameReceiver::start(conn, delivery, timeout)?)
    }

    /// Says the mode and takes the hello and the setup message from `conn`.
    pub fn start(
        conn: Connection,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<FrameReceiver, ConsumerError> {
        let mode = match delivery {
            Delivery::Latest => protocol::MODE_LATEST,
            Delivery::Lossless => protocol::MODE_LOSSLESS,
        };
        consumer::send_packet(&conn, &Packet::subscribe(mode))
            .map_err(|e| ConsumerError::Protocol(format!("cannot subscribe: {e}")))?;
        let deadline = deadline_after(timeout);
        let hello = consumer::recv_packet(&conn, deadline, timeout)?;
        if hello.kind != Kind::Hello {
            return Err(ConsumerError::Protocol(format!(
                "the sender's first packet must be a hello, not {:?}",
                hello.kind
            )));
        }
        let setup = conn.recv(left(deadline))?;
        check_setup_any(&hello, &setup)?;
        Ok(FrameReceiver {
            conn: Arc::new(conn),
            delivery,
            held: vec![None; hello.slot as usize],
            layout: hello,
            setup: Some(setup),
            last: 0,
            asked: false,
            stats: ReceiverStats::default(),
        })
    }

    /// The ring's layout (the sender's hello).
    pub fn layout(&self) -> &Packet {
        &self.layout
    }

    /// The delivery mode.
    pub fn delivery(&self) -> Delivery {
        self.delivery
    }

    /// The connection (for [`crate::consumer::Ring::import`]).
    pub fn connection(&self) -> &Arc<Connection> {
        &self.conn
    }

    /// The setup message (the ring's buffers and timelines), once.
    pub fn take_setup(&mut self) -> Option<vk_export::wire::Received> {
        self.setup.take()
    }

    /// What it has had so far.
    pub fn stats(&self) -> ReceiverStats {
        self.stats
    }

    /// Whether `frame` is one this receiver holds now (received, not yet
    /// released).
    pub fn holds(&self, frame: &FrameInfo) -> bool {
        self.held.get(frame.slot as usize).copied().flatten() == Some(frame.sequence)
    }

    /// How many slots it holds.
    pub fn held(&self) -> usize {
        self.held.iter().flatten().count()
    }

    /// The next frame (latest: the newest, asked for now), waiting at most
    /// `timeout`. A timed-out request stays asked: the frame it brings is
    /// the next call's.
    pub fn next_frame(&mut self, timeout: Duration) -> Result<FrameInfo, ConsumerError> {
        if self.delivery == Delivery::Latest && !self.asked {
            consumer::send_packet(&self.conn, &Packet::acquire())
                .map_err(|e| ConsumerError::Protocol(format!("cannot ask for a frame: {e}")))?;
            self.asked = true;
        }
        let packet = consumer::recv_packet(&self.conn, deadline_after(timeout), timeout)?;
        let mut frame = self.accept(packet)?;
        // Latest: frames already queued behind it (pushed before the sender
        // read the subscribe) are newer; keep the newest, give the rest back.
        while self.delivery == Delivery::Latest {
            match consumer::recv_packet(&self.conn, Instant::now(), Duration::ZERO) {
                Ok(packet) => {
                    let newer = self.accept(packet)?;
                    self.stats.dropped += 1;
                    let older = std::mem::replace(&mut frame, newer);
                    frame.dropped_before += 1 + older.dropped_before;
                    self.stats.received -= 1;
                    self.release(older, false).map_err(|e| {
                        ConsumerError::Protocol(format!("cannot give a stale frame back: {e}"))
                    })?;
                }
                Err(ConsumerError::Timeout(_)) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(frame)
    }

    /// Checks a frame packet and marks its slot held.
    fn accept(&mut self, packet: Packet) -> Result<FrameInfo, ConsumerError> {
        if packet.kind != Kind::Frame {
            return Err(ConsumerError::Protocol(format!(
                "expected a frame packet, got {:?}",
                packet.kind
            )));
        }
        let slot = packet.slot as usize;
        if slot >= self.held.len() {
            return Err(ConsumerError::Protocol(format!(
                "frame {} names slot {slot} of a ring of {}",
                packet.frame,
                self.held.len()
            )));
        }
        if packet.frame <= self.last {
            return Err(ConsumerError::Protocol(format!(
                "frame number {} after {}: frame numbers must go up",
                packet.frame, self.last
            )));
        }
        if let Some(old) = self.held[slot] {
            return Err(ConsumerError::Protocol(format!(
                "frame {} sent into slot {slot}, which still holds frame {old}: a sender bug",
                packet.frame
            )));
        }
        // Frames presented before this receiver's first are not dropped.
        let dropped_before = if self.last == 0 {
            0
        } else {
            packet.frame - self.last - 1
        };
        self.held[slot] = Some(packet.frame);
        self.last = packet.frame;
        self.asked = false;
        self.stats.received += 1;
        self.stats.dropped += dropped_before;
        Ok(FrameInfo {
            slot: packet.slot,
            sequence: packet.frame,
            timestamp_ns: packet.timestamp_ns,
            dropped_before,
        })
    }

    /// Gives `frame` back; `gpu_signalled`: this receiver signalled (or
    /// enqueued the signal of) the slot's "released" timeline with the
    /// frame's sequence number after its GPU reads.
    pub fn release(&mut self, frame: FrameInfo, gpu_signalled: bool) -> Result<(), SendError> {
        let slot = frame.slot as usize;
        consumer::send_packet(
            &self.conn,
            &Packet::release(frame.slot, frame.sequence, gpu_signalled),
        )?;
        if self.held[slot] == Some(frame.sequence) {
            self.held[slot] = None;
        }
        Ok(())
    }
}

/// A ring with semaphores ([`check_setup`]) or one with buffers only.
fn check_setup_any(hello: &Packet, setup: &vk_export::wire::Received) -> Result<(), ConsumerError> {
    let n = hello.slot as usize;
    let (tag, count) = (setup.message().tag, setup.message().resources.len());
    if tag == protocol::SETUP_TAG && count == n {
        return Ok(());
    }
    check_setup(hello, setup)
}
