//! The receive path with real exports (issue 22, item 5): a pool of real
//! OPAQUE_FD exports of one device, and cases that send the fd of one export
//! with the record of another (or of itself), now and then with one field of
//! the record rewritten on the wire, then receive, take and import on the
//! same device. Shared by the fuzz target `receive_exports` and the stable
//! run in `tests/tests/fuzz_corpus.rs`.
//!
//! # Contract
//!
//! [`export_case`] checks, for every case: nothing panics; an import that
//! succeeds never claims more memory than the sent fd's export really holds
//! (the record's allocation size is at most the export's); the process has
//! as many open fds afterwards as before (the caller holds
//! [`crate::fds::lock`] or is alone); and the validation layer reported no
//! `VUID-` of invalid usage (what a peer sends must never make this crate
//! call the driver wrongly; the driver's own reports of refused imports,
//! Mesa's `vk_error` lines, are not VUIDs).

use std::os::fd::AsFd;

use arbitrary::Unstructured;
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, Optimal};
use vk_export::socket::Connection;
use vk_export::wire::{Message, Resource};
use vk_export::{Context, ExportableBuffer, ImageDesc};

use crate::tamper::{self, BUFFER_FIELDS, IMAGE_FIELDS};
use crate::{Image, Mem};

/// One export of the pool: its record as sent on the wire and its real
/// allocation size.
#[derive(Debug)]
enum Export {
    Buffer(ExportableBuffer<Mem>),
    Image(Image),
}

impl Export {
    fn resource(&self) -> Resource {
        match self {
            Export::Buffer(b) => Resource::Buffer(b.info().clone()),
            Export::Image(i) => Resource::Image(i.info().clone()),
        }
    }

    fn allocation_size(&self) -> u64 {
        match self {
            Export::Buffer(b) => b.info().allocation_size(),
            Export::Image(i) => i.info().allocation_size(),
        }
    }

    fn export_fd(&self) -> std::os::fd::OwnedFd {
        match self {
            Export::Buffer(b) => b.export_fd(),
            Export::Image(i) => i.export_fd(),
        }
        .expect("a real export")
    }
}

/// Real exports of one device, made once: buffers of 4 KiB, 64 KiB and
/// 1 MiB, RGBA8 OPTIMAL images of 16x16, 64x64 and 256x256.
#[derive(Debug)]
pub struct ExportPool {
    ctx: Context,
    exports: Vec<Export>,
}

impl ExportPool {
    /// The pool on a context with the validation layer ([`crate::vulkan`]).
    pub fn new() -> ExportPool {
        let ctx = crate::vulkan(None);
        let mut exports = Vec::new();
        for size in [4096, 64 << 10, 1 << 20] {
            exports.push(Export::Buffer(
                ExportableBuffer::<Mem>::new(&ctx, size).expect("a pool buffer"),
            ));
        }
        for side in [16, 64, 256] {
            exports.push(Export::Image(
                Image::new(&ctx, ImageDesc::new_2d(side, side)).expect("a pool image"),
            ));
        }
        ExportPool { ctx, exports }
    }

    /// The pool's context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// How many exports the pool holds.
    pub fn len(&self) -> usize {
        self.exports.len()
    }

    /// Never: the pool always holds its six exports.
    pub fn is_empty(&self) -> bool {
        self.exports.is_empty()
    }
}

impl Default for ExportPool {
    fn default() -> Self {
        ExportPool::new()
    }
}

/// A field of the record rewritten on the wire (the CRC fixed after).
#[derive(Clone, Copy, Debug)]
pub enum FieldEdit {
    /// The field set to a value.
    Set(usize, u64),
    /// A small signed delta added to the field.
    Add(usize, i64),
}

/// One case: whose record, whose fd, and what edit of the record.
#[derive(Clone, Debug)]
pub struct ExportCase {
    /// The pool index whose record is sent.
    pub record_of: usize,
    /// The pool index whose fd is sent.
    pub fd_of: usize,
    /// An optional edit of the record.
    pub edit: Option<FieldEdit>,
}

impl ExportCase {
    /// Reads a case from a fuzzer's input (indices modulo the pool's size).
    pub fn from_fuzz_bytes(data: &[u8], pool: &ExportPool) -> ExportCase {
        let mut u = Unstructured::new(data);
        let n = pool.len();
        let record_of = usize::from(u.arbitrary::<u8>().unwrap_or(0)) % n;
        let fd_of = usize::from(u.arbitrary::<u8>().unwrap_or(0)) % n;
        let edit = match u.int_in_range(0u8..=2).unwrap_or(0) {
            0 => None,
            kind => {
                let field = usize::from(u.arbitrary::<u8>().unwrap_or(0));
                if kind == 1 {
                    Some(FieldEdit::Set(field, u.arbitrary().unwrap_or(0)))
                } else {
                    let delta: i16 = u.arbitrary().unwrap_or(1);
                    Some(FieldEdit::Add(field, i64::from(delta)))
                }
            }
        };
        ExportCase {
            record_of,
            fd_of,
            edit,
        }
    }
}

