//! The doctor: whether this machine can share memory and semaphores between
//! Vulkan and CUDA, and, for each missing piece, what to install or change.
//!
//! # Contract
//!
//! * [`diagnose`] never panics and never needs a driver: a missing Vulkan
//!   loader, Vulkan device, CUDA driver or CUDA device is a finding with its
//!   fix, not an error. It creates one Vulkan instance (no layer, no
//!   device) and destroys it before it returns; on the CUDA side it loads
//!   the driver and lists devices, creating no context. Only where memory
//!   interop works on a pair does it go further: the `switch` module makes
//!   a headless Vulkan device and uses the CUDA device's primary context to
//!   time the switch (bounded; a failure there is a finding).
//! * The report ([`Report`], `Display`) lists the Vulkan devices (name,
//!   UUIDs, driver, API version, queue families and whether a transfer-only
//!   family exists, memory types, extensions, timeline semaphores, external
//!   memory per handle type for buffers and per format for optimal images,
//!   external semaphores per kind and handle type, SYNC_FD among them), the
//!   validation layer, the CUDA driver (library, version) and devices, the
//!   UUID pairing, and, on a paired device, CIG support and the measured
//!   graphics-engine switch (module `switch`); and whether CUDA MPS runs
//!   for this user, what several receiving processes cost without it, and
//!   how to start it (module `mps`; never part of the verdict).
//! * [`Report::ready`] is true when at least one Vulkan device with
//!   OPAQUE_FD memory export and import is paired by UUID with a CUDA
//!   device: the binary `cuda-interop-doctor` exits 0 then, 1 otherwise.
//! * Modules: `vulkan` and `cuda` probe one side each, `switch` measures a
//!   pair, `mps` looks for an MPS daemon; none uses another; this file
//!   pairs and prints.

use std::fmt;

mod cuda;
mod mps;
mod switch;
mod vulkan;

pub use cuda::{CudaDeviceInfo, CudaReport};
pub use mps::{MpsReport, DEFAULT_PIPE_DIRECTORY};
pub use switch::SwitchReport;
pub use vulkan::{Support, VulkanDeviceInfo, VulkanReport};

/// One thing the doctor looked at: what it found and, when it is missing,
/// what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Whether this piece is there.
    pub ok: bool,
    /// What was looked at and found.
    pub what: String,
    /// What to install or change (for a missing piece).
    pub fix: Option<String>,
}

impl Finding {
    pub(crate) fn ok(what: impl Into<String>) -> Finding {
        Finding {
            ok: true,
            what: what.into(),
            fix: None,
        }
    }

    pub(crate) fn missing(what: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            ok: false,
            what: what.into(),
            fix: Some(fix.into()),
        }
    }
}

/// A Vulkan device and the CUDA device with the same `deviceUUID`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    /// The Vulkan device's name.
    pub vulkan: String,
    /// The CUDA device's ordinal and name.
    pub cuda: (i32, String),
    /// The shared UUID.
    pub uuid: String,
    /// Whether the Vulkan device can export and import OPAQUE_FD memory.
    pub memory: bool,
    /// Whether it can export and import OPAQUE_FD timeline semaphores.
    pub timeline: bool,
}

/// What [`diagnose`] found.
#[derive(Debug)]
pub struct Report {
    /// The Vulkan side.
    pub vulkan: VulkanReport,
    /// The CUDA side.
    pub cuda: CudaReport,
    /// The devices paired by UUID.
    pub pairs: Vec<Pair>,
    /// Pairing findings (none paired, and why).
    pub pairing: Vec<Finding>,
    /// CIG and the graphics-engine switch, measured where memory interop
    /// works (`None` elsewhere; `Err` when the measurement failed).
    pub switch: Option<Result<SwitchReport, Finding>>,
    /// Whether CUDA MPS runs for this user (several receiving processes).
    pub mps: MpsReport,
}

impl Report {
    /// Whether memory interop works on at least one device pair.
    pub fn ready(&self) -> bool {
        self.pairs.iter().any(|p| p.memory)
    }
}

