//! S8: the switch of the GPU's graphics engine between the Vulkan and the
//! CUDA contexts (issue 19), measured by the bench on every queue family the
//! device has, both directions, with `CUDA_DEVICE_MAX_CONNECTIONS` unset and
//! set to 1.
//!
//! The timed CUDA op is what `probes/handoff.c` (shared reference notes)
//! timed: a 4-byte `cuMemsetD8Async`, an event record and a host spin on the
//! event, with the context current. Every leg times it (or, in the reverse
//! direction, a Vulkan fill + fence) after the earlier work has completed, so
//! a figure above the floor is what the earlier work costs the next one.
//! Each leg is reported as p50 and p99, each against the floor's p50 and p99
//! measured in the same process.
//!
//! # Contract
//!
//! * The parent ([`s8`]) measures nothing itself: the environment variable
//!   has to be set before CUDA initialises, so both variants run in a child
//!   process of this binary (`bench --s8-child`), unset and `=1`, and the
//!   parent merges the rows the children print (`S8ROW`, `S8NOTE`, `S8SKIP`
//!   lines). A child that finds no CUDA device says so (`S8SKIP`), and the
//!   parent reports S8 as skipped, with the reason. [`two_switches`] reads
//!   the main family's two switches back from the merged rows (S3 sets the
//!   render producer's overhead against them); the case names it matches
//!   are built by the same functions the child prints them with.
//! * The child creates its own `VkDevice` on the paired physical device with
//!   one queue of every family (raw ash calls: the measurement legs, like
//!   S6's raw baseline), and imports one timeline semaphore of it into CUDA
//!   with raw driver calls. Everything it submits only signals; every host
//!   wait is a spin bounded by [`WAIT_LIMIT`]. The CUDA import is destroyed
//!   after the stream drained and before the Vulkan device is.

use std::ffi::c_int;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cuda_interop::{sys, CudaDevice, DeviceBuffer, Event, Stream};
use vk_export::ash::{self, vk};
use vk_export::{Context, HeadlessOptions};

use crate::common::{Drain, WAIT_LIMIT};
use crate::report::{quantile, us, Report};
use crate::Res;

/// The argument that makes this binary an S8 child.
pub(crate) const CHILD_FLAG: &str = "--s8-child";
const VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// Runs both children and adds their rows and notes to `report` (a child
/// that fails is a [`Report::fail`]: the other scenarios still run).
pub(crate) fn s8(report: &mut Report, quick: bool) -> Res<()> {
    let exe = std::env::current_exe()?;
    for setting in [None, Some("1")] {
        let label = match setting {
            None => format!("{VAR} unset"),
            Some(v) => format!("{VAR}={v}"),
        };
        let mut child = Command::new(&exe);
        child.arg(CHILD_FLAG);
        if quick {
            child.arg("--quick");
        }
        match setting {
            None => child.env_remove(VAR),
            Some(v) => child.env(VAR, v),
        };
        let out = match child.stderr(Stdio::inherit()).output() {
            Ok(out) => out,
            Err(e) => {
                report.fail(format!("S8 ({label}): the child did not start: {e}"));
                continue;
            }
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let mut skipped = None;
        for line in text.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            match fields.as_slice() {
                ["S8ROW", case, value, "", ""] => {
                    report.add("S8", format!("{label}: {case}"), value.parse()?, "us")
                }
                ["S8ROW", case, value, base, base_value] => report.add_vs(
                    "S8",
                    format!("{label}: {case}"),
                    value.parse()?,
                    "us",
                    (*base, base_value.parse()?),
                ),
                ["S8NOTE", note] => report.note(format!("S8 ({label}): {note}")),
                ["S8SKIP", why] => skipped = Some(why.to_string()),
                _ => println!("S8 child ({label}): {line}"),
            }
        }
        if let Some(why) = skipped {
            report.note(format!("S8 (engine switch) skipped: {why}"));
            return Ok(());
        }
        if !out.status.success() {
            // The other scenarios still run; the bench fails at the end.
            report.fail(format!(
                "S8 ({label}): the child failed ({}; its error is on stderr above)",
                out.status
            ));
        }
    }
    Ok(())
}

