//! [`GlReceiver`]: a ring's image slots as GL textures (see the crate
//! contract).

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::time::Duration;

use cuda_interop_frames::protocol::RingLayout;
use cuda_interop_frames::session::{has_semaphores, Frame, Session};
use cuda_interop_frames::transport::{deadline_after, left};
use vk_export::format::{Bgra8Srgb, Bgra8Unorm, Format, Rgba16Sfloat, Rgba8Srgb, Rgba8Unorm};
use vk_export::markers::{usage, DeviceLocal, HostVisible, MemoryLocation, Optimal, Usage};
use vk_export::wire::Received;
use vk_export::ImageInfo;
use vk_export::{Context, HeadlessOptions, Timeline, TimelineSemaphore, WaitStrategy};

use crate::gl::{self, GLenum, GLuint, Gl, SemaphoreFns};
use crate::Error;

/// The environment variable that forces the host wait (`host`), for
/// comparisons; unset or any other value: the GPU-side wait where offered.
pub const WAIT_ENV: &str = "CUDA_INTEROP_GL_WAIT";

/// How a [`GlReceiver`] waits for a frame's writes and gives a frame back
/// (see the crate contract; [`GlReceiver::wait_mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitMode {
    /// On the GPU: the ring's "produced" timeline and this receiver's
    /// "released" ones are imported into GL; a frame's texture is handed
    /// out behind `glWaitSemaphoreEXT` for the frame's value, and a release
    /// signals the slot's "released" timeline after the GL work submitted
    /// so far (`glSignalSemaphoreEXT`). Nothing waits on the host.
    Gpu,
    /// On the host: the "produced" timeline waited for on a Vulkan device
    /// of the receiver's before the texture is handed out, and a release
    /// fences the GL work and waits for it. The ring shares timelines, but
    /// the context lacks the GPU-side wait's extensions (or it was turned
    /// off, [`WAIT_ENV`]).
    Host,
    /// The ring shares no semaphores (a sender on a driver without
    /// exportable semaphores, such as lavapipe, or started without them):
    /// the frame message, sent once the writes completed, orders the
    /// reads; a release fences the GL work and waits for it.
    FrameMessage,
}

/// Which wait a receiver takes, and why: `shares`, the ring shares its
/// timelines; `offered`, the context has the GPU-side wait's extensions and
/// entry points; `forced_host`, [`WAIT_ENV`] asks for the host wait.
fn choose_wait(
    shares: bool,
    offered: bool,
    forced_host: bool,
    renderer: &str,
) -> (WaitMode, String) {
    match (shares, offered, forced_host) {
        (false, _, _) => (
            WaitMode::FrameMessage,
            "the ring shares no semaphores: the frame message orders the reads".into(),
        ),
        (true, _, true) => (
            WaitMode::Host,
            format!("{WAIT_ENV}=host: the host wait was asked for"),
        ),
        (true, false, false) => (
            WaitMode::Host,
            format!(
                "{renderer} lacks one of {}: the host waits for the \"produced\" timeline",
                gl::GPU_WAIT.join(", ")
            ),
        ),
        (true, true, false) => (
            WaitMode::Gpu,
            "GL waits for the \"produced\" timeline and signals \"released\"".into(),
        ),
    }
}

/// The ring's timelines imported into GL (the GPU-side wait).
struct GpuSync {
    fns: SemaphoreFns,
    produced: GLuint,
    /// Per slot, this receiver's "released" timeline.
    released: Vec<GLuint>,
    /// Per slot, the frame whose "produced" wait GL was given (a second
    /// [`GlReceiver::texture`] of the frame adds none).
    waited: Vec<Cell<u64>>,
    /// Per slot, the last value GL was told to signal (values only go up).
    signalled: Vec<Cell<u64>>,
}

impl GpuSync {
    /// Every semaphore name, for the delete.
    fn names(&self) -> Vec<GLuint> {
        std::iter::once(self.produced)
            .chain(self.released.iter().copied())
            .filter(|&n| n != 0)
            .collect()
    }
}

/// How a ring's format is a GL texture.
#[derive(Clone, Copy, Debug)]
struct GlFormat {
    internal: GLenum,
    /// Stored B, G, R, A: sampled through a swizzle.
    bgra: bool,
    /// `glGetTextureImage`'s type, and bytes per texel.
    read_type: GLenum,
    texel_bytes: u32,
}

