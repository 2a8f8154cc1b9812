//! A headless OpenGL 4.5 core context through EGL, for tools, tests and
//! processes without a window: on an EGL device (`EGL_EXT_platform_device`:
//! NVIDIA's GPUs, Mesa's), else Mesa's surfaceless platform (llvmpipe);
//! [`HeadlessGl::on_device`] picks the one on a ring's device.
//!
//! # Contract
//!
//! * `libEGL.so.1` is loaded at run time; where it, a display or a 4.5
//!   core context is missing, [`HeadlessGl::new`] says which and what to
//!   install.
//! * The context is made current on the creating thread and the value is
//!   neither `Send` nor `Sync`: the context stays with that thread. When
//!   no context is made, the one current before the call is current again.
//!   [`HeadlessGl::make_current`] makes it current again (after other GL
//!   code on the thread made another one current).
//! * Dropping it releases the context from the thread (only if it is the
//!   current one) and destroys it; the display is left
//!   initialised (EGL displays are shared within a process), and
//!   `libEGL.so.1` stays loaded for the process's life: EGL registers
//!   thread-exit destructors that must find its code.

use std::ffi::{c_char, c_void, CStr};
use std::marker::PhantomData;
use std::sync::OnceLock;

use crate::gl::Gl;
use crate::Error;

type EglDisplay = *mut c_void;
type EglContext = *mut c_void;
type EglBoolean = u32;
type EglInt = i32;

const PLATFORM_SURFACELESS_MESA: u32 = 0x31DD;
const PLATFORM_DEVICE_EXT: u32 = 0x313F;
const OPENGL_API: u32 = 0x30A2;
const CONTEXT_MAJOR_VERSION: EglInt = 0x3098;
const CONTEXT_MINOR_VERSION: EglInt = 0x30FB;
const CONTEXT_OPENGL_PROFILE_MASK: EglInt = 0x30FD;
const CONTEXT_OPENGL_CORE_PROFILE_BIT: EglInt = 0x1;
const NONE: EglInt = 0x3038;
const VENDOR: EglInt = 0x3053;

type GetProcAddress = unsafe extern "system" fn(*const c_char) -> *const c_void;
type GetPlatformDisplay = unsafe extern "system" fn(u32, *mut c_void, *const EglInt) -> EglDisplay;
type QueryDevices = unsafe extern "system" fn(EglInt, *mut *mut c_void, *mut EglInt) -> EglBoolean;
type Initialize = unsafe extern "system" fn(EglDisplay, *mut EglInt, *mut EglInt) -> EglBoolean;
type BindApi = unsafe extern "system" fn(u32) -> EglBoolean;
type CreateContext =
    unsafe extern "system" fn(EglDisplay, *mut c_void, EglContext, *const EglInt) -> EglContext;
type MakeCurrent =
    unsafe extern "system" fn(EglDisplay, *mut c_void, *mut c_void, EglContext) -> EglBoolean;
type DestroyContext = unsafe extern "system" fn(EglDisplay, EglContext) -> EglBoolean;
type GetError = unsafe extern "system" fn() -> EglInt;
type QueryString = unsafe extern "system" fn(EglDisplay, EglInt) -> *const c_char;
type GetCurrentContext = unsafe extern "system" fn() -> EglContext;
type QueryApi = unsafe extern "system" fn() -> u32;
type GetCurrentDisplay = unsafe extern "system" fn() -> EglDisplay;
type GetCurrentSurface = unsafe extern "system" fn(EglInt) -> *mut c_void;

const DRAW: EglInt = 0x3059;
const READ: EglInt = 0x305A;

/// A headless GL context, current on the thread that made it (see the
/// module contract).
pub struct HeadlessGl {
    display: EglDisplay,
    context: EglContext,
    make_current: MakeCurrent,
    destroy_context: DestroyContext,
    get_current_context: GetCurrentContext,
    /// `None` only while being made.
    gl: Option<Gl>,
    vendor: String,
    /// Current on one thread: neither `Send` nor `Sync`.
    _thread: PhantomData<*const ()>,
}

