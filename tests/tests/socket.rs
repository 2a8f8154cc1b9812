//! The socket layer on a real Vulkan driver: accept and receive time out
//! within their bound, edge cases are bounded and typed errors, and messages
//! without a valid record close their fds exactly once.
//!
//! Fd checks: some tests compare the fd table or count open fds, which are
//! process-wide, so every test of this binary that is not a `child_*` entry
//! point holds `fds::lock()` for its whole run (a `child_*` test runs alone in
//! a process of its own).

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use cuda_interop_testkit::{fds, open_fd_count, sample, TIMEOUT};
use vk_export::socket::{Connection, Listener};
use vk_export::wire::{WireError, HEADER_LEN, MAGIC};
use vk_export::Error;

/// What a refusal of a malformed message must be.
type Expected = fn(&WireError) -> bool;

/// Case 29: records that are missing, empty, of another version or cut
/// short, each with fds attached, are refused, and every fd that came with
/// them is closed exactly once (the fd count is back at its baseline; a
/// debug build's std aborts on a second close).
#[test]
fn messages_without_a_valid_record_close_their_fds_exactly_once() {
    let _fds = fds::lock();
    let baseline = open_fd_count();
    {
        let (tx, rx) = Connection::pair().unwrap();
        let good = sample::message().encode().unwrap();
        let mut other_version = good.clone();
        other_version[4] = 2;
        let zero_resources = sample::frame(&{
            let mut p = 7u64.to_le_bytes().to_vec();
            p.extend_from_slice(&0u16.to_le_bytes());
            p
        });
        let mut header_only = Vec::new();
        header_only.extend_from_slice(&MAGIC);
        header_only.extend_from_slice(&1u16.to_le_bytes());
        header_only.extend_from_slice(&[0; 10]);
        let cut = sample::frame(&sample::message_bytes()[HEADER_LEN..HEADER_LEN + 40]);
        let cases: [(&str, Vec<u8>, Expected); 5] = [
            ("an empty payload", Vec::new(), |e| {
                matches!(e, WireError::TooShort(0))
            }),
            ("version 2", other_version, |e| {
                matches!(e, WireError::UnsupportedVersion { found: 2, .. })
            }),
            ("no resources", zero_resources, |e| {
                matches!(e, WireError::ResourceCount(0))
            }),
            ("a bare header", header_only, |e| {
                matches!(
                    e,
                    WireError::ResourceCount(_)
                        | WireError::Truncated(_)
                        | WireError::Checksum { .. }
                )
            }),
            ("a record cut short", cut, |e| {
                matches!(e, WireError::Truncated(_))
            }),
        ];
        for (what, bytes, expected) in cases {
            let fds: Vec<OwnedFd> = (0..3)
                .map(|_| std::fs::File::open("/dev/null").unwrap().into())
                .collect();
            let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
            // SAFETY: the receiver refuses these messages; nothing is imported.
            unsafe { tx.send_raw(&bytes, &borrowed) }.unwrap();
            drop(fds);
            let err = rx.recv(TIMEOUT).unwrap_err();
            println!("{what}: {err}");
            assert!(
                matches!(&err, Error::Wire(e) if expected(e)),
                "{what}: {err}"
            );
        }
    }
    assert_eq!(open_fd_count(), baseline, "every received fd closed once");
}

#[test]
fn accept_and_recv_return_timeout_within_their_bound() {
    let _fds = fds::lock();
    let dir = std::env::temp_dir().join(format!("vk-export-timeout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let listener = Listener::bind(dir.join("s")).unwrap();
    let bound = Duration::from_millis(150);
    let start = Instant::now();
    assert!(matches!(listener.accept(bound), Err(Error::Timeout(_))));
    assert!(start.elapsed() < bound * 3);
    let (a, _b) = Connection::pair().unwrap();
    let start = Instant::now();
    assert!(matches!(a.recv(bound), Err(Error::Timeout(_))));
    assert!(start.elapsed() >= bound && start.elapsed() < bound * 3);
    // The peer's identity is known: this process, this user.
    assert_eq!(a.peer().pid, Some(std::process::id() as i32));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn socket_edge_cases_are_bounded_and_typed() {
    let _fds = fds::lock();
    let (a, b) = Connection::pair().unwrap();
    // An unbounded timeout does not overflow.
    // SAFETY: nothing is imported; the message is decoded and dropped.
    unsafe { b.send_raw(&[], &[]) }.unwrap();
    // An empty message is not the end of the connection.
    let err = a.recv(Duration::MAX).unwrap_err();
    assert!(
        matches!(err, Error::Wire(vk_export::wire::WireError::TooShort(0))),
        "{err}"
    );
    // A peer that does not read: the send gives up after its bound.
    b.set_send_timeout(Duration::from_millis(100)).unwrap();
    let start = Instant::now();
    let err = loop {
        // SAFETY: nothing is ever received, let alone imported.
        if let Err(e) = unsafe { b.send_raw(&[0u8; 4096], &[]) } {
            break e;
        }
        assert!(start.elapsed() < TIMEOUT, "the socket never filled up");
    };
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    drop(b);
    assert!(matches!(a.recv(Duration::MAX), Ok(_) | Err(Error::Wire(_))));
}
