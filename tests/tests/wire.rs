//! The wire decoder and the socket layer against corrupted, truncated and
//! hostile input: every case is a typed error, no panic, and the process's
//! open fd count returns to its baseline.
//!
//! One `#[test]` runs the fd-counting cases in order, and it and every other
//! test here that opens fds hold `fds::lock()`: the count is process-wide, so
//! another test thread opening a socket in between would move it.

use std::os::fd::{AsFd, OwnedFd};

use ash::vk;
use cuda_interop_testkit::{fds, open_fd_count, sample, tamper, TIMEOUT};
use proptest::prelude::*;
use vk_export::socket::{Connection, Listener};
use vk_export::wire::{Message, Resource, WireError, HEADER_LEN, MAGIC};
use vk_export::Error;

fn sample_message() -> Message {
    sample::message()
}

fn sample_image() -> vk_export::ImageInfo {
    match sample_message().resources.remove(0) {
        Resource::Image(i) => i,
        _ => unreachable!("the sample's first resource is an image"),
    }
}

#[test]
fn a_message_round_trips() {
    let m = sample_message();
    assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
}

#[test]
fn specific_corruptions_get_specific_errors() {
    let good = sample_message().encode().unwrap();
    let mut bad = good.clone();
    bad[0] = b'X';
    assert_eq!(Message::decode(&bad), Err(WireError::BadMagic));
    let mut bad = good.clone();
    bad[4] = 2;
    assert!(matches!(
        Message::decode(&bad),
        Err(WireError::UnsupportedVersion {
            found: 2,
            supported: 1
        })
    ));
    assert!(matches!(
        Message::decode(&good[..good.len() - 1]),
        Err(WireError::LengthMismatch { .. })
    ));
    assert!(matches!(
        Message::decode(&good[..10]),
        Err(WireError::TooShort(10))
    ));
    let mut bad = good.clone();
    *bad.last_mut().unwrap() ^= 1;
    assert!(matches!(
        Message::decode(&bad),
        Err(WireError::Checksum { .. })
    ));
    // A well-formed, correctly checksummed record with a nonsense value.
    let (_, decoded) = tamper::edit(
        Resource::Image(sample_image()),
        tamper::IMAGE_FIELDS,
        "mip_levels",
        tamper::set(40),
    );
    assert!(matches!(
        decoded,
        Err(WireError::InvalidValue {
            field: "image.mip_levels",
            ..
        })
    ));
    // Three channels: not mappable, not accepted.
    let (_, decoded) = tamper::edit(
        Resource::Image(sample_image()),
        tamper::IMAGE_FIELDS,
        "format",
        tamper::set(vk::Format::R8G8B8_UNORM.as_raw() as u64),
    );
    assert!(matches!(
        decoded,
        Err(WireError::InvalidValue {
            field: "image.format",
            ..
        })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// Arbitrary bytes never panic the decoder, and are almost always rejected.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = Message::decode(&bytes);
    }

    /// Arbitrary payloads behind a valid header (so the checksum passes) are
    /// either rejected or decode to something that re-encodes identically.
    #[test]
    fn checksummed_garbage_is_rejected_or_canonical(payload in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&1u16.to_le_bytes());
        bytes.extend_from_slice(&0u16.to_le_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
        if let Ok(m) = Message::decode(&bytes) {
            prop_assert_eq!(m.encode().unwrap(), bytes);
        }
    }

    /// Any single corrupted byte of a valid message is detected.
    #[test]
    fn every_single_byte_corruption_is_rejected(index in 0usize..10_000, flip in 1u8..=255) {
        let mut bytes = sample_message().encode().unwrap();
        let i = index % bytes.len();
        bytes[i] ^= flip;
        prop_assert!(Message::decode(&bytes).is_err(), "byte {} ^ {:#x} accepted", i, flip);
    }

    /// Every truncation of a valid message is rejected.
    #[test]
    fn every_truncation_is_rejected(cut in 0usize..10_000) {
        let bytes = sample_message().encode().unwrap();
        let cut = cut % bytes.len();
        prop_assert!(Message::decode(&bytes[..cut]).is_err());
    }

    /// A plane resource of a two-plane image (kind 4) with drawn field
    /// values, correctly framed: the decoder never panics, a refusal names a
    /// `planar.` field, and what it accepts is a valid two-plane record that
    /// re-encodes to the same bytes. (The fuzz generators draw kind 4 only as
    /// raw bytes; this draws its fields.)
    #[test]
    fn planar_plane_fields_are_validated_or_canonical(f in planar_fields()) {
        let bytes = framed(&planar_resource(&f));
        match Message::decode(&bytes) {
            Ok(m) => {
                prop_assert_eq!(m.encode().unwrap(), bytes);
                let Resource::PlanarPlane(info, _) = &m.resources[0] else {
                    return Err(TestCaseError::fail("kind 4 decoded to another kind"));
                };
                prop_assert_eq!(info.extent()[0] % 2, 0);
                prop_assert!(info.plane(vk_export::format::Plane::Chroma).allocation_size
                    >= info.plane_bytes(vk_export::format::Plane::Chroma));
            }
            Err(WireError::InvalidValue { field, .. } | WireError::Truncated(field)) => {
                prop_assert!(field.starts_with("planar."), "{}", field);
            }
            Err(other) => return Err(TestCaseError::fail(format!("{other:?}"))),
        }
    }
}

/// The drawn kind-4 resources reach both the decoder's acceptance and each of
/// its refusals often enough to mean something.
#[test]
fn planar_field_draws_reach_acceptance_and_refusals() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut decoded, mut refused) = (0, std::collections::BTreeSet::new());
    for _ in 0..4000 {
        let f = planar_fields().new_tree(&mut runner).unwrap().current();
        match Message::decode(&framed(&planar_resource(&f))) {
            Ok(_) => decoded += 1,
            Err(WireError::InvalidValue { field, .. }) => {
                refused.insert(field);
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    println!("{decoded} of 4000 decoded; refused by: {refused:?}");
    assert!(
        decoded >= 100,
        "only {decoded} of 4000 drawn resources decoded"
    );
    for field in [
        "planar.plane",
        "planar.format",
        "planar.width",
        "planar.usage",
        "planar.plane0.allocation_size",
        "planar.plane1.dedicated",
    ] {
        assert!(refused.contains(field), "no draw was refused by {field}");
    }
}

/// A kind-4 resource's fields as raw integers, in wire order.
#[derive(Debug, Clone)]
struct PlanarFields {
    plane: u8,
    format: u32,
    width: u32,
    height: u32,
    usage: u32,
    planes: [(u64, u32, u32, u64, u8); 2],
}

/// Each field valid most of the time (so that a fair share of messages
/// decodes), and now and then any value.
fn planar_fields() -> impl Strategy<Value = PlanarFields> {
    let format = prop_oneof![
        4 => Just(vk::Format::G8_B8R8_2PLANE_420_UNORM.as_raw() as u32),
        4 => Just(vk::Format::G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16.as_raw() as u32),
        1 => Just(vk::Format::R8_UNORM.as_raw() as u32),
        1 => any::<u32>(),
    ];
    let side = prop_oneof![
        12 => (1u32..32).prop_map(|x| 2 * x),
        1 => Just(0u32),
        1 => Just(65_538u32),
        1 => any::<u32>(),
    ];
    let usage = prop_oneof![
        8 => Just(vk_export::PLANAR_USAGE.as_raw()),
        1 => any::<u32>(),
    ];
    let size = prop_oneof![
        8 => 8_192u64..20_000,
        1 => 0u64..8_192,
        1 => Just((1u64 << 40) + 1),
        1 => any::<u64>(),
    ];
    let plane = (
        size,
        prop_oneof![8 => 0u32..32, 1 => any::<u32>()],
        prop_oneof![8 => Just(1u32), 1 => any::<u32>()],
        prop_oneof![8 => Just(65_536u64), 1 => any::<u64>()],
        prop_oneof![8 => Just(0u8), 1 => Just(1u8), 1 => any::<u8>()],
    );
    (
        prop_oneof![4 => Just(0u8), 4 => Just(1u8), 1 => any::<u8>()],
        format,
        side.clone(),
        side,
        usage,
        plane.clone(),
        plane,
    )
        .prop_map(
            |(plane_index, format, width, height, usage, p0, p1)| PlanarFields {
                plane: plane_index,
                format,
                width,
                height,
                usage,
                planes: [p0, p1],
            },
        )
}

fn planar_resource(f: &PlanarFields) -> Vec<u8> {
    let mut r = vec![4u8, f.plane];
    for v in [f.format, f.width, f.height, f.usage] {
        r.extend_from_slice(&v.to_le_bytes());
    }
    for (size, index, flags, alignment, dedicated) in f.planes {
        r.extend_from_slice(&size.to_le_bytes());
        r.extend_from_slice(&index.to_le_bytes());
        r.extend_from_slice(&flags.to_le_bytes());
        r.extend_from_slice(&alignment.to_le_bytes());
        r.push(dedicated);
    }
    r.extend_from_slice(&[7; 16]);
    r.extend_from_slice(&[8; 16]);
    r
}

/// One resource in a correctly framed message (tag 1, count 1).
fn framed(resource: &[u8]) -> Vec<u8> {
    let mut payload = 1u64.to_le_bytes().to_vec();
    payload.extend_from_slice(&1u16.to_le_bytes());
    payload.extend_from_slice(resource);
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&1u16.to_le_bytes());
    bytes.extend_from_slice(&0u16.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    bytes.extend_from_slice(&payload);
    bytes
}

fn some_fds(n: usize) -> Vec<OwnedFd> {
    (0..n)
        .map(|_| std::fs::File::open("/dev/null").unwrap().into())
        .collect()
}

#[test]
fn hostile_socket_input_is_rejected_and_no_fd_leaks() {
    let _fds = fds::lock();
    let baseline = open_fd_count();
    {
        let (tx, rx) = Connection::pair().unwrap();
        let good = sample_message();

        // 1. A valid message with the right fds arrives, fds owned by the receiver.
        // SAFETY: the receiver validates and drops what arrives; nothing is imported.
        unsafe { tx.send(&good, some_fds(3)) }.unwrap();
        let received = rx.recv(TIMEOUT).unwrap();
        assert_eq!(received.message(), &good);
        drop(received);

        // 2. Fewer fds than resources.
        let fds = some_fds(2);
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        // SAFETY: the receiver validates and drops what arrives; nothing is imported.
        unsafe { tx.send_raw(&good.encode().unwrap(), &borrowed) }.unwrap();
        drop(fds);
        let err = rx.recv(TIMEOUT).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Wire(WireError::FdCount {
                    expected: 3,
                    received: 2
                })
            ),
            "{err}"
        );

        // 3. More fds than the receiver has room for: the kernel truncates
        //    the control data and closes the excess; we report it.
        let fds = some_fds(12);
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        // SAFETY: the receiver validates and drops what arrives; nothing is imported.
        unsafe { tx.send_raw(&good.encode().unwrap(), &borrowed) }.unwrap();
        drop(fds);
        let err = rx.recv_with_fd_capacity(1, TIMEOUT).unwrap_err();
        assert!(
            matches!(err, Error::Wire(WireError::ControlTruncated)),
            "{err}"
        );

        // 4. Garbage with fds attached.
        let fds = some_fds(4);
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        // SAFETY: the receiver validates and drops what arrives; nothing is imported.
        unsafe { tx.send_raw(b"definitely not a record", &borrowed) }.unwrap();
        drop(fds);
        let err = rx.recv(TIMEOUT).unwrap_err();
        assert!(matches!(err, Error::Wire(WireError::BadMagic)), "{err}");

        // 5. A corrupted record with fds.
        let mut bytes = good.encode().unwrap();
        bytes[HEADER_LEN + 20] ^= 0x40;
        let fds = some_fds(3);
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        // SAFETY: the receiver validates and drops what arrives; nothing is imported.
        unsafe { tx.send_raw(&bytes, &borrowed) }.unwrap();
        drop(fds);
        assert!(matches!(
            rx.recv(TIMEOUT).unwrap_err(),
            Error::Wire(WireError::Checksum { .. })
        ));

        // 6. Asking for the wrong kind leaves the fd to be closed with the message.
        // SAFETY: the receiver validates and drops what arrives; nothing is imported.
        unsafe { tx.send(&good, some_fds(3)) }.unwrap();
        let mut received = rx.recv(TIMEOUT).unwrap();
        let err = received
            .take_buffer::<vk_export::markers::DeviceLocal>(0)
            .unwrap_err();
        assert!(err.to_string().contains("resource 0 is an image"), "{err}");
        let bundle = received
            .take_buffer::<vk_export::markers::DeviceLocal>(1)
            .unwrap();
        drop(bundle);
        drop(received);

        // 7. The peer hangs up.
        drop(tx);
        assert!(matches!(
            rx.recv(TIMEOUT).unwrap_err(),
            Error::Wire(WireError::Closed)
        ));
    }
    let after = open_fd_count();
    println!("open fds: {baseline} before, {after} after 7 hostile and valid exchanges");
    assert_eq!(
        after, baseline,
        "every fd sent or received was closed exactly once"
    );
}

#[test]
fn a_peer_the_credential_check_refuses_is_dropped() {
    let _fds = fds::lock();
    let dir = std::env::temp_dir().join(format!("vk-export-peer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("socket");
    let mut listener = Listener::bind(&path).unwrap();
    listener.set_allowed_uids(vec![]); // nobody, not even us
    let client = Connection::connect(&path).unwrap();
    let err = listener.accept(TIMEOUT).unwrap_err();
    assert!(
        matches!(err, Error::PeerRefused { pid, .. } if pid == Some(std::process::id() as i32)),
        "{err}"
    );
    // The server side was closed: the client sees the connection end.
    assert!(matches!(
        client.recv(TIMEOUT).unwrap_err(),
        Error::Wire(WireError::Closed)
    ));
    drop(listener);
    assert!(!path.exists(), "the listener removes its socket file");
    std::fs::remove_dir_all(&dir).ok();
}
