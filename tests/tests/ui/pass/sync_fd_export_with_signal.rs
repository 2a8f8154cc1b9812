// Twin of fail/sync_fd_export_without_signal.rs: signal, then export with the signal's token.
use vk_export::{BinarySemaphore, Context, SubmitSync};

fn export(ctx: &Context, semaphore: &BinarySemaphore) -> vk_export::Result<()> {
    let token = ctx.signal_binary(semaphore, SubmitSync::new())?;
    let _sync_fd = semaphore.export_sync_fd(token).map_err(|(e, _token)| e)?;
    Ok(())
}

fn main() {}
