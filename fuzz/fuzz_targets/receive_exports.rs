//! Fuzz target: the receive path with real exports. A pool of real OPAQUE_FD
//! exports of one device (lavapipe or a GPU, with the validation layer), made
//! once; each input sends one export's fd with the record of another (or its
//! own), now and then with one field rewritten on the wire, then receives,
//! takes and imports it on the same device.
//!
//! Properties (`cuda_interop_testkit::export_swap::export_case`): nothing
//! panics; no import claims more memory than the fd's export holds; fds flat;
//! no `VUID-` reported by the layer.
#![no_main]

use std::sync::OnceLock;

use cuda_interop_testkit::export_swap::{export_case, ExportCase, ExportPool};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static POOL: OnceLock<ExportPool> = OnceLock::new();
    let pool = POOL.get_or_init(ExportPool::new);
    let _ = export_case(pool, &ExportCase::from_fuzz_bytes(data, pool));
});
