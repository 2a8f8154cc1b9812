// The twin: a frame read through its accessors and released once, by value.
use cuda_interop_frames::session::Session;

fn once(session: &Session) {
    let frame = session.next(std::time::Duration::from_secs(1)).unwrap();
    let _ = (frame.slot(), frame.sequence(), frame.timestamp_ns(), frame.dropped_before());
    let _ = session.release(frame, false);
}

fn main() {
    let _ = once;
}
