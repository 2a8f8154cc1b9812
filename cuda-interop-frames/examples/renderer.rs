//! A renderer that publishes its frames by name from a Vulkan device of its
//! own: it creates the instance and device with ash, wraps them with
//! `Context::from_raw`, and renders every frame into an image slot of an
//! `ImageSender` with its own command pool, command buffer and timeline
//! (`WriteSlot::open`, its own submission under the context's queue lock,
//! `OpenSlot::present`), as an engine does. Receivers in other processes
//! (`frame_client`, the Python module, a Vulkan receiver) connect by name.
//!
//! ```text
//! cargo run --release -p cuda-interop-frames --example renderer -- --help
//! ```
//!
//! * The "rendering" is the demo pattern of `frame_server --image`
//!   (`demo::record_demo_pattern_image`: the frame number in every
//!   word, a moving band of its complement), recorded into the
//!   application's own command buffer, so that every receiver can check
//!   every pixel.
//! * `--queue main` (default) submits on the application's graphics or
//!   compute queue, as a renderer's pass runs; `--queue transfer` on its
//!   transfer-only queue where the device has one.
//! * Memory and timelines as `frame_server` picks them (`demo::choose`:
//!   device-local slots and timelines where the driver offers them,
//!   NVIDIA; host-visible slots without timelines on lavapipe), said in
//!   one line, or as told (`--host-visible`, `--device-local`,
//!   `--no-semaphores`, `--semaphores`).
//! * `--with-depth`: a multi-image ring (`MultiImageSender`) on the same
//!   own device, every slot a colour (RGBA8), a depth (R32_SFLOAT) and a
//!   segmentation (R32_UINT) image of one frame: the application renders
//!   into its own colour target, `D32_SFLOAT` depth attachment and label
//!   target and publishes the three with one `present_copy`
//!   (`demo::run_with_depth`, as `frame_server --with-depth`; 3 slots
//!   unless `--slots` says fewer; `--format` and `--queue` do not apply).
//! * The progress lines are `frame_server`'s (`demo::serve`), tagged
//!   `[renderer]`, so the measurement scripts read both alike.

mod common;

use std::process::ExitCode;
use std::time::Duration;

use common::demo::{self, record_demo_pattern_image, Choice, ImageFormat, ProducerOptions};
use common::{Cli, Opt};
use cuda_interop_frames::sender::{self, Address, ImageSender, ImageTarget, SenderOptions};
use vk_export::ash::{self, vk};
use vk_export::format::Format;
use vk_export::markers::{DeviceLocal, HostVisible, MemoryLocation, Usage};
use vk_export::{
    Context, DeviceRequirements, ExportableBuffer, QueueRole, TimelineSemaphore, WaitStrategy,
};

type Error = Box<dyn std::error::Error>;

struct Args {
    opts: ProducerOptions,
    format: ImageFormat,
    role: QueueRole,
}

fn args() -> Result<Args, String> {
    let mut opts = vec![
        Opt::valued(
            "--name",
            "NAME",
            "announce the ring by this name (default renderer)",
        ),
        Opt::valued(
            "--format",
            ImageFormat::NAMES,
            "the images' format (default rgba8)",
        ),
        Opt::flag(
            "--with-depth",
            "publish colour + depth + segmentation images a slot (a multi-image ring, 3 slots)",
        ),
        Opt::valued(
            "--queue",
            "main|transfer",
            "render on the main queue, or the transfer-only one where offered (default main)",
        ),
    ];
    opts.extend(common::sender_opts((3840, 2160), 60.0));
    let about =
        "A renderer on its own ash device (Context::from_raw) publishing an image ring by name.";
    let cli = Cli::parse("renderer", about, &opts);
    let format = common::image_format("--format", cli.value("--format"))?;
    let role = match cli.value("--queue").unwrap_or("main") {
        "main" => QueueRole::Main,
        "transfer" => QueueRole::Transfer,
        other => return Err(format!("--queue: main or transfer, not {other:?}")),
    };
    let shared = common::producer_options(&cli, "[renderer]", (3840, 2160), 60.0)?;
    let with_depth = cli.flag("--with-depth");
    let opts = ProducerOptions {
        name: Some(shared.name.clone().unwrap_or_else(|| "renderer".into())),
        image: (!with_depth).then_some(format),
        with_depth,
        slots: match (with_depth, cli.value("--slots")) {
            (true, None) => 3,
            _ => shared.slots,
        },
        ..shared
    };
    opts.validate().map_err(|e| e.to_string())?;
    Ok(Args { opts, format, role })
}

