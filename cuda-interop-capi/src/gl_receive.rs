//! The OpenGL receiver: thin bindings over `cuda_interop_gl::GlReceiver`
//! (its imports, device check and fencing; nothing of it is redone here),
//! in the GL context the application makes current.
//!
//! # Contract
//!
//! * A `ci_gl_receiver*` is bound to the thread that connected it: every
//!   `ci_gl_receiver_*` call on another thread (the free included) is
//!   `CI_INVALID_ARGUMENT`, touching nothing, as GL calls need the thread's
//!   current context. Should the receiver's last reference go on another
//!   thread (a call there in flight when the owner frees it), it is leaked,
//!   never dropped there.
//! * The GL context the loader's functions belong to must be current on
//!   that thread for every call (the `# Safety` of each function).
//! * Frames are `ci_frame*` handles, as for the other receivers.
//! * Which wait the receiver uses (GL's on the GPU, the host's, or the
//!   frame message alone) is chosen when it connects, as
//!   `cuda_interop_gl::GlReceiver::wait_mode` says, and read back with
//!   `ci_gl_receiver_get_wait_mode` (`CI_GL_WAIT_*`).

use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, PoisonError};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::session::{ConnectError, Session};
use cuda_interop_gl::{Gl, GlReceiver, WaitMode};

use crate::ffi::{
    ci_frame, consumer, delivery_of, discovery, frame_of, key, register_frame, string, vulkan,
};
use crate::handles::{self, Object};
use crate::receive::{ci_ring_layout, write_layout};
use crate::thread_bound::ThreadBound;
use crate::{ci_status, entry, non_null, seconds, CiError};

/// An opaque OpenGL receiver (`ci_gl_receiver_connect_named`).
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct ci_gl_receiver {
    _opaque: [u8; 0],
}

/// `ci_gl_loader_fn`: returns the address of the GL function `name` of the
/// application's context (`eglGetProcAddress`, `glXGetProcAddress`,
/// `SDL_GL_GetProcAddress`), or NULL.
#[allow(non_camel_case_types)]
pub type ci_gl_loader_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, name: *const c_char) -> *const c_void>;

/// `ci_gl_receiver_get_wait_mode`: GL waits on the GPU. The context has
/// `GL_EXT_semaphore_fd` and `GL_NV_timeline_semaphore` and the ring
/// shares its timelines: `ci_gl_receiver_texture` returns at once, with a
/// GL wait for the frame ahead of the GL work submitted after it, and
/// `ci_gl_receiver_release` has GL signal the sender's "released" timeline
/// after the GL work submitted so far (no host wait).
pub const CI_GL_WAIT_GPU: u32 = 0;
/// `ci_gl_receiver_get_wait_mode`: the host waits. The ring shares its
/// timelines but the context lacks the GPU-side wait's extensions (or
/// `CUDA_INTEROP_GL_WAIT=host` was set): `ci_gl_receiver_texture` waits for
/// the frame on the host, `ci_gl_receiver_release` fences the GL work and
/// waits for it.
pub const CI_GL_WAIT_HOST: u32 = 1;
/// `ci_gl_receiver_get_wait_mode`: the ring shares no semaphores (a sender
/// on lavapipe, or without semaphores): the frame message, sent once the
/// writes completed, orders the reads; `ci_gl_receiver_release` fences the
/// GL work and waits for it.
pub const CI_GL_WAIT_FRAME_MESSAGE: u32 = 2;

fn gl_error(e: cuda_interop_gl::Error) -> CiError {
    use cuda_interop_gl::Error as E;
    match e {
        E::Consumer(c) => consumer(&c),
        E::Vulkan(v) => vulkan(v),
        E::Timeout(_) => CiError::new(ci_status::CI_TIMEOUT, e.to_string()),
        // Missing functions or extensions, another device, a ring of
        // another kind, a failed GL call: what the context cannot do.
        other => CiError::new(ci_status::CI_UNSUPPORTED, other.to_string()),
    }
}