/// What one case came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwapOutcome {
    /// The edited record did not decode (refused by the sender's own check).
    NotSent,
    /// Refused at `recv` or `take_*`.
    RefusedOnReceive,
    /// Refused at import, typed (the fd came back and was closed).
    RefusedOnImport,
    /// Imported (the record fits the fd's real allocation).
    Imported,
}

/// Runs `case` against `pool` and checks the properties of the module
/// contract (panics naming the case when one fails).
pub fn export_case(pool: &ExportPool, case: &ExportCase) -> SwapOutcome {
    let before = crate::fds::open_fd_count();
    let outcome = send_receive_import(pool, case);
    let after = crate::fds::open_fd_count();
    assert_eq!(after, before, "open fds changed: {case:?} -> {outcome:?}");
    let vuids: Vec<String> = pool
        .ctx
        .validation_error_ids()
        .into_iter()
        .filter(|id| id.starts_with("VUID-"))
        .collect();
    assert!(
        vuids.is_empty(),
        "invalid usage reported after {case:?} -> {outcome:?}: {vuids:?}"
    );
    outcome
}

fn send_receive_import(pool: &ExportPool, case: &ExportCase) -> SwapOutcome {
    let record = &pool.exports[case.record_of];
    let target = &pool.exports[case.fd_of];
    let resource = record.resource();
    let fields = match resource {
        Resource::Buffer(_) => BUFFER_FIELDS,
        _ => IMAGE_FIELDS,
    };
    let bytes = match case.edit {
        None => Message {
            tag: 7,
            resources: vec![resource],
        }
        .encode()
        .expect("a pool record encodes"),
        Some(edit) => {
            let index = match edit {
                FieldEdit::Set(i, _) | FieldEdit::Add(i, _) => i % fields.len(),
            };
            let (name, _, width) = fields[index];
            // A UUID (16 bytes) takes no delta: it is set instead.
            let edited = match edit {
                FieldEdit::Add(_, d) if width <= 8 => {
                    tamper::edit(resource, fields, name, tamper::add(d))
                }
                FieldEdit::Add(_, d) => tamper::edit(resource, fields, name, tamper::set(d as u64)),
                FieldEdit::Set(_, v) => tamper::edit(resource, fields, name, tamper::set(v)),
            };
            match edited {
                (bytes, Ok(_)) => bytes,
                (_, Err(_)) => return SwapOutcome::NotSent,
            }
        }
    };
    let (tx, rx) = Connection::pair().expect("socketpair");
    let fd = target.export_fd();
    // SAFETY: deliberately not, most of the time: the record need not be
    // the fd's export's (the fault under test); the receiver's checks and
    // its driver stand between it and any misuse.
    unsafe { tx.send_raw(&bytes, &[fd.as_fd()]) }.expect("send");
    drop(fd);
    let Ok(mut received) = crate::wire_gen::receive(&rx) else {
        return SwapOutcome::RefusedOnReceive;
    };
    let ctx = &pool.ctx;
    let imported_size = match received.message().resources[0].clone() {
        Resource::Buffer(info) => match received.take_buffer::<Mem>(0) {
            Err(_) => return SwapOutcome::RefusedOnReceive,
            Ok(bundle) => match ExportableBuffer::<Mem>::import_received(ctx, bundle) {
                Ok(imported) => {
                    drop(imported);
                    info.allocation_size()
                }
                Err(_) => return SwapOutcome::RefusedOnImport,
            },
        },
        Resource::Image(info) => {
            match received.take_image::<Rgba8Unorm, Optimal, Mem, usage::Storage>(0) {
                Err(_) => return SwapOutcome::RefusedOnReceive,
                Ok(bundle) => match Image::import_received(ctx, bundle) {
                    Ok(imported) => {
                        drop(imported);
                        info.allocation_size()
                    }
                    Err(_) => return SwapOutcome::RefusedOnImport,
                },
            }
        }
        // The pool exports no two-plane images.
        Resource::Semaphore(_) | Resource::PlanarPlane(..) => return SwapOutcome::RefusedOnReceive,
    };
    assert!(
        imported_size <= target.allocation_size(),
        "{case:?}: a record of {imported_size} bytes was imported over an export of {} bytes",
        target.allocation_size()
    );
    SwapOutcome::Imported
}
