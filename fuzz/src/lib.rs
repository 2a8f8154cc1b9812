//! Support for the fuzz targets: sampling the inputs libFuzzer generates, so
//! that a separate tool can replay them and measure which decoders they reach
//! (`cargo run -p cuda-interop-tests --example wire_reach -- DIR`).
//!
//! # Contract
//!
//! * [`sample`] does nothing unless `CUDA_INTEROP_FUZZ_SAMPLE_DIR` is set; then
//!   it writes every `CUDA_INTEROP_FUZZ_SAMPLE_EVERY`-th input (default 1000)
//!   there, named by process id and input number. It never panics on an I/O
//!   error (a sample is lost instead).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

struct Sampler {
    dir: PathBuf,
    every: u64,
}

/// Writes every n-th input to the sample directory, if one is configured.
pub fn sample(data: &[u8]) {
    static SAMPLER: OnceLock<Option<Sampler>> = OnceLock::new();
    static SEEN: AtomicU64 = AtomicU64::new(0);
    let sampler = SAMPLER.get_or_init(|| {
        let dir = PathBuf::from(std::env::var_os("CUDA_INTEROP_FUZZ_SAMPLE_DIR")?);
        let every = std::env::var("CUDA_INTEROP_FUZZ_SAMPLE_EVERY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000u64)
            .max(1);
        std::fs::create_dir_all(&dir).ok()?;
        Some(Sampler { dir, every })
    });
    let Some(sampler) = sampler else { return };
    let n = SEEN.fetch_add(1, Ordering::Relaxed);
    if n.is_multiple_of(sampler.every) {
        let name = format!("{}-{n:012}", std::process::id());
        let _ = std::fs::write(sampler.dir.join(name), data);
    }
}
