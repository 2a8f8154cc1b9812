//! What the frame examples share: their command lines, the demo sender
//! ([`demo`]) and the CUDA receiver's host copies ([`cuda_host`]).
//!
//! [`Cli::parse`] takes an example's options as a table ([`Opt`]): its
//! `--help` is made from that table (a synopsis naming every option, then
//! one line per option saying what it does and its default), so the help
//! cannot leave one out. It answers `-h`/`--help` with it (exit 0) and
//! refuses, with it on stderr (exit 2), an argument that is not one of the
//! options or the value after a valued one, and a valued option without a
//! value: a misspelt flag is an error, never silently ignored. Then
//! [`Cli::flag`], [`Cli::value`], [`Cli::num`] and [`Cli::seconds`] read
//! it; [`sender_opts`] and [`producer_options`] are the options the two
//! senders share.

#![allow(dead_code, reason = "each example reads the options it has")]

pub mod cuda_host;
pub mod demo;

use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use cuda_interop_frames::protocol::Delivery;
use demo::{ImageFormat, ProducerOptions};

/// One option of an example's command line.
pub struct Opt {
    /// `--name`.
    pub flag: &'static str,
    /// The value's placeholder (`NAME`, `1920`, `rgba8|rgba16f`); `None`
    /// for a flag.
    pub value: Option<&'static str>,
    /// A flag that may be followed by a value (`--image [rgba8]`).
    pub optional_value: bool,
    /// What it does and its default, one line.
    pub help: String,
}

impl Opt {
    /// A flag without a value.
    pub fn flag(flag: &'static str, help: impl Into<String>) -> Opt {
        Opt {
            flag,
            value: None,
            optional_value: false,
            help: help.into(),
        }
    }

    /// An option with a value (`placeholder` shows it in the synopsis).
    pub fn valued(flag: &'static str, placeholder: &'static str, help: impl Into<String>) -> Opt {
        Opt {
            flag,
            value: Some(placeholder),
            optional_value: false,
            help: help.into(),
        }
    }

    /// A flag whose value may follow it (taken when the next argument does
    /// not start with `-`).
    pub fn optional(flag: &'static str, placeholder: &'static str, help: impl Into<String>) -> Opt {
        Opt {
            flag,
            value: Some(placeholder),
            optional_value: true,
            help: help.into(),
        }
    }

    /// Options from a table of `"--flag VALUE -- help"` lines: no value
    /// is a flag, one in brackets (`[rgba8]`) an optional value.
    pub fn table(rows: &[&'static str]) -> Vec<Opt> {
        rows.iter()
            .map(|row| {
                let (spec, help) = row.split_once(" -- ").unwrap_or((row, ""));
                match spec.split_once(' ') {
                    None => Opt::flag(spec, help),
                    Some((flag, v)) if v.starts_with('[') => {
                        Opt::optional(flag, v.trim_matches(['[', ']']), help)
                    }
                    Some((flag, v)) => Opt::valued(flag, v, help),
                }
            })
            .collect()
    }

    fn synopsis(&self) -> String {
        match (self.value, self.optional_value) {
            (None, _) => format!("[{}]", self.flag),
            (Some(v), false) => format!("[{} {v}]", self.flag),
            (Some(v), true) => format!("[{} [{v}]]", self.flag),
        }
    }
}

/// The help of example `name`: the synopsis (wrapped), a blank line,
/// `about`, a blank line, one line per option.
pub fn usage(name: &str, about: &str, opts: &[Opt]) -> String {
    let mut text = format!("usage: {name}");
    let mut width = text.len();
    for o in opts {
        let s = o.synopsis();
        if width + s.len() + 1 > 100 {
            text += "\n   ";
            width = 3;
        }
        text += " ";
        text += &s;
        width += s.len() + 1;
    }
    text += &format!("\n\n{about}\n\n");
    let column = opts.iter().map(|o| o.synopsis().len()).max().unwrap_or(0);
    for o in opts {
        let s = o.synopsis();
        text += &format!("  {s:column$}  {}\n", o.help);
    }
    text.trim_end().to_string()
}

/// An example's checked command line.
pub struct Cli {
    /// The flags given (not an option's value that looks like one).
    flags: Vec<String>,
    /// The valued options given, with their values.
    values: Vec<(String, String)>,
}

impl Cli {
    /// This process's arguments, checked against `opts` (exits as the
    /// module says when they do not fit).
    pub fn parse(name: &str, about: &str, opts: &[Opt]) -> Cli {
        let help = usage(name, about, opts);
        let mut rest = std::env::args().skip(1).peekable();
        let (mut flags, mut values) = (Vec::new(), Vec::new());
        while let Some(arg) = rest.next() {
            if arg == "-h" || arg == "--help" {
                println!("{help}");
                std::process::exit(0);
            }
            let Some(opt) = opts.iter().find(|o| o.flag == arg) else {
                eprintln!("unknown argument {arg:?}\n{help}");
                std::process::exit(2);
            };
            match (opt.value, opt.optional_value) {
                (None, _) => flags.push(arg),
                (Some(_), true) => match rest.next_if(|v| !v.starts_with('-')) {
                    Some(v) => values.push((arg, v)),
                    None => flags.push(arg),
                },
                (Some(_), false) => {
                    let Some(value) = rest.next() else {
                        eprintln!("{arg} needs a value\n{help}");
                        std::process::exit(2);
                    };
                    values.push((arg, value));
                }
            }
        }
        Cli { flags, values }
    }