/// The child: measures every leg and prints the rows (see the module's
/// contract).
pub(crate) fn child_main(quick: bool) -> Res<()> {
    let ctx = match Context::headless(&HeadlessOptions::default()) {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("S8SKIP\tno Vulkan device with external memory ({e})");
            return Ok(());
        }
    };
    let cuda = match CudaDevice::for_vulkan(&ctx) {
        Ok(cuda) => cuda,
        Err(e) => {
            // The Vulkan half still runs, so that its calls are checked
            // where the layer is (CI's lavapipe); nothing is timed.
            // SAFETY: the paired physical device of a live instance.
            let export = unsafe {
                ctx.instance()
                    .enumerate_device_extension_properties(ctx.physical_device())
            }?
            .iter()
            .any(|e| {
                e.extension_name_as_c_str()
                    .is_ok_and(|name| name == ash::khr::external_semaphore_fd::NAME)
            });
            let raw = raw_device(&ctx, export)?;
            raw.exercise(3)?;
            drop(raw);
            if ctx.validation_errors() > 0 {
                return Err(format!("{} validation errors", ctx.validation_errors()).into());
            }
            let e = e.to_string().replace(['\t', '\n'], " ");
            println!(
                "S8SKIP\tno CUDA device for this Vulkan device ({e}); nothing measured (the Vulkan half of the legs ran untimed on {} queue families, validation layer {})",
                props_count(&ctx),
                if ctx.validation_enabled() { "on, 0 errors" } else { "off" }
            );
            return Ok(());
        }
    };
    let iterations = if quick { 60 } else { 300 };
    let result = measure(&ctx, &cuda, iterations);
    if ctx.validation_errors() > 0 {
        return Err(format!("{} validation errors", ctx.validation_errors()).into());
    }
    result
}

/// The child's Vulkan objects on its own device, destroyed in `Drop` after
/// the device is idle (everything submitted only signals, so idle comes).
struct RawDevice {
    device: ash::Device,
    families: Vec<Family>,
    fence: vk::Fence,
    shared: vk::Semaphore,
    local: vk::Semaphore,
}

/// One queue of one family, with a fill command buffer where the family
/// may record one (graphics, compute or transfer).
struct Family {
    index: u32,
    flags: vk::QueueFlags,
    queue: vk::Queue,
    pool: vk::CommandPool,
    fill: Option<vk::CommandBuffer>,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
}

impl Drop for RawDevice {
    fn drop(&mut self) {
        // SAFETY: objects of this device, each destroyed once, after the
        // device is idle; nothing else uses them (the CUDA import of
        // `shared` was destroyed before: it is declared after this value).
        unsafe {
            let _ = self.device.device_wait_idle();
            for f in &self.families {
                self.device.destroy_command_pool(f.pool, None);
                self.device.destroy_buffer(f.buffer, None);
                self.device.free_memory(f.memory, None);
            }
            self.device.destroy_fence(self.fence, None);
            self.device.destroy_semaphore(self.shared, None);
            self.device.destroy_semaphore(self.local, None);
            self.device.destroy_device(None);
        }
    }
}

impl RawDevice {
    /// Spins until `semaphore` (a timeline of this device) reaches `value`.
    fn counter(&self, semaphore: vk::Semaphore, value: u64) -> Res<()> {
        spin("a Vulkan signal", || {
            // SAFETY: a live timeline semaphore of this device.
            Ok(unsafe { self.device.get_semaphore_counter_value(semaphore) }? >= value)
        })
    }

    /// Submits only a timeline signal of `semaphore` to `value` on `queue`.
    fn signal(&self, queue: vk::Queue, semaphore: vk::Semaphore, value: u64) -> Res<()> {
        let values = [value];
        let semaphores = [semaphore];
        let mut timeline =
            vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
        let info = vk::SubmitInfo::default()
            .signal_semaphores(&semaphores)
            .push_next(&mut timeline);
        // SAFETY: a queue of this device used by this thread only; a live
        // timeline semaphore and a value above every earlier one (callers
        // count up); the arrays outlive the call.
        unsafe { self.device.queue_submit(queue, &[info], vk::Fence::null()) }?;
        Ok(())
    }

