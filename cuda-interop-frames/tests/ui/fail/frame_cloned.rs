// A frame is neither Clone nor Copy: no second handle to release.
use cuda_interop_frames::session::Session;

fn copy(session: &Session) {
    let frame = session.next(std::time::Duration::from_secs(1)).unwrap();
    let again = frame.clone();
    let _ = session.release(frame, false);
    let _ = session.release(again, false);
}

fn main() {
    let _ = copy;
}
