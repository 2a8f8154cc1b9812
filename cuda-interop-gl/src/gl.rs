//! The OpenGL entry points the receiver calls, loaded once through the
//! caller's loader (`eglGetProcAddress`, `glXGetProcAddress`, SDL's, GLFW's),
//! and the extensions it needs.
//!
//! # Contract
//!
//! * [`Gl::load`] resolves every entry point first and names the first
//!   one missing; no function pointer is called before the whole table is
//!   known.
//! * The GPU-side wait's entry points (`GL_EXT_semaphore`,
//!   `GL_EXT_semaphore_fd`, `GL_NV_timeline_semaphore`) are optional:
//!   [`Gl::semaphores`] holds them only when every one resolved, and the
//!   receiver uses them only where the context also lists the three
//!   extensions (a loader may return an address for any name).
//! * The table only holds addresses: calling them needs a current context
//!   of the implementation they came from, which the callers in this crate
//!   require of their own callers (`unsafe fn`s with that contract).
//! * [`give_fd`] is the one place an fd is handed to a GL import: GL owns
//!   it after the import succeeded, it is closed here after an argument
//!   error (the command had no effect), and leaked after any other error
//!   (whether GL took it is unknown; a leak is bounded, a double close is
//!   not).

use std::ffi::{c_char, c_void, CStr};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};

use crate::Error;

pub(crate) type GLenum = u32;
pub(crate) type GLuint = u32;
pub(crate) type GLint = i32;
pub(crate) type GLsizei = i32;
pub(crate) type GLuint64 = u64;
pub(crate) type GLsync = *const c_void;

pub(crate) const NO_ERROR: GLenum = 0;
pub(crate) const INVALID_ENUM: GLenum = 0x0500;
pub(crate) const INVALID_VALUE: GLenum = 0x0501;
pub(crate) const INVALID_OPERATION: GLenum = 0x0502;
#[cfg(test)]
pub(crate) const OUT_OF_MEMORY: GLenum = 0x0505;
pub(crate) const EXTENSIONS: GLenum = 0x1F03;
pub(crate) const NUM_EXTENSIONS: GLenum = 0x821D;
pub(crate) const RENDERER: GLenum = 0x1F01;
pub(crate) const NUM_DEVICE_UUIDS: GLenum = 0x9596;
pub(crate) const DEVICE_UUID: GLenum = 0x9597;
pub(crate) const DRIVER_UUID: GLenum = 0x9598;
pub(crate) const HANDLE_TYPE_OPAQUE_FD: GLenum = 0x9586;
pub(crate) const DEDICATED_MEMORY_OBJECT: GLenum = 0x9581;
pub(crate) const TEXTURE_2D: GLenum = 0x0DE1;
pub(crate) const TEXTURE_TILING: GLenum = 0x9580;
pub(crate) const OPTIMAL_TILING: GLint = 0x9584;
pub(crate) const TEXTURE_SWIZZLE_RGBA: GLenum = 0x8E46;
pub(crate) const RED: GLint = 0x1903;
pub(crate) const GREEN: GLint = 0x1904;
pub(crate) const BLUE: GLint = 0x1905;
pub(crate) const ALPHA: GLint = 0x1906;
pub(crate) const RGBA: GLenum = 0x1908;
pub(crate) const UNSIGNED_BYTE: GLenum = 0x1401;
pub(crate) const HALF_FLOAT: GLenum = 0x140B;
pub(crate) const RGBA8: GLenum = 0x8058;
pub(crate) const SRGB8_ALPHA8: GLenum = 0x8C43;
pub(crate) const RGBA16F: GLenum = 0x881A;
pub(crate) const PACK_ALIGNMENT: GLenum = 0x0D05;
pub(crate) const SYNC_GPU_COMMANDS_COMPLETE: GLenum = 0x9117;
pub(crate) const SYNC_FLUSH_COMMANDS_BIT: u32 = 0x1;
pub(crate) const ALREADY_SIGNALED: GLenum = 0x911A;
pub(crate) const CONDITION_SATISFIED: GLenum = 0x911C;
pub(crate) const TIMEOUT_EXPIRED: GLenum = 0x911B;
/// `GL_LAYOUT_GENERAL_EXT`: the layout the sender leaves the slots in
/// (`VK_IMAGE_LAYOUT_GENERAL`, released to the external family).
pub(crate) const LAYOUT_GENERAL: GLenum = 0x958D;
pub(crate) const SEMAPHORE_TYPE_NV: GLenum = 0x95B3;
pub(crate) const SEMAPHORE_TYPE_TIMELINE_NV: GLint = 0x95B5;
pub(crate) const TIMELINE_SEMAPHORE_VALUE_NV: GLenum = 0x9595;

