//! Frame timestamps (`CLOCK_MONOTONIC` nanoseconds) and GStreamer running
//! time, both ways.
//!
//! # Contract
//!
//! * A pipeline whose clock is a `GstSystemClock` of type
//!   `GST_CLOCK_TYPE_MONOTONIC` (the default system clock) counts
//!   `CLOCK_MONOTONIC`: there a frame's timestamp `t` is running time `t -
//!   base_time` ([`running_time_of`]) and running time `r` is timestamp
//!   `base_time + r` ([`timestamp_of`]), so that timestamps survive a trip
//!   through `cudainteropsrc ! ... ! cudainteropsink`.
//! * With any other clock (a network clock, a realtime system clock), or
//!   before the element has a clock and a base time, the source stamps a
//!   frame with the clock's now and the sink with `CLOCK_MONOTONIC`'s now.
//! * A frame older than the base time (presented before the pipeline went
//!   to PLAYING) gets running time 0; one stamped later than the clock's now
//!   (a sender's timestamps are claims) gets now's: a timestamp from the
//!   future would hold every later buffer back.
//! * A running time whose timestamp would overflow `u64` is stamped with
//!   `CLOCK_MONOTONIC`'s now.

use cuda_interop_frames::sender::monotonic_ns;
use gst::prelude::*;

/// Whether `clock` counts `CLOCK_MONOTONIC`.
pub(crate) fn is_monotonic(clock: &gst::Clock) -> bool {
    clock
        .downcast_ref::<gst::SystemClock>()
        .is_some_and(|c| c.property::<gst::ClockType>("clock-type") == gst::ClockType::Monotonic)
}

/// The running time of a frame stamped `timestamp_ns` in `element`'s
/// pipeline (see the module contract); `None` without a clock or base time.
pub(crate) fn running_time_of(element: &gst::Element, timestamp_ns: u64) -> Option<gst::ClockTime> {
    let clock = element.clock()?;
    let base = element.base_time()?;
    let now = clock.time();
    // A peer's timestamp is only a claim: one from the future (or
    // GST_CLOCK_TIME_NONE's value) would hold every later buffer back, so
    // no frame counts as captured after now.
    let at = if is_monotonic(&clock) {
        gst::ClockTime::try_from(std::time::Duration::from_nanos(timestamp_ns))
            .map_or(now, |at| at.min(now))
    } else {
        now
    };
    Some(at.checked_sub(base).unwrap_or(gst::ClockTime::ZERO))
}

/// The `CLOCK_MONOTONIC` timestamp of running time `running` in
/// `element`'s pipeline (see the module contract).
pub(crate) fn timestamp_of(element: &gst::Element, running: Option<gst::ClockTime>) -> u64 {
    let (Some(clock), Some(base), Some(running)) = (element.clock(), element.base_time(), running)
    else {
        return monotonic_ns();
    };
    if is_monotonic(&clock) {
        base.checked_add(running)
            .map_or_else(monotonic_ns, gst::ClockTime::nseconds)
    } else {
        monotonic_ns()
    }
}