    /// Whether the flag `name` was given (an optional-valued one, with or
    /// without its value).
    pub fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|a| a == name) || self.value(name).is_some()
    }

    /// The value after the option `name`, if given (the last one, if given
    /// twice).
    pub fn value(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(option, _)| option == name)
            .map(|(_, value)| value.as_str())
    }

    /// The number after `name`, if given; an error naming the option if it
    /// is not one.
    pub fn opt_num<T: FromStr>(&self, name: &str) -> Result<Option<T>, String> {
        self.value(name)
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("{name} needs a number, not {v:?}"))
            })
            .transpose()
    }

    /// The number after `name`, else `default`.
    pub fn num<T: FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        Ok(self.opt_num(name)?.unwrap_or(default))
    }

    /// The seconds after `name` (else `default`) as a duration.
    pub fn seconds(&self, name: &str, default: f64) -> Result<Duration, String> {
        let secs: f64 = self.num(name, default)?;
        Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{name} needs a number of seconds, not {secs}"))
    }

    /// The receivers' delivery: `--lossless`, else latest.
    pub fn delivery(&self) -> Delivery {
        if self.flag("--lossless") {
            Delivery::Lossless
        } else {
            Delivery::Latest
        }
    }
}

/// The receivers' options `--lossless` and `--timeout`.
pub fn receiver_opts(timeout: f64) -> Vec<Opt> {
    vec![
        Opt::flag(
            "--lossless",
            "every frame, in order (the sender waits, bounded, for this receiver); default: \
             latest (the newest frame each time, never waited for)",
        ),
        Opt::valued(
            "--timeout",
            "S",
            format!("bound on every wait, in seconds (default {timeout})"),
        ),
    ]
}