/// The entry points, resolved for one GL implementation.
#[derive(Clone, Copy)]
pub struct Gl {
    pub(crate) get_string: unsafe extern "system" fn(GLenum) -> *const c_char,
    pub(crate) get_stringi: unsafe extern "system" fn(GLenum, GLuint) -> *const c_char,
    pub(crate) get_error: unsafe extern "system" fn() -> GLenum,
    pub(crate) get_integerv: unsafe extern "system" fn(GLenum, *mut GLint),
    pub(crate) get_unsigned_bytei_v: unsafe extern "system" fn(GLenum, GLuint, *mut u8),
    pub(crate) get_unsigned_bytev: unsafe extern "system" fn(GLenum, *mut u8),
    pub(crate) create_memory_objects: unsafe extern "system" fn(GLsizei, *mut GLuint),
    pub(crate) delete_memory_objects: unsafe extern "system" fn(GLsizei, *const GLuint),
    pub(crate) memory_object_parameteriv: unsafe extern "system" fn(GLuint, GLenum, *const GLint),
    pub(crate) import_memory_fd: unsafe extern "system" fn(GLuint, GLuint64, GLenum, GLint),
    pub(crate) create_textures: unsafe extern "system" fn(GLenum, GLsizei, *mut GLuint),
    pub(crate) delete_textures: unsafe extern "system" fn(GLsizei, *const GLuint),
    pub(crate) texture_parameteri: unsafe extern "system" fn(GLuint, GLenum, GLint),
    pub(crate) texture_parameteriv: unsafe extern "system" fn(GLuint, GLenum, *const GLint),
    pub(crate) texture_storage_mem_2d:
        unsafe extern "system" fn(GLuint, GLsizei, GLenum, GLsizei, GLsizei, GLuint, GLuint64),
    pub(crate) get_texture_image:
        unsafe extern "system" fn(GLuint, GLint, GLenum, GLenum, GLsizei, *mut c_void),
    pub(crate) pixel_storei: unsafe extern "system" fn(GLenum, GLint),
    pub(crate) fence_sync: unsafe extern "system" fn(GLenum, u32) -> GLsync,
    pub(crate) client_wait_sync: unsafe extern "system" fn(GLsync, u32, GLuint64) -> GLenum,
    pub(crate) delete_sync: unsafe extern "system" fn(GLsync),
    pub(crate) flush: unsafe extern "system" fn(),
    /// The GPU-side wait's entry points, where every one resolved.
    pub(crate) semaphores: Option<SemaphoreFns>,
}

/// `GL_EXT_semaphore`, `GL_EXT_semaphore_fd` and `GL_NV_timeline_semaphore`
/// entry points.
#[derive(Clone, Copy)]
pub(crate) struct SemaphoreFns {
    /// `glCreateSemaphoresNV`: semaphore objects whose type can be set
    /// before the import.
    pub(crate) create: unsafe extern "system" fn(GLsizei, *mut GLuint),
    pub(crate) delete: unsafe extern "system" fn(GLsizei, *const GLuint),
    /// `glSemaphoreParameterivNV` (`GL_SEMAPHORE_TYPE_NV`).
    pub(crate) parameteriv: unsafe extern "system" fn(GLuint, GLenum, *const GLint),
    /// `glSemaphoreParameterui64vEXT` (`GL_TIMELINE_SEMAPHORE_VALUE_NV`).
    pub(crate) parameterui64v: unsafe extern "system" fn(GLuint, GLenum, *const GLuint64),
    pub(crate) import_fd: unsafe extern "system" fn(GLuint, GLenum, GLint),
    #[allow(clippy::type_complexity)]
    pub(crate) wait: unsafe extern "system" fn(
        GLuint,
        GLuint,
        *const GLuint,
        GLuint,
        *const GLuint,
        *const GLenum,
    ),
    #[allow(clippy::type_complexity)]
    pub(crate) signal: unsafe extern "system" fn(
        GLuint,
        GLuint,
        *const GLuint,
        GLuint,
        *const GLuint,
        *const GLenum,
    ),
}

