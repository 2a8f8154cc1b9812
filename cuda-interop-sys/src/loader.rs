//! Opening `libcuda` and filling [`DriverFns`].
//!
//! # Contract
//!
//! * [`Driver::load`] opens the NVIDIA driver by the sonames it installs and
//!   is safe to call. [`Driver::load_from`] opens any path, runs that
//!   library's initialisers and calls its `cuDriverGetVersion` with an
//!   assumed ABI, so it is `unsafe`: its caller vouches for the library.
//! * Neither panics: a library that cannot be opened or is not a driver is a
//!   [`LoadError`], a missing function a [`MissingFunction`].
//!
//! # Why `dlsym` of the versioned names, not `cuGetProcAddress`
//!
//! Each field of [`DriverFns`] has the signature bindgen read from the pinned
//! header *for the symbol that header maps the API name to* (`cuMemAlloc` ->
//! `cuMemAlloc_v2`). Looking that exact symbol up with `dlsym` guarantees the
//! pointer has that ABI, on any driver new enough to export it, and an older
//! driver simply lacks the symbol (a `None`, reported by name). With
//! `cuGetProcAddress` we would instead have to pick a `cudaVersion` per function
//! and trust the driver to map it to the same ABI variant; it also does not
//! exist on drivers before 11.3, so it could not bootstrap the loader there.
//! `cuGetProcAddress` stays in the table for callers who want per-thread
//! default-stream variants.

use std::ffi::{c_int, c_void, CStr, OsStr};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::fns::{DriverFns, SYMBOLS};

/// Names tried by [`Driver::load`], in order: the driver's soname first (what
/// the NVIDIA driver installs), then the development symlink.
pub const LIBRARY_CANDIDATES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// `cuDriverGetVersion`'s number, e.g. `13000` for CUDA 13.0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion(pub i32);

impl DriverVersion {
    /// Major version (`13` for `13000`).
    pub fn major(self) -> i32 {
        self.0 / 1000
    }
    /// Minor version (`0` for `13000`, `9` for `12090`).
    pub fn minor(self) -> i32 {
        (self.0 % 1000) / 10
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CUDA {}.{} ({})", self.major(), self.minor(), self.0)
    }
}

/// `libcuda` could not be opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadError {
    /// None of the candidate libraries could be opened.
    Library {
        /// Each name or path tried, with the loader's message for it.
        tried: Vec<(String, String)>,
    },
    /// The library opened but exports none of the driver API: it is not
    /// `libcuda` (or is a stub such as the toolkit's `stubs/libcuda.so`).
    NotADriver {
        /// The library that was opened.
        library: String,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Library { tried } => {
                write!(f, "could not open the CUDA driver library (tried ")?;
                for (i, (name, why)) in tried.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    write!(f, "{name}: {why}")?;
                }
                write!(
                    f,
                    "); install the NVIDIA driver, or pass the path of libcuda.so.1 to Driver::load_from"
                )
            }
            LoadError::NotADriver { library } => write!(
                f,
                "{library} opened, but it exports neither cuInit nor cuDriverGetVersion: it is not \
                 the NVIDIA driver library (a toolkit stub?)"
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// A function the loaded driver does not export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingFunction {
    /// The C API name (`cuMemAlloc`).
    pub function: &'static str,
    /// The symbol that was looked up (`cuMemAlloc_v2`).
    pub symbol: &'static str,
    /// The library it was looked up in.
    pub library: String,
    /// What the driver reports, if it reports anything.
    pub driver_version: Option<DriverVersion>,
}

impl fmt::Display for MissingFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the CUDA driver {} ({}) does not export `{}` (needed for {}); these bindings follow \
             CUDA 12.9's cuda.h: update the NVIDIA driver",
            self.library,
            match self.driver_version {
                Some(v) => v.to_string(),
                None => "version unknown".to_string(),
            },
            self.symbol,
            self.function,
        )
    }
}

impl std::error::Error for MissingFunction {}

/// An opened `libcuda` and its function table.
///
/// The library stays mapped for as long as the `Driver` lives; the function
/// pointers in [`Driver::fns`] must not be called after it is dropped.
/// [`Driver::global`] never drops, which is what the safe crate uses.
pub struct Driver {
    fns: DriverFns,
    library_name: String,
    version: Option<DriverVersion>,
    // Last, so it is unmapped after nothing else refers to it.
    _library: libloading::Library,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let present = self.fns.presence().iter().filter(|p| p.2).count();
        f.debug_struct("Driver")
            .field("library", &self.library_name)
            .field("version", &self.version)
            .field(
                "functions",
                &format_args!("{present} of {} resolved", SYMBOLS.len()),
            )
            .finish()
    }
}

impl Driver {
    /// Opens the system's driver: [`LIBRARY_CANDIDATES`] in order.
    pub fn load() -> Result<Driver, LoadError> {
        let mut tried = Vec::new();
        for name in LIBRARY_CANDIDATES {
            // SAFETY: the candidates are the sonames the NVIDIA driver installs
            // for its own libcuda, whose initialisers and exports are the
            // driver's, with the ABI of the pinned cuda.h for each symbol.
            match unsafe { Self::open(OsStr::new(name), name) } {
                Ok(driver) => return Ok(driver),
                Err(LoadError::Library { tried: t }) => tried.extend(t),
                Err(e) => return Err(e),
            }
        }
        Err(LoadError::Library { tried })
    }

