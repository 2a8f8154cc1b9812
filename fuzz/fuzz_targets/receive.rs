//! Fuzz target: the receive path. A fresh socket pair, `send_raw` of a
//! structure-aware (or raw) message with 0 to 3 fds (pipe ends, `/dev/null`,
//! a memfd), `recv`, typed takes, drop.
//!
//! Properties (`cuda_interop_testkit::wire_gen::receive_case`): nothing panics;
//! `recv` agrees with `Message::decode` and the fd count; the process's open
//! fds (`/proc/self/fd`) are the same after everything is dropped.
#![no_main]

use cuda_interop_testkit::wire_gen::{receive_case, ReceiveCase};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = receive_case(&ReceiveCase::from_fuzz_bytes(data));
});