impl Gl {
    /// Resolves every entry point with `loader` (given each name, returns
    /// its address or null); the first one missing is [`Error::Missing`].
    /// The GPU-side wait's entry points are optional: without one of them
    /// the table has none of them (see the module contract).
    pub fn load(mut loader: impl FnMut(&CStr) -> *const c_void) -> Result<Gl, Error> {
        let mut address = |name: &CStr| {
            let address = loader(name);
            if address.is_null() {
                Err(Error::Missing(name.to_string_lossy().into_owned()))
            } else {
                Ok(address)
            }
        };
        // SAFETY: as below: each address is the named function's, whose
        // prototype is the field's.
        let semaphores = (|| unsafe {
            Ok::<_, Error>(SemaphoreFns {
                create: entry(address(c"glCreateSemaphoresNV")?),
                delete: entry(address(c"glDeleteSemaphoresEXT")?),
                parameteriv: entry(address(c"glSemaphoreParameterivNV")?),
                parameterui64v: entry(address(c"glSemaphoreParameterui64vEXT")?),
                import_fd: entry(address(c"glImportSemaphoreFdEXT")?),
                wait: entry(address(c"glWaitSemaphoreEXT")?),
                signal: entry(address(c"glSignalSemaphoreEXT")?),
            })
        })()
        .ok();
        // SAFETY: each address is non-null and is what the implementation
        // gave for that name, whose C prototype is the field's signature
        // (the Khronos registry's); a GL loader's address is a function
        // pointer of the platform's C ABI. They are only called under the
        // current-context contract of this crate's unsafe functions.
        unsafe {
            Ok(Gl {
                get_string: entry(address(c"glGetString")?),
                get_stringi: entry(address(c"glGetStringi")?),
                get_error: entry(address(c"glGetError")?),
                get_integerv: entry(address(c"glGetIntegerv")?),
                get_unsigned_bytei_v: entry(address(c"glGetUnsignedBytei_vEXT")?),
                get_unsigned_bytev: entry(address(c"glGetUnsignedBytevEXT")?),
                create_memory_objects: entry(address(c"glCreateMemoryObjectsEXT")?),
                delete_memory_objects: entry(address(c"glDeleteMemoryObjectsEXT")?),
                memory_object_parameteriv: entry(address(c"glMemoryObjectParameterivEXT")?),
                import_memory_fd: entry(address(c"glImportMemoryFdEXT")?),
                create_textures: entry(address(c"glCreateTextures")?),
                delete_textures: entry(address(c"glDeleteTextures")?),
                texture_parameteri: entry(address(c"glTextureParameteri")?),
                texture_parameteriv: entry(address(c"glTextureParameteriv")?),
                texture_storage_mem_2d: entry(address(c"glTextureStorageMem2DEXT")?),
                get_texture_image: entry(address(c"glGetTextureImage")?),
                pixel_storei: entry(address(c"glPixelStorei")?),
                fence_sync: entry(address(c"glFenceSync")?),
                client_wait_sync: entry(address(c"glClientWaitSync")?),
                delete_sync: entry(address(c"glDeleteSync")?),
                flush: entry(address(c"glFlush")?),
                semaphores,
            })
        }
    }
}

impl std::fmt::Debug for Gl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gl").finish_non_exhaustive()
    }
}

/// `address` as the function pointer type `F`.
///
/// # Safety
/// `F` is an `extern "system" fn` type, and `address` is a function of
/// that prototype.
unsafe fn entry<F: Copy>(address: *const c_void) -> F {
    assert_eq!(
        std::mem::size_of::<F>(),
        std::mem::size_of::<*const c_void>(),
        "a function pointer"
    );
    // SAFETY: the caller's: `F` is a function pointer type (of a pointer's
    // size, checked) and `address` such a function.
    unsafe { std::mem::transmute_copy::<*const c_void, F>(&address) }
}

/// The extensions a receiver needs.
pub(crate) const REQUIRED: [&str; 2] = ["GL_EXT_memory_object", "GL_EXT_memory_object_fd"];

/// The extensions the GPU-side wait needs (a timeline wait: the ring's
/// semaphores are Vulkan timelines, which `GL_EXT_semaphore` alone would
/// treat as binary).
pub(crate) const GPU_WAIT: [&str; 3] = [
    "GL_EXT_semaphore",
    "GL_EXT_semaphore_fd",
    "GL_NV_timeline_semaphore",
];

