//! The wire format's fixed numbers (magic, version, sizes), below both the
//! codec ([`crate::wire`]) and its errors ([`crate::error::WireError`]).
//!
//! # Contract
//!
//! Changing any of these is a new wire version: both sides must agree.

/// First four bytes of every message.
pub const MAGIC: [u8; 4] = *b"CIVX";
/// The one version this build reads and writes.
pub const VERSION: u16 = 1;
/// Header size in bytes.
pub const HEADER_LEN: usize = 16;
/// Most resources (and so fds) in one message: far below the kernel's
/// `SCM_MAX_FD` (253).
pub const MAX_RESOURCES: usize = 16;
/// Largest message accepted.
pub const MAX_MESSAGE_LEN: usize = 16 * 1024;
