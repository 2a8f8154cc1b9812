//! Two-plane 4:2:0 images (issue 31): `ExportablePlanarImage` of
//! `Nv12Planes` (`G8_B8R8_2PLANE_420_UNORM`) and `P010Planes`
//! (`G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16`), always disjoint, each
//! plane imported into CUDA as an array of its own format.
//!
//! Everywhere (lavapipe in CI): what the driver offers for these formats
//! (printed), the preflight's refusal where it offers too little (Mesa
//! 22.3's lavapipe offers nothing: no format features, no
//! `samplerYcbcrConversion`), odd sides refused before the driver, and a
//! record that lies about its device or memory types refused by
//! `Context::verify_planar_image` before anything is created.
//!
//! With the fake libcuda (`testkit/fake_cuda`, CPU only), in child
//! processes: the descriptors the driver gets for each plane (its own size,
//! not dedicated; an array of the plane's format and extent, offset 0, one
//! level, flags 0), and both fds handed back from every failure of
//! `import_planar_image_fds` (the driver's, a bad second fd after the first
//! plane was imported, a foreign device), consumed on success.
//!
//! Every test of this binary holds `fds::lock()` (the GPU tests compare the
//! fd table).
//!
//! The tests ignored as "GPU:" need an NVIDIA GPU (the H100 probe of run 23
//! showed the recipe): known per-plane patterns written with Vulkan, both
//! planes imported into CUDA and mapped, each array copied back and compared
//! texel by texel, both formats at 256x128 and 1920x1080; then CUDA writes
//! each plane and Vulkan reads it back. `cargo test -p cuda-interop-tests
//! --test planar -- --ignored`, or `docs/gpu-runs/scripts/multiplanar.sh`.

use ash::vk;
use cuda_interop::{CudaDevice, Stream};
use cuda_interop_testkit::{assert_no_validation_errors, fake, fds, vulkan, Mem};
use vk_export::format::{Nv12Planes, P010Planes, PlanarFormat, Plane};
use vk_export::markers::{DeviceLocal, HostVisible, MemoryLocation as _};
use vk_export::{
    Context, Error, ExportablePlanarImage, PlanarImageFields, PlanarImageInfo, PlaneMemory,
    SubmitSync, PLANAR_USAGE,
};

/// What the driver reports for `format`, in one line per query.
fn offered(ctx: &Context, name: &str, format: vk::Format) -> Vec<String> {
    let (instance, physical) = (ctx.instance(), ctx.physical_device());
    // SAFETY: plain queries on the context's live instance and physical device.
    let props = unsafe { instance.get_physical_device_format_properties(physical, format) };
    let mut lines = vec![format!(
        "{name}: optimal-tiling features {:?} (DISJOINT: {})",
        props.optimal_tiling_features,
        props
            .optimal_tiling_features
            .contains(vk::FormatFeatureFlags::DISJOINT)
    )];
    for flags in [
        vk::ImageCreateFlags::empty(),
        vk::ImageCreateFlags::DISJOINT,
    ] {
        let mut external = vk::PhysicalDeviceExternalImageFormatInfo::default()
            .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        let info = vk::PhysicalDeviceImageFormatInfo2::default()
            .format(format)
            .ty(vk::ImageType::TYPE_2D)
            .tiling(vk::ImageTiling::OPTIMAL)
            .usage(PLANAR_USAGE)
            .flags(flags)
            .push_next(&mut external);
        let mut external_props = vk::ExternalImageFormatProperties::default();
        let mut props = vk::ImageFormatProperties2::default().push_next(&mut external_props);
        // SAFETY: plain query; the chains live across the call.
        let result = unsafe {
            instance.get_physical_device_image_format_properties2(physical, &info, &mut props)
        };
        lines.push(format!(
            "{name}: vkGetPhysicalDeviceImageFormatProperties2(OPTIMAL, {PLANAR_USAGE:?}, flags {flags:?}, OPAQUE_FD) = {result:?}, external memory features {:?}",
            external_props.external_memory_properties.external_memory_features
        ));
    }
    lines
}

fn offers_ycbcr_conversion(ctx: &Context) -> bool {
    let mut features11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut features11);
    // SAFETY: plain query (Vulkan 1.2 instance); the chain lives across the call.
    unsafe {
        ctx.instance()
            .get_physical_device_features2(ctx.physical_device(), &mut features)
    };
    features11.sampler_ycbcr_conversion == vk::TRUE
}

