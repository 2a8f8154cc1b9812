// Invariant: a binary wait needs the token of a submitted signal (E0061: no token, no wait). Twin: pass/vulkan_binary_wait_with_signal.rs
use vk_export::{BinarySemaphore, Context, SubmitSync};

fn wait(ctx: &Context, semaphore: &BinarySemaphore) -> vk_export::Result<()> {
    ctx.submit_and_wait(SubmitSync::new().wait_binary(semaphore), |_, _| {})
}

fn main() {}