/// Looks at this machine's Vulkan and CUDA drivers and devices.
pub fn diagnose() -> Report {
    let vulkan = vulkan::probe();
    let cuda = cuda::probe();
    let mut pairs = Vec::new();
    for v in &vulkan.devices {
        if let Some(c) = cuda.devices.iter().find(|c| c.uuid == v.device_uuid) {
            pairs.push(Pair {
                vulkan: v.name.clone(),
                cuda: (c.ordinal, c.name.clone()),
                uuid: v.device_uuid.clone(),
                memory: v.opaque_fd_memory(),
                timeline: v.opaque_fd_timeline(),
            });
        }
    }
    let mut pairing = Vec::new();
    if pairs.is_empty() {
        let fix = match (vulkan.devices.is_empty(), cuda.devices.is_empty()) {
            (true, true) => "a Vulkan device and a CUDA device are needed (see above)",
            (true, false) => "no Vulkan device: see the Vulkan findings above",
            (false, true) => "no CUDA device: see the CUDA findings above",
            (false, false) => {
                "no Vulkan device has the UUID of a CUDA device: the Vulkan device is another \
                 GPU's or a software driver's (lavapipe), or CUDA shows a MIG instance (its UUID \
                 is not the GPU's) or another subset (CUDA_VISIBLE_DEVICES); run on the NVIDIA \
                 driver's Vulkan ICD of the same GPU (VK_DRIVER_FILES=/usr/share/vulkan/icd.d/\
                 nvidia_icd.json) with MIG off"
            }
        };
        pairing.push(Finding::missing(
            "no Vulkan device paired with a CUDA device",
            fix,
        ));
    }
    for p in &pairs {
        if !p.memory {
            pairing.push(Finding::missing(
                format!("{} is paired with CUDA device {}, but cannot share OPAQUE_FD memory", p.vulkan, p.cuda.0),
                "VK_KHR_external_memory_fd with OPAQUE_FD export and import is needed: update the NVIDIA driver",
            ));
        } else if !p.timeline {
            pairing.push(Finding::missing(
                format!("{} shares memory with CUDA device {}, but no OPAQUE_FD timeline semaphores", p.vulkan, p.cuda.0),
                "semaphore sharing needs VK_KHR_external_semaphore_fd and timeline semaphores (Vulkan 1.2): update the driver",
            ));
        }
    }
    let switch = pairs.iter().any(|p| p.memory).then(switch::probe);
    Report {
        vulkan,
        cuda,
        pairs,
        pairing,
        switch,
        mps: mps::probe(),
    }
}

/// Writes a finding: `ok` or `MISSING`, and the fix on the next line.
fn write_finding(f: &mut fmt::Formatter<'_>, indent: &str, finding: &Finding) -> fmt::Result {
    let mark = if finding.ok { "ok     " } else { "MISSING" };
    writeln!(f, "{indent}{mark} {}", finding.what)?;
    if let Some(fix) = &finding.fix {
        writeln!(f, "{indent}        fix: {fix}")?;
    }
    Ok(())
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Vulkan")?;
        for finding in &self.vulkan.findings {
            write_finding(f, "  ", finding)?;
        }
        for d in &self.vulkan.devices {
            d.write(f)?;
        }
        writeln!(f, "CUDA")?;
        for finding in &self.cuda.findings {
            write_finding(f, "  ", finding)?;
        }
        for d in &self.cuda.devices {
            writeln!(f, "  device {}: {} (uuid {})", d.ordinal, d.name, d.uuid)?;
        }
        writeln!(f, "Pairing (Vulkan deviceUUID = CUDA device UUID)")?;
        for p in &self.pairs {
            writeln!(
                f,
                "  ok      {} <-> CUDA device {} ({}), uuid {}: memory {}, timeline semaphores {}",
                p.vulkan,
                p.cuda.0,
                p.cuda.1,
                p.uuid,
                yes_no(p.memory),
                yes_no(p.timeline)
            )?;
        }
        for finding in &self.pairing {
            write_finding(f, "  ", finding)?;
        }
        writeln!(f, "Vulkan <-> CUDA hand-off (measured on the first pair)")?;
        match &self.switch {
            None => writeln!(
                f,
                "  not measured: no pair shares memory (CIG and the graphics-engine switch need one)"
            )?,
            Some(Ok(report)) => {
                for finding in report.findings() {
                    write_finding(f, "  ", &finding)?;
                }
            }
            Some(Err(finding)) => write_finding(f, "  ", finding)?,
        }
        writeln!(f, "Several receiving processes (CUDA MPS)")?;
        for finding in self.mps.findings() {
            write_finding(f, "  ", &finding)?;
        }
        let verdict = if self.ready() {
            "interop works on this machine"
        } else {
            "interop does not work on this machine (see MISSING above)"
        };
        writeln!(f, "Verdict: {verdict}")
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