/// Prints what this driver offers for the two formats (the issue asks what
/// lavapipe offers), and what the crate's preflight says.
#[test]
fn what_this_driver_offers_for_two_plane_formats() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    println!(
        "device: {} ({:?}); samplerYcbcrConversion feature offered: {}",
        ctx.identity().name,
        ctx.identity().driver_id,
        offers_ycbcr_conversion(&ctx)
    );
    for line in offered(&ctx, Nv12Planes::NAME, Nv12Planes::VK)
        .into_iter()
        .chain(offered(&ctx, P010Planes::NAME, P010Planes::VK))
    {
        println!("{line}");
    }
    println!(
        "preflight Nv12Planes 256x128: {:?}",
        ExportablePlanarImage::<Nv12Planes, Mem>::preflight(&ctx, 256, 128)
    );
    println!(
        "preflight P010Planes 256x128: {:?}",
        ExportablePlanarImage::<P010Planes, Mem>::preflight(&ctx, 256, 128)
    );
    assert_no_validation_errors(&ctx);
}

/// Where the driver gives the format no optimal features (lavapipe) or no
/// DISJOINT, the preflight and `new` refuse with `Unsupported`, naming what
/// is missing and pointing to the pitched path; where it offers both, the
/// preflight passes.
fn refused_or_offered<P: PlanarFormat>(ctx: &Context) {
    // SAFETY: plain query on the context's live instance and physical device.
    let features = unsafe {
        ctx.instance()
            .get_physical_device_format_properties(ctx.physical_device(), P::VK)
    }
    .optimal_tiling_features;
    let preflight = ExportablePlanarImage::<P, Mem>::preflight(ctx, 256, 128);
    if features.contains(vk::FormatFeatureFlags::DISJOINT) {
        println!("{}: offered, preflight {preflight:?}", P::NAME);
        return;
    }
    let made = ExportablePlanarImage::<P, Mem>::new(ctx, 256, 128).map(drop);
    for result in [preflight, made] {
        let Err(Error::Unsupported { what, reason }) = result else {
            panic!("{}: expected Unsupported, got {result:?}", P::NAME);
        };
        println!("{}: refused: {what}: {reason}", P::NAME);
        assert!(what.contains(P::NAME), "{what}");
        assert!(reason.contains("pitched buffers"), "{reason}");
        if features.is_empty() {
            assert!(reason.contains("no format features"), "{reason}");
            if !offers_ycbcr_conversion(ctx) {
                assert!(reason.contains("samplerYcbcrConversion"), "{reason}");
            }
        } else {
            assert!(reason.contains("without DISJOINT"), "{reason}");
        }
    }
}

#[test]
fn the_preflight_refuses_what_the_driver_lacks_and_points_to_the_pitched_path() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    refused_or_offered::<Nv12Planes>(&ctx);
    refused_or_offered::<P010Planes>(&ctx);
    assert_no_validation_errors(&ctx);
}

/// 4:2:0 needs even sides: refused before any driver query, on any driver.
#[test]
fn odd_or_zero_sides_are_refused_before_the_driver() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    for (w, h) in [(255, 128), (256, 127), (0, 128), (256, 0), (1, 1)] {
        for result in [
            ExportablePlanarImage::<Nv12Planes, Mem>::preflight(&ctx, w, h),
            ExportablePlanarImage::<P010Planes, Mem>::new(&ctx, w, h).map(drop),
        ] {
            match result {
                Err(Error::InvalidArgument(m)) => assert!(m.contains("even"), "{m}"),
                other => panic!("{w}x{h}: expected InvalidArgument, got {other:?}"),
            }
        }
    }
    assert_no_validation_errors(&ctx);
}

/// A record for this device: this device's UUIDs and its first host-visible
/// memory type for both planes, with the sizes of tightly packed NV12 planes.
fn record_here(ctx: &Context) -> PlanarImageFields {
    // SAFETY: plain query.
    let memory = unsafe {
        ctx.instance()
            .get_physical_device_memory_properties(ctx.physical_device())
    };
    let index = (0..memory.memory_type_count)
        .find(|&i| HostVisible::admits(memory.memory_types[i as usize].property_flags))
        .expect("a host-visible memory type");
    let plane = |size| PlaneMemory {
        allocation_size: size,
        memory_type_index: index,
        memory_flags: memory.memory_types[index as usize].property_flags,
        alignment: 65536,
        dedicated: false,
    };
    PlanarImageFields {
        format: Nv12Planes::VK,
        extent: [256, 128],
        usage: PLANAR_USAGE,
        planes: [plane(256 * 128), plane(128 * 64 * 2)],
        device_uuid: ctx.identity().device_uuid,
        driver_uuid: ctx.identity().driver_uuid,
    }
}

fn verify(ctx: &Context, fields: PlanarImageFields) -> vk_export::Result<()> {
    let record = PlanarImageInfo::from_fields(fields)
        .unwrap()
        .typed::<Nv12Planes, HostVisible>()
        .unwrap();
    ctx.verify_planar_image(&record)
}