    /// Opens the driver at an explicit path (tests, unusual installs).
    ///
    /// # Safety
    ///
    /// Loading runs the library's initialisers, and then calls its
    /// `cuDriverGetVersion`, if it exports one, with the ABI that `cuda.h`
    /// declares (`CUresult cuDriverGetVersion(int *)`); every function later
    /// taken from [`Driver::fns`] is called with the ABI the pinned header
    /// declares for its symbol. So the file at `path` must be an NVIDIA
    /// driver library (or a library whose exported `cu*` symbols have exactly
    /// those signatures and behave as documented), and its initialisers must
    /// be sound to run in this process. Nothing here can check either.
    pub unsafe fn load_from(path: impl AsRef<Path>) -> Result<Driver, LoadError> {
        let path: PathBuf = path.as_ref().to_path_buf();
        // SAFETY: the caller vouches for the library at `path`, as this
        // function's contract requires.
        unsafe { Self::open(path.as_os_str(), &path.display().to_string()) }
    }

    /// The process-wide driver, opened on first use with [`Driver::load`] and
    /// never unloaded (so handles created from it can outlive any scope).
    pub fn global() -> Result<&'static Driver, &'static LoadError> {
        static GLOBAL: OnceLock<Result<Driver, LoadError>> = OnceLock::new();
        GLOBAL.get_or_init(Driver::load).as_ref()
    }

    /// Opens `file` (named `shown` in messages) and fills the table.
    ///
    /// # Safety
    ///
    /// As [`Driver::load_from`]: `file` must be a CUDA driver library whose
    /// initialisers are sound to run and whose `cu*` exports have the pinned
    /// header's ABI (`cuDriverGetVersion` is called here).
    unsafe fn open(file: &OsStr, shown: &str) -> Result<Driver, LoadError> {
        // SAFETY: opening a shared library runs its initialisers; the caller
        // vouches for them (this function's contract).
        let library =
            unsafe { libloading::Library::new(file) }.map_err(|e| LoadError::Library {
                tried: vec![(shown.to_string(), e.to_string())],
            })?;
        // SAFETY: each symbol is looked up by its exact exported name, and the
        // table's types are the header's declarations for those names.
        let fns = unsafe {
            DriverFns::load_with(|symbol: &CStr| {
                library
                    .get::<*mut c_void>(symbol.to_bytes_with_nul())
                    .map(|s| *s)
                    .unwrap_or(std::ptr::null_mut())
            })
        };
        if fns.cuInit.is_none() && fns.cuDriverGetVersion.is_none() {
            return Err(LoadError::NotADriver {
                library: shown.to_string(),
            });
        }
        let version = fns.cuDriverGetVersion.and_then(|get_version| {
            let mut v: c_int = 0;
            // SAFETY: the caller vouches that this export has cuda.h's ABI
            // (this function's contract): it writes one int and needs no cuInit.
            let status = unsafe { get_version(&mut v) };
            (status == crate::types::CUresult::CUDA_SUCCESS).then_some(DriverVersion(v))
        });
        Ok(Driver {
            fns,
            library_name: shown.to_string(),
            version,
            _library: library,
        })
    }

    /// The whole table; fields are `None` where the driver lacks the symbol.
    pub fn fns(&self) -> &DriverFns {
        &self.fns
    }

    /// The library that was opened (name or path as given).
    pub fn library_name(&self) -> &str {
        &self.library_name
    }

    /// What `cuDriverGetVersion` reported when the library was opened.
    pub fn version(&self) -> Option<DriverVersion> {
        self.version
    }

    /// One function, or an error naming it, its symbol and the driver version.
    ///
    /// ```no_run
    /// # use cuda_interop_sys::Driver;
    /// let driver = Driver::load()?;
    /// let cu_init = driver.get(|f| f.cuInit, "cuInit")?;
    /// // SAFETY: cuInit takes a flags word that must be 0.
    /// let status = unsafe { cu_init(0) };
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get<F>(
        &self,
        pick: impl FnOnce(&DriverFns) -> Option<F>,
        function: &'static str,
    ) -> Result<F, MissingFunction> {
        pick(&self.fns).ok_or_else(|| self.missing(function))
    }

    /// The error [`Driver::get`] returns for `function`.
    pub fn missing(&self, function: &'static str) -> MissingFunction {
        let symbol = SYMBOLS
            .iter()
            .find(|(api, _)| *api == function)
            .map_or(function, |(_, symbol)| *symbol);
        MissingFunction {
            function,
            symbol,
            library: self.library_name.clone(),
            driver_version: self.version,
        }
    }
}

// SAFETY: the table holds plain function pointers and the library handle is
// only used to keep the mapping alive; the driver API is thread-safe.
unsafe impl Send for Driver {}
// SAFETY: as above; nothing is mutated after construction.
unsafe impl Sync for Driver {}
