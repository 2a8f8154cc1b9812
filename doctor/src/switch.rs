//! What the GPU costs when work moves between Vulkan and CUDA (issue 19), as
//! the doctor measures it on a paired device: CIG support and the
//! graphics-engine switch.
//!
//! # Contract
//!
//! * [`probe`] makes a headless `vk_export::Context` (a transfer-only queue
//!   where the device has one) and uses the paired CUDA device's primary
//!   context; everything it makes is dropped before it returns. It never
//!   panics and never blocks for long: every host wait is a spin bounded by
//!   [`WAIT_LIMIT`], and a failure is a finding, not an error.
//! * The timed CUDA op is a 4-byte `cuMemsetD8Async`, an event record and a
//!   host spin on the event (what the bench's S8 and
//!   `probes/handoff.c` time). It is timed alone (the floor), right after a
//!   fill + fence on the main (graphics or compute) queue, and right after
//!   one on the transfer queue; p50 of [`ROUNDS`] each. The difference to
//!   the floor is what that Vulkan work costs the next CUDA work.
//! * Uses no other module of this crate but [`crate::Finding`].

use std::ffi::c_int;
use std::time::{Duration, Instant};

use cuda_interop::{sys, CudaDevice, DeviceBuffer, Event, Stream};
use vk_export::markers::DeviceLocal;
use vk_export::{Context, ExportableBuffer, HeadlessOptions, QueueRole, SubmitSync};

use crate::Finding;

/// Timed rounds per leg.
pub const ROUNDS: usize = 100;
/// The longest any one host spin may take.
pub const WAIT_LIMIT: Duration = Duration::from_secs(5);

/// What was measured (µs, p50 of [`ROUNDS`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SwitchReport {
    /// `CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED`, if the query answered.
    pub cig_supported: Option<bool>,
    /// The CUDA op alone.
    pub floor_us: f64,
    /// The CUDA op right after a fill + fence on the main queue, and that
    /// queue's family.
    pub after_main_us: (f64, u32),
    /// The same after the transfer queue, where the context has one of its
    /// own family.
    pub after_transfer_us: Option<(f64, u32)>,
}

/// Measures on the first Vulkan device paired with a CUDA device; `Err` is
/// the finding to print (what failed and what to do).
pub(crate) fn probe() -> Result<SwitchReport, Finding> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        Finding::missing(
            format!("the graphics-engine switch could not be measured: {what}: {e}"),
            "this is only a measurement; the rest of the report stands (the bench's S8 measures \
             it in full: cargo run -p cuda-interop-bench --release)",
        )
    };
    let ctx = Context::headless(&HeadlessOptions::default())
        .map_err(|e| failed("no headless Vulkan context", &e))?;
    let cuda = CudaDevice::for_vulkan(&ctx).map_err(|e| failed("no paired CUDA device", &e))?;
    let cig_supported = cig(&cuda);
    let target = ExportableBuffer::<DeviceLocal>::new(&ctx, 4096)
        .map_err(|e| failed("no device-local buffer", &e))?;
    let stream = Stream::new(&cuda).map_err(|e| failed("no CUDA stream", &e))?;
    let memory = DeviceBuffer::new(&cuda, 4).map_err(|e| failed("no CUDA memory", &e))?;
    let event = Event::new(&cuda).map_err(|e| failed("no CUDA event", &e))?;
    let op = || cuda_op(&stream, &memory, &event);
    let fill = |role: QueueRole| {
        ctx.submit_and_wait_on(role, SubmitSync::new(), |device, cmd, _family| {
            // SAFETY: `cmd` is recording, `target` is a live buffer of this
            // device with TRANSFER_DST usage, 4 bytes at offset 0 lie in it;
            // its contents are never read (no ownership transfer needed).
            unsafe { device.cmd_fill_buffer(cmd, target.raw(), 0, 4, 0) }
        })
        .map_err(|e| e.to_string())
    };
    let floor = p50(op).map_err(|e| failed("the CUDA op", &e))?;
    let after = |role: QueueRole| {
        p50(|| {
            fill(role)?;
            op()
        })
    };
    let main_family = ctx.queue_family_of(QueueRole::Main);
    let after_main = after(QueueRole::Main).map_err(|e| failed("after the main queue", &e))?;
    let transfer_family = ctx.queue_family_of(QueueRole::Transfer);
    let after_transfer = if transfer_family != main_family {
        Some((
            after(QueueRole::Transfer).map_err(|e| failed("after the transfer queue", &e))?,
            transfer_family,
        ))
    } else {
        None
    };
    stream
        .synchronize(WAIT_LIMIT)
        .map_err(|e| failed("draining the stream", &e))?;
    Ok(SwitchReport {
        cig_supported,
        floor_us: floor,
        after_main_us: (after_main, main_family),
        after_transfer_us: after_transfer,
    })
}