/// A hostile peer's record is checked on this device before anything is
/// made: another device or driver, a memory type this device does not
/// have, or one whose flags differ here, each refused as `Error::Record`
/// naming the lie (each check's own case: without it, the refusal would
/// come from elsewhere or not at all).
#[test]
fn a_record_that_lies_about_device_or_memory_is_refused() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let here = || record_here(&ctx);
    let refused = |fields: PlanarImageFields, needle: &str| match verify(&ctx, fields) {
        Err(Error::Record(m)) => assert!(m.contains(needle), "{needle}: {m}"),
        other => panic!("{needle}: expected Error::Record, got {other:?}"),
    };
    let mut other_device = here();
    other_device.device_uuid = vk_export::DeviceUuid::from_bytes([0xab; 16]);
    refused(
        other_device,
        "OPAQUE_FD handles only work on the same device",
    );
    let mut other_driver = here();
    other_driver.driver_uuid = vk_export::DriverUuid::from_bytes([0xcd; 16]);
    refused(
        other_driver,
        "OPAQUE_FD handles only work on the same device",
    );
    let mut no_such_type = here();
    no_such_type.planes[1].memory_type_index = 31;
    refused(no_such_type, "memory type 31 does not exist");
    let mut other_flags = here();
    other_flags.planes[0].memory_flags ^= vk::MemoryPropertyFlags::HOST_CACHED;
    refused(other_flags, "in the record");
    // The honest record of a device that cannot make the image: refused by
    // the preflight (lavapipe), or by the sizes this device derives (a GPU:
    // the record's 65536-byte alignment and tight sizes are not its own).
    match verify(&ctx, here()) {
        Err(Error::Unsupported { .. } | Error::Record(_)) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_no_validation_errors(&ctx);
}

/// The probe's patterns (docs/probes/multiplanar.c): luma `x*7 + y*13`,
/// chroma Cb `x*3 + y`, Cr `x + y*5`; 8-bit: the low byte; 16-bit: the
/// low 10 bits in the top 10 bits of the word, little-endian.
fn plane_pattern<P: PlanarFormat>(plane: Plane, width: u32, height: u32, seed: u32) -> Vec<u8> {
    let [w, h] = plane.extent(width, height);
    let wide = P::VK == P010Planes::VK;
    let mut out = Vec::new();
    for y in 0..h {
        for x in 0..w {
            let values = match plane {
                Plane::Luma => vec![x * 7 + y * 13 + seed],
                Plane::Chroma => vec![x * 3 + y + seed, x + y * 5 + seed],
            };
            for v in values {
                if wide {
                    out.extend_from_slice(&(((v & 0x3ff) << 6) as u16).to_le_bytes());
                } else {
                    out.push(v as u8);
                }
            }
        }
    }
    out
}

/// How many texels of `plane` differ between `got` and `want`, and the first few.
fn mismatches<P: PlanarFormat>(
    plane: Plane,
    width: u32,
    got: &[u8],
    want: &[u8],
) -> (usize, String) {
    let texel = plane.channels() as usize * if P::VK == P010Planes::VK { 2 } else { 1 };
    let row = plane.extent(width, 2)[0] as usize;
    let mut bad = 0;
    let mut first = String::new();
    for (i, (g, w)) in got.chunks(texel).zip(want.chunks(texel)).enumerate() {
        if g != w {
            if bad < 4 {
                first += &format!(" (x={}, y={}): {g:?} != {w:?}", i % row, i / row);
            }
            bad += 1;
        }
    }
    (bad + got.len().abs_diff(want.len()), first)
}