/// Connects an OpenGL receiver to the image ring of the sender named
/// `name` in the default directory (`$XDG_RUNTIME_DIR/cuda-interop-frames`),
/// waiting up to `timeout_s` seconds for it to appear, in `delivery`
/// (`CI_DELIVERY_LATEST` or `CI_DELIVERY_LOSSLESS`), and imports every slot
/// into the GL context current on this thread as a texture
/// (`GL_EXT_memory_object_fd`): `loader(user, name)` resolves that
/// context's functions. The context must be on the sender's GPU and
/// driver (`GL_DEVICE_UUID_EXT`, `GL_DRIVER_UUID_EXT`): another, a context
/// without the extensions or below OpenGL 4.5, a buffer ring or a format
/// other than `R8G8B8A8_UNORM`/`_SRGB`, `B8G8R8A8_UNORM`/`_SRGB` and
/// `R16G16B16A16_SFLOAT` is `CI_UNSUPPORTED`, saying why. The receiver is
/// bound to this thread.
///
/// Thread safety: the receiver's calls on this thread only.
///
/// # Safety
/// A GL context is current on this thread, and stays current on it (or
/// one sharing its objects) for every call on the receiver and its free;
/// `loader` is NULL or returns that context's functions (or NULL); `name`
/// is NULL or a NUL-terminated string; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_gl_receiver_connect_named(
    loader: ci_gl_loader_fn,
    user: *mut c_void,
    name: *const c_char,
    delivery: u32,
    timeout_s: f64,
    out: *mut *mut ci_gl_receiver,
) -> ci_status {
    entry(|| {
        let loader = loader.ok_or_else(|| {
            CiError::new(
                ci_status::CI_NULL_POINTER,
                "loader is NULL: pass the function that resolves your GL context's functions \
                 (eglGetProcAddress through a wrapper)",
            )
        })?;
        // SAFETY: NULL or NUL-terminated (the caller's promise).
        let name = unsafe { string(name, "name") }?;
        non_null(out, "out")?;
        let timeout = seconds("timeout_s", timeout_s)?;
        let delivery = delivery_of(delivery)?;
        // SAFETY: the caller's loader, given NUL-terminated names.
        let gl = Gl::load(|f: &CStr| unsafe { loader(user, f.as_ptr()) }).map_err(gl_error)?;
        let directory = Directory::from_env().map_err(discovery)?;
        let (session, setup) = Session::connect_named(&directory, name, delivery, timeout)
            .map_err(|e| match e {
                ConnectError::Discovery(d) => discovery(d),
                ConnectError::Consumer(c) => consumer(&c),
            })?;
        // SAFETY: the caller's promise: a context of `gl`'s implementation
        // is current on this thread now and for every later call; the
        // receiver is only used and dropped on this thread (ThreadBound).
        let rx = unsafe { GlReceiver::new(gl, session, setup) }.map_err(gl_error)?;
        let handle = handles::insert(Object::GlReceiver(Arc::new(ThreadBound::new(rx))));
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_gl_receiver) };
        Ok(())
    })
}

/// Stores the layout of OpenGL receiver `receiver`'s ring in `*layout`
/// (set `layout->struct_size = sizeof(ci_ring_layout)` first).
///
/// Thread safety: the receiver's thread.
///
/// # Safety
/// As `ci_receiver_get_layout`.
#[no_mangle]
pub unsafe extern "C" fn ci_gl_receiver_get_layout(
    receiver: *const ci_gl_receiver,
    layout: *mut ci_ring_layout,
) -> ci_status {
    entry(|| {
        let bound = handles::gl_receiver(key(receiver))?;
        let rx = bound.get()?;
        // SAFETY: the caller's promise, forwarded.
        unsafe { write_layout(layout, rx.session().layout()) }
    })
}

/// Stores how OpenGL receiver `receiver` waits for frames and gives them
/// back in `*mode_out`: `CI_GL_WAIT_GPU`, `CI_GL_WAIT_HOST` or
/// `CI_GL_WAIT_FRAME_MESSAGE` (chosen when it connected).
///
/// Thread safety: the receiver's thread.
///
/// # Safety
/// `mode_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_gl_receiver_get_wait_mode(
    receiver: *const ci_gl_receiver,
    mode_out: *mut u32,
) -> ci_status {
    entry(|| {
        let bound = handles::gl_receiver(key(receiver))?;
        let rx = bound.get()?;
        non_null(mode_out, "mode_out")?;
        let mode = match rx.wait_mode() {
            WaitMode::Gpu => CI_GL_WAIT_GPU,
            WaitMode::Host => CI_GL_WAIT_HOST,
            WaitMode::FrameMessage => CI_GL_WAIT_FRAME_MESSAGE,
            other => {
                return Err(CiError::new(
                    ci_status::CI_UNSUPPORTED,
                    format!("a wait mode this C ABI has no value for: {other:?}"),
                ))
            }
        };
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { mode_out.write(mode) };
        Ok(())
    })
}