impl std::fmt::Debug for HeadlessGl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadlessGl")
            .field("egl_vendor", &self.vendor)
            .finish_non_exhaustive()
    }
}

const INSTALL: &str = "install an EGL driver (Debian, Ubuntu: apt-get install libegl1 \
     libegl-mesa0 libgl1-mesa-dri; with an NVIDIA GPU, its driver's EGL)";

impl HeadlessGl {
    /// Loads EGL and makes a GL 4.5 core context without a window current
    /// on this thread: on the first EGL device that gives one (NVIDIA's
    /// EGL lists its GPUs), else on Mesa's surfaceless platform.
    pub fn new() -> Result<HeadlessGl, Error> {
        Self::first(|_| true)
    }

    /// As [`HeadlessGl::new`], on the device whose `GL_DEVICE_UUID_EXT` is
    /// `device` (a ring's, `Session::layout`'s device): the context a
    /// [`crate::GlReceiver`] of that ring needs.
    pub fn on_device(device: vk_export::DeviceUuid) -> Result<HeadlessGl, Error> {
        Self::first(|gl| {
            // SAFETY: `first` calls this with the candidate's context
            // current on this thread.
            let has = unsafe { gl.extensions() }
                .iter()
                .any(|e| e == "GL_EXT_memory_object");
            // SAFETY: as above, and the context has GL_EXT_memory_object.
            has && unsafe { gl.uuids() }.0.contains(device.as_bytes())
        })
        .map_err(|e| match e {
            Error::Unavailable(why) => Error::Mismatch(format!(
                "no EGL context on device {}: {why}",
                device
                    .as_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            )),
            other => other,
        })
    }

    /// The first candidate display whose context `accept` takes (called
    /// with that context current).
    fn first(accept: impl Fn(&Gl) -> bool) -> Result<HeadlessGl, Error> {
        let library = egl_library()?;
        let egl = Egl::load(library)?;
        // The thread's bound API (eglBindAPI below sets it; the default is
        // OpenGL ES), given back on every return.
        // SAFETY: a plain query of this thread's EGL state.
        let api = unsafe { (egl.query_api)() };
        let made = Self::first_with(&egl, accept);
        // SAFETY: a plain call with the API value EGL gave.
        unsafe { (egl.bind_api)(api) };
        made
    }

    /// [`HeadlessGl::first`], the bound API left to the caller.
    fn first_with(egl: &Egl, accept: impl Fn(&Gl) -> bool) -> Result<HeadlessGl, Error> {
        // What was current on this thread, made current again if no
        // candidate is taken (a rejected one's drop leaves nothing current).
        // SAFETY: plain queries of this thread's EGL state.
        let previous = unsafe {
            (
                (egl.get_current_display)(),
                (egl.get_current_surface)(DRAW),
                (egl.get_current_surface)(READ),
                (egl.get_current_context)(),
            )
        };
        let mut why = String::from("no display");
        for display in candidate_displays(egl)? {
            match egl.context_on(display) {
                Ok(made) => {
                    if accept(&made.gl()) {
                        return Ok(made);
                    }
                    why = format!("{} (not the device asked for)", made.vendor);
                }
                Err(e) => why = e.to_string(),
            }
        }
        if !previous.3.is_null() {
            // SAFETY: the display, surfaces and context that were current
            // on this thread when the call began.
            unsafe { (egl.make_current)(previous.0, previous.1, previous.2, previous.3) };
        }
        Err(Error::Unavailable(format!(
            "no EGL display gave a GL 4.5 core context without a window (last: {why}): {INSTALL}"
        )))
    }

    /// The GL entry points of this context's implementation.
    pub fn gl(&self) -> Gl {
        self.gl.expect("set when made")
    }

    /// Makes the context current on this thread again.
    pub fn make_current(&self) -> Result<(), Error> {
        // SAFETY: this value's display and context, on the thread that made
        // them (the value is neither Send nor Sync).
        let made = unsafe {
            (self.make_current)(
                self.display,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                self.context,
            )
        };
        if made == 0 {
            return Err(Error::Unavailable("eglMakeCurrent failed".into()));
        }
        Ok(())
    }
}

