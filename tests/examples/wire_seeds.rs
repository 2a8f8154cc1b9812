//! Writes seed inputs for the fuzz targets: valid messages (the tests'
//! sample image, buffer and semaphore, alone and together, and 16 resources),
//! encoded as the inputs the targets read back as those messages, so that
//! the fuzzer starts from records every validator accepts.
//!
//! ```text
//! cargo run -p cuda-interop-tests --example wire_seeds -- fuzz/corpus
//! ```
//!
//! Writes `seed-*` files into `DIR/wire_decode/` and `DIR/receive/`.

use std::path::Path;
use std::process::ExitCode;

use cuda_interop_testkit::sample;
use cuda_interop_testkit::wire_gen::{FdKind, Framing, ReceiveCase, Take, WireSpec};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    check_args(&args, &[], &[], |_| true);
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: wire_seeds DIR");
        return ExitCode::FAILURE;
    };
    let all = WireSpec::from(&sample::message());
    let one = |i: usize| WireSpec {
        resources: vec![all.resources[i].clone()],
        ..all.clone()
    };
    let sixteen = WireSpec {
        resources: all.resources.iter().cycle().take(16).cloned().collect(),
        ..all.clone()
    };
    let mut miscounted = all.clone();
    miscounted.framing = Framing::Count(2);
    let decode = [
        ("all", all.clone()),
        ("image", one(0)),
        ("buffer", one(1)),
        ("semaphore", one(2)),
        ("sixteen", sixteen),
        ("miscounted", miscounted),
    ];
    let receive = [
        (
            "all",
            vec![FdKind::DevNull, FdKind::Memfd, FdKind::PipeRead],
            vec![Take::Image, Take::Buffer, Take::Semaphore],
            all.clone(),
        ),
        ("image", vec![FdKind::Memfd], vec![Take::Image], one(0)),
        (
            "buffer",
            vec![FdKind::PipeWrite],
            vec![Take::Buffer],
            one(1),
        ),
        (
            "semaphore",
            vec![FdKind::DevNull],
            vec![Take::Semaphore],
            one(2),
        ),
        (
            "wrong-take",
            vec![FdKind::Memfd],
            vec![Take::Buffer],
            one(0),
        ),
    ];
    let write = |target: &str, name: &str, bytes: Option<Vec<u8>>| {
        let bytes = bytes.unwrap_or_else(|| panic!("{target}/{name} has no input form"));
        let path = Path::new(&dir).join(target).join(format!("seed-{name}"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        println!("{}", path.display());
    };
    for (name, spec) in &decode {
        write("wire_decode", name, spec.to_fuzz_bytes());
    }
    for (name, fds, takes, spec) in &receive {
        write("receive", name, ReceiveCase::seed(fds, takes, spec));
    }
    ExitCode::SUCCESS
}

/// What `--help` prints (and a refused argument is followed by).
const USAGE: &str =
    "usage: wire_seeds DIR\n\nWrites the fuzz seed corpus (the wire samples) into DIR.";

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
