//! The fuzzer's findings, on stable, in every CI run: every file of
//! `fuzz/corpus/*/` replayed through the same code the fuzz targets run
//! (`wire_gen`), and a short fresh structure-aware run with proptest.
//!
//! Properties: `Message::decode` never panics; whatever decodes re-encodes to
//! exactly the same bytes; a message whose framing is broken is rejected; the
//! receive path closes every fd it is sent. The fresh run prints how many
//! inputs reached each resource decoder and fails if one of them is reached
//! by fewer than 10%.
//!
//! The fd-counting replay must not overlap anything else in this process
//! that opens fds, so every test here that opens files holds [`FDS`].

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cuda_interop_testkit::wire_gen::{
    check_decode, decode_case, receive_case, BufferSpec, Decoder, Framing, ImageSpec, Reach,
    ReceiveCase, ResourceSpec, SemaphoreSpec, WireSpec,
};
use cuda_interop_testkit::{open_fd_count, sample};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use vk_export::format::SUPPORTED;

static FDS: Mutex<()> = Mutex::new(());

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

/// The files of `fuzz/corpus/<target>/`, sorted by name.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = corpus_dir().join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).unwrap();
            (p, data)
        })
        .collect()
}

#[test]
fn every_corpus_file_round_trips_or_is_rejected() {
    let _fds = FDS.lock().unwrap_or_else(|e| e.into_inner());
    let mut targets: Vec<String> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    targets.sort();
    assert!(
        targets.iter().any(|t| t == "wire_decode") && targets.iter().any(|t| t == "receive"),
        "fuzz/corpus/ has the wire_decode and receive corpora: {targets:?}"
    );
    for target in targets {
        let files = corpus(&target);
        assert!(!files.is_empty(), "fuzz/corpus/{target}/ is empty");
        let mut reach = Reach::default();
        for (path, data) in &files {
            let result = std::panic::catch_unwind(|| match target.as_str() {
                "receive" => check_decode(&ReceiveCase::from_fuzz_bytes(data).bytes),
                _ => decode_case(data),
            });
            match result {
                Ok(decoded) => reach.add(&decoded),
                Err(_) => panic!("{} fails (see the panic above)", path.display()),
            }
        }
        println!("fuzz/corpus/{target}: {reach}");
    }
}

#[test]
fn the_receive_corpus_closes_every_fd() {
    let _fds = FDS.lock().unwrap_or_else(|e| e.into_inner());
    let files = corpus("receive");
    let before = open_fd_count();
    let (mut ok, mut refused) = (0, 0);
    for (path, data) in &files {
        let case = ReceiveCase::from_fuzz_bytes(data);
        // receive_case checks the fd count around each case itself.
        match std::panic::catch_unwind(|| receive_case(&case)) {
            Ok(Ok(_)) => ok += 1,
            Ok(Err(_)) => refused += 1,
            Err(_) => panic!("{} fails (see the panic above)", path.display()),
        }
    }
    println!(
        "fuzz/corpus/receive: {} cases sent with their fds: {ok} received, {refused} refused",
        files.len()
    );
    assert_eq!(open_fd_count(), before);
}

#[test]
fn a_spec_encodes_exactly_as_the_crate_does() {
    let message = sample::message();
    let spec = WireSpec::from(&message);
    assert_eq!(spec.encode(), message.encode().unwrap());
    assert_eq!(spec.encode(), sample::message_bytes());
    assert!(!spec.must_be_rejected());
}

/// A raw value for a field: anything, or near the validators' bounds.
fn raw_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..=3,
        (0u32..64).prop_map(|s| 1u64 << s),
        (0u32..64).prop_map(|s| (1u64 << s).wrapping_sub(1)),
        (0u32..64).prop_map(|s| (1u64 << s) + 1),
    ]
}

fn uuid() -> impl Strategy<Value = [u8; 16]> {
    any::<[u8; 16]>()
}

