// Twin of fail/submit_sync_outlives_semaphore.rs: the semaphore outlives the submission that names it.
use vk_export::{Context, SubmitSync, TimelineSemaphore};

fn fresh(ctx: &Context) -> vk_export::Result<()> {
    let timeline = TimelineSemaphore::new(ctx)?;
    let sync = SubmitSync::new().signal_timeline(&timeline, 1);
    ctx.submit_and_wait(sync, |_, _| {})
}

fn main() {}