    /// Submits the fill `cb` on `queue` with the fence, spins until the
    /// fence is signalled and resets it.
    fn fill_and_fence(&self, queue: vk::Queue, cb: vk::CommandBuffer) -> Res<()> {
        let buffers = [cb];
        let info = vk::SubmitInfo::default().command_buffers(&buffers);
        // SAFETY: a recorded command buffer of this queue's family, not
        // pending (every earlier submission of it was waited for below); an
        // unsignalled fence.
        unsafe { self.device.queue_submit(queue, &[info], self.fence) }?;
        spin("a Vulkan fill", || {
            // SAFETY: a live fence of this device.
            Ok(unsafe { self.device.get_fence_status(self.fence) }?)
        })?;
        // SAFETY: a signalled fence no pending submission uses.
        unsafe { self.device.reset_fences(&[self.fence]) }?;
        Ok(())
    }

    /// The Vulkan half of every leg, without CUDA: where there is no CUDA
    /// device (lavapipe), this still runs the child's Vulkan code under the
    /// validation layer.
    fn exercise(&self, rounds: u64) -> Res<()> {
        let (mut shared, mut local) = (0, 0);
        for f in &self.families {
            for _ in 0..rounds {
                shared += 1;
                self.signal(f.queue, self.shared, shared)?;
                self.counter(self.shared, shared)?;
                local += 1;
                self.signal(f.queue, self.local, local)?;
                self.counter(self.local, local)?;
                if let Some(cb) = f.fill {
                    self.fill_and_fence(f.queue, cb)?;
                }
            }
            let info = vk::SemaphoreSignalInfo::default()
                .semaphore(self.shared)
                .value(shared + 1);
            shared += 1;
            // SAFETY: a live timeline semaphore of this device, a value
            // above every earlier one, no signal pending.
            unsafe { self.device.signal_semaphore(&info) }?;
        }
        Ok(())
    }
}

fn props_count(ctx: &Context) -> usize {
    // SAFETY: the paired physical device of a live instance.
    unsafe {
        ctx.instance()
            .get_physical_device_queue_family_properties(ctx.physical_device())
    }
    .len()
}

fn fill_capable(flags: vk::QueueFlags) -> bool {
    flags.intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE | vk::QueueFlags::TRANSFER)
}

/// A device with one queue of each of `families` (indices), with
/// `VK_KHR_external_semaphore_fd` when `export`.
fn create_device(ctx: &Context, families: &[u32], export: bool) -> Result<ash::Device, vk::Result> {
    let priorities = [1.0f32];
    let queues: Vec<vk::DeviceQueueCreateInfo<'_>> = families
        .iter()
        .map(|&f| {
            vk::DeviceQueueCreateInfo::default()
                .queue_family_index(f)
                .queue_priorities(&priorities)
        })
        .collect();
    let extensions = [ash::khr::external_semaphore_fd::NAME.as_ptr()];
    let extensions = if export { &extensions[..] } else { &[] };
    let mut features = vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(true);
    let info = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_extension_names(extensions)
        .push_next(&mut features);
    // SAFETY: the paired physical device of a live instance; the arrays and
    // chain outlive the call.
    unsafe {
        ctx.instance()
            .create_device(ctx.physical_device(), &info, None)
    }
}