/// An image record the decoder accepts: a supported format, 2D (maybe a
/// cube) or 3D, levels within the extent, an allocation that holds level 0 of
/// every layer, pitches that match the tiling.
fn valid_image() -> impl Strategy<Value = ImageSpec> {
    let shape = (
        0..SUPPORTED.len(),
        0u8..3, // 2D, 2D cube, 3D
        1u32..=64,
        1u32..=64,
        1u32..=8,
        1u32..=4,
        0u32..=1,
        1u64..=3,
    );
    let memory = (
        1u32..=0xff,
        0u32..32,
        0u32..=0x1ff,
        any::<bool>(),
        0u32..=16,
        any::<u32>(),
        uuid(),
        uuid(),
    );
    (shape, memory).prop_map(
        |(
            (format, kind, width, height, depth, layers, tiling, slack),
            (
                usage,
                memory_type_index,
                memory_flags,
                dedicated,
                align,
                mips,
                device_uuid,
                driver_uuid,
            ),
        )| {
            let (vk_format, _, channels, channel) = SUPPORTED[format];
            let texel = u64::from(channels * channel.bytes());
            let (image_type, flags, height, depth, layers) = match kind {
                0 => (1, 0, height, 1, layers),
                1 => (1, 0x10, width, 1, 6 * layers),
                _ => (2, 0, height, depth, 1),
            };
            let max_levels = 32 - width.max(height).max(depth).leading_zeros();
            let texels =
                texel * u64::from(width) * u64::from(height) * u64::from(depth) * u64::from(layers);
            let allocation_size = texels * slack;
            let linear = tiling == 1;
            ImageSpec {
                format: vk_format.as_raw() as u32,
                image_type,
                width,
                height,
                depth,
                mip_levels: 1 + mips % max_levels,
                array_layers: layers,
                flags,
                tiling,
                usage,
                allocation_size,
                memory_type_index,
                memory_flags,
                dedicated: u8::from(dedicated),
                alignment: 1 << align,
                offset: 0,
                row_pitch: if linear { texel * u64::from(width) } else { 0 },
                array_pitch: if linear {
                    texels / u64::from(layers)
                } else {
                    0
                },
                device_uuid,
                driver_uuid,
            }
        },
    )
}

fn valid_buffer() -> impl Strategy<Value = BufferSpec> {
    (
        1u64..=1 << 20,
        1u32..=0x3ff,
        0u64..=4096,
        0u32..32,
        0u32..=0x1ff,
        any::<bool>(),
        0u32..=16,
        (uuid(), uuid()),
    )
        .prop_map(
            |(size, usage, extra, memory_type_index, memory_flags, dedicated, align, uuids)| {
                BufferSpec {
                    size,
                    usage,
                    allocation_size: size + extra,
                    memory_type_index,
                    memory_flags,
                    dedicated: u8::from(dedicated),
                    alignment: 1 << align,
                    device_uuid: uuids.0,
                    driver_uuid: uuids.1,
                }
            },
        )
}

fn valid_semaphore() -> impl Strategy<Value = SemaphoreSpec> {
    (0u32..=1, uuid(), uuid()).prop_map(|(semaphore_type, device_uuid, driver_uuid)| {
        SemaphoreSpec {
            semaphore_type,
            device_uuid,
            driver_uuid,
        }
    })
}

fn resource() -> impl Strategy<Value = ResourceSpec> {
    prop_oneof![
        5 => valid_image().prop_map(ResourceSpec::Image),
        5 => valid_buffer().prop_map(ResourceSpec::Buffer),
        5 => valid_semaphore().prop_map(ResourceSpec::Semaphore),
        1 => (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..160))
            .prop_map(|(kind, body)| ResourceSpec::Raw { kind: kind % 5, body }),
    ]
}

fn framing() -> impl Strategy<Value = Framing> {
    prop_oneof![
        26 => Just(Framing::Exact),
        1 => any::<u16>().prop_map(Framing::Count),
        1 => proptest::collection::vec(any::<u8>(), 0..8).prop_map(Framing::Trailing),
        1 => any::<u16>().prop_map(Framing::Cut),
        1 => any::<u32>().prop_map(Framing::Crc),
        1 => any::<u32>().prop_map(Framing::Length),
        1 => any::<[u8; 8]>().prop_map(Framing::Header),
    ]
}

