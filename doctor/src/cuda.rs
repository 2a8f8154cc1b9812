//! The CUDA side of the doctor: the driver library, its version and the
//! devices it shows. Loads the driver; creates no context. Uses no other
//! module of this crate.

use crate::Finding;

/// A CUDA device as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaDeviceInfo {
    /// Ordinal under the current `CUDA_VISIBLE_DEVICES`.
    pub ordinal: i32,
    /// `cuDeviceGetName`.
    pub name: String,
    /// `cuDeviceGetUuid_v2`, spelled as `nvidia-smi -L` does.
    pub uuid: String,
}

/// What the CUDA probe found.
#[derive(Debug, Default)]
pub struct CudaReport {
    /// The driver, its version and the device count; what is missing.
    pub findings: Vec<Finding>,
    /// The devices.
    pub devices: Vec<CudaDeviceInfo>,
}

/// Loads the CUDA driver and lists its devices.
pub(crate) fn probe() -> CudaReport {
    let mut report = CudaReport::default();
    let driver = match cuda_interop::sys::Driver::global() {
        Ok(driver) => driver,
        Err(e) => {
            report.findings.push(Finding::missing(
                format!("no CUDA driver: {e}"),
                "install the NVIDIA driver (it provides libcuda.so.1; Debian/Ubuntu: the \
                 nvidia-driver / libnvidia-compute package of your driver version); in a \
                 container, run it with the GPU passed in (--gpus all, the NVIDIA container \
                 toolkit)",
            ));
            return report;
        }
    };
    let version = match cuda_interop::driver_version() {
        Ok(v) => format!("CUDA {}.{}", v.major(), v.minor()),
        Err(e) => format!("version unknown ({e})"),
    };
    report.findings.push(Finding::ok(format!(
        "driver {} ({version})",
        driver.library_name()
    )));
    match cuda_interop::list_devices() {
        Ok(devices) if devices.is_empty() => report.findings.push(Finding::missing(
            "the CUDA driver shows no device",
            "check CUDA_VISIBLE_DEVICES (empty or wrong hides every GPU) and nvidia-smi",
        )),
        Ok(devices) => {
            report
                .findings
                .push(Finding::ok(format!("{} device(s)", devices.len())));
            report.devices = devices
                .into_iter()
                .map(|d| CudaDeviceInfo {
                    ordinal: d.ordinal,
                    name: d.name,
                    uuid: d.uuid.to_string(),
                })
                .collect();
        }
        Err(e) => report.findings.push(Finding::missing(
            format!("the devices cannot be listed: {e}"),
            "CUDA_ERROR_NO_DEVICE or _NOT_INITIALIZED: check nvidia-smi, that the kernel module \
             matches the driver library, and CUDA_VISIBLE_DEVICES; \
             cuDeviceGetUuid_v2 missing: update the driver (CUDA 11.4 or later)",
        )),
    }
    report
}
