//! The doctor, run here (lavapipe, no CUDA driver: CI) and, with the
//! testkit's fake libcuda, as it reports a pair; on the GPU machine the
//! binary's own run is the test (see xtask/gpu/run.sh).
//!
//! `child_*` tests are entry points of child processes (a fake libcuda),
//! run by their parent test by exact name; they fail when run by hand.

use std::process::Command;

use cuda_interop_doctor::diagnose;
use cuda_interop_testkit::fake;

fn doctor(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cuda-interop-doctor"))
        .args(args)
        .output()
        .expect("the doctor binary runs");
    (
        out.status.code().expect("exited, not killed by a signal"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The binary reports every section, never panics, and its exit status is
/// its verdict; where this machine has no CUDA driver (CI), it says so,
/// with what to install, and exits 1.
#[test]
fn the_doctor_reports_every_section_and_exits_with_its_verdict() {
    let (code, out, err) = doctor(&[]);
    println!("{out}{err}");
    assert!(!err.contains("panicked"), "{err}");
    for section in [
        "Vulkan\n",
        "CUDA\n",
        "Pairing",
        "Vulkan <-> CUDA hand-off",
        "Several receiving processes (CUDA MPS)\n",
        "Verdict: ",
    ] {
        assert!(out.contains(section), "no {section:?} in\n{out}");
    }
    let works = out.contains("Verdict: interop works on this machine");
    assert_eq!(code, if works { 0 } else { 1 }, "{out}");
    if !works {
        assert!(out.contains("MISSING") && out.contains("fix: "), "{out}");
    }
    // No MPS daemon here (CI): said so, with the cost and how to start it;
    // never part of the verdict. (On a machine where one runs, it says so.)
    let mps = diagnose().mps;
    if !mps.running() {
        assert!(
            out.contains("CUDA MPS is not running")
                || out.contains("but no nvidia-cuda-mps-control")
                || out.contains("but not with the pipe"),
            "{out}"
        );
        assert!(out.contains("-d`") && out.contains("echo quit |"), "{out}");
    } else {
        assert!(
            out.contains("CUDA MPS: a control daemon runs for this user"),
            "{out}"
        );
    }
    assert!(out.contains("MPS caveats: one server per user"), "{out}");
    if cuda_interop::sys::Driver::load().is_err() {
        assert!(out.contains("MISSING no CUDA driver"), "{out}");
        assert!(out.contains("install the NVIDIA driver"), "{out}");
        assert_eq!(code, 1);
    }
}

/// `--help` prints the usage and exits 0; an unknown flag is refused with
/// the usage on stderr and exit status 2, before any probing.
#[test]
fn the_doctor_answers_help_and_refuses_unknown_flags() {
    let (code, out, _) = doctor(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("usage: cuda-interop-doctor"), "{out}");
    let (code, out, err) = doctor(&["--verbsoe"]);
    assert_eq!(code, 2);
    assert!(out.is_empty(), "nothing probed: {out}");
    assert!(
        err.contains("unknown argument \"--verbsoe\"") && err.contains("usage:"),
        "{err}"
    );
}

/// With a fake CUDA driver whose device has the Vulkan device's UUID, the
/// doctor pairs them and reports memory interop as working (lavapipe
/// exports OPAQUE_FD memory) and semaphores as missing, with the fix; with
/// a fake device of another UUID it pairs nothing and names the causes.
#[test]
fn the_doctor_pairs_by_uuid_and_names_what_is_missing() {
    fake::run("child_fake_pairing", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of doctor.rs, with a fake libcuda: run by the_doctor_pairs_by_uuid_and_names_what_is_missing"]
fn child_fake_pairing() {
    let fake = fake::Fake::open();
    let first = diagnose();
    println!("{first}");
    let vulkan = first
        .vulkan
        .devices
        .first()
        .expect("a Vulkan device (lavapipe in CI)");
    assert!(vulkan.opaque_fd_memory(), "{first}");
    // The fake's own UUID is no Vulkan device's: nothing pairs.
    assert_eq!(first.cuda.devices.len(), 1, "{first}");
    assert!(!first.ready());
    let unpaired = first.to_string();
    assert!(
        unpaired.contains("MISSING no Vulkan device paired with a CUDA device"),
        "{unpaired}"
    );
    assert!(unpaired.contains("MIG"), "{unpaired}");
    assert!(first.switch.is_none(), "nothing measured without a pair");
    assert!(
        unpaired.contains("not measured: no pair shares memory"),
        "{unpaired}"
    );

    let uuid: vk_export::DeviceUuid = vulkan.device_uuid.parse().unwrap();
    fake.set_devices(&[fake::UUID, uuid]);
    let paired = diagnose();
    let text = paired.to_string();
    println!("{text}");
    assert!(paired.ready(), "{text}");
    assert_eq!(paired.pairs.len(), 1, "{text}");
    assert_eq!(
        paired.pairs[0].cuda.0, 1,
        "the device with the UUID, not ordinal 0"
    );
    assert_eq!(paired.pairs[0].uuid, vulkan.device_uuid);
    assert!(
        text.contains("Verdict: interop works on this machine"),
        "{text}"
    );
    // The pair is measured: on lavapipe (no device-local memory, a fake
    // CUDA) the measurement fails as a finding that names why, and the
    // verdict stands.
    match &paired.switch {
        Some(Err(finding)) => assert!(finding.what.contains("could not be measured"), "{text}"),
        Some(Ok(report)) => assert!(report.floor_us > 0.0, "{text}"),
        None => panic!("a pair that shares memory is measured: {text}"),
    }
    if !vulkan.opaque_fd_timeline() {
        assert!(
            text.contains("but no OPAQUE_FD timeline semaphores"),
            "{text}"
        );
    }
}
