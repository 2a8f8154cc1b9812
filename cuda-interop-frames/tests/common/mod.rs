//! What the frames crate's cross-process tests share: a child's environment
//! and the `RESULT key=value` lines it prints on stdout.

#![allow(dead_code, reason = "each test binary uses part of it")]

use std::collections::HashMap;

/// The variable `name` a parent test set for its child.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name}: started by the parent test"))
}

/// `RESULT key=value` lines of a child's stdout.
pub fn results(stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        // The first may follow libtest's "test NAME ... " on its line.
        .filter_map(|l| l.find("RESULT ").map(|i| &l[i + "RESULT ".len()..]))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The number `key` of a child's results.
pub fn num(r: &HashMap<String, String>, key: &str) -> u64 {
    r.get(key)
        .unwrap_or_else(|| panic!("no RESULT {key} in {r:?}"))
        .parse()
        .unwrap()
}

/// The comma-separated numbers `key` of a child's results.
pub fn seqs(r: &HashMap<String, String>, key: &str) -> Vec<u64> {
    r.get(key)
        .unwrap_or_else(|| panic!("no RESULT {key} in {r:?}"))
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect()
}

/// A session connected to `name` in `directory` on another thread while
/// `serve` runs here (the sender answers the subscribe only when served),
/// within `bound`.
pub fn connect_serving(
    directory: &cuda_interop_frames::discovery::Directory,
    name: &str,
    delivery: cuda_interop_frames::protocol::Delivery,
    bound: std::time::Duration,
    mut serve: impl FnMut(),
) -> (
    cuda_interop_frames::session::Session,
    vk_export::wire::Received,
) {
    let (dir, name) = (directory.clone(), name.to_string());
    let t = std::thread::spawn(move || {
        cuda_interop_frames::session::Session::connect_named(
            &dir,
            &name,
            delivery,
            std::time::Duration::from_secs(10),
        )
    });
    let start = std::time::Instant::now();
    while !t.is_finished() {
        assert!(start.elapsed() < bound, "no connection within {bound:?}");
        serve();
    }
    t.join().unwrap().expect("connected")
}

/// The application's own submission on the main queue: clears `image` (in
/// GENERAL, acquired for `family` by the open) to `texel` after a GPU wait
/// for `ready`, and signals `written` = `value`; waits for it.
pub fn clear_on_own_queue(
    ctx: &vk_export::Context,
    family: u32,
    image: vk_export::ash::vk::Image,
    ready: (&vk_export::TimelineSemaphore, u64),
    written: &vk_export::TimelineSemaphore,
    value: u64,
    texel: [u8; 4],
) {
    use vk_export::ash::vk;
    let device = ctx.device();
    // SAFETY: plain creation on the live device; destroyed below after the
    // submission completed (the written value reached, waited for).
    let (pool, cmd) = unsafe {
        let pool = device
            .create_command_pool(
                &vk::CommandPoolCreateInfo::default().queue_family_index(family),
                None,
            )
            .unwrap();
        let cmd = device
            .allocate_command_buffers(
                &vk::CommandBufferAllocateInfo::default()
                    .command_pool(pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(1),
            )
            .unwrap()[0];
        (pool, cmd)
    };
    let [r, g, b, a] = texel.map(|c| f32::from(c) / 255.0);
    let range = vk::ImageSubresourceRange {
        aspect_mask: vk::ImageAspectFlags::COLOR,
        base_mip_level: 0,
        level_count: 1,
        base_array_layer: 0,
        layer_count: 1,
    };
    // SAFETY: recording a fresh command buffer of the slot's family; the
    // image is a slot of the sender (alive for its life, leaked after an
    // opened frame's drop), in GENERAL.
    unsafe {
        device
            .begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default())
            .unwrap();
        device.cmd_clear_color_image(
            cmd,
            image,
            vk::ImageLayout::GENERAL,
            &vk::ClearColorValue {
                float32: [r, g, b, a],
            },
            &[range],
        );
        device.end_command_buffer(cmd).unwrap();
    }
    let waits = [ready.0.raw()];
    let wait_values = [ready.1];
    let stages = [vk::PipelineStageFlags::ALL_COMMANDS];
    let signals = [written.raw()];
    let signal_values = [value];
    let mut timeline = vk::TimelineSemaphoreSubmitInfo::default()
        .wait_semaphore_values(&wait_values)
        .signal_semaphore_values(&signal_values);
    let cmds = [cmd];
    let submit = vk::SubmitInfo::default()
        .wait_semaphores(&waits)
        .wait_dst_stage_mask(&stages)
        .command_buffers(&cmds)
        .signal_semaphores(&signals)
        .push_next(&mut timeline);
    // SAFETY: the main queue under the context's lock; everything the
    // submission names lives until it completed (waited for below).
    ctx.with_queue_of(vk_export::QueueRole::Main, |q| unsafe {
        device.queue_submit(q, &[submit], vk::Fence::null())
    })
    .unwrap()
    .unwrap();
    written
        .wait(
            value,
            std::time::Duration::from_secs(10),
            vk_export::WaitStrategy::Block,
        )
        .unwrap();
    // SAFETY: the submission completed (its signal was reached).
    unsafe { device.destroy_command_pool(pool, None) };
}