fn main() -> ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("renderer: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("renderer FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The application's device and instance: the context keeps them
/// (`from_raw_with_owner`) and drops them after its last handle and every
/// object made from it, so they are never destroyed under one (a leaked
/// one leaks them too).
struct App {
    instance: ash::Instance,
    device: ash::Device,
    _entry: ash::Entry,
}

impl Drop for App {
    fn drop(&mut self) {
        // SAFETY: the context drops its owner (this) only after its last
        // handle and every object made from the device are gone; nothing
        // else uses them.
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

/// Creates the application's instance and device with what
/// `DeviceRequirements` lists for its first physical device (a
/// compute-capable main queue, a transfer-only queue where offered, the
/// extensions and the feature `from_raw` needs) and wraps them.
fn own_device() -> Result<Context, Error> {
    // SAFETY: loading the system's Vulkan loader.
    let entry = unsafe { ash::Entry::load() }?;
    let app_info = vk::ApplicationInfo::default()
        .application_name(c"renderer")
        .api_version(vk::API_VERSION_1_2);
    // SAFETY: the create info lives across the call.
    let instance = unsafe {
        entry.create_instance(
            &vk::InstanceCreateInfo::default().application_info(&app_info),
            None,
        )
    }?;
    let device = (|| -> Result<_, Error> {
        // SAFETY: plain enumeration.
        let physicals = unsafe { instance.enumerate_physical_devices() }?;
        let &physical = physicals.first().ok_or("no Vulkan device")?;
        // SAFETY: the instance above (Vulkan 1.2) and one of its devices.
        let needs = unsafe { DeviceRequirements::of(&instance, physical) }?;
        let priorities = [1.0f32];
        let queue_infos = needs.queue_create_infos(&priorities);
        let extensions = needs.extension_names();
        let mut features12 = needs.features12();
        let device_info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_infos)
            .enabled_extension_names(&extensions)
            .push_next(&mut features12);
        // SAFETY: the create info and its chain live across the call.
        let device = unsafe { instance.create_device(physical, &device_info, None) }?;
        Ok((physical, device, needs))
    })();
    let (physical, device, needs) = match device {
        Ok(made) => made,
        Err(e) => {
            // SAFETY: nothing else was made from the instance.
            unsafe { instance.destroy_instance(None) };
            return Err(e);
        }
    };
    let app = App {
        instance,
        device,
        _entry: entry.clone(),
    };
    let (instance, device) = (app.instance.clone(), app.device.clone());
    // SAFETY: the device was created above from `physical` of the instance
    // with everything `needs` lists (Vulkan 1.2, timelineSemaphore, its
    // extensions, queue 0 of each family of `needs.queues`); this
    // application submits to them only through `with_queue_of`; the context
    // owns `app`, which destroys them after the context is gone.
    let ctx = unsafe {
        Context::from_raw_with_owner(
            entry,
            instance,
            physical,
            device,
            needs.queues,
            needs.semaphore_fd,
            Box::new(app),
        )
    }?;
    Ok(ctx)
}

fn run(args: &Args) -> Result<(), Error> {
    let ctx = own_device()?;
    println!(
        "[renderer] own device {} (Context::from_raw): main family {}, transfer family {}; \
         rendering on the {:?} queue (family {})",
        ctx.identity().name,
        ctx.queue_family(),
        ctx.queue_family_of(QueueRole::Transfer),
        args.role,
        ctx.queue_family_of(args.role)
    );
    let result = if args.opts.with_depth {
        let (choice, line) = demo::choose(&ctx, &args.opts)?;
        println!("{line}");
        demo::run_with_depth(ctx.clone(), &args.opts, choice).map_err(Error::from)
    } else {
        demo::with_image_format!(args.format, with_memory::<_>(&ctx, args))
    };
    drop(ctx);
    result
}

/// The memory and timelines `demo::choose` picks.
fn with_memory<F: demo::DemoFormat>(ctx: &Context, args: &Args) -> Result<(), Error> {
    let (choice, line) = demo::choose(ctx, &args.opts)?;
    println!("{line}");
    let opts = sender_options(args, choice)?;
    if choice.host_visible {
        render(
            ctx,
            args,
            ImageSender::<F, HostVisible, F::Usage>::new(ctx, opts)?,
        )
    } else {
        render(
            ctx,
            args,
            ImageSender::<F, DeviceLocal, F::Usage>::new(ctx, opts)?,
        )
    }
}

fn sender_options(args: &Args, choice: Choice) -> Result<SenderOptions, Error> {
    let name = args.opts.name.as_deref().unwrap_or("renderer");
    Ok(SenderOptions {
        hold_timeout: args.opts.hold_timeout,
        semaphores: choice.semaphores,
        queue: args.role,
        ..SenderOptions::new(
            Address::named(name)?,
            args.opts.width,
            args.opts.height,
            args.opts.slots,
        )
    })
}

/// The application's recording state: a command pool of the rendering
/// queue's family, one command buffer, the scratch buffer the pattern is
/// written into, and the timeline its submissions signal.
struct Recorder<'c, M: MemoryLocation> {
    ctx: &'c Context,
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    scratch: Option<ExportableBuffer<M>>,
    written: std::mem::ManuallyDrop<TimelineSemaphore>,
    /// The last value `written` got.
    value: u64,
    /// A submission may still be pending (a present that failed): the pool
    /// and scratch buffer are leaked rather than freed under it.
    pending: bool,
}

impl<M: MemoryLocation> Drop for Recorder<'_, M> {
    fn drop(&mut self) {
        if self.pending {
            // Leaked with the pool: each keeps a context handle, so the
            // device (the context's owner) is leaked too, never destroyed
            // under the pending submission.
            std::mem::forget(self.scratch.take());
            return;
        }
        // SAFETY: not pending: every submission of the pool, and every
        // signal of `written`, completed (each present waited for it);
        // `written` is dropped once, here; the pool is destroyed once.
        unsafe {
            std::mem::ManuallyDrop::drop(&mut self.written);
            self.ctx.device().destroy_command_pool(self.pool, None);
        }
    }
}