impl Drop for HeadlessGl {
    fn drop(&mut self) {
        // SAFETY: this value's display and context, on their thread; the
        // thread's current context is released only if it is this one
        // (releasing another would take it from whoever made it current).
        unsafe {
            if (self.get_current_context)() == self.context {
                (self.make_current)(
                    self.display,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                );
            }
            (self.destroy_context)(self.display, self.context);
        }
    }
}

/// `libEGL.so.1`, loaded once and never unloaded.
fn egl_library() -> Result<&'static libloading::Library, Error> {
    static EGL: OnceLock<Result<libloading::Library, String>> = OnceLock::new();
    EGL.get_or_init(|| {
        // SAFETY: loading the system's EGL, whose initialisers only set up
        // its vendor dispatch.
        unsafe { libloading::Library::new("libEGL.so.1") }
            .map_err(|e| format!("libEGL.so.1 did not load ({e}): {INSTALL}"))
    })
    .as_ref()
    .map_err(|why| Error::Unavailable(why.clone()))
}

fn missing(e: libloading::Error) -> Error {
    Error::Unavailable(format!(
        "libEGL.so.1 lacks an EGL 1.5 function ({e}): {INSTALL}"
    ))
}

/// EGL's entry points.
#[derive(Clone, Copy)]
struct Egl {
    get_proc: GetProcAddress,
    initialize: Initialize,
    bind_api: BindApi,
    create_context: CreateContext,
    make_current: MakeCurrent,
    destroy_context: DestroyContext,
    get_error: GetError,
    query_string: QueryString,
    get_current_context: GetCurrentContext,
    get_current_display: GetCurrentDisplay,
    get_current_surface: GetCurrentSurface,
    query_api: QueryApi,
}

impl Egl {
    fn load(library: &libloading::Library) -> Result<Egl, Error> {
        // SAFETY: each symbol is EGL 1.5's, with the signature its type
        // states (the Khronos registry's).
        unsafe {
            Ok(Egl {
                get_proc: *library.get(b"eglGetProcAddress\0").map_err(missing)?,
                initialize: *library.get(b"eglInitialize\0").map_err(missing)?,
                bind_api: *library.get(b"eglBindAPI\0").map_err(missing)?,
                create_context: *library.get(b"eglCreateContext\0").map_err(missing)?,
                make_current: *library.get(b"eglMakeCurrent\0").map_err(missing)?,
                destroy_context: *library.get(b"eglDestroyContext\0").map_err(missing)?,
                get_error: *library.get(b"eglGetError\0").map_err(missing)?,
                query_string: *library.get(b"eglQueryString\0").map_err(missing)?,
                get_current_context: *library.get(b"eglGetCurrentContext\0").map_err(missing)?,
                get_current_display: *library.get(b"eglGetCurrentDisplay\0").map_err(missing)?,
                get_current_surface: *library.get(b"eglGetCurrentSurface\0").map_err(missing)?,
                query_api: *library.get(b"eglQueryAPI\0").map_err(missing)?,
            })
        }
    }

    fn proc(&self, name: &CStr) -> *const c_void {
        // SAFETY: a NUL-terminated name; EGL returns an address or null.
        unsafe { (self.get_proc)(name.as_ptr()) }
    }

