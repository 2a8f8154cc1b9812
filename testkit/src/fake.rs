//! A fake `libcuda.so.1` for CPU-only tests of the CUDA side: the C source
//! is `fake_cuda/fake_cuda.c`, built by `build.rs` in three variants; this
//! module starts a child test with one of them as its driver and reads and
//! sets what the fake saw and does.
//!
//! The fake records every descriptor the crate hands the driver, insists
//! that a context is current (and that a handle is used in the context that
//! made it), keeps an imported fd until the import is destroyed, counts live
//! objects, and can fail imports and mappings, raise a sticky error on every
//! later call, delay enqueued work, lower device limits and list several
//! devices. What it shows is what the crate does before and
//! around the driver, never the real driver's answer.
//!
//! # Contract
//!
//! * [`run`] runs a `child_*` test of the calling binary with the variant's
//!   directory first on `LD_LIBRARY_PATH` and `CUDA_INTEROP_FAKE_CUDA=1`;
//!   in that child, [`Fake::open`] loads the same `libcuda.so.1` the crate
//!   loads, and panics unless it is the fake. [`library`] is the build's
//!   `OUT_DIR` copy unless `CUDA_INTEROP_FAKE_CUDA_DIR` names another.
//! * The record makers ([`image`], [`buffer`], [`timeline`], [`binary`]) are
//!   made by the crate's decoder, on the fake's device ([`UUID`]).

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_long, c_longlong, c_void, CString, OsString};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use ash::vk;
use cuda_interop::sys;
use vk_export::format::Format;
use vk_export::markers::{DeviceLocal, Optimal, Usage};
use vk_export::semaphore_kinds::{Binary, Timeline};
use vk_export::{BufferRecord, ImageRecord, SemaphoreRecord};

use crate::sample::ImageFields;
use crate::tamper;

/// Which fake: the whole API the crate uses, or one without a function.
#[derive(Clone, Copy, Debug)]
pub enum Variant {
    /// Every driver function the crate calls.
    Full,
    /// Without `cuDeviceGetUuid_v2` (`-DFAKE_OMIT_UUID_V2`).
    WithoutUuidV2,
    /// Without `cuExternalMemoryGetMappedMipmappedArray`
    /// (`-DFAKE_OMIT_MIPMAPPED`).
    WithoutMipmappedArrays,
}

/// The directory holding `variant`'s `libcuda.so.1`: the one this crate's
/// `build.rs` built from `fake_cuda/fake_cuda.c`, or, when
/// `CUDA_INTEROP_FAKE_CUDA_DIR` is set (test binaries copied to another
/// machine, with the `fake-libcuda-*` directories of the build's `OUT_DIR`),
/// the directory of the same name under it.
pub fn library(variant: Variant) -> PathBuf {
    let built = Path::new(match variant {
        Variant::Full => env!("FAKE_CUDA_DIR_FULL"),
        Variant::WithoutUuidV2 => env!("FAKE_CUDA_DIR_WITHOUT_UUID_V2"),
        Variant::WithoutMipmappedArrays => env!("FAKE_CUDA_DIR_WITHOUT_MIPMAPPED"),
    });
    match std::env::var_os("CUDA_INTEROP_FAKE_CUDA_DIR") {
        Some(dir) => Path::new(&dir).join(built.file_name().expect("a directory name")),
        None => built.to_path_buf(),
    }
}

/// Runs the child test `name` with the fake `variant` as its libcuda.
pub fn run(name: &str, variant: Variant) -> String {
    let dir = library(variant);
    assert!(
        dir.join("libcuda.so.1").is_file(),
        "no fake libcuda.so.1 in {dir:?} (binaries copied from their build? \
         set CUDA_INTEROP_FAKE_CUDA_DIR to the copied fake-libcuda-* directories' parent)"
    );
    crate::child::run_with_os(
        name,
        &[
            ("LD_LIBRARY_PATH", dir.as_os_str().to_owned()),
            ("CUDA_INTEROP_FAKE_CUDA", OsString::from("1")),
        ],
        None,
    )
}

/// The UUID of the fake's one device by default, and of the wire samples.
pub const UUID: vk_export::DeviceUuid = vk_export::DeviceUuid::from_bytes([7; 16]);

/// One call the fake logged: its `key=value` fields.
#[derive(Debug)]
pub struct Call(BTreeMap<String, String>);

impl Call {
    /// The value of field `key`; panics if the call has none.
    pub fn get(&self, key: &str) -> &str {
        self.0
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in {self:?}"))
    }
    /// The value of field `key` as a number.
    pub fn num(&self, key: &str) -> u64 {
        self.get(key).parse().unwrap()
    }
}

/// The fake driver this process runs with.
#[derive(Debug)]
pub struct Fake(libloading::Library);