/// `CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED` of `cuda`'s device.
fn cig(cuda: &CudaDevice) -> Option<bool> {
    let attribute = sys::Driver::global().ok()?.fns().cuDeviceGetAttribute?;
    let mut value: c_int = 0;
    // SAFETY: writes one int for the valid device handle of a live device.
    let r = unsafe {
        attribute(
            &mut value,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED,
            cuda.raw_device(),
        )
    };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(value != 0)
}

/// One timed CUDA op: memset 4 bytes, record, spin on the event; its time.
fn cuda_op(stream: &Stream, memory: &DeviceBuffer, event: &Event) -> Result<Duration, String> {
    let memset = sys::Driver::global()
        .map_err(|e| e.to_string())?
        .fns()
        .cuMemsetD8Async
        .ok_or("the driver has no cuMemsetD8Async")?;
    let _context = stream.device().enter().map_err(|e| e.to_string())?;
    let start = Instant::now();
    // SAFETY: 4 bytes of a live 4-byte allocation of this stream's device,
    // on a live stream of it, with its context current; nothing else uses
    // the memory.
    let r = unsafe { memset(memory.device_ptr(), 0, 4, stream.raw()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuMemsetD8Async: {r:?}"));
    }
    stream.record(event).map_err(|e| e.to_string())?;
    while !event.query().map_err(|e| e.to_string())? {
        if start.elapsed() > WAIT_LIMIT {
            return Err(format!("the CUDA op did not finish within {WAIT_LIMIT:?}"));
        }
        std::hint::spin_loop();
    }
    Ok(start.elapsed())
}

/// The median of [`ROUNDS`] timings, in µs.
fn p50(mut round: impl FnMut() -> Result<Duration, String>) -> Result<f64, String> {
    let mut times = (0..ROUNDS)
        .map(|_| round().map(|d| d.as_secs_f64() * 1e6))
        .collect::<Result<Vec<f64>, String>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[ROUNDS / 2])
}

impl SwitchReport {
    /// The report's lines: CIG, and each leg against the floor.
    pub(crate) fn findings(&self) -> Vec<Finding> {
        let mut findings = vec![match self.cig_supported {
            Some(true) => Finding::ok(
                "CIG (CUDA in graphics contexts): offered (CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED \
                 = 1); this crate does not use it",
            ),
            Some(false) => Finding::ok(
                "CIG (CUDA in graphics contexts): not offered by this driver \
                 (CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED = 0): Vulkan and CUDA work run in two \
                 scheduling contexts",
            ),
            None => Finding::ok("CIG (CUDA in graphics contexts): the driver did not answer"),
        }];
        let (main, family) = self.after_main_us;
        findings.push(Finding::ok(format!(
            "CUDA work right after Vulkan work on queue family {family} (main): {main:.1} µs, \
             alone {:.1} µs: the switch costs about {:.1} µs (p50 of {ROUNDS})",
            self.floor_us,
            main - self.floor_us
        )));
        match self.after_transfer_us {
            Some((t, family)) => findings.push(Finding::ok(format!(
                "after Vulkan work on the transfer-only family {family}: {t:.1} µs ({:.1} µs over \
                 the floor): copies and signals there avoid the switch (vk-export submits them \
                 there)",
                t - self.floor_us
            ))),
            None => findings.push(Finding::ok(
                "no transfer-only queue family: every Vulkan submission shares the main family",
            )),
        }
        findings
    }
}