/// One format at one size through CUDA and back; returns the PASS/FAIL lines.
fn planes_through_cuda<P: PlanarFormat>(
    ctx: &Context,
    cuda: &CudaDevice,
    width: u32,
    height: u32,
) -> Vec<String> {
    let mut lines = Vec::new();
    let mut check = |what: String, bad: usize, first: String| {
        let ok = bad == 0;
        lines.push(format!(
            "{} {} {width}x{height} {what}{}",
            if ok { "PASS" } else { "FAIL" },
            P::NAME,
            if ok {
                String::new()
            } else {
                format!(": {bad} texels differ;{first}")
            }
        ));
    };
    let image = ExportablePlanarImage::<P, DeviceLocal>::new(ctx, width, height).unwrap();
    let info = image.info().clone();
    println!("{} {width}x{height}: {info:?}", P::NAME);
    ctx.verify_planar_image(&image.record()).unwrap();
    // Records that lie about one plane's allocation, each refused by the
    // comparison with what this device derives for that plane.
    let lie = |plane: Plane, edit: &dyn Fn(&mut PlaneMemory), needle: &str| {
        let mut fields = fields_of(&info);
        edit(&mut fields.planes[plane.index()]);
        let record = PlanarImageInfo::from_fields(fields)
            .unwrap()
            .typed::<P, DeviceLocal>()
            .unwrap();
        match ctx.verify_planar_image(&record) {
            Err(Error::Record(m)) => assert!(m.contains(needle), "{needle}: {m}"),
            other => panic!("{needle}: expected Error::Record, got {other:?}"),
        }
    };
    lie(Plane::Luma, &|m| m.allocation_size *= 2, "Luma plane: size");
    lie(
        Plane::Chroma,
        &|m| m.allocation_size += 65536,
        "Chroma plane: size",
    );
    lie(
        Plane::Chroma,
        &|m| m.alignment *= 2,
        "Chroma plane: alignment",
    );
    // A memory type of the same flags the plane may not use, where the
    // device has one.
    // SAFETY: plain query.
    let memory = unsafe {
        ctx.instance()
            .get_physical_device_memory_properties(ctx.physical_device())
    };
    let used = info.plane(Plane::Luma).memory_type_index;
    if let Some(other) = (0..memory.memory_type_count).find(|&i| {
        i != used
            && memory.memory_types[i as usize].property_flags
                == memory.memory_types[used as usize].property_flags
    }) {
        println!("memory type {other} has type {used}'s flags: checking a record that names it");
        // The plane's allowed types are not known here: the refusal is
        // "memory types" when `other` is not among them; otherwise the
        // record is honest about the class and passes.
        let mut fields = fields_of(&info);
        fields.planes[0].memory_type_index = other;
        let record = PlanarImageInfo::from_fields(fields)
            .unwrap()
            .typed::<P, DeviceLocal>()
            .unwrap();
        match ctx.verify_planar_image(&record) {
            Ok(()) => println!("type {other} is allowed for the luma plane too"),
            Err(Error::Record(m)) => assert!(m.contains("Luma plane: memory types"), "{m}"),
            other => panic!("another memory type: {other:?}"),
        }
    }
    let patterns = Plane::ALL.map(|plane| plane_pattern::<P>(plane, width, height, 0));
    for plane in Plane::ALL {
        ctx.write_plane(&image, plane, &patterns[plane.index()], SubmitSync::new())
            .unwrap();
    }
    for plane in Plane::ALL {
        let back = ctx.read_plane(&image, plane, SubmitSync::new()).unwrap();
        let (bad, first) = mismatches::<P>(plane, width, &back, &patterns[plane.index()]);
        check(format!("{plane:?} Vulkan readback (control)"), bad, first);
    }
    ctx.release_planar_image(&image, SubmitSync::new()).unwrap();
    // Over a socket: both planes in one message, received, verified on the
    // paired Vulkan device, imported with the size probe; every texel again.
    {
        let (tx, rx) = vk_export::socket::Connection::pair().unwrap();
        let planes = image.planes_to_send();
        tx.send_exported(31, &[&planes[0], &planes[1]]).unwrap();
        let mut received = rx.recv(std::time::Duration::from_secs(5)).unwrap();
        let bundle = received.take_planar_image::<P, DeviceLocal>(0).unwrap();
        let imported = cuda
            .import_received_planar_image(bundle)
            .map_err(|e| e.error)
            .unwrap();
        let (luma, chroma) = imported.map_planes().unwrap();
        let stream = Stream::new(cuda).unwrap();
        let (luma_level, chroma_level) = (luma.level(0).unwrap(), chroma.level(0).unwrap());
        let mut got = [
            vec![0u8; luma_level.byte_len().unwrap()],
            vec![0u8; chroma_level.byte_len().unwrap()],
        ];
        luma_level.copy_to_host(&stream, &mut got[0]).unwrap();
        chroma_level.copy_to_host(&stream, &mut got[1]).unwrap();
        for plane in Plane::ALL {
            let (bad, first) =
                mismatches::<P>(plane, width, &got[plane.index()], &patterns[plane.index()]);
            check(
                format!("{plane:?} plane received over a socket, as a CUDA array, every texel"),
                bad,
                first,
            );
        }
    }
    // A first import and drop, so that whatever the driver opens once (on
    // its first import) is not counted below.
    drop(cuda.import_planar_image(&image).unwrap());
    let fds_before = fds::open_fd_count();
    {
        let imported = cuda.import_planar_image(&image).unwrap();
        for plane in Plane::ALL {
            let size = match plane {
                Plane::Luma => imported.luma().external_memory().size(),
                Plane::Chroma => imported.chroma().external_memory().size(),
            };
            assert_eq!(size, info.plane(plane).allocation_size, "{plane:?}");
        }
        let (luma, chroma) = imported.map_planes().unwrap();
        let stream = Stream::new(cuda).unwrap();
        let luma_level = luma.level(0).unwrap();
        let chroma_level = chroma.level(0).unwrap();
        assert_eq!(luma_level.extent(), [width, height, 1]);
        assert_eq!(chroma_level.extent(), [width / 2, height / 2, 1]);
        let mut got = [
            vec![0u8; luma_level.byte_len().unwrap()],
            vec![0u8; chroma_level.byte_len().unwrap()],
        ];
        luma_level.copy_to_host(&stream, &mut got[0]).unwrap();
        chroma_level.copy_to_host(&stream, &mut got[1]).unwrap();
        for plane in Plane::ALL {
            let (bad, first) =
                mismatches::<P>(plane, width, &got[plane.index()], &patterns[plane.index()]);
            check(
                format!("{plane:?} plane as a CUDA array, every texel"),
                bad,
                first,
            );
        }
        // The other way: CUDA writes each plane, Vulkan reads it back;
        // NV12's luma plane refuses CUDA's writes (run 44: Vulkan read them
        // back wrong), so its Vulkan-written pattern must still be there.
        let mut written = Plane::ALL.map(|plane| plane_pattern::<P>(plane, width, height, 41));
        let nv12 = P::VK == vk::Format::G8_B8R8_2PLANE_420_UNORM;
        match luma_level.copy_from_host(&stream, &written[0]) {
            Err(cuda_interop::Error::Unsupported(_)) if nv12 => {
                check("Luma: CUDA's write refused".to_string(), 0, String::new());
                written[0] = patterns[0].clone();
            }
            other => other.unwrap(),
        }
        chroma_level.copy_from_host(&stream, &written[1]).unwrap();
        stream.synchronize(stream.timeout()).unwrap();
        for plane in Plane::ALL {
            let back = ctx.read_plane(&image, plane, SubmitSync::new()).unwrap();
            let (bad, first) = mismatches::<P>(plane, width, &back, &written[plane.index()]);
            check(
                format!("{plane:?} written by CUDA, read by Vulkan"),
                bad,
                first,
            );
        }
    }
    assert_eq!(
        fds::open_fd_count(),
        fds_before,
        "the planes' fds are closed once the imports are dropped"
    );
    lines
}

