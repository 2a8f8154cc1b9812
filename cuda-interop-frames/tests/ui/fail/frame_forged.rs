// A frame cannot be made by hand (its fields are private): no frame names a
// slot or a sequence number its session did not hand out.
use cuda_interop_frames::session::Frame;

fn forge() -> Frame {
    Frame {
        slot: 7,
        sequence: 22,
        timestamp_ns: 0,
        dropped_before: 0,
    }
}

fn main() {
    let _ = forge;
}