fn gl_format(vk_format: u32) -> Option<GlFormat> {
    let (internal, bgra, read_type, texel_bytes) = match vk_format {
        37 => (gl::RGBA8, false, gl::UNSIGNED_BYTE, 4),
        43 => (gl::SRGB8_ALPHA8, false, gl::UNSIGNED_BYTE, 4),
        44 => (gl::RGBA8, true, gl::UNSIGNED_BYTE, 4),
        50 => (gl::SRGB8_ALPHA8, true, gl::UNSIGNED_BYTE, 4),
        97 => (gl::RGBA16F, false, gl::HALF_FLOAT, 8),
        _ => return None,
    };
    Some(GlFormat {
        internal,
        bgra,
        read_type,
        texel_bytes,
    })
}

/// A GL receiver of an image ring (see the crate contract).
pub struct GlReceiver {
    gl: Gl,
    textures: Vec<GLuint>,
    memories: Vec<GLuint>,
    format: GlFormat,
    /// The "produced" timeline, where the sender shares one (the host
    /// wait; kept in GPU mode too).
    produced: Option<TimelineSemaphore>,
    /// The timelines in GL: GPU mode.
    gpu: Option<GpuSync>,
    mode: WaitMode,
    why: String,
    /// A Vulkan device of the ring's (its records verified there).
    _vulkan: Context,
    session: Session,
    /// GL calls need the thread's current context.
    _thread: PhantomData<*const ()>,
}

impl std::fmt::Debug for GlReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlReceiver")
            .field("textures", &self.textures)
            .field("semaphores", &self.produced.is_some())
            .field("wait", &self.mode)
            .field("why", &self.why)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

fn refused(layout: &RingLayout, why: &str) -> Error {
    Error::Unsupported(format!(
        "cannot receive the {}x{} ring of {} slots in OpenGL: {why}",
        layout.width, layout.height, layout.slots
    ))
}

/// Slot `index`'s record and fd, whatever memory class and usage preset
/// the sender made it with (GL takes any), verified on `ctx` (a Vulkan
/// device of the ring's) as a Vulkan import would be: the size, memory
/// type, alignment and dedicated flag GL is given are what this device
/// derives for the image, not merely what the peer claims.
fn take_image<F: Format>(
    ctx: &Context,
    setup: &mut Received,
    index: usize,
) -> Result<(ImageInfo, OwnedFd), Error> {
    /// `Err`: a record of another class or preset (the fd stays in
    /// `setup`); `Ok(Err)`: taken, and refused on this device (the fd
    /// closed with it).
    #[allow(clippy::type_complexity)]
    fn attempt<F: Format, M: MemoryLocation, U: Usage>(
        ctx: &Context,
        setup: &mut Received,
        index: usize,
    ) -> Result<Result<(ImageInfo, OwnedFd), vk_export::Error>, vk_export::Error> {
        let received = setup.take_image::<F, Optimal, M, U>(index)?;
        if let Err(e) = ctx.verify_image(received.record()) {
            return Ok(Err(e));
        }
        let (record, fd, _) = received.into_parts();
        Ok(Ok((record.into_info(), fd)))
    }
    let attempts = [
        attempt::<F, DeviceLocal, usage::Storage>,
        attempt::<F, HostVisible, usage::Storage>,
        attempt::<F, DeviceLocal, usage::Sampled>,
        attempt::<F, HostVisible, usage::Sampled>,
        attempt::<F, DeviceLocal, usage::ColorAttachment>,
        attempt::<F, HostVisible, usage::ColorAttachment>,
        attempt::<F, DeviceLocal, usage::StorageColorAttachment>,
        attempt::<F, HostVisible, usage::StorageColorAttachment>,
    ];
    let mut refusals = Vec::new();
    for attempt in attempts {
        match attempt(ctx, setup, index) {
            Ok(Ok(taken)) => return Ok(taken),
            // Taken: this device refuses the record itself.
            Ok(Err(e)) => return Err(e.into()),
            Err(e) => refusals.push(e.to_string()),
        }
    }
    Err(Error::Unsupported(format!(
        "its record is not an OPTIMAL {} image of a memory class and usage this device \
         imports ({})",
        F::NAME,
        refusals.join("; ")
    )))
}

/// Whether the GL context (its device UUIDs, driver UUID, renderer) is on
/// the ring's device and driver: GL lays an imported image out as its own
/// driver does, so any other pairing would read garbled pixels.
fn check_device(
    (devices, driver, renderer): (&[[u8; 16]], &[u8; 16], &str),
    (ring_device, ring_driver): (&[u8; 16], &[u8; 16]),
) -> Result<(), Error> {
    if devices.contains(ring_device) && driver == ring_driver {
        return Ok(());
    }
    Err(Error::Mismatch(format!(
        "the ring is on device {} (driver {}), this GL context ({renderer}) on {} (driver {}): \
         receive on a GL context of the sender's GPU and driver (HeadlessGl::on_device; on a \
         machine with two GPUs, start the program on the sender's)",
        hex(ring_device),
        hex(ring_driver),
        devices.iter().map(hex).collect::<Vec<_>>().join(", "),
        hex(driver)
    )))
}