/// Builds the child's device and its objects; `shared` is exportable
/// (OPAQUE_FD) when `export`.
fn raw_device(ctx: &Context, export: bool) -> Res<RawDevice> {
    let instance = ctx.instance();
    let pd = ctx.physical_device();
    // SAFETY: the paired physical device of a live instance.
    let props = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    let all: Vec<u32> = (0..props.len() as u32).collect();
    let (device, used) = match create_device(ctx, &all, export) {
        Ok(device) => (device, all),
        Err(e) => {
            // A family that needs an extension to be used (video, say):
            // measured without it, and said so.
            let usable: Vec<u32> = all
                .iter()
                .copied()
                .filter(|&f| fill_capable(props[f as usize].queue_flags))
                .collect();
            println!(
                "S8NOTE\ta device with a queue of every family failed ({e}); measured on families {usable:?} only"
            );
            (create_device(ctx, &usable, export)?, usable)
        }
    };
    // SAFETY: the physical device of this device.
    let memory_props = unsafe { instance.get_physical_device_memory_properties(pd) };
    let mut raw = RawDevice {
        device,
        families: Vec::new(),
        fence: vk::Fence::null(),
        shared: vk::Semaphore::null(),
        local: vk::Semaphore::null(),
    };
    let d = raw.device.clone();
    // SAFETY (this block): objects of the live device `d`, created with
    // valid create infos whose data outlive each call; every object is put
    // into `raw` as soon as it exists, so that `Drop` destroys it.
    unsafe {
        raw.fence = d.create_fence(&vk::FenceCreateInfo::default(), None)?;
        let mut export_info = vk::ExportSemaphoreCreateInfo::default()
            .handle_types(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        let mut timeline = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let mut info = vk::SemaphoreCreateInfo::default().push_next(&mut timeline);
        if export {
            info = info.push_next(&mut export_info);
        }
        raw.shared = d.create_semaphore(&info, None)?;
        let mut timeline = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        raw.local = d.create_semaphore(
            &vk::SemaphoreCreateInfo::default().push_next(&mut timeline),
            None,
        )?;
        for (index, p) in props.iter().enumerate() {
            let index = index as u32;
            if !used.contains(&index) {
                continue;
            }
            // Queue 0 of a family the device was created with one queue of.
            let queue = d.get_device_queue(index, 0);
            let buffer = d.create_buffer(
                &vk::BufferCreateInfo::default()
                    .size(1 << 16)
                    .usage(vk::BufferUsageFlags::TRANSFER_DST)
                    .sharing_mode(vk::SharingMode::EXCLUSIVE),
                None,
            )?;
            let mut family = Family {
                index,
                flags: p.queue_flags,
                queue,
                pool: vk::CommandPool::null(),
                fill: None,
                buffer,
                memory: vk::DeviceMemory::null(),
            };
            let requirements = d.get_buffer_memory_requirements(buffer);
            let allowed = |i: u32| requirements.memory_type_bits >> i & 1 == 1;
            let types = &memory_props.memory_types[..memory_props.memory_type_count as usize];
            let type_index = (0..types.len() as u32)
                .find(|&i| {
                    allowed(i)
                        && types[i as usize]
                            .property_flags
                            .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
                })
                .or_else(|| (0..types.len() as u32).find(|&i| allowed(i)));
            let Some(type_index) = type_index else {
                raw.families.push(family);
                return Err("no memory type for a 64 KiB transfer buffer".into());
            };
            let memory = d.allocate_memory(
                &vk::MemoryAllocateInfo::default()
                    .allocation_size(requirements.size)
                    .memory_type_index(type_index),
                None,
            );
            family.memory = match memory {
                Ok(m) => m,
                Err(e) => {
                    raw.families.push(family);
                    return Err(e.into());
                }
            };
            let pool = d.create_command_pool(
                &vk::CommandPoolCreateInfo::default().queue_family_index(index),
                None,
            );
            family.pool = match pool {
                Ok(p) => p,
                Err(e) => {
                    raw.families.push(family);
                    return Err(e.into());
                }
            };
            raw.families.push(family);
            let family = raw.families.last_mut().expect("just pushed");
            d.bind_buffer_memory(family.buffer, family.memory, 0)?;
            if fill_capable(family.flags) {
                let cb = d.allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(family.pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1),
                )?[0];
                d.begin_command_buffer(cb, &vk::CommandBufferBeginInfo::default())?;
                d.cmd_fill_buffer(cb, family.buffer, 0, 4096, 0x1234);
                d.end_command_buffer(cb)?;
                family.fill = Some(cb);
            }
        }
    }
    Ok(raw)
}

/// The CUDA import of the child's shared timeline, destroyed on drop (after
/// the stream drained: see [`measure`]'s declaration order).
struct CudaSemaphore<'d> {
    cuda: &'d CudaDevice,
    handle: sys::CUexternalSemaphore,
}

impl Drop for CudaSemaphore<'_> {
    fn drop(&mut self) {
        let Ok(driver) = sys::Driver::global() else {
            return;
        };
        let (Some(destroy), Ok(_context)) =
            (driver.fns().cuDestroyExternalSemaphore, self.cuda.enter())
        else {
            return;
        };
        // SAFETY: a live import of the current context, destroyed once,
        // after the stream that used it drained (declaration order).
        unsafe { destroy(self.handle) };
    }
}

fn check(r: sys::CUresult, what: &str) -> Res<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}").into())
    }
}