/// The options `frame_server` and `renderer` share, with these defaults
/// for the size and the run time.
pub fn sender_opts((width, height): (u32, u32), seconds: f64) -> Vec<Opt> {
    vec![
        Opt::valued("--width", "W", format!("pixels per row (default {width})")),
        Opt::valued("--height", "H", format!("rows (default {height})")),
        Opt::valued("--slots", "N", "slots in the ring, 2 to 7 (default 4)"),
        Opt::valued(
            "--seconds",
            "S",
            format!("stop after this many seconds (default {seconds})"),
        ),
        Opt::valued("--frames", "N", "stop after this many frames (default: no limit)"),
        Opt::valued("--fps", "F", "at most this many frames a second (default: as fast as receivers take them)"),
        Opt::valued(
            "--wait-for-receivers",
            "N",
            "present nothing until N receivers subscribed, stop when all left (default 0: serve any)",
        ),
        Opt::valued(
            "--wait-timeout",
            "S",
            "give up after this many seconds of --wait-for-receivers (default 60)",
        ),
        Opt::valued(
            "--hold-timeout",
            "S",
            "drop a receiver that holds a frame longer than this (default 5)",
        ),
        Opt::flag(
            "--host-visible",
            "slots in host-visible memory (default: device-local where the device offers it)",
        ),
        Opt::flag(
            "--device-local",
            "slots in device-local memory (CUDA receivers need it), or refuse to start",
        ),
        Opt::flag(
            "--no-semaphores",
            "share no timelines (default: share them where the device exports semaphores)",
        ),
        Opt::flag(
            "--semaphores",
            "share the timelines (CUDA receivers need them), or refuse to start",
        ),
    ]
}

/// The options of [`sender_opts`] read from `cli`, with these defaults for
/// the size and the run time; the rest as [`ProducerOptions`]'s defaults,
/// for the example to finish.
pub fn producer_options(
    cli: &Cli,
    tag: &'static str,
    (width, height): (u32, u32),
    seconds: f64,
) -> Result<ProducerOptions, String> {
    let width = cli.num("--width", width)?;
    let pair = |a: &str, b: &str| -> Result<(), String> {
        if cli.flag(a) && cli.flag(b) {
            return Err(format!(
                "{a} and {b} contradict each other: pass one of them"
            ));
        }
        Ok(())
    };
    pair("--host-visible", "--device-local")?;
    pair("--semaphores", "--no-semaphores")?;
    Ok(ProducerOptions {
        tag,
        name: cli.value("--name").map(str::to_string),
        width,
        height: cli.num("--height", height)?,
        row_pitch: u64::from(width) * 4,
        slots: cli.num("--slots", 4u32)?,
        seconds: cli.num("--seconds", seconds)?,
        frames: cli.opt_num("--frames")?,
        fps: cli.num("--fps", 0.0f64)?,
        wait_for_receivers: cli.num("--wait-for-receivers", 0usize)?,
        wait_timeout: cli.seconds("--wait-timeout", 60.0)?,
        hold_timeout: cli.seconds("--hold-timeout", 5.0)?,
        host_visible: cli.flag("--host-visible"),
        device_local: cli.flag("--device-local"),
        no_semaphores: cli.flag("--no-semaphores"),
        semaphores: cli.flag("--semaphores"),
        ..ProducerOptions::default()
    })
}

/// An image format option's value (`option` names it in the error).
pub fn image_format(option: &str, value: Option<&str>) -> Result<ImageFormat, String> {
    let name = value.unwrap_or("rgba8");
    ImageFormat::parse(name)
        .ok_or_else(|| format!("{option}: one of {}, not {name:?}", ImageFormat::NAMES))
}

/// The median and 99th percentile of `samples` (sorted here).
pub fn median_p99(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (
        demo::quantile_of_sorted(samples, 0.5),
        demo::quantile_of_sorted(samples, 0.99),
    )
}

/// `--list`: prints the named senders, one a line (`NAME: ...`, what the
/// scripts look for).
pub fn list_senders() -> Result<u64, Box<dyn std::error::Error>> {
    for s in cuda_interop_frames::discovery::list_senders()? {
        println!(
            "{}: {}x{} {} {:?} ring of {} slots, {:.1} frames/s, pid {}",
            s.name, s.width, s.height, s.format, s.kind, s.slots, s.fps, s.pid
        );
    }
    Ok(0)
}

/// A receiver example's exit: success, or failure with the count of bad
/// frames or the error, said on stderr.
pub fn finish(name: &str, outcome: Result<u64, Box<dyn std::error::Error>>) -> ExitCode {
    match outcome {
        Ok(0) => ExitCode::SUCCESS,
        Ok(bad) => {
            eprintln!("{name}: {bad} bad frames");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{name} FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
