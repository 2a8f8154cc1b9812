//! Loads the CUDA driver and prints what it found: library, driver version,
//! devices with their names and UUIDs. Without a driver it says so and exits 0.
//!
//! ```text
//! cargo run -p cuda-interop-sys --example driver_info
//! ```

use std::ffi::{c_char, CStr};

use cuda_interop_sys::{CUresult, CUuuid, Driver};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    check_args(&args, &[], &[], |_| false);
    let driver = match Driver::global() {
        Ok(driver) => driver,
        Err(e) => {
            println!("no CUDA driver: {e}");
            return;
        }
    };
    println!("library: {}", driver.library_name());
    match driver.version() {
        Some(v) => println!("driver version: {} ({v})", v.0),
        None => println!("driver version: unknown (cuDriverGetVersion failed)"),
    }
    if let Err(e) = list_devices(driver) {
        println!("{e}");
    }
}

fn check(driver: &Driver, status: CUresult, call: &str) -> Result<(), String> {
    if status == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const c_char = std::ptr::null();
    if let Some(get_name) = driver.fns().cuGetErrorName {
        // SAFETY: writes a pointer to a static string, or leaves it null.
        unsafe { get_name(status, &mut name) };
    }
    let name = if name.is_null() {
        format!("error {}", status.0)
    } else {
        // SAFETY: the driver returned a NUL-terminated static string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    Err(format!("{call} failed: {name}"))
}

fn list_devices(driver: &Driver) -> Result<(), String> {
    let f = driver.fns();
    let missing = |name| driver.missing(name).to_string();
    let init = f.cuInit.ok_or_else(|| missing("cuInit"))?;
    let count = f
        .cuDeviceGetCount
        .ok_or_else(|| missing("cuDeviceGetCount"))?;
    let get = f.cuDeviceGet.ok_or_else(|| missing("cuDeviceGet"))?;
    let get_name = f
        .cuDeviceGetName
        .ok_or_else(|| missing("cuDeviceGetName"))?;
    let get_uuid = f
        .cuDeviceGetUuid_v2
        .ok_or_else(|| missing("cuDeviceGetUuid_v2"))?;

    // SAFETY: the flags word must be 0.
    check(driver, unsafe { init(0) }, "cuInit")?;
    let mut n = 0;
    // SAFETY: writes one int.
    check(driver, unsafe { count(&mut n) }, "cuDeviceGetCount")?;
    println!("devices: {n}");
    for ordinal in 0..n {
        let mut device = 0;
        // SAFETY: ordinal is below the count the driver reported.
        check(driver, unsafe { get(&mut device, ordinal) }, "cuDeviceGet")?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` chars; the driver NUL-terminates.
        let status = unsafe { get_name(name.as_mut_ptr(), name.len() as i32, device) };
        check(driver, status, "cuDeviceGetName")?;
        let mut uuid = CUuuid::default();
        // SAFETY: writes 16 bytes into `uuid`.
        let status = unsafe { get_uuid(&mut uuid, device) };
        check(driver, status, "cuDeviceGetUuid_v2")?;
        // SAFETY: the driver wrote a NUL-terminated string into the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy();
        println!(
            "  [{ordinal}] {name}  GPU-{}",
            format_uuid(&uuid.bytes.map(|b| b as u8))
        );
    }
    Ok(())
}

/// The `nvidia-smi -L` spelling: 8-4-4-4-12 hex digits.
fn format_uuid(b: &[u8; 16]) -> String {
    let hex: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

/// What `--help` prints (and a refused argument is followed by).
const USAGE: &str = "usage: driver_info\n\nPrints the CUDA driver library, its version and the devices (names, UUIDs).";

/// Answers `-h`/`--help` with [`USAGE`] (exit 0) and refuses, with it
/// (exit 2), an argument that is none of `flags`, not the value after one of
/// `valued`, and not a positional argument `positional` accepts: a misspelt
/// flag is an error, never silently ignored.
fn check_args(args: &[String], flags: &[&str], valued: &[&str], positional: fn(&str) -> bool) {
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let arg = arg.as_str();
        if arg == "-h" || arg == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if valued.contains(&arg) {
            rest.next();
        } else if !flags.contains(&arg) && (arg.starts_with('-') || !positional(arg)) {
            eprintln!("unknown argument {arg:?}\n{USAGE}");
            std::process::exit(2);
        }
    }
}
