//! A multi-image ring (several named images a slot) reaches an OpenGL
//! receiver only through `Session::connect_any`/`connect_named_any`; the
//! receiver refuses it (`ConsumerError::MultiImage`, naming the parts), as
//! `VulkanReceiver` does: its one texture a slot would otherwise take
//! another part, of another frame, as slot i's image (the adversarial
//! review of stop 35 showed slot 1's texture holding frame n-1's second
//! part).

use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{Address, ImagePart, MultiImageSender, SenderOptions};
use cuda_interop_frames::session::Session;
use cuda_interop_frames::transport::ConsumerError;
use cuda_interop_gl::{Error, GlReceiver, HeadlessGl};
use cuda_interop_testkit::{vulkan, Mem};
use vk_export::format::Rgba8Unorm;

const BOUND: Duration = Duration::from_secs(60);

#[test]
fn a_multi_image_ring_is_refused_naming_its_parts() {
    let ctx = vulkan(None);
    let gl = match HeadlessGl::on_device(ctx.identity().device_uuid) {
        Ok(gl) => gl,
        Err(e) => panic!("no headless GL on the Vulkan device: {e}"),
    };
    let dir = std::env::temp_dir().join(format!("cig-gl-multi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let opts = SenderOptions {
        semaphores: false,
        ..SenderOptions::new(
            Address::Named {
                directory: directory.clone(),
                name: "stereo".into(),
            },
            16,
            8,
            2,
        )
    }
    .with_parts([
        ImagePart::new::<Rgba8Unorm>("left").unwrap(),
        ImagePart::new::<Rgba8Unorm>("right").unwrap(),
    ]);
    let mut sender = MultiImageSender::<Mem>::new(&ctx, opts).unwrap();
    let (d, n) = (directory.clone(), "stereo".to_string());
    let connecting = std::thread::spawn(move || {
        Session::connect_named_any(&d, &n, Delivery::Lossless, Duration::from_secs(10))
    });
    let start = Instant::now();
    while !connecting.is_finished() {
        assert!(start.elapsed() < BOUND, "the session did not connect");
        sender.serve(Duration::from_millis(5));
    }
    let (session, setup) = connecting.join().unwrap().expect("connected");
    // SAFETY: `gl`'s context is current on this thread (HeadlessGl made it
    // so) and stays current until after the receiver's drop (it is refused).
    match unsafe { GlReceiver::new(gl.gl(), session, setup) } {
        Err(Error::Consumer(ConsumerError::MultiImage { parts })) => {
            assert_eq!(parts, ["left", "right"]);
        }
        Err(other) => panic!("another refusal: {other}"),
        Ok(rx) => panic!(
            "a multi-image ring was taken: {} textures",
            rx.textures().len()
        ),
    }
    drop(gl);
    drop(sender);
    let _ = std::fs::remove_dir_all(&dir);
}