/// Waits up to `timeout_s` seconds for the next frame and stores its
/// handle in `*out` (as `ci_vulkan_receiver_next`).
///
/// Thread safety: the receiver's thread.
///
/// # Safety
/// `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_gl_receiver_next(
    receiver: *mut ci_gl_receiver,
    timeout_s: f64,
    out: *mut *mut ci_frame,
) -> ci_status {
    entry(|| {
        let owner = key(receiver);
        let bound = handles::gl_receiver(owner)?;
        let rx = bound.get()?;
        non_null(out, "out")?;
        let timeout = seconds("timeout_s", timeout_s)?;
        let frame = rx.next(timeout).map_err(gl_error)?;
        let layout = *rx.session().layout();
        let bytes = layout.frame_bytes().unwrap_or(0);
        let handle = register_frame(owner, frame, &layout, bytes, || {
            handles::gl_receiver(owner).is_ok()
        })?;
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_frame) };
        Ok(())
    })
}

/// Stores `frame`'s texture (a GL name of the receiver's context, a 2D
/// texture of the ring's format) in `*texture_out` once the frame is
/// complete: with `CI_GL_WAIT_GPU`, at once, behind a GL wait for the
/// ring's "produced" timeline that the GL work submitted afterwards waits
/// for on the GPU (a blocking GL read such as `glGetTextureImage` then
/// blocks until the frame is written); with `CI_GL_WAIT_HOST`, after a host
/// wait for that timeline within `timeout_s` seconds; with
/// `CI_GL_WAIT_FRAME_MESSAGE`, at once. Sample or copy it, then
/// `ci_gl_receiver_release` the frame.
///
/// Thread safety: the receiver's thread.
///
/// # Safety
/// `texture_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_gl_receiver_texture(
    receiver: *mut ci_gl_receiver,
    frame: *const ci_frame,
    timeout_s: f64,
    texture_out: *mut u32,
) -> ci_status {
    entry(|| {
        let bound = handles::gl_receiver(key(receiver))?;
        let rx = bound.get()?;
        let entry = frame_of(key(receiver), key(frame))?;
        non_null(texture_out, "texture_out")?;
        let timeout = seconds("timeout_s", timeout_s)?;
        let held = entry.frame.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(held) = held.as_ref() else {
            return Err(CiError::new(
                ci_status::CI_WRONG_HANDLE,
                "the frame was released: use a frame between ci_gl_receiver_next and \
                 ci_gl_receiver_release",
            ));
        };
        let texture = rx.texture(held, timeout).map_err(gl_error)?;
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { texture_out.write(texture) };
        Ok(())
    })
}

/// Gives `frame` back once the GL work submitted so far on this thread's
/// context is done, and frees its handle. With `CI_GL_WAIT_GPU`, GL signals
/// the sender's "released" timeline after that work and nothing waits here
/// (`timeout_s` unused; the sender waits on the GPU). Otherwise the work is
/// fenced and waited for (at most `timeout_s` seconds): a fence that does
/// not signal in time (`CI_TIMEOUT`) or fails (`CI_UNSUPPORTED`, the GL
/// error) ends the session; the frame's handle is freed.
///
/// Thread safety: the receiver's thread.
///
/// # Safety
/// None beyond the receiver's (`ci_gl_receiver_connect_named`).
#[no_mangle]
pub unsafe extern "C" fn ci_gl_receiver_release(
    receiver: *mut ci_gl_receiver,
    frame: *mut ci_frame,
    timeout_s: f64,
) -> ci_status {
    entry(|| {
        let bound = handles::gl_receiver(key(receiver))?;
        let rx = bound.get()?;
        frame_of(key(receiver), key(frame))?;
        let timeout = seconds("timeout_s", timeout_s)?;
        let Some(frame) = handles::take_frame(key(frame))? else {
            return Ok(());
        };
        rx.release(frame, timeout).map_err(gl_error)
    })
}

/// Frees `receiver` (NULL: nothing) and its frames: the GL work submitted
/// so far is fenced and waited for first (at most 5 s; beyond, the
/// session ends), then the frames still held are given back and the
/// textures and memory objects deleted. On another
/// thread than the receiver's: `CI_INVALID_ARGUMENT`, nothing freed.
///
/// Thread safety: the receiver's thread.
///
/// # Safety
/// None beyond the receiver's (`ci_gl_receiver_connect_named`).
#[no_mangle]
pub unsafe extern "C" fn ci_gl_receiver_free(receiver: *mut ci_gl_receiver) -> ci_status {
    entry(|| {
        if !receiver.is_null() {
            // The GL work on the textures first (bounded), as the frames
            // still held are given back with the receiver: a fence that
            // does not complete ends the session before they go.
            let _ = handles::gl_receiver(key(receiver))?
                .get()?
                .finish(std::time::Duration::from_secs(5));
        }
        handles::free_receiver(key(receiver), "ci_gl_receiver*", |o| {
            matches!(o, Object::GlReceiver(_))
        })
    })
}
