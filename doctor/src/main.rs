//! `cuda-interop-doctor`: prints what [`cuda_interop_doctor::diagnose`]
//! found; exits 0 when Vulkan-CUDA memory interop works on this machine, 1
//! when it does not, 2 on a bad argument.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => {}
        Some("-h" | "--help") => {
            println!(
                "usage: cuda-interop-doctor\n\nReports the Vulkan devices and drivers, the CUDA \
                 driver and devices, their pairing by UUID, external memory and semaphore support \
                 per handle type, queue families and the validation layer, and what to install or \
                 change for each missing piece. Exit status: 0 when interop works, 1 when not."
            );
            return;
        }
        Some(other) => {
            eprintln!("cuda-interop-doctor: unknown argument {other:?}\nusage: cuda-interop-doctor [--help]");
            std::process::exit(2);
        }
    }
    let report = cuda_interop_doctor::diagnose();
    print!("{report}");
    std::process::exit(if report.ready() { 0 } else { 1 });
}