    /// A GL 4.5 core context on `display`, current on this thread.
    fn context_on(&self, display: EglDisplay) -> Result<HeadlessGl, Error> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: a display EGL returned; two EGLints written.
        if unsafe { (self.initialize)(display, &mut major, &mut minor) } == 0 {
            // SAFETY: plain query of this thread's last EGL error.
            let e = unsafe { (self.get_error)() };
            return Err(Error::Unavailable(format!(
                "eglInitialize failed (EGL error {e:#x})"
            )));
        }
        // SAFETY: a plain call; OpenGL is a valid API name.
        if unsafe { (self.bind_api)(OPENGL_API) } == 0 {
            return Err(Error::Unavailable(
                "this EGL has no desktop OpenGL (eglBindAPI(EGL_OPENGL_API) failed)".into(),
            ));
        }
        let attributes = [
            CONTEXT_MAJOR_VERSION,
            4,
            CONTEXT_MINOR_VERSION,
            5,
            CONTEXT_OPENGL_PROFILE_MASK,
            CONTEXT_OPENGL_CORE_PROFILE_BIT,
            NONE,
        ];
        // SAFETY: an initialised display; no config (EGL_KHR_no_config_context,
        // which Mesa and NVIDIA have), no share context; the attribute list
        // ends with EGL_NONE.
        let context = unsafe {
            (self.create_context)(
                display,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                attributes.as_ptr(),
            )
        };
        if context.is_null() {
            // SAFETY: plain query.
            let e = unsafe { (self.get_error)() };
            return Err(Error::Unavailable(format!(
                "no OpenGL 4.5 core context without a window (EGL error {e:#x}): the driver \
                 needs EGL_KHR_no_config_context and EGL_KHR_surfaceless_context"
            )));
        }
        // SAFETY: the context just made, no surfaces (surfaceless).
        let current = unsafe {
            (self.make_current)(display, std::ptr::null_mut(), std::ptr::null_mut(), context)
        };
        if current == 0 {
            // SAFETY: the context is current nowhere.
            unsafe { (self.destroy_context)(display, context) };
            return Err(Error::Unavailable(
                "eglMakeCurrent without a surface failed (EGL_KHR_surfaceless_context)".into(),
            ));
        }
        // SAFETY: an initialised display; EGL returns a static string.
        let vendor = unsafe {
            let s = (self.query_string)(display, VENDOR);
            if s.is_null() {
                String::new()
            } else {
                CStr::from_ptr(s).to_string_lossy().into_owned()
            }
        };
        let mut made = HeadlessGl {
            display,
            context,
            make_current: self.make_current,
            destroy_context: self.destroy_context,
            get_current_context: self.get_current_context,
            // Set below; on an error the drop releases the context.
            gl: None,
            vendor,
            _thread: PhantomData,
        };
        made.gl = Some(Gl::load(|name| self.proc(name))?);
        Ok(made)
    }
}

/// Every EGL device's display, then Mesa's surfaceless one.
fn candidate_displays(egl: &Egl) -> Result<Vec<EglDisplay>, Error> {
    let get_display = egl.proc(c"eglGetPlatformDisplayEXT");
    if get_display.is_null() {
        return Err(Error::Unavailable(format!(
            "EGL has no eglGetPlatformDisplayEXT: {INSTALL}"
        )));
    }
    // SAFETY: EGL_EXT_platform_base's entry point, of this signature.
    let get_display =
        unsafe { std::mem::transmute::<*const c_void, GetPlatformDisplay>(get_display) };
    let mut displays = Vec::new();
    let query_devices = egl.proc(c"eglQueryDevicesEXT");
    if !query_devices.is_null() {
        // SAFETY: EGL_EXT_device_enumeration's entry point, of this
        // signature.
        let query_devices =
            unsafe { std::mem::transmute::<*const c_void, QueryDevices>(query_devices) };
        let mut devices = [std::ptr::null_mut(); 16];
        let mut n = 0;
        // SAFETY: room for 16 devices; the count written.
        if unsafe { query_devices(16, devices.as_mut_ptr(), &mut n) } != 0 {
            for device in &devices[..n.clamp(0, 16) as usize] {
                // SAFETY: a device EGL listed; no attributes.
                let display =
                    unsafe { get_display(PLATFORM_DEVICE_EXT, *device, std::ptr::null()) };
                if !display.is_null() {
                    displays.push(display);
                }
            }
        }
    }
    // SAFETY: a platform enum and its default native display; no attributes.
    let surfaceless = unsafe {
        get_display(
            PLATFORM_SURFACELESS_MESA,
            std::ptr::null_mut(),
            std::ptr::null(),
        )
    };
    if !surfaceless.is_null() {
        displays.push(surfaceless);
    }
    Ok(displays)
}
