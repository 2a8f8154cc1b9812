//! The OpenGL entry points the receiver calls, loaded once through the
//! caller's loader (`eglGetProcAddress`, `glXGetProcAddress`, SDL's, GLFW's),
//! and the extensions it needs.
//!
//! # Contract
//!
//! * [`Gl::load`] resolves every entry point first and names the first
//!   one missing; no function pointer is called before the whole table is
//!   known.
//! * The table only holds addresses: calling them needs a current context
//!   of the implementation they came from, which the callers in this crate
//!   require of their own callers (`unsafe fn`s with that contract).

use std::ffi::{c_char, c_void, CStr};

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
}

impl Gl {
    /// Resolves every entry point with `loader` (given each name, returns
    /// its address or null); the first one missing is [`Error::Missing`].
    pub fn load(mut loader: impl FnMut(&CStr) -> *const c_void) -> Result<Gl, Error> {
        let mut address = |name: &CStr| {
            let address = loader(name);
            if address.is_null() {
                Err(Error::Missing(name.to_string_lossy().into_owned()))
            } else {
                Ok(address)
            }
        };
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