/// Hands `fd` to a GL import: `import` is called with its number, then
/// `error` (`glGetError`'s first flag) says how it went. `NO_ERROR`: GL owns
/// the fd now (nothing here closes it). `INVALID_ENUM`, `INVALID_VALUE`,
/// `INVALID_OPERATION`: the command had no effect (GL's rule for every
/// error but `OUT_OF_MEMORY`), the fd is still ours and closed here. Any
/// other code (`OUT_OF_MEMORY`, a lost context): GL's state is undefined,
/// whether it took the fd is unknown, and the fd is leaked rather than
/// risk closing a number GL may close too. `Err` is the code.
///
/// # Safety
/// `import` gives the fd to GL or to nothing: it takes ownership only if
/// `error` then returns `NO_ERROR`, and after an argument error it has
/// neither closed it nor kept it (what a GL import command does).
pub(crate) unsafe fn give_fd(
    fd: OwnedFd,
    import: impl FnOnce(RawFd),
    error: impl FnOnce() -> GLenum,
) -> Result<(), GLenum> {
    let raw = fd.into_raw_fd();
    import(raw);
    match error() {
        NO_ERROR => Ok(()),
        code @ (INVALID_ENUM | INVALID_VALUE | INVALID_OPERATION) => {
            // SAFETY: the caller's: after an argument error the command had
            // no effect, so `raw` is still the one we owned.
            drop(unsafe { OwnedFd::from_raw_fd(raw) });
            Err(code)
        }
        code => Err(code),
    }
}

impl Gl {
    /// Clears the error flags (a GL keeps several); the first one found.
    ///
    /// # Safety
    /// A context of this table's implementation is current on this thread.
    pub(crate) unsafe fn take_error(&self) -> GLenum {
        let mut first = NO_ERROR;
        for _ in 0..16 {
            // SAFETY: the caller's current context.
            let e = unsafe { (self.get_error)() };
            if e == NO_ERROR {
                break;
            }
            if first == NO_ERROR {
                first = e;
            }
        }
        first
    }

    /// The GPU-side wait's entry points, where the context lists its
    /// extensions (`extensions`, the context's) and every one resolved.
    pub(crate) fn semaphores(&self, extensions: &[String]) -> Option<SemaphoreFns> {
        let listed = GPU_WAIT.iter().all(|x| extensions.iter().any(|e| e == x));
        self.semaphores.filter(|_| listed)
    }