/// Spins until `done` says so, at most [`WAIT_LIMIT`].
fn spin(what: &str, mut done: impl FnMut() -> Res<bool>) -> Res<()> {
    let start = Instant::now();
    while !done()? {
        if start.elapsed() > WAIT_LIMIT {
            return Err(format!("S8: {what} did not complete within {WAIT_LIMIT:?}").into());
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// p50 and p99 (µs) of `n` runs of `f` after 20 unrecorded ones.
fn leg(n: usize, mut f: impl FnMut() -> Res<Duration>) -> Res<(f64, f64)> {
    let mut t = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let d = f()?;
        if i >= 20 {
            t.push(d);
        }
    }
    Ok((us(quantile(&mut t, 0.5)), us(quantile(&mut t, 0.99))))
}

fn row(case: &str, value: f64, baseline: Option<(&str, f64)>) {
    match baseline {
        Some((name, b)) => println!("S8ROW\t{case}\t{value}\t{name}\t{b}"),
        None => println!("S8ROW\t{case}\t{value}\t\t"),
    }
}

const OP: &str = "the CUDA op (4-byte memset, event record, host spin on the event)";

/// A family's name in the rows.
fn family_name(index: u32, flags: vk::QueueFlags) -> String {
    format!("family {index} ({flags:?})")
}

/// The cases the parent reads back ([`two_switches`]), one format each for
/// the child and the parent.
fn floor_case() -> String {
    format!("floor: {OP}, nothing before")
}

fn fill_alone_case(family: &str) -> String {
    format!("{family}: reverse: a fill + fence alone (after Vulkan work)")
}

fn whole_cycle_case(family: &str) -> String {
    format!("{family}: whole cycle: a fill + fence, then {OP}")
}

/// The two switches S8 measured on `family` with `CUDA_DEVICE_MAX_CONNECTIONS`
/// unset, in µs, from the rows [`s8`] merged into `report`: the whole cycle
/// (a fill + fence, then the CUDA op) minus a fill + fence alone minus the
/// floor, p50s. `None` where S8 did not measure them (skipped or failed).
pub(crate) fn two_switches(report: &Report, family: u32) -> Option<f64> {
    let unset = format!("{VAR} unset: ");
    let p50 = |case_of: &dyn Fn(&str) -> String| {
        let (prefix, suffix) = (
            format!("family {family} ("),
            format!("{}: p50", case_of("")),
        );
        report.rows.iter().find_map(|r| {
            let rest = r.case.strip_prefix(&unset)?;
            (r.scenario == "S8" && rest.starts_with(&prefix) && rest.ends_with(&suffix))
                .then_some(r.value)
        })
    };
    let floor = report
        .rows
        .iter()
        .find(|r| r.scenario == "S8" && r.case == format!("{unset}{}: p50", floor_case()))?
        .value;
    Some(p50(&whole_cycle_case)? - p50(&fill_alone_case)? - floor)
}

fn measure(ctx: &Context, cuda: &CudaDevice, n: usize) -> Res<()> {
    let driver = sys::Driver::global().map_err(|e| e.to_string())?;
    let fns = driver.fns();
    let missing = |name: &str| format!("the driver has no {name}");
    let memset = fns
        .cuMemsetD8Async
        .ok_or_else(|| missing("cuMemsetD8Async"))?;
    let record = fns.cuEventRecord.ok_or_else(|| missing("cuEventRecord"))?;
    let query = fns.cuEventQuery.ok_or_else(|| missing("cuEventQuery"))?;
    let wait = fns
        .cuWaitExternalSemaphoresAsync
        .ok_or_else(|| missing("cuWaitExternalSemaphoresAsync"))?;
    let import = fns
        .cuImportExternalSemaphore
        .ok_or_else(|| missing("cuImportExternalSemaphore"))?;
    let attribute = fns
        .cuDeviceGetAttribute
        .ok_or_else(|| missing("cuDeviceGetAttribute"))?;

    // What NVIDIA offers to share one scheduling group (issue 19): reported,
    // not used.
    let mut cig: c_int = -1;
    {
        let _context = cuda.enter()?;
        // SAFETY: writes one int for a valid device ordinal.
        let r = unsafe {
            attribute(
                &mut cig,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED,
                cuda.raw_device(),
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            cig = -1;
        }
    }
    // SAFETY: the paired physical device of a live instance.
    let has_external_compute_queue = unsafe {
        ctx.instance()
            .enumerate_device_extension_properties(ctx.physical_device())
    }?
    .iter()
    .any(|e| {
        e.extension_name_as_c_str()
            .is_ok_and(|name| name == c"VK_NV_external_compute_queue")
    });
    println!(
        "S8NOTE\t{VAR}={}; CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED = {}; VK_NV_external_compute_queue {}",
        std::env::var(VAR).unwrap_or_else(|_| "(unset)".into()),
        if cig < 0 { "unknown (query failed)".to_string() } else { cig.to_string() },
        if has_external_compute_queue { "offered" } else { "not offered" }
    );

    let raw = raw_device(ctx, true)?;
    let d = &raw.device;
    let families: Vec<String> = raw
        .families
        .iter()
        .map(|f| format!("{}: {:?}", f.index, f.flags))
        .collect();
    println!("S8NOTE\tqueue families measured: {}", families.join("; "));
    let stream = Stream::new(cuda)?;
    let target = DeviceBuffer::new(cuda, 4)?;
    let event = Event::new(cuda)?;
    let semaphore_fd = ash::khr::external_semaphore_fd::Device::new(ctx.instance(), d);
    // SAFETY: a live exportable (OPAQUE_FD) semaphore of this device.
    let fd = unsafe {
        semaphore_fd.get_semaphore_fd(
            &vk::SemaphoreGetFdInfoKHR::default()
                .semaphore(raw.shared)
                .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD),
        )
    }?;
    let mut desc = sys::CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC {
        type_: sys::CUexternalSemaphoreHandleType::CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD,
        ..Default::default()
    };
    desc.handle.fd = fd;
    let mut handle: sys::CUexternalSemaphore = std::ptr::null_mut();
    let imported = {
        let _context = cuda.enter()?;
        // SAFETY: a zeroed descriptor naming an fd this function owns, of a
        // timeline semaphore; writes one handle. On success the driver owns
        // the fd.
        unsafe { import(&mut handle, &desc) }
    };
    if imported != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the driver did not take the fd; it is ours, closed once.
        unsafe { libc::close(fd) };
        return Err(format!("cuImportExternalSemaphore: {imported:?}").into());
    }
    let cu_semaphore = CudaSemaphore { cuda, handle };
    let _drain = Drain(&stream);
    let context = cuda.enter()?;
    let (st, ev, ptr) = (stream.raw(), event.raw(), target.device_ptr());

    // The timed CUDA op, waiting first on the shared timeline's `value`
    // when one is given.
    let cuda_op = |wait_value: Option<u64>| -> Res<Duration> {
        let start = Instant::now();
        if let Some(value) = wait_value {
            let mut params = sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
            params.params.fence.value = value;
            // SAFETY: one zeroed parameter block for a live import of the
            // current context, on a live stream of it; the value was
            // signalled already (callers spin on it first), so the wait
            // completes; the import outlives the stream's work (`_drain`).
            check(
                unsafe { wait(&cu_semaphore.handle, &params, 1, st) },
                "cuWaitExternalSemaphoresAsync",
            )?;
        }
        // SAFETY: 4 bytes at the start of `target` (4 bytes), live until the
        // stream drained; a live stream and event of the current context.
        check(unsafe { memset(ptr, 7, 4, st) }, "cuMemsetD8Async")?;
        // SAFETY: as above.
        check(unsafe { record(ev, st) }, "cuEventRecord")?;
        spin("the CUDA op", || {
            // SAFETY: a live event of the current context.
            match unsafe { query(ev) } {
                sys::CUresult::CUDA_SUCCESS => Ok(true),
                sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
                r => Err(format!("cuEventQuery: {r:?}").into()),
            }
        })?;
        Ok(start.elapsed())
    };
    let counter = |semaphore, value| raw.counter(semaphore, value);
    let submit_signal = |queue, semaphore, value| raw.signal(queue, semaphore, value);
    let fill_and_fence = |queue, cb| raw.fill_and_fence(queue, cb);

    for _ in 0..50 {
        cuda_op(None)?;
    }
    let (floor50, floor99) = leg(n, || cuda_op(None))?;
    row(&format!("{}: p50", floor_case()), floor50, None);
    row("floor: p99", floor99, None);
    let vs = |case: String, (p50, p99): (f64, f64)| {
        row(&format!("{case}: p50"), p50, Some(("floor p50", floor50)));
        row(&format!("{case}: p99"), p99, Some(("floor p99", floor99)));
    };
    let mut value = 0u64;
    let mut local_value = 0u64;
    vs(
        format!("host vkSignalSemaphore, then CUDA waits on it + {OP}"),
        leg(n, || {
            value += 1;
            let info = vk::SemaphoreSignalInfo::default()
                .semaphore(raw.shared)
                .value(value);
            // SAFETY: a live timeline semaphore of this device, a value above
            // every earlier one.
            unsafe { d.signal_semaphore(&info) }?;
            cuda_op(Some(value))
        })?,
    );
    for f in &raw.families {
        let name = family_name(f.index, f.flags);
        vs(
            format!(
                "{name}: a queue submit of only a semaphore signal, then CUDA waits on it + {OP}"
            ),
            leg(n, || {
                value += 1;
                submit_signal(f.queue, raw.shared, value)?;
                counter(raw.shared, value)?;
                cuda_op(Some(value))
            })?,
        );
        vs(
            format!("{name}: a queue submit of only a signal of a semaphore CUDA never imported, then {OP}"),
            leg(n, || {
                local_value += 1;
                submit_signal(f.queue, raw.local, local_value)?;
                counter(raw.local, local_value)?;
                cuda_op(None)
            })?,
        );
        let Some(cb) = f.fill else {
            println!(
                "S8NOTE\t{name}: no fill legs (the family has none of GRAPHICS, COMPUTE, TRANSFER)"
            );
            continue;
        };
        vs(
            format!("{name}: a fence-only fill (no semaphore), then {OP}"),
            leg(n, || {
                fill_and_fence(f.queue, cb)?;
                cuda_op(None)
            })?,
        );
        vs(
            format!("{name}: after a fill and a first CUDA op, a second {OP}"),
            leg(n, || {
                fill_and_fence(f.queue, cb)?;
                cuda_op(None)?;
                cuda_op(None)
            })?,
        );
        vs(
            format!("{name}: a fill, the host sleeps 2 ms, then {OP}"),
            leg(n, || {
                fill_and_fence(f.queue, cb)?;
                std::thread::sleep(Duration::from_millis(2));
                cuda_op(None)
            })?,
        );
        let alone = leg(n, || {
            let start = Instant::now();
            fill_and_fence(f.queue, cb)?;
            Ok(start.elapsed())
        })?;
        vs(fill_alone_case(&name), alone);
        let after_cuda = leg(n, || {
            cuda_op(None)?;
            let start = Instant::now();
            fill_and_fence(f.queue, cb)?;
            Ok(start.elapsed())
        })?;
        vs(
            format!("{name}: reverse: a fill + fence right after {OP}"),
            after_cuda,
        );
        row(
            &format!("{name}: reverse: a fill + fence after CUDA against alone: p50"),
            after_cuda.0,
            Some(("fill + fence alone p50", alone.0)),
        );
        vs(
            whole_cycle_case(&name),
            leg(n, || {
                let start = Instant::now();
                fill_and_fence(f.queue, cb)?;
                cuda_op(None)?;
                Ok(start.elapsed())
            })?,
        );
    }
    drop(context);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows as the parent merges them from a child (`{label}: {case}`).
    fn merged(report: &mut Report, label: &str, case: String, value: f64) {
        report.add("S8", format!("{label}: {case}: p50"), value, "us");
    }

    #[test]
    fn two_switches_reads_the_main_familys_rows_of_the_unset_child() {
        let mut report = Report::default();
        let graphics = vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE;
        let transfer = vk::QueueFlags::TRANSFER;
        for (label, scale) in [(format!("{VAR}=1"), 2.0), (format!("{VAR} unset"), 1.0)] {
            merged(&mut report, &label, floor_case(), 5.0 * scale);
            for (index, flags, cycle, alone) in [
                (1, transfer, 17.0, 7.0),
                (10, graphics, 900.0, 10.0),
                (0, graphics, 324.0, 13.0),
            ] {
                let name = family_name(index, flags);
                merged(&mut report, &label, whole_cycle_case(&name), cycle * scale);
                merged(&mut report, &label, fill_alone_case(&name), alone * scale);
            }
        }
        // 324 - 13 - 5 on family 0 (not family 10's rows, not the =1 child's).
        assert_eq!(two_switches(&report, 0), Some(306.0));
        assert_eq!(two_switches(&report, 1), Some(5.0));
        assert_eq!(two_switches(&report, 2), None);
    }

    #[test]
    fn two_switches_is_none_without_s8_rows() {
        let mut report = Report::default();
        report.add("S2", "CUDA-only floor: p50", 5.0, "us");
        assert_eq!(two_switches(&report, 0), None);
    }
}