/// A failed call of the renderer's own recording or submission.
fn failed(call: &'static str) -> impl Fn(vk::Result) -> sender::SenderError {
    move |result| {
        sender::SenderError::Vulkan(vk_export::Error::Vulkan {
            call,
            result,
            hint: "the renderer's own command buffer",
        })
    }
}

fn render<F: Format, M: MemoryLocation, U: Usage>(
    ctx: &Context,
    args: &Args,
    sender: ImageSender<F, M, U>,
) -> Result<(), Error> {
    let family = ctx.queue_family_of(args.role);
    let device = ctx.device();
    // SAFETY: plain creation on the live device; destroyed by the
    // Recorder's drop after its submissions completed.
    let pool = unsafe {
        device.create_command_pool(
            &vk::CommandPoolCreateInfo::default()
                .queue_family_index(family)
                .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
            None,
        )
    }?;
    // SAFETY: one primary buffer of the pool above.
    let allocated = unsafe {
        device.allocate_command_buffers(
            &vk::CommandBufferAllocateInfo::default()
                .command_pool(pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1),
        )
    };
    let cmd = match allocated {
        Ok(cmds) => cmds[0],
        Err(e) => {
            // SAFETY: nothing of the pool is in use.
            unsafe { device.destroy_command_pool(pool, None) };
            return Err(e.into());
        }
    };
    let (width, height) = (args.opts.width, args.opts.height);
    let bytes = u64::from(width) * u64::from(height) * u64::from(F::TEXEL_BYTES);
    let mut rec = Recorder {
        ctx,
        pool,
        cmd,
        scratch: None,
        written: std::mem::ManuallyDrop::new(TimelineSemaphore::new_local(ctx)?),
        value: 0,
        pending: false,
    };
    rec.scratch = Some(ExportableBuffer::<M>::new(ctx, bytes)?);
    demo::serve(ctx, &args.opts, sender, |slot| {
        let slot = slot.open(args.role)?;
        let f = slot.sequence();
        let (ready, ready_value) = slot.ready();
        let target = ImageTarget {
            image: slot.resource().raw(),
            queue_family: slot.queue_family(),
        };
        let scratch = rec.scratch.as_ref().expect("made above").raw();
        // SAFETY: the command buffer is not pending (the last present waited
        // for its submission); the scratch buffer has the frame's bytes and
        // transfer usage; the target is the slot this OpenSlot acquired for
        // this family, an image of F and this extent in GENERAL.
        unsafe {
            device
                .reset_command_buffer(rec.cmd, vk::CommandBufferResetFlags::empty())
                .map_err(failed("vkResetCommandBuffer"))?;
            device
                .begin_command_buffer(
                    rec.cmd,
                    &vk::CommandBufferBeginInfo::default()
                        .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                )
                .map_err(failed("vkBeginCommandBuffer"))?;
            record_demo_pattern_image::<F>(device, rec.cmd, scratch, target, (width, height), f);
            device
                .end_command_buffer(rec.cmd)
                .map_err(failed("vkEndCommandBuffer"))?;
        }
        let value = rec.value + 1;
        let (waits, wait_values) = ([ready.raw()], [ready_value]);
        let (signals, signal_values) = ([rec.written.raw()], [value]);
        let stages = [vk::PipelineStageFlags::ALL_COMMANDS];
        let cmds = [rec.cmd];
        let mut timeline = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_values)
            .signal_semaphore_values(&signal_values);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&waits)
            .wait_dst_stage_mask(&stages)
            .command_buffers(&cmds)
            .signal_semaphores(&signals)
            .push_next(&mut timeline);
        rec.pending = true;
        // SAFETY: a queue of the slot's family under the context's lock;
        // everything the submission names lives until it completed: present
        // waits for `written` to reach `value` before it returns Ok.
        ctx.with_queue_of(args.role, |q| unsafe {
            device.queue_submit(q, &[submit], vk::Fence::null())
        })?
        .map_err(failed("vkQueueSubmit"))?;
        rec.value = value;
        match slot.present(sender::monotonic_ns(), (&rec.written, value)) {
            Ok(sequence) => {
                rec.pending = false;
                Ok(sequence)
            }
            Err(e) => {
                // The submission above may still run, writing a slot image
                // the sender (dropped when this error ends `serve`) owns:
                // wait for it, bounded, before giving up; if it never
                // completes the pool and scratch buffer are leaked.
                if rec
                    .written
                    .wait(value, Duration::from_secs(5), WaitStrategy::ADAPTIVE)
                    .is_ok()
                {
                    rec.pending = false;
                }
                Err(e)
            }
        }
    })?;
    Ok(())
}
