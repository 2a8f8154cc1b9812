//! [`GlReceiver`]: a ring's image slots as GL textures (see the crate
//! contract).

use std::marker::PhantomData;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::time::Duration;

use cuda_interop_frames::protocol::RingLayout;
use cuda_interop_frames::session::{has_semaphores, Frame, Session};
use cuda_interop_frames::transport::{deadline_after, left};
use vk_export::format::{Bgra8Srgb, Bgra8Unorm, Format, Rgba16Sfloat, Rgba8Srgb, Rgba8Unorm};
use vk_export::markers::{usage, DeviceLocal, HostVisible, MemoryLocation, Optimal, Usage};
use vk_export::wire::Received;
use vk_export::ImageInfo;
use vk_export::{Context, HeadlessOptions, TimelineSemaphore, WaitStrategy};

use crate::gl::{self, GLenum, GLuint, Gl};
use crate::Error;

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
    /// The "produced" timeline, where the sender shares one.
    produced: Option<TimelineSemaphore>,
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
        if has_semaphores(&layout, &setup) {
            let received = setup.take_semaphore(n)?;
            let produced = TimelineSemaphore::import_received(&vulkan, received)
                .map_err(|e| e.into_error())?;
            receiver.produced = Some(produced);
        }
        Ok(receiver)
    }

    /// Imports one slot: its memory object, then its texture.
    ///
    /// # Safety
    /// The receiver's current-context contract.
    unsafe fn import_slot(&mut self, info: &ImageInfo, fd: OwnedFd) -> Result<(), Error> {
        let gl = self.gl;
        // SAFETY: the receiver's current context for every GL call below;
        // each pointer is to a live local of the written type and count;
        // `raw` is given to GL, or taken back and closed only after an
        // argument error (which takes nothing).
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
            let raw = fd.into_raw_fd();
            (gl.import_memory_fd)(
                memory,
                info.allocation_size(),
                gl::HANDLE_TYPE_OPAQUE_FD,
                raw,
            );
            let code = gl.take_error();
            if code != gl::NO_ERROR {
                // A refused argument leaves the fd with the caller (GL takes
                // it only on success); after any other error whether GL
                // took it is unknown: leaked rather than closed twice.
                if matches!(
                    code,
                    gl::INVALID_ENUM | gl::INVALID_VALUE | gl::INVALID_OPERATION
                ) {
                    drop(OwnedFd::from_raw_fd(raw));
                }
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
    /// crate contract), within `timeout`. Sample or copy it, then
    /// [`GlReceiver::release`] the frame.
    pub fn texture(&self, frame: &Frame, timeout: Duration) -> Result<u32, Error> {
        self.session.check_held(frame)?;
        if let Some(produced) = &self.produced {
            produced.wait(frame.sequence(), timeout, WaitStrategy::default())?;
        }
        Ok(self.textures[frame.slot() as usize])
    }

    /// `frame`'s texels as the ring holds them, rows tightly packed
    /// (`glGetTextureImage`, waited for): for tools and tests. A receiver
    /// the sender dropped during the read gets the drop's error.
    pub fn read_pixels(&self, frame: &Frame, timeout: Duration) -> Result<Vec<u8>, Error> {
        let texture = self.texture(frame, timeout)?;
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

    /// Fences the GL work submitted so far on the context current now (read
    /// the textures there: a shared context's work is not fenced), waits
    /// for it within `timeout`, then gives `frame` back. A fence that does not signal in time (or
    /// fails) ends the session ([`Error::Timeout`], or the GL error): the
    /// sender then counts every slot free, and may write them while those
    /// reads still run.
    pub fn release(&self, frame: Frame, timeout: Duration) -> Result<(), Error> {
        let sequence = frame.sequence();
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
        let gl = self.gl;
        let deadline = deadline_after(timeout);
        // SAFETY: the receiver's current context; the sync made here is
        // deleted here.
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
}