fn gpu_run<P: PlanarFormat>(width: u32, height: u32) {
    let _fds = fds::lock();
    let (ctx, cuda) = cuda_interop_testkit::gpu::pair();
    let lines = planes_through_cuda::<P>(&ctx, &cuda, width, height);
    for line in &lines {
        println!("{line}");
    }
    assert_no_validation_errors(&ctx);
    assert!(
        lines.iter().all(|l| l.starts_with("PASS")),
        "{}",
        lines.join("\n")
    );
}

#[test]
#[ignore = "GPU: needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test planar -- --ignored, or docs/gpu-runs/scripts/multiplanar.sh"]
fn gpu_nv12_planes_are_exact_cuda_arrays_256x128() {
    gpu_run::<Nv12Planes>(256, 128);
}

#[test]
#[ignore = "GPU: needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test planar -- --ignored, or docs/gpu-runs/scripts/multiplanar.sh"]
fn gpu_nv12_planes_are_exact_cuda_arrays_1920x1080() {
    gpu_run::<Nv12Planes>(1920, 1080);
}

#[test]
#[ignore = "GPU: needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test planar -- --ignored, or docs/gpu-runs/scripts/multiplanar.sh"]
fn gpu_p010_planes_are_exact_cuda_arrays_256x128() {
    gpu_run::<P010Planes>(256, 128);
}

#[test]
#[ignore = "GPU: needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test planar -- --ignored, or docs/gpu-runs/scripts/multiplanar.sh"]
fn gpu_p010_planes_are_exact_cuda_arrays_1920x1080() {
    gpu_run::<P010Planes>(1920, 1080);
}

/// On the GPU, the driver offers both formats disjoint and exportable (the
/// H100 did in run 23), so the preflight passes and a bad memory class is
/// still refused by type.
#[test]
#[ignore = "GPU: needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test planar -- --ignored, or docs/gpu-runs/scripts/multiplanar.sh"]
fn gpu_the_driver_offers_both_formats_disjoint() {
    let _fds = fds::lock();
    let (ctx, _cuda) = cuda_interop_testkit::gpu::pair();
    for line in offered(&ctx, Nv12Planes::NAME, Nv12Planes::VK)
        .into_iter()
        .chain(offered(&ctx, P010Planes::NAME, P010Planes::VK))
    {
        println!("{line}");
    }
    ExportablePlanarImage::<Nv12Planes, DeviceLocal>::preflight(&ctx, 1920, 1080).unwrap();
    ExportablePlanarImage::<P010Planes, DeviceLocal>::preflight(&ctx, 1920, 1080).unwrap();
    println!("PASS both formats pass the preflight at 1920x1080");
    assert_no_validation_errors(&ctx);
}

