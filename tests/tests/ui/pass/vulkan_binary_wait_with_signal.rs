// Twin of fail/vulkan_binary_wait_without_signal.rs and fail/vulkan_binary_wait_twice.rs: one signal, one wait.
use vk_export::{BinarySemaphore, Context, SubmitSync};

fn signal_then_wait(ctx: &Context, semaphore: &BinarySemaphore) -> vk_export::Result<()> {
    let token = ctx.signal_binary(semaphore, SubmitSync::new())?;
    ctx.submit_and_wait(SubmitSync::new().wait_binary(semaphore, token), |_, _| {})
}

fn main() {}
