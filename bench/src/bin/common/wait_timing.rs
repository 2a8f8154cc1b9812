//! What the host-wait benchmarks (`host_wait`, `wait_mechanisms`) measure the
//! same way: the process's CPU time, and how late each wait returned after
//! its kernel ended.

use std::time::Duration;

use cuda_interop::{DeviceBuffer, Stream};

/// User + system CPU time of the whole process (every thread, the driver's
/// included).
pub fn cpu_time() -> Duration {
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a live, writable rusage; RUSAGE_SELF is valid.
    let status = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(status, 0, "getrusage failed");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// How late each measured wait returned after its kernel ended, sorted:
/// `windows[n]` (launch to return of iteration `n + warm_up`) minus that
/// kernel's own duration, from the two `%globaltimer` stamps (u64 start,
/// u64 end) `spin_ns` wrote at `stamps[16 * iteration]`. Waits for the
/// stream first, bounded by `timeout`.
pub fn late_after_kernel(
    stream: &Stream,
    stamps: &DeviceBuffer,
    windows: &[Duration],
    warm_up: usize,
    timeout: Duration,
) -> cuda_interop::Result<Vec<Duration>> {
    stream.synchronize(timeout)?;
    let mut raw = vec![0u8; stamps.len()];
    stream.copy_to_host(stamps, &mut raw)?;
    let word = |at: usize| u64::from_ne_bytes(raw[at..at + 8].try_into().unwrap());
    let mut late: Vec<Duration> = windows
        .iter()
        .enumerate()
        .map(|(n, window)| {
            let slot = (n + warm_up) * 16;
            let kernel = Duration::from_nanos(word(slot + 8).saturating_sub(word(slot)));
            window.saturating_sub(kernel)
        })
        .collect();
    late.sort();
    Ok(late)
}