/// A two-plane record of `P` on the fake's device: tight planes in 64 KiB
/// granules, device-local.
fn fake_record<P: PlanarFormat>(
    width: u32,
    height: u32,
) -> vk_export::PlanarImageRecord<P, DeviceLocal> {
    let bytes = if P::VK == P010Planes::VK { 2 } else { 1 };
    let (w, h) = (u64::from(width), u64::from(height));
    let plane = |size: u64| PlaneMemory {
        allocation_size: size.next_multiple_of(65536),
        memory_type_index: 0,
        memory_flags: vk::MemoryPropertyFlags::DEVICE_LOCAL,
        alignment: 65536,
        dedicated: false,
    };
    PlanarImageInfo::from_fields(PlanarImageFields {
        format: P::VK,
        extent: [width, height],
        usage: PLANAR_USAGE,
        planes: [plane(w * h * bytes), plane(w / 2 * (h / 2) * 2 * bytes)],
        device_uuid: fake::UUID,
        driver_uuid: vk_export::DriverUuid::from_bytes([0; 16]),
    })
    .unwrap()
    .typed()
    .unwrap()
}

#[test]
fn the_planes_descriptors_come_from_the_record() {
    let _fds = fds::lock();
    fake::run("child_fake_plane_descriptors", fake::Variant::Full);
}

/// Each plane: one import of its own size (flags 0: never dedicated), one
/// array of its own format and extent at offset 0 (one level, flags 0: no
/// surface, no colour attachment); the arrays before the imports on drop.
fn plane_descriptors<P: PlanarFormat>(
    fake: &fake::Fake,
    cuda: &CudaDevice,
    width: u32,
    height: u32,
    format: cuda_interop::sys::CUarray_format,
) {
    fake.clear();
    let record = fake_record::<P>(width, height);
    let sizes = Plane::ALL.map(|plane| record.info().plane(plane).allocation_size);
    // SAFETY: the driver is the fake (this process was started with it): it
    // records the descriptors and holds the fds, and nothing reads or writes
    // memory through the imports, so the fds need not be the planes' exports.
    let imported =
        unsafe { cuda.import_planar_image_fds(record, [fake::some_fd(), fake::some_fd()]) }
            .map_err(|e| e.error)
            .unwrap();
    let imports = fake.calls("cuImportExternalMemory");
    assert_eq!(imports.len(), 2);
    for (call, size) in imports.iter().zip(sizes) {
        assert_eq!(call.get("type"), "1", "OPAQUE_FD");
        assert_eq!(call.num("size"), size);
        assert_eq!(
            call.num("flags"),
            0,
            "a disjoint image's planes are never dedicated"
        );
    }
    assert_eq!(fake.live("memory"), 2);
    {
        let (luma, chroma) = imported.map_planes().unwrap();
        let arrays = fake.calls("cuExternalMemoryGetMappedMipmappedArray");
        assert_eq!(arrays.len(), 2);
        let expected = [
            (u64::from(width), u64::from(height), 1),
            (u64::from(width / 2), u64::from(height / 2), 2),
        ];
        for (call, (w, h, channels)) in arrays.iter().zip(expected) {
            assert_eq!(call.num("offset"), 0);
            assert_eq!(
                (call.num("width"), call.num("height"), call.num("depth")),
                (w, h, 0)
            );
            assert_eq!(call.num("format"), u64::from(format.0), "{}", P::NAME);
            assert_eq!(call.num("channels"), channels);
            assert_eq!(call.num("flags"), 0);
            assert_eq!(call.num("levels"), 1);
        }
        assert_eq!(luma.level(0).unwrap().extent(), [width, height, 1]);
        assert_eq!(
            chroma.level(0).unwrap().extent(),
            [width / 2, height / 2, 1]
        );
        assert_eq!(fake.live("array"), 2);
        // CUDA's writes: refused into NV12's luma plane (run 44: Vulkan
        // read them back wrong), before the driver; allowed elsewhere.
        let stream = cuda_interop::Stream::new(cuda).unwrap();
        let (luma0, chroma0) = (luma.level(0).unwrap(), chroma.level(0).unwrap());
        let luma_bytes = vec![0u8; luma0.byte_len().unwrap()];
        let chroma_bytes = vec![0u8; chroma0.byte_len().unwrap()];
        let copies = || fake.calls("cuMemcpy3DAsync").len();
        let before = copies();
        let written = luma0.copy_from_host(&stream, &luma_bytes);
        if P::VK == vk::Format::G8_B8R8_2PLANE_420_UNORM {
            match written {
                Err(cuda_interop::Error::Unsupported(why)) => {
                    assert!(why.contains("NV12") && why.contains("luma"), "{why}")
                }
                other => panic!("a CUDA write into NV12's luma plane: {other:?}"),
            }
            let device = cuda_interop::DeviceBuffer::new(cuda, luma_bytes.len()).unwrap();
            let from_device =
                luma0.enqueue_copy_from(&stream, cuda_interop::Pitched::buffer(&device));
            assert!(
                matches!(from_device, Err(cuda_interop::Error::Unsupported(_))),
                "{from_device:?}"
            );
            assert_eq!(copies(), before, "refused before the driver");
        } else {
            written.unwrap();
        }
        chroma0.copy_from_host(&stream, &chroma_bytes).unwrap();
        stream.synchronize(stream.timeout()).unwrap();
    }
    assert_eq!(fake.live("array"), 0);
    drop(imported);
    assert_eq!(fake.live("memory"), 0);
}

