// A frame is released by value: releasing it twice does not compile.
use cuda_interop_frames::session::Session;

fn twice(session: &Session) {
    let frame = session.next(std::time::Duration::from_secs(1)).unwrap();
    let _ = session.release(frame, false);
    let _ = session.release(frame, false);
}

fn main() {
    let _ = twice;
}