impl Fake {
    /// The fake, loaded by name as the crate loads its driver; panics
    /// unless this process was started by [`run`].
    pub fn open() -> Fake {
        assert!(
            std::env::var_os("CUDA_INTEROP_FAKE_CUDA").is_some(),
            "started by the parent test, with the fake libcuda"
        );
        // SAFETY: `libcuda.so.1` on this process's LD_LIBRARY_PATH is the
        // fake built from fake_cuda.c (the parent test set it), plain C with no
        // initialisers; the crate loads the same file by the same name.
        let library = unsafe { libloading::Library::new("libcuda.so.1") }.unwrap();
        let fake = Fake(library);
        // SAFETY: as in `log`: the fake exports this function.
        let is_fake = unsafe {
            fake.0
                .get::<unsafe extern "C" fn(*mut c_char, usize) -> usize>(b"fake_cuda_log\0")
        };
        assert!(is_fake.is_ok(), "libcuda.so.1 is not the fake");
        fake
    }

    /// Everything logged so far.
    pub fn log(&self) -> String {
        // SAFETY: fake_cuda.c defines `size_t fake_cuda_log(char *out, size_t
        // cap)`: it copies at most cap - 1 bytes and a NUL into `out` (or
        // nothing for a null `out`) and returns the log's length.
        unsafe {
            let f = self
                .0
                .get::<unsafe extern "C" fn(*mut c_char, usize) -> usize>(b"fake_cuda_log\0")
                .unwrap();
            let len = f(std::ptr::null_mut(), 0);
            let mut buf = vec![0u8; len + 1];
            f(buf.as_mut_ptr().cast(), buf.len());
            buf.truncate(len);
            String::from_utf8(buf).unwrap()
        }
    }

    /// Forgets what was logged.
    pub fn clear(&self) {
        // SAFETY: fake_cuda.c defines `void fake_cuda_clear_log(void)`.
        unsafe {
            self.0
                .get::<unsafe extern "C" fn()>(b"fake_cuda_clear_log\0")
                .unwrap()()
        }
    }

    /// Sets one of the fake's knobs (`import_fail`, `close_on_fail`,
    /// `map_fail` (the CUresult of buffer and array mappings), `sticky`
    /// (a CUresult every call that needs a context returns from now on, as
    /// after an illegal address), `latency_ms`, `max_surface2d`,
    /// `max_tex2d_mipmapped`).
    pub fn set(&self, key: &str, value: i64) {
        let key = CString::new(key).unwrap();
        // SAFETY: fake_cuda.c defines `int fake_cuda_set(const char *key, long
        // long value)`; `key` is a NUL-terminated string living across
        // the call.
        let status = unsafe {
            self.0
                .get::<unsafe extern "C" fn(*const c_char, c_longlong) -> c_int>(b"fake_cuda_set\0")
                .unwrap()(key.as_ptr(), value)
        };
        assert_eq!(status, 0, "unknown knob {key:?}");
    }

    /// The devices the fake lists, in ordinal order.
    pub fn set_devices(&self, uuids: &[vk_export::DeviceUuid]) {
        let flat: Vec<u8> = uuids.iter().flat_map(|u| *u.as_bytes()).collect();
        // SAFETY: fake_cuda.c defines `int fake_cuda_set_devices(const unsigned
        // char *ids, int count)`, which reads 16 * count bytes (count at
        // most 4); `flat` holds exactly that.
        let status = unsafe {
            self.0
                .get::<unsafe extern "C" fn(*const u8, c_int) -> c_int>(b"fake_cuda_set_devices\0")
                .unwrap()(flat.as_ptr(), uuids.len() as c_int)
        };
        assert_eq!(status, 0);
    }

    /// How many objects of a kind are alive (`memory`, `buffer`,
    /// `alloc`, `array`, `surface`, `texture`, `semaphore`, `stream`,
    /// `event`).
    pub fn live(&self, what: &str) -> i64 {
        let what = CString::new(what).unwrap();
        // SAFETY: fake_cuda.c defines `long fake_cuda_live(const char *what)`;
        // `what` is a NUL-terminated string living across the call.
        let n = unsafe {
            self.0
                .get::<unsafe extern "C" fn(*const c_char) -> c_long>(b"fake_cuda_live\0")
                .unwrap()(what.as_ptr())
        };
        assert!(n >= 0, "unknown kind {what:?}");
        n
    }

    /// How many calls of `query` (`"cuStreamQuery"`, `"cuEventQuery"`) the
    /// process made so far (a wait polls many times, a look once); panics
    /// for another name.
    pub fn queries(&self, query: &str) -> i64 {
        let name = CString::new(query).unwrap();
        // SAFETY: fake_cuda.c defines `long long fake_cuda_queries(const
        // char *)`, which reads the string and keeps no pointer.
        let n = unsafe {
            self.0
                .get::<unsafe extern "C" fn(*const c_char) -> c_longlong>(b"fake_cuda_queries\0")
                .unwrap()(name.as_ptr())
        };
        assert!(n >= 0, "the fake counts no {query} calls");
        n
    }