    /// The current context's extension names.
    ///
    /// # Safety
    /// As [`Gl::take_error`].
    pub(crate) unsafe fn extensions(&self) -> Vec<String> {
        let mut n = 0;
        // SAFETY: the caller's current context; one GLint written.
        unsafe { (self.get_integerv)(NUM_EXTENSIONS, &mut n) };
        (0..n.max(0) as GLuint)
            .filter_map(|i| {
                // SAFETY: the caller's current context; `i` below the count.
                let s = unsafe { (self.get_stringi)(EXTENSIONS, i) };
                // SAFETY: GL returns a static NUL-terminated string or null.
                (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
            })
            .collect()
    }

    /// The renderer's name.
    ///
    /// # Safety
    /// As [`Gl::take_error`].
    pub(crate) unsafe fn renderer(&self) -> String {
        // SAFETY: the caller's current context.
        let s = unsafe { (self.get_string)(RENDERER) };
        if s.is_null() {
            return "an unnamed renderer".into();
        }
        // SAFETY: GL returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    /// The device UUIDs (`GL_DEVICE_UUID_EXT`, one per device of the
    /// context) and the driver UUID.
    ///
    /// # Safety
    /// As [`Gl::take_error`], and the context has `GL_EXT_memory_object`.
    pub(crate) unsafe fn uuids(&self) -> (Vec<[u8; 16]>, [u8; 16]) {
        let mut n = 0;
        // SAFETY: the caller's current context; one GLint written.
        unsafe { (self.get_integerv)(NUM_DEVICE_UUIDS, &mut n) };
        let devices = (0..n.clamp(0, 16) as GLuint)
            .map(|i| {
                let mut uuid = [0u8; 16];
                // SAFETY: GL_UUID_SIZE_EXT (16) bytes written; `i` below the
                // count.
                unsafe { (self.get_unsigned_bytei_v)(DEVICE_UUID, i, uuid.as_mut_ptr()) };
                uuid
            })
            .collect();
        let mut driver = [0u8; 16];
        // SAFETY: 16 bytes written.
        unsafe { (self.get_unsigned_bytev)(DRIVER_UUID, driver.as_mut_ptr()) };
        (devices, driver)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;

    use super::*;

    /// What this machine's GL offers (printed: the issue asks where Mesa
    /// has the GPU-side wait's extensions): the memory and semaphore
    /// extensions, and which wait a receiver of a ring with semaphores
    /// would get.
    #[test]
    fn print_the_semaphore_extensions() {
        let gl = crate::HeadlessGl::new().expect("a headless GL context");
        // SAFETY: `HeadlessGl::new` made its context current on this thread.
        let (renderer, extensions) = unsafe { (gl.gl().renderer(), gl.gl().extensions()) };
        println!("renderer: {renderer}");
        for x in REQUIRED.iter().chain(&GPU_WAIT) {
            let has = extensions.iter().any(|e| e == x);
            println!("  {x}: {}", if has { "yes" } else { "no" });
        }
        let entry_points = gl.gl().semaphores.is_some();
        println!("  the GPU-side wait's entry points resolve: {entry_points}");
        println!(
            "  GPU-side wait offered: {}",
            gl.gl().semaphores(&extensions).is_some()
        );
    }

    /// A socket pair: the fd handed over, and the peer that tells whether
    /// it is still open (a read of a closed peer's socket is end of file;
    /// of an open one, would block). Unlike an fd number, which another
    /// test's thread may reuse, the peer tells about this very file.
    fn pair() -> (OwnedFd, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        (OwnedFd::from(a), b)
    }

    fn is_open(peer: &mut UnixStream) -> bool {
        match peer.read(&mut [0u8; 1]) {
            Ok(0) => false,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
            other => panic!("{other:?}"),
        }
    }

    /// An argument error: the import had no effect, the fd is closed here
    /// (once: the peer sees end of file); GL is given the fd's number.
    #[test]
    fn an_fd_gl_refused_is_closed_here() {
        for code in [INVALID_ENUM, INVALID_VALUE, INVALID_OPERATION] {
            let (fd, mut peer) = pair();
            let number = fd.as_raw_fd();
            let mut given = None;
            // SAFETY: the stand-in import neither keeps nor closes the fd.
            let r = unsafe { give_fd(fd, |raw| given = Some(raw), || code) };
            assert_eq!(r, Err(code));
            assert_eq!(given, Some(number));
            assert!(
                !is_open(&mut peer),
                "{code:#x}: the refused fd was not closed"
            );
        }
    }

    /// A successful import: GL owns the fd, nothing here closes it (the
    /// stand-in "GL" closes it later, as a driver would).
    #[test]
    fn an_fd_gl_took_is_not_closed_here() {
        let (fd, mut peer) = pair();
        let mut taken = None;
        // SAFETY: the stand-in import takes the fd on success (below it is
        // closed by its owner, the stand-in).
        let r = unsafe { give_fd(fd, |raw| taken = Some(raw), || NO_ERROR) };
        assert_eq!(r, Ok(()));
        assert!(is_open(&mut peer), "an fd GL owns was closed");
        // SAFETY: the stand-in GL owns it and closes it once.
        drop(unsafe { OwnedFd::from_raw_fd(taken.unwrap()) });
        assert!(!is_open(&mut peer));
    }

    /// Any other error: whether GL took the fd is unknown, so it is left
    /// open (leaked), never closed here.
    #[test]
    fn an_fd_after_another_error_is_left_open() {
        let (fd, mut peer) = pair();
        let mut given = None;
        // SAFETY: the stand-in import neither keeps nor closes the fd.
        let r = unsafe { give_fd(fd, |raw| given = Some(raw), || OUT_OF_MEMORY) };
        assert_eq!(r, Err(OUT_OF_MEMORY));
        assert!(is_open(&mut peer), "an fd GL may own was closed");
        // SAFETY: the test's own: the stand-in did not take it.
        drop(unsafe { OwnedFd::from_raw_fd(given.unwrap()) });
    }

    /// The real GL's refusal: a memory import of a handle type GL does not
    /// take (`INVALID_ENUM`) leaves the fd with us, and `give_fd` closes it
    /// (once: the peer sees end of file).
    #[test]
    fn a_real_refused_import_closes_the_fd_once() {
        let headless = crate::HeadlessGl::new().expect("a headless GL context");
        let gl = headless.gl();
        let (fd, mut peer) = pair();
        // SAFETY: the context is current on this thread (made here); the
        // memory object is made and deleted here; a refused import takes
        // nothing (GL's rule for argument errors).
        let r = unsafe {
            gl.take_error();
            let mut memory = 0;
            (gl.create_memory_objects)(1, &mut memory);
            assert_ne!(memory, 0);
            let r = give_fd(
                fd,
                |raw| (gl.import_memory_fd)(memory, 4096, 0x1234, raw),
                || gl.take_error(),
            );
            (gl.delete_memory_objects)(1, &memory);
            r
        };
        // INVALID_ENUM by the spec; any argument error takes nothing.
        assert!(
            matches!(r, Err(INVALID_ENUM | INVALID_VALUE | INVALID_OPERATION)),
            "{r:?}"
        );
        assert!(!is_open(&mut peer), "the refused fd was not closed");
    }
}
