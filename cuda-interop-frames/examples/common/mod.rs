//! What the frame examples share: their command lines.
//!
//! [`Cli::parse`] answers `-h`/`--help` with the example's usage (exit 0)
//! and refuses, with the usage (exit 2), an argument that is neither one
//! of its flags nor the value after one of its valued options, and a valued
//! option without a value: a misspelt flag is an error, never silently
//! ignored. Then [`Cli::flag`], [`Cli::value`] and [`Cli::num`] read it;
//! [`producer_options`] reads the options the two senders share.

#![allow(dead_code, reason = "each example reads the options it has")]

use std::str::FromStr;
use std::time::Duration;

use cuda_interop_frames::producer::{ImageFormat, ProducerOptions};
use cuda_interop_frames::receiver::Delivery;

/// An example's checked command line.
pub struct Cli {
    /// The flags given (not an option's value that looks like one).
    flags: Vec<String>,
    /// The valued options given, with their values.
    values: Vec<(String, String)>,
}

impl Cli {
    /// This process's arguments, checked against `flags` and `valued`
    /// (exits as the module says when they do not fit).
    pub fn parse(usage: &str, flags: &[&str], valued: &[&str]) -> Cli {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let (mut given, mut values) = (Vec::new(), Vec::new());
        let mut rest = args.into_iter();
        while let Some(arg) = rest.next() {
            if arg == "-h" || arg == "--help" {
                println!("{usage}");
                std::process::exit(0);
            }
            if valued.contains(&arg.as_str()) {
                let Some(value) = rest.next() else {
                    eprintln!("{arg} needs a value\n{usage}");
                    std::process::exit(2);
                };
                values.push((arg, value));
            } else if flags.contains(&arg.as_str()) {
                given.push(arg);
            } else {
                eprintln!("unknown argument {arg:?}\n{usage}");
                std::process::exit(2);
            }
        }
        Cli {
            flags: given,
            values,
        }
    }

    /// Whether the flag `name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|a| a == name)
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

    /// The receivers' delivery: `--lossless`, else latest.
    pub fn delivery(&self) -> Delivery {
        if self.flag("--lossless") {
            Delivery::Lossless
        } else {
            Delivery::Latest
        }
    }

    /// The seconds after `name` (else `default`) as a duration.
    pub fn seconds(&self, name: &str, default: f64) -> Result<Duration, String> {
        let secs: f64 = self.num(name, default)?;
        Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{name} needs a number of seconds, not {secs}"))
    }

    /// The number after `name`, else `default`.
    pub fn num<T: FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        Ok(self.opt_num(name)?.unwrap_or(default))
    }
}

/// The options `frame_server` and `renderer` share, read from `cli` with
/// these defaults for the size and the run time; the rest as
/// [`ProducerOptions`]'s buffer-ring defaults (`--row-pitch` unread), for
/// the example to finish.
pub fn producer_options(
    cli: &Cli,
    (width, height): (u32, u32),
    seconds: f64,
) -> Result<ProducerOptions, String> {
    let width = cli.num("--width", width)?;
    Ok(ProducerOptions {
        name: cli.value("--name").map(str::to_string),
        socket: String::new(),
        width,
        height: cli.num("--height", height)?,
        row_pitch: u64::from(width) * 4,
        slots: cli.num("--slots", 4u32)?,
        seconds: cli.num("--seconds", seconds)?,
        frames: cli.opt_num("--frames")?,
        fps: cli.num("--fps", 0.0f64)?,
        hold_timeout: Duration::from_secs_f64(cli.num("--hold-timeout", 5.0f64)?),
        device: None,
        host_visible: false,
        no_semaphores: false,
        image: None,
    })
}

/// `--image-format` / `--format`'s value (`option` names it in the error).
pub fn image_format(option: &str, value: Option<&str>) -> Result<ImageFormat, String> {
    let name = value.unwrap_or("rgba8");
    ImageFormat::parse(name).ok_or_else(|| format!("{option}: rgba8 or rgba16f, not {name:?}"))
}