    /// Every kind of object the fake counts, alive now.
    pub fn all_live(&self) -> Vec<(&'static str, i64)> {
        [
            "memory",
            "buffer",
            "alloc",
            "array",
            "surface",
            "texture",
            "semaphore",
            "stream",
            "event",
        ]
        .into_iter()
        .map(|k| (k, self.live(k)))
        .filter(|(_, n)| *n != 0)
        .collect()
    }

    /// The calling thread's current context, as the fake sees it.
    pub fn current(&self) -> usize {
        // SAFETY: fake_cuda.c defines `void *fake_cuda_current(void)`.
        unsafe {
            self.0
                .get::<unsafe extern "C" fn() -> *mut c_void>(b"fake_cuda_current\0")
                .unwrap()() as usize
        }
    }

    /// The logged calls of the driver function `name`, in order.
    pub fn calls(&self, name: &str) -> Vec<Call> {
        self.log()
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(name))
            .map(|l| {
                Call(
                    l.split_whitespace()
                        .skip(1)
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                )
            })
            .collect()
    }

    /// The last logged call of `name`.
    pub fn last(&self, name: &str) -> Call {
        self.calls(name)
            .pop()
            .unwrap_or_else(|| panic!("no call of {name}; the log:\n{}", self.log()))
    }
}

/// A context handle as the fake prints it (`%p`).
pub fn shown(context: sys::CUcontext) -> String {
    format!("{context:p}")
}

/// An fd for the fake to import: a memfd (the fake never reads it).
pub fn some_fd() -> OwnedFd {
    rustix::fs::memfd_create("fake-export", rustix::fs::MemfdFlags::CLOEXEC).unwrap()
}

/// An optimal, device-local image record of format `F` and usage `U`
/// on the fake's device, made by the decoder (dedicated).
pub fn image<F: Format, U: Usage>(
    extent: [u32; 3],
    levels: u32,
    layers: u32,
    cube: bool,
) -> ImageRecord<F, Optimal, DeviceLocal, U> {
    let texels = u64::from(F::TEXEL_BYTES)
        * extent.iter().map(|&e| u64::from(e)).product::<u64>()
        * u64::from(layers);
    ImageFields {
        format: F::VK.as_raw() as u32,
        image_type: if extent[2] > 1 { 2 } else { 1 },
        extent,
        mip_levels: levels,
        array_layers: layers,
        flags: if cube {
            vk::ImageCreateFlags::CUBE_COMPATIBLE.as_raw()
        } else {
            0
        },
        tiling: 0,
        usage: U::VK.as_raw(),
        allocation_size: 2 * texels,
        memory_type_index: 0,
        memory_flags: vk::MemoryPropertyFlags::DEVICE_LOCAL.as_raw(),
    }
    .decode()
    .typed::<F, Optimal, DeviceLocal, U>()
    .unwrap()
}

/// `record` with its dedicated flag set to `dedicated`, on the wire.
pub fn with_dedicated<F: Format, U: Usage>(
    record: &ImageRecord<F, Optimal, DeviceLocal, U>,
    dedicated: bool,
) -> ImageRecord<F, Optimal, DeviceLocal, U> {
    tamper::image(record.info(), "dedicated", |b| b[0] = u8::from(dedicated))
        .typed()
        .unwrap()
}

/// The wire sample's buffer record (1000 bytes in a 4096-byte
/// allocation), with its dedicated flag set to `dedicated`.
pub fn buffer(dedicated: bool) -> BufferRecord<DeviceLocal> {
    tamper::buffer(&crate::sample::buffer(), "dedicated", |b| {
        b[0] = u8::from(dedicated)
    })
    .typed()
    .unwrap()
}

/// The wire sample's timeline semaphore record.
pub fn timeline() -> SemaphoreRecord<Timeline> {
    crate::sample::semaphore().typed().unwrap()
}

/// [`timeline`] imported into `cuda`, a device of the fake (its UUID is
/// [`UUID`]; panics otherwise), with a memfd for its fd.
pub fn import_timeline(
    cuda: &cuda_interop::CudaDevice,
) -> cuda_interop::ExternalSemaphore<Timeline> {
    assert_eq!(
        cuda.uuid(),
        UUID,
        "import_timeline is for the fake's device"
    );
    // SAFETY: the device is the fake's (checked above: no real GPU has its
    // UUID), and the fake records the import, holds the fd and reads nothing.
    unsafe { cuda.import_semaphore_fd(timeline(), some_fd()) }
        .map_err(|e| e.error)
        .unwrap()
}

/// The wire sample's semaphore record as a binary semaphore.
pub fn binary() -> SemaphoreRecord<Binary> {
    tamper::semaphore(
        &crate::sample::semaphore(),
        "semaphore_type",
        tamper::set(0),
    )
    .typed()
    .unwrap()
}