#[test]
#[ignore = "entry point of a child process of planar.rs, with a fake libcuda: run by the_planes_descriptors_come_from_the_record"]
fn child_fake_plane_descriptors() {
    use cuda_interop::sys::CUarray_format;
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    plane_descriptors::<Nv12Planes>(
        &fake,
        &cuda,
        1920,
        1080,
        CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8,
    );
    plane_descriptors::<P010Planes>(
        &fake,
        &cuda,
        256,
        128,
        CUarray_format::CU_AD_FORMAT_UNSIGNED_INT16,
    );
}

#[test]
fn a_failed_two_plane_import_hands_both_fds_back() {
    let _fds = fds::lock();
    fake::run("child_fake_planar_fd_ownership", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of planar.rs, with a fake libcuda: run by a_failed_two_plane_import_hands_both_fds_back"]
fn child_fake_planar_fd_ownership() {
    use std::os::fd::AsRawFd;
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let before = fds::fd_table();
    // Both fds come back as they were: the same numbers, the same files.
    let check_back =
        |err: cuda_interop::PlanarImportError, sent: [(i32, (u64, u64)); 2], what: &str| {
            for (fd, (n, id)) in err.fds.iter().zip(sent) {
                assert_eq!(fd.as_raw_fd(), n, "{what}: the caller's own fd came back");
                assert_eq!(fds::identity(fd), id, "{what}: unchanged");
            }
            assert_eq!(fake.live("memory"), 0, "{what}: nothing stays imported");
            println!("{what}: {}", err.error);
            err.error
        };
    let sent =
        |fds: &[std::os::fd::OwnedFd; 2]| fds.each_ref().map(|f| (f.as_raw_fd(), fds::identity(f)));

    // The driver refuses the first plane.
    fake.set("import_fail", 999);
    let pair = [fake::some_fd(), fake::some_fd()];
    let ids = sent(&pair);
    // SAFETY: the driver is the fake, which refuses every import now.
    let err = unsafe { cuda.import_planar_image_fds(fake_record::<Nv12Planes>(256, 128), pair) }
        .unwrap_err();
    let error = check_back(err, ids, "the driver refuses");
    assert!(error.to_string().contains("CUDA_ERROR_UNKNOWN"), "{error}");
    fake.set("import_fail", 0);

    // Plane 1's fd is no export (a pipe): refused after plane 0 was
    // imported, which is undone; both fds come back.
    let (pipe, _writer) = rustix::pipe::pipe().unwrap();
    let pair = [fake::some_fd(), pipe];
    let ids = sent(&pair);
    fake.clear();
    // SAFETY: the fake holds what it imports and reads nothing.
    let err = unsafe { cuda.import_planar_image_fds(fake_record::<P010Planes>(256, 128), pair) }
        .unwrap_err();
    assert_eq!(
        fake.calls("cuImportExternalMemory").len(),
        1,
        "plane 0 was imported"
    );
    assert_eq!(
        fake.calls("cuDestroyExternalMemory").len(),
        1,
        "and its import undone"
    );
    check_back(err, ids, "plane 1's fd is a pipe");

    // A record of another device: refused before the driver.
    let foreign = PlanarImageInfo::from_fields(PlanarImageFields {
        device_uuid: vk_export::DeviceUuid::from_bytes([9; 16]),
        ..fields_of(fake_record::<Nv12Planes>(256, 128).info())
    })
    .unwrap()
    .typed::<Nv12Planes, DeviceLocal>()
    .unwrap();
    let pair = [fake::some_fd(), fake::some_fd()];
    let ids = sent(&pair);
    fake.clear();
    // SAFETY: refused before any driver call.
    let err = unsafe { cuda.import_planar_image_fds(foreign, pair) }.unwrap_err();
    assert!(fake.calls("cuImportExternalMemory").is_empty());
    let error = check_back(err, ids, "another device's record");
    assert!(
        matches!(error, cuda_interop::Error::DeviceMismatch { .. }),
        "{error}"
    );

    // Success consumes both fds: none of this process's is left open once
    // the import is dropped (the fake closes its duplicates).
    let pair = [fake::some_fd(), fake::some_fd()];
    // SAFETY: the fake holds what it imports and reads nothing.
    let imported =
        unsafe { cuda.import_planar_image_fds(fake_record::<Nv12Planes>(256, 128), pair) }
            .map_err(|e| e.error)
            .unwrap();
    drop(imported);
    assert_eq!(fake.live("memory"), 0);
    drop(_writer);
    assert_eq!(
        fds::fd_table(),
        before,
        "no fd left open, none closed that was not ours"
    );
}

fn fields_of(info: &PlanarImageInfo) -> PlanarImageFields {
    PlanarImageFields {
        format: info.format(),
        extent: info.extent(),
        usage: info.usage(),
        planes: [*info.plane(Plane::Luma), *info.plane(Plane::Chroma)],
        device_uuid: info.device_uuid(),
        driver_uuid: info.driver_uuid(),
    }
}

/// A forged two-plane record of this Vulkan device, with two memfds, sent as
/// the two planes of one message over a socket pair.
fn send_forged_planes(ctx: &Context) -> (vk_export::wire::Received, [(u64, u64); 2]) {
    use vk_export::wire::{Message, Resource};
    let info = PlanarImageInfo::from_fields(record_here(ctx)).unwrap();
    let message = Message {
        tag: 31,
        resources: vec![
            Resource::PlanarPlane(info.clone(), Plane::Luma),
            Resource::PlanarPlane(info, Plane::Chroma),
        ],
    };
    let fds = vec![fake::some_fd(), fake::some_fd()];
    let ids = [fds::identity(&fds[0]), fds::identity(&fds[1])];
    let (tx, rx) = vk_export::socket::Connection::pair().unwrap();
    // SAFETY: the receiver never imports these (the tests check that the
    // record is verified, and refused, before any driver sees an fd).
    unsafe { tx.send(&message, fds) }.unwrap();
    (rx.recv(std::time::Duration::from_secs(5)).unwrap(), ids)
}

/// A two-plane image travels as its two planes, each with its own fd; the
/// receiver takes them as one bundle and verifies the record on its device
/// before anything imports it: lavapipe cannot make the image (refused by
/// the preflight), a GPU derives other sizes than this forged record's.
#[test]
fn a_two_plane_image_travels_as_its_two_planes_and_is_verified() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let (mut received, ids) = send_forged_planes(&ctx);
    let bundle = received
        .take_planar_image::<Nv12Planes, HostVisible>(0)
        .unwrap();
    let (record, fds, _) = bundle.into_parts();
    assert_eq!(
        [fds::identity(&fds[0]), fds::identity(&fds[1])],
        ids,
        "each plane with the fd sent for it"
    );
    match ctx.verify_planar_image(&record) {
        Err(Error::Unsupported { .. } | Error::Record(_)) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_no_validation_errors(&ctx);
}

#[test]
fn a_received_two_plane_image_is_verified_before_cuda_sees_its_fds() {
    let _fds = fds::lock();
    fake::run("child_fake_received_planes", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of planar.rs, with a fake libcuda: run by a_received_two_plane_image_is_verified_before_cuda_sees_its_fds"]
fn child_fake_received_planes() {
    let fake = fake::Fake::open();
    let ctx = vulkan(None);
    fake.set_devices(&[ctx.identity().device_uuid]);
    let cuda = CudaDevice::for_vulkan(&ctx).unwrap();
    let (mut received, ids) = send_forged_planes(&ctx);
    let bundle = received
        .take_planar_image::<Nv12Planes, HostVisible>(0)
        .unwrap();
    fake.clear();
    let err = cuda.import_received_planar_image(bundle).unwrap_err();
    println!("refused: {}", err.error);
    assert!(
        fake.calls("cuImportExternalMemory").is_empty(),
        "the record was refused before the driver saw an fd"
    );
    assert!(
        matches!(err.error, cuda_interop::Error::Vulkan(_)),
        "{}",
        err.error
    );
    assert_eq!(
        [fds::identity(&err.fds[0]), fds::identity(&err.fds[1])],
        ids,
        "both fds come back"
    );
    assert_no_validation_errors(&ctx);
}
