// Invariant: a submission's synchronisation borrows its semaphores, so it cannot name a destroyed one (E0597). Twin: pass/submit_sync_within_semaphore.rs
use vk_export::{Context, SubmitSync, TimelineSemaphore};

fn stale(ctx: &Context) -> vk_export::Result<()> {
    let sync;
    {
        let timeline = TimelineSemaphore::new(ctx)?;
        sync = SubmitSync::new().signal_timeline(&timeline, 1);
    }
    ctx.submit_and_wait(sync, |_, _| {})
}

fn main() {}
