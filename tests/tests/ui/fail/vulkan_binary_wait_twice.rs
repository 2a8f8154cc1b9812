// Invariant: one wait per binary signal (E0382: the token moved into the first wait). Twin: pass/vulkan_binary_wait_with_signal.rs
use vk_export::{BinarySemaphore, Context, SubmitSync};

fn wait_twice(ctx: &Context, semaphore: &BinarySemaphore) -> vk_export::Result<()> {
    let token = ctx.signal_binary(semaphore, SubmitSync::new())?;
    ctx.submit_and_wait(SubmitSync::new().wait_binary(semaphore, token), |_, _| {})?;
    ctx.submit_and_wait(SubmitSync::new().wait_binary(semaphore, token), |_, _| {})
}

fn main() {}
