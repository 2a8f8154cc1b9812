//! Fuzz target: the wire decoder on structure-aware messages (every field a
//! raw integer, length and CRC correct unless the input says otherwise) and,
//! one input in eight, raw bytes.
//!
//! Properties (`cuda_interop_testkit::wire_gen::decode_case`): `Message::decode`
//! never panics; whatever decodes re-encodes to exactly the same bytes; a
//! message with broken framing is never accepted.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cuda_interop_fuzz::sample(data);
    let _ = cuda_interop_testkit::wire_gen::decode_case(data);
});
