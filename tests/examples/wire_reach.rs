//! Which wire decoders a set of fuzzer inputs reaches, measured by replaying
//! them and classifying each decode result (`wire_gen::classify`): decoded,
//! rejected by the image/buffer/semaphore decoder (`InvalidValue`/`Truncated`
//! of an `image.`/`buffer.`/`semaphore.` field), or rejected before any
//! resource (header, length, CRC) or around them (count, kind, trailing).
//!
//! ```text
//! cargo run -p cuda-interop-tests --example wire_reach -- [--receive] PATH...
//! cargo run -p cuda-interop-tests --example wire_reach -- --random N [--max-len L]
//! ```
//!
//! PATHs are files or directories of inputs as the `wire_decode` target reads
//! them (`--receive`: as the `receive` target does): a corpus, or a sample of
//! generated inputs written with `CUDA_INTEROP_FUZZ_SAMPLE_DIR` (see
//! `fuzz/README.md`). `--random N` measures N fresh random inputs of up to L
//! bytes (default 1024) instead: what the generator makes of unguided bytes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cuda_interop_testkit::wire_gen::{from_fuzz_bytes, Reach, ReceiveCase};
use cuda_interop_testkit::{pattern, wire_gen};

fn files(path: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            files(&entry?.path(), out)?;
        }
    } else {
        out.push(path.to_path_buf());
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    check_args(&args, &["--receive"], &["--random", "--max-len"], |_| true);
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<usize>().ok())
    };
    let receive = args.iter().any(|a| a == "--receive");
    let mut reach = Reach::default();
    let mut decode = |data: &[u8]| {
        let bytes = if receive {
            ReceiveCase::from_fuzz_bytes(data).bytes
        } else {
            from_fuzz_bytes(data)
        };
        reach.add(&wire_gen::check_decode(&bytes));
    };
    if let Some(n) = value("--random") {
        let max_len = value("--max-len").unwrap_or(1024);
        let mut lengths = pattern(n * 2, 1).into_iter();
        for i in 0..n {
            let len = (usize::from(lengths.next().unwrap_or(0)) << 8
                | usize::from(lengths.next().unwrap_or(0)))
                % (max_len + 1);
            decode(&pattern(len, i as u32 + 2));
        }
        println!("{n} random inputs of 0 to {max_len} bytes:");
    } else {
        let mut all = Vec::new();
        let skip = |a: &&String| a.starts_with("--");
        for path in args.iter().filter(|a| !skip(a)) {
            if let Err(e) = files(Path::new(path), &mut all) {
                eprintln!("{path}: {e}");
                return ExitCode::FAILURE;
            }
        }
        if all.is_empty() {
            eprintln!("usage: wire_reach [--receive] PATH... | --random N [--max-len L]");
            return ExitCode::FAILURE;
        }
        for file in &all {
            match std::fs::read(file) {
                Ok(data) => decode(&data),
                Err(e) => {
                    eprintln!("{}: {e}", file.display());
                    return ExitCode::FAILURE;
                }
            }
        }
        println!("{} files:", all.len());
    }
    println!("{reach}");
    ExitCode::SUCCESS
}

/// What `--help` prints (and a refused argument is followed by).
const USAGE: &str = "usage: wire_reach [--receive] PATH... | --random N [--max-len L]";

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