/// Valid resources, then (one message in two) one field of one resource set
/// to a raw value, as a hostile peer would write it; mostly exact framing.
fn wire_spec() -> impl Strategy<Value = WireSpec> {
    let count = prop_oneof![3 => 1usize..=3, 1 => 4usize..=16];
    (
        any::<u64>(),
        count.prop_flat_map(|n| proptest::collection::vec(resource(), n)),
        framing(),
        proptest::option::of((any::<usize>(), any::<usize>(), raw_value())),
    )
        .prop_map(|(tag, mut resources, framing, edit)| {
            if let Some((r, field, value)) = edit {
                let n = resources.len();
                resources[r % n].set_field(field, value);
            }
            WireSpec {
                tag,
                resources,
                framing,
            }
        })
}

#[test]
fn fresh_structured_messages_reach_every_decoder_and_round_trip() {
    let reach = Mutex::new(Reach::default());
    let mut runner = TestRunner::new(Config {
        cases: 3000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&wire_spec(), |spec| {
            let bytes = spec.encode();
            let decoded = check_decode(&bytes);
            prop_assert!(
                !(decoded.is_ok() && spec.must_be_rejected()),
                "broken framing accepted: {:?}",
                spec
            );
            reach.lock().unwrap().add(&decoded);
            // The fuzzer's seeds are made by the inverse of its input reader:
            // every spec without lengths drawn from the input's end has one.
            let lengths_from_end = matches!(spec.framing, Framing::Trailing(_))
                || spec
                    .resources
                    .iter()
                    .any(|r| matches!(r, ResourceSpec::Raw { .. }));
            let flag_bytes_readable = spec.resources.iter().all(|r| match r {
                ResourceSpec::Image(i) => matches!(i.dedicated, 0 | 1 | 0xf0..),
                ResourceSpec::Buffer(b) => matches!(b.dedicated, 0 | 1 | 0xf0..),
                _ => true,
            });
            if !lengths_from_end && flag_bytes_readable {
                let input = spec.to_fuzz_bytes();
                prop_assert!(input.is_some(), "no fuzzer input reads back as {:?}", spec);
            }
            Ok(())
        })
        .unwrap();
    let reach = reach.into_inner().unwrap();
    println!("fresh proptest run: {reach}");
    for d in Decoder::ALL {
        assert!(
            reach.share(d) >= 0.10 && reach.validated_share(d) >= 0.10,
            "only {:.1}% of inputs reached the {} decoder ({:.1}% its validator)",
            100.0 * reach.share(d),
            d.prefix(),
            100.0 * reach.validated_share(d)
        );
    }
    assert!(
        reach.decoded * 5 >= reach.inputs,
        "fewer than 20% decoded: {reach}"
    );
}

/// The receive path with real exports (issue 22, item 5), on stable: 600
/// random cases of `export_swap` (the fuzz target `receive_exports` runs the
/// same code), each sending a real export's fd with the record of a random
/// export of the pool, a third of them with one field rewritten on the wire,
/// then receiving and importing on the same device. Every case keeps the
/// module's properties (no import beyond the fd's real allocation, fds flat,
/// no VUID); the run (a fixed seed) must reach each outcome, so that it exercises refusals
/// at receive and at import as well as honest imports.
#[test]
fn real_exports_with_random_records_never_import_beyond_their_allocation() {
    use cuda_interop_testkit::export_swap::{export_case, ExportCase, ExportPool, SwapOutcome};
    let _fds = FDS.lock().unwrap_or_else(|e| e.into_inner());
    let pool = ExportPool::new();
    // A fixed seed: the outcome counts below are the same in every run.
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 600,
            failure_persistence: None,
            ..Config::default()
        },
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let counted = Mutex::new(std::collections::BTreeMap::<String, usize>::new());
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..24), |data| {
            let case = ExportCase::from_fuzz_bytes(&data, &pool);
            let outcome = export_case(&pool, &case);
            *counted
                .lock()
                .unwrap()
                .entry(format!("{outcome:?}"))
                .or_default() += 1;
            Ok(())
        })
        .unwrap();
    let counts = counted.into_inner().unwrap();
    println!("600 export swaps: {counts:?}");
    for outcome in [
        SwapOutcome::NotSent,
        SwapOutcome::RefusedOnReceive,
        SwapOutcome::RefusedOnImport,
        SwapOutcome::Imported,
    ] {
        assert!(
            counts.get(&format!("{outcome:?}")).is_some_and(|&n| n >= 1),
            "no case came to {outcome:?}: {counts:?}"
        );
    }
}