fn hex(uuid: &[u8; 16]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

/// Imports one timeline into GL: a semaphore object made a timeline
/// (`GL_SEMAPHORE_TYPE_TIMELINE_NV`) before `fd` is imported into it.
///
/// # Safety
/// A context of `gl`'s implementation is current on this thread, and
/// `fns` are that implementation's, which the context offers.
unsafe fn import_timeline(gl: &Gl, fns: &SemaphoreFns, fd: OwnedFd) -> Result<GLuint, Error> {
    // SAFETY: the caller's current context; each pointer is to a live
    // local of the written type and count; `give_fd`'s import is GL's,
    // which takes the fd only on success.
    unsafe {
        gl.take_error();
        let mut semaphore = 0;
        (fns.create)(1, &mut semaphore);
        if semaphore != 0 {
            (fns.parameteriv)(
                semaphore,
                gl::SEMAPHORE_TYPE_NV,
                &gl::SEMAPHORE_TYPE_TIMELINE_NV,
            );
        }
        // Before the fd is given: a failure here leaves it ours (the drop
        // of `fd` closes it).
        let code = gl.take_error();
        if code != gl::NO_ERROR || semaphore == 0 {
            if semaphore != 0 {
                (fns.delete)(1, &semaphore);
            }
            return Err(Error::Gl {
                call: "glCreateSemaphoresNV",
                code,
            });
        }
        let imported = gl::give_fd(
            fd,
            |raw| (fns.import_fd)(semaphore, gl::HANDLE_TYPE_OPAQUE_FD, raw),
            || gl.take_error(),
        );
        if let Err(code) = imported {
            (fns.delete)(1, &semaphore);
            return Err(Error::Gl {
                call: "glImportSemaphoreFdEXT",
                code,
            });
        }
        Ok(semaphore)
    }
}

/// The ring's timelines in GL: "produced" (`produced`, GL's own fd of it)
/// and this receiver's "released" ones (`setup`'s resources `n + 1 ..`,
/// each checked to be a timeline of the context's device and driver, its
/// fd an exported object). On an error, what was imported is deleted.
///
/// # Safety
/// As [`import_timeline`].
unsafe fn import_timelines(
    gl: &Gl,
    fns: SemaphoreFns,
    produced: OwnedFd,
    setup: &mut Received,
    n: usize,
    context: (&[[u8; 16]], &[u8; 16], &str),
) -> Result<GpuSync, Error> {
    let mut gpu = GpuSync {
        fns,
        produced: 0,
        released: Vec::with_capacity(n),
        waited: (0..n).map(|_| Cell::new(0)).collect(),
        signalled: (0..n).map(|_| Cell::new(0)).collect(),
    };
    let all = || -> Result<(), Error> {
        vk_export::check_export_fd(&produced, "semaphore")?;
        // SAFETY: the caller's.
        gpu.produced = unsafe { import_timeline(gl, &fns, produced) }?;
        for s in 0..n {
            let (record, fd, _) = setup.take_semaphore::<Timeline>(n + 1 + s)?.into_parts();
            let info = record.info();
            check_device(
                context,
                (info.device_uuid().as_bytes(), info.driver_uuid().as_bytes()),
            )?;
            vk_export::check_export_fd(&fd, "semaphore")?;
            // SAFETY: the caller's.
            gpu.released.push(unsafe { import_timeline(gl, &fns, fd) }?);
        }
        Ok(())
    };
    match all() {
        Ok(()) => Ok(gpu),
        Err(e) => {
            let names = gpu.names();
            // SAFETY: the caller's current context; the names are the
            // semaphores imported above, used by nothing yet.
            unsafe { (fns.delete)(names.len() as i32, names.as_ptr()) };
            Err(e)
        }
    }
}

impl GlReceiver {
    /// Imports `session`'s image ring (its setup message) into the GL
    /// context current on this thread.
    ///
    /// # Safety
    /// Every address in `gl` is its named function of one GL
    /// implementation (what [`Gl::load`] resolves with that
    /// implementation's loader); a context of it is current on this
    /// thread, and is current on it again (or one sharing its objects) for
    /// every later call on the receiver and for its drop.
    pub unsafe fn new(gl: Gl, session: Session, mut setup: Received) -> Result<GlReceiver, Error> {
        // A multi-image ring's slots are several images each: this
        // receiver's one texture a slot would take another part (of another
        // frame) as slot i's image.
        session.refuse_multi_image()?;
        let layout = *session.layout();
        let Some(vk_format) = layout.vk_format() else {
            return Err(refused(
                &layout,
                "the sender shares pitched buffers, not images (a host receiver, \
                 host_receiver::HostReceiver, or a CUDA one reads those)",
            ));
        };
        let Some(format) = gl_format(vk_format) else {
            return Err(refused(
                &layout,
                &format!(
                    "its images are VkFormat {vk_format}; OpenGL takes R8G8B8A8_UNORM/_SRGB, \
                     B8G8R8A8_UNORM/_SRGB and R16G16B16A16_SFLOAT rings"
                ),
            ));
        };
        // SAFETY: the caller's current context of `gl`'s implementation.
        let renderer = unsafe { gl.renderer() };
        // SAFETY: as above.
        let extensions = unsafe { gl.extensions() };
        for extension in gl::REQUIRED {
            if !extensions.iter().any(|e| e == extension) {
                return Err(Error::Extension {
                    renderer,
                    extension,
                });
            }
        }
        // SAFETY: as above; the context has GL_EXT_memory_object (checked).
        let (devices, driver) = unsafe { gl.uuids() };
        let n = layout.slots as usize;
        let uuid = match setup.message().resources.first() {
            Some(vk_export::wire::Resource::Image(info)) => info.device_uuid(),
            _ => return Err(refused(&layout, "its first resource is not an image")),
        };
        let vulkan = Context::headless(&HeadlessOptions {
            device_uuid: Some(uuid),
            ..HeadlessOptions::default()
        })?;
        let mut receiver = GlReceiver {
            gl,
            textures: Vec::with_capacity(n),
            memories: Vec::with_capacity(n),
            format,
            produced: None,
            gpu: None,
            mode: WaitMode::FrameMessage,
            why: String::new(),
            _vulkan: vulkan.clone(),
            session,
            _thread: PhantomData,
        };
        for i in 0..n {
            let (info, fd) = match vk_format {
                37 => take_image::<Rgba8Unorm>(&vulkan, &mut setup, i),
                43 => take_image::<Rgba8Srgb>(&vulkan, &mut setup, i),
                44 => take_image::<Bgra8Unorm>(&vulkan, &mut setup, i),
                50 => take_image::<Bgra8Srgb>(&vulkan, &mut setup, i),
                _ => take_image::<Rgba16Sfloat>(&vulkan, &mut setup, i),
            }
            .map_err(|e| refused(&layout, &format!("slot {i}: {e}")))?;
            check_device(
                (&devices, &driver, &renderer),
                (info.device_uuid().as_bytes(), info.driver_uuid().as_bytes()),
            )?;
            let extent = info.extent();
            if extent != [layout.width, layout.height, 1]
                || info.mip_levels() != 1
                || info.array_layers() != 1
            {
                return Err(refused(
                    &layout,
                    &format!(
                        "slot {i}'s image is {}x{}x{} with {} levels and {} layers, not one \
                         level of the layout's size",
                        extent[0],
                        extent[1],
                        extent[2],
                        info.mip_levels(),
                        info.array_layers()
                    ),
                ));
            }
            // SAFETY: the caller's current context. The receiver's drop
            // deletes what was imported so far.
            unsafe { receiver.import_slot(&info, fd) }?;
        }
        let shares = has_semaphores(&layout, &setup);
        let forced_host = std::env::var_os(WAIT_ENV).is_some_and(|v| v == "host");
        let fns = gl.semaphores(&extensions);
        let (mode, why) = choose_wait(shares, fns.is_some(), forced_host, &renderer);
        (receiver.mode, receiver.why) = (mode, why);
        if shares {
            let (record, fd, _) = setup.take_semaphore::<Timeline>(n)?.into_parts();
            // GL's own fd of "produced" (each import consumes one), made
            // before the Vulkan import takes `fd`.
            let for_gl = match (mode, fns) {
                (WaitMode::Gpu, Some(fns)) => Some((fns, fd.try_clone())),
                _ => None,
            };
            // SAFETY: `record` and `fd` are a received pair, as
            // `TimelineSemaphore::import_received` would import them (which
            // this is, with the fd duplicated first): the import checks the
            // record against this device and the fd's kind before the
            // driver sees it, and a semaphore holds no memory.
            let produced = unsafe { TimelineSemaphore::import_fd(&vulkan, &record, fd) }
                .map_err(|e| e.into_error())?;
            receiver.produced = Some(produced);
            if let Some((fns, gl_fd)) = for_gl {
                let ring = (record.info().device_uuid(), record.info().driver_uuid());
                let imported = gl_fd
                    .map_err(|e| Error::Unavailable(format!("dup of the \"produced\" fd: {e}")))
                    .and_then(|gl_fd| {
                        check_device(
                            (&devices, &driver, &renderer),
                            (ring.0.as_bytes(), ring.1.as_bytes()),
                        )?;
                        // SAFETY: the caller's current context; `fns` are
                        // this implementation's (the table's), offered by
                        // the context (listed extensions).
                        unsafe {
                            import_timelines(
                                &gl,
                                fns,
                                gl_fd,
                                &mut setup,
                                n,
                                (&devices, &driver, &renderer),
                            )
                        }
                    });
                match imported {
                    Ok(gpu) => receiver.gpu = Some(gpu),
                    Err(e) => {
                        receiver.mode = WaitMode::Host;
                        receiver.why = format!(
                            "importing the timelines into GL failed ({e}): the host waits for \
                             the \"produced\" timeline"
                        );
                    }
                }
            }
        }
        Ok(receiver)
    }

    /// How this receiver waits for frames and gives them back (see the
    /// crate contract); its `Debug` also says why.
    pub fn wait_mode(&self) -> WaitMode {
        self.mode
    }

    /// Imports one slot: its memory object, then its texture.
    ///
    /// # Safety
    /// The receiver's current-context contract.
    unsafe fn import_slot(&mut self, info: &ImageInfo, fd: OwnedFd) -> Result<(), Error> {
        let gl = self.gl;
        // SAFETY: the receiver's current context for every GL call below;
        // each pointer is to a live local of the written type and count;
        // `give_fd`'s import is GL's, which takes the fd only on success.
        unsafe {
            gl.take_error();
            let mut memory = 0;
            (gl.create_memory_objects)(1, &mut memory);
            if info.dedicated() {
                let yes = 1;
                (gl.memory_object_parameteriv)(memory, gl::DEDICATED_MEMORY_OBJECT, &yes);
            }
            // Before the fd is given: a failure here leaves it ours (the
            // drop of `fd` closes it).
            let code = gl.take_error();
            if code != gl::NO_ERROR || memory == 0 {
                if memory != 0 {
                    (gl.delete_memory_objects)(1, &memory);
                }
                return Err(Error::Gl {
                    call: "glCreateMemoryObjectsEXT",
                    code,
                });
            }
            let imported = gl::give_fd(
                fd,
                |raw| {
                    (gl.import_memory_fd)(
                        memory,
                        info.allocation_size(),
                        gl::HANDLE_TYPE_OPAQUE_FD,
                        raw,
                    )
                },
                || gl.take_error(),
            );
            if let Err(code) = imported {
                (gl.delete_memory_objects)(1, &memory);
                return Err(Error::Gl {
                    call: "glImportMemoryFdEXT",
                    code,
                });
            }
            self.memories.push(memory);
            let mut texture = 0;
            (gl.create_textures)(gl::TEXTURE_2D, 1, &mut texture);
            self.textures.push(texture);
            (gl.texture_parameteri)(texture, gl::TEXTURE_TILING, gl::OPTIMAL_TILING);
            let [w, h, _] = info.extent();
            (gl.texture_storage_mem_2d)(
                texture,
                1,
                self.format.internal,
                w as i32,
                h as i32,
                memory,
                0,
            );
            if self.format.bgra {
                let swizzle = [gl::BLUE, gl::GREEN, gl::RED, gl::ALPHA];
                (gl.texture_parameteriv)(texture, gl::TEXTURE_SWIZZLE_RGBA, swizzle.as_ptr());
            }
            let code = gl.take_error();
            if code != gl::NO_ERROR {
                return Err(Error::Gl {
                    call: "glTextureStorageMem2DEXT",
                    code,
                });
            }
        }
        Ok(())
    }

    /// The session (layout, delivery, statistics, why it ended).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The slots' textures (GL names), slot by slot.
    pub fn textures(&self) -> &[u32] {
        &self.textures
    }

    /// The next frame ([`Session::next`]).
    pub fn next(&self, timeout: Duration) -> Result<Frame, Error> {
        Ok(self.session.next(timeout)?)
    }

    /// `frame`'s texture (a GL name), once the frame is complete (see the
    /// crate contract): in [`WaitMode::Gpu`], at once, behind a GL wait for
    /// the frame's "produced" value that the GL work submitted after this
    /// call waits for on the GPU; in [`WaitMode::Host`], after a host wait
    /// within `timeout`. Sample or copy it, then [`GlReceiver::release`]
    /// the frame.
    pub fn texture(&self, frame: &Frame, timeout: Duration) -> Result<u32, Error> {
        self.session.check_held(frame)?;
        let slot = frame.slot() as usize;
        let texture = self.textures[slot];
        if let Some(gpu) = &self.gpu {
            let value = frame.sequence();
            if gpu.waited[slot].get() != value {
                let gl = self.gl;
                // SAFETY: the receiver's current context; `gpu`'s names are
                // this receiver's; each pointer is to one live local of the
                // type read.
                unsafe {
                    gl.take_error();
                    (gpu.fns.parameterui64v)(gpu.produced, gl::TIMELINE_SEMAPHORE_VALUE_NV, &value);
                    (gpu.fns.wait)(
                        gpu.produced,
                        0,
                        std::ptr::null(),
                        1,
                        &texture,
                        &gl::LAYOUT_GENERAL,
                    );
                    let code = gl.take_error();
                    if code != gl::NO_ERROR {
                        return Err(Error::Gl {
                            call: "glWaitSemaphoreEXT",
                            code,
                        });
                    }
                }
                gpu.waited[slot].set(value);
            }
        } else if let Some(produced) = &self.produced {
            produced.wait(frame.sequence(), timeout, WaitStrategy::default())?;
        }
        Ok(texture)
    }

    /// `frame`'s texels as the ring holds them, rows tightly packed
    /// (`glGetTextureImage`, waited for): for tools and tests. In
    /// [`WaitMode::Gpu`] the GL wait is fenced and waited for first, within
    /// `timeout` (else [`Error::Timeout`]): the read itself would block
    /// on it without a bound. A receiver the sender dropped during the read
    /// gets the drop's error.
    pub fn read_pixels(&self, frame: &Frame, timeout: Duration) -> Result<Vec<u8>, Error> {
        let texture = self.texture(frame, timeout)?;
        if self.gpu.is_some() && !self.gl_idle(timeout)? {
            return Err(Error::Timeout(frame.sequence()));
        }
        let layout = self.session.layout();
        let len = layout.width as usize * layout.height as usize * self.format.texel_bytes as usize;
        let mut pixels = vec![0u8; len];
        let gl = self.gl;
        // SAFETY: the receiver's current context; `pixels` holds the whole
        // level (its size passed, so GL writes no more).
        unsafe {
            gl.take_error();
            (gl.pixel_storei)(gl::PACK_ALIGNMENT, 1);
            (gl.get_texture_image)(
                texture,
                0,
                gl::RGBA,
                self.format.read_type,
                len as i32,
                pixels.as_mut_ptr().cast(),
            );
            let code = gl.take_error();
            if code != gl::NO_ERROR {
                return Err(Error::Gl {
                    call: "glGetTextureImage",
                    code,
                });
            }
        }
        self.session.check_held(frame)?;
        Ok(pixels)
    }

    /// Gives `frame` back once the GL work submitted so far on the context
    /// current now is done (read the textures there: a shared context's
    /// work is not covered). In [`WaitMode::Gpu`], GL signals the slot's
    /// "released" timeline with the frame's number after that work
    /// (`glSignalSemaphoreEXT`, flushed) and the sender waits for it on the
    /// GPU before it writes the slot again: nothing waits here, and
    /// `timeout` is not used. Otherwise (or where GL refuses the signal)
    /// the work is fenced and waited for within `timeout`; a fence that does
    /// not signal in time (or fails) ends the session ([`Error::Timeout`],
    /// or the GL error): the sender then counts every slot free, and may
    /// write them while those reads still run.
    pub fn release(&self, frame: Frame, timeout: Duration) -> Result<(), Error> {
        let sequence = frame.sequence();
        // Only a frame this session holds is signalled for: another's
        // would move this receiver's timeline for a release it never made.
        if self.gpu.is_some()
            && self.session.check_held(&frame).is_ok()
            && self.signal_released(&frame)
        {
            return Ok(self.session.release(frame, true)?);
        }
        let idle = self.gl_idle(timeout);
        if !matches!(idle, Ok(true)) {
            // The reads may still run: this receiver ends, and the sender,
            // which counts its slots as free then, may write them under
            // those reads (torn texels of frames no longer held).
            self.session.close(&format!(
                "the GL work reading frame {sequence} did not complete in time (or its fence \
                 failed)"
            ));
            drop(frame);
            return Err(idle.err().unwrap_or(Error::Timeout(sequence)));
        }
        Ok(self.session.release(frame, false)?)
    }

    /// GPU mode: has GL signal `frame`'s slot's "released" timeline with
    /// the frame's number after the GL work submitted so far, and flushes;
    /// whether it did (not where the value would not go up, or GL refused:
    /// the caller then fences instead).
    fn signal_released(&self, frame: &Frame) -> bool {
        let Some(gpu) = &self.gpu else {
            return false;
        };
        let (slot, value) = (frame.slot() as usize, frame.sequence());
        if gpu.signalled[slot].get() >= value {
            return false;
        }
        let gl = self.gl;
        // SAFETY: the receiver's current context; `gpu`'s names and
        // textures are this receiver's; each pointer is to one live local
        // of the type read.
        let code = unsafe {
            gl.take_error();
            (gpu.fns.parameterui64v)(gpu.released[slot], gl::TIMELINE_SEMAPHORE_VALUE_NV, &value);
            (gpu.fns.signal)(
                gpu.released[slot],
                0,
                std::ptr::null(),
                1,
                &self.textures[slot],
                &gl::LAYOUT_GENERAL,
            );
            (gl.flush)();
            gl.take_error()
        };
        if code != gl::NO_ERROR {
            return false;
        }
        gpu.signalled[slot].set(value);
        true
    }

    /// Fences the GL work submitted so far and waits for it within
    /// `timeout`; where it does not complete (or the fence fails), ends the
    /// session (the sender may then write every slot). Before frames are
    /// dropped without [`GlReceiver::release`] (which releases them with no
    /// fence): `Ok(false)` when the session was ended.
    pub fn finish(&self, timeout: Duration) -> Result<bool, Error> {
        let idle = self.gl_idle(timeout);
        if !matches!(idle, Ok(true)) {
            self.session.close(
                "the GL work on the textures did not complete in time (or its fence failed)",
            );
        }
        idle
    }

    /// Whether the GL work submitted so far completed within `timeout`.
    fn gl_idle(&self, timeout: Duration) -> Result<bool, Error> {
        // SAFETY: the receiver's current context.
        unsafe { gl_idle(&self.gl, timeout) }
    }
}

/// Whether the GL work submitted so far on the current context completed
/// within `timeout` (a fence, flushed, waited for in slices).
///
/// # Safety
/// A context of `gl`'s implementation is current on this thread.
unsafe fn gl_idle(gl: &Gl, timeout: Duration) -> Result<bool, Error> {
    let deadline = deadline_after(timeout);
    // SAFETY: the caller's current context; the sync made here is deleted
    // here.
    unsafe {
        let sync = (gl.fence_sync)(gl::SYNC_GPU_COMMANDS_COMPLETE, 0);
        if sync.is_null() {
            return Err(Error::Gl {
                call: "glFenceSync",
                code: gl.take_error(),
            });
        }
        let mut flags = gl::SYNC_FLUSH_COMMANDS_BIT;
        let done = loop {
            let ns = u64::try_from(left(deadline).as_nanos()).unwrap_or(u64::MAX);
            match (gl.client_wait_sync)(sync, flags, ns.min(50_000_000)) {
                gl::ALREADY_SIGNALED | gl::CONDITION_SATISFIED => break true,
                gl::TIMEOUT_EXPIRED if !left(deadline).is_zero() => flags = 0,
                _ => break false,
            }
        };
        (gl.delete_sync)(sync);
        Ok(done)
    }
}

impl Drop for GlReceiver {
    fn drop(&mut self) {
        // GL deletes objects still in use only once its work on them is
        // done; the wait is for the memory, which the session's end lets
        // the sender write again.
        let _ = self.gl_idle(Duration::from_secs(5));
        let gl = self.gl;
        // SAFETY: the receiver's current-context contract covers its drop;
        // the names are this receiver's.
        unsafe {
            (gl.delete_textures)(self.textures.len() as i32, self.textures.as_ptr());
            (gl.delete_memory_objects)(self.memories.len() as i32, self.memories.as_ptr());
            if let Some(gpu) = &self.gpu {
                let names = gpu.names();
                (gpu.fns.delete)(names.len() as i32, names.as_ptr());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device check: the ring's device among the context's and the
    /// same driver, or a mismatch naming both sides.
    #[test]
    fn a_context_on_another_device_or_driver_is_refused() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        let (d1, d2) = ([7u8; 16], [8u8; 16]);
        assert!(check_device((&[b, a], &d1, "gl"), (&a, &d1)).is_ok());
        for (devices, driver) in [([b, b], d1), ([a, b], d2)] {
            let e = check_device((&devices, &driver, "gl"), (&a, &d1)).unwrap_err();
            assert!(
                matches!(&e, Error::Mismatch(why) if why.contains(&hex(&a)) && why.contains("on_device")),
                "{e}"
            );
        }
    }

    /// The GPU machine's (`--ignored`, `.gpu-run/gl_wait.sh`): GL's
    /// timeline wait and signal, as the receiver makes them, on Vulkan
    /// timelines of this process (NVIDIA's GL; fails, never skips,
    /// elsewhere). A GL wait for a value not reached yet holds the GL work
    /// behind it (a fence after it does not signal) until the host signals
    /// the value; a GL signal of a value sets the Vulkan timeline to it.
    /// (The ring tests cannot show the first: a sender announces a frame
    /// once its writes completed.)
    #[test]
    #[ignore = "the GPU machine's: NVIDIA's EGL with GL_NV_timeline_semaphore (.gpu-run/gl_wait.sh)"]
    fn gpu_side_wait_holds_gl_until_the_value_and_signal_sets_it() {
        let ctx = cuda_interop_testkit::vulkan(None);
        assert!(
            ctx.supports_semaphore_fds(),
            "{}: no exportable timelines: this test is for the GPU machine",
            ctx.identity().name
        );
        let headless = crate::HeadlessGl::on_device(ctx.identity().device_uuid).unwrap();
        let gl = headless.gl();
        // SAFETY: `headless` made its context current on this thread.
        let extensions = unsafe { gl.extensions() };
        let fns = gl
            .semaphores(&extensions)
            .expect("the context offers the GPU-side wait");
        let waited = TimelineSemaphore::new(&ctx).unwrap();
        let signalled = TimelineSemaphore::new(&ctx).unwrap();
        // SAFETY: the context is current and offers `fns`; each fd is a
        // fresh export of a timeline of this context's device.
        let (w, s) = unsafe {
            (
                import_timeline(&gl, &fns, waited.export_fd().unwrap()).unwrap(),
                import_timeline(&gl, &fns, signalled.export_fd().unwrap()).unwrap(),
            )
        };
        // SAFETY: the current context; `w` and `s` are its semaphores; the
        // values are live locals; no textures or buffers.
        unsafe {
            gl.take_error();
            (fns.parameterui64v)(w, gl::TIMELINE_SEMAPHORE_VALUE_NV, &3);
            (fns.wait)(
                w,
                0,
                std::ptr::null(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            assert_eq!(gl.take_error(), gl::NO_ERROR);
            assert!(
                !gl_idle(&gl, Duration::from_millis(300)).unwrap(),
                "GL's work ran past a wait for a value not reached"
            );
        }
        waited.signal(3).unwrap();
        // SAFETY: as above.
        unsafe {
            assert!(
                gl_idle(&gl, Duration::from_secs(10)).unwrap(),
                "GL's wait did not end once the value was reached"
            );
            (fns.parameterui64v)(s, gl::TIMELINE_SEMAPHORE_VALUE_NV, &7);
            (fns.signal)(
                s,
                0,
                std::ptr::null(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            (gl.flush)();
            assert_eq!(gl.take_error(), gl::NO_ERROR);
        }
        signalled
            .wait(7, Duration::from_secs(10), WaitStrategy::default())
            .expect("GL's signal set the Vulkan timeline");
        assert_eq!(signalled.value().unwrap(), 7);
        // SAFETY: the current context; the semaphores are idle (waited
        // for above).
        unsafe {
            assert!(gl_idle(&gl, Duration::from_secs(10)).unwrap());
            (fns.delete)(2, [w, s].as_ptr());
        }
        println!("GL timeline wait held until the value, GL signal set it (7): {headless:?}");
    }

    /// The wait chosen: the frame message without semaphores, else the
    /// GPU-side wait where the context offers it (unless the host wait is
    /// asked for), else the host wait; each naming why.
    #[test]
    fn the_gpu_side_wait_is_chosen_only_where_offered_and_not_turned_off() {
        for (shares, offered, forced, want) in [
            (false, false, false, WaitMode::FrameMessage),
            (false, true, false, WaitMode::FrameMessage),
            (false, true, true, WaitMode::FrameMessage),
            (true, false, false, WaitMode::Host),
            (true, true, true, WaitMode::Host),
            (true, false, true, WaitMode::Host),
            (true, true, false, WaitMode::Gpu),
        ] {
            let (mode, why) = choose_wait(shares, offered, forced, "llvmpipe");
            assert_eq!(mode, want, "{shares} {offered} {forced}: {why}");
            if want == WaitMode::Host && !forced {
                assert!(
                    why.contains("llvmpipe") && why.contains("GL_NV_timeline_semaphore"),
                    "{why}"
                );
            }
            if forced && shares {
                assert!(why.contains(WAIT_ENV), "{why}");
            }
        }
    }
}
