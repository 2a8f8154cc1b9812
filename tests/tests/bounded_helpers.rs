//! Soundness rules of issue 18 that live on the Vulkan side: every helper's
//! bound holds, whatever the caller asks for.

use std::time::Duration;

use cuda_interop_testkit::{assert_no_validation_errors, vulkan};
use vk_export::{BinarySemaphore, Error, SubmitSync, TimelineSemaphore};

/// Issue 18 item 1: a binary signal behind a timeline value nobody has
/// signalled is never submitted, so no later binary wait can block a queue
/// (or, on lavapipe, `vkQueueSubmit` under the context's submit lock) for
/// ever. Without the host pre-wait, `signal_binary` returns `Ok(token)` here.
#[test]
fn a_binary_signal_behind_an_unreached_timeline_value_is_not_submitted() {
    let ctx = vulkan(None);
    let timeline = TimelineSemaphore::new_local(&ctx).unwrap();
    let binary = BinarySemaphore::new_local(&ctx).unwrap();
    let bound = Duration::from_millis(50);
    let result = ctx.signal_binary(
        &binary,
        SubmitSync::new().wait_timeline(&timeline, 1).timeout(bound),
    );
    assert!(
        matches!(result, Err(Error::Timeout(d)) if d == bound),
        "{result:?}"
    );
    // Nothing was submitted: the payload is free and nothing waits on the
    // timeline, so a second helper with the same bound returns at once.
    assert!(!binary.payload().is_signal_pending());
    let token = ctx.signal_binary(&binary, SubmitSync::new()).unwrap();
    ctx.submit_and_wait(
        SubmitSync::new().wait_binary(&binary, token).timeout(bound),
        |_, _| {},
    )
    .unwrap();
    // Once the value is reached, the same request goes through.
    timeline.signal(1).unwrap();
    let token = ctx
        .signal_binary(
            &binary,
            SubmitSync::new().wait_timeline(&timeline, 1).timeout(bound),
        )
        .unwrap();
    ctx.submit_and_wait(SubmitSync::new().wait_binary(&binary, token), |_, _| {})
        .unwrap();
    assert_no_validation_errors(&ctx);
}

/// Issue 18 item 9: a temporary SYNC_FD import checks what it can before the
/// driver: the fd is a sync file, and no submission of this crate still uses
/// the semaphore. Without the checks lavapipe answers `Unsupported` (it has
/// no semaphore fds), later than the refusals asserted here.
#[test]
fn a_sync_fd_import_refuses_fds_that_are_not_sync_files_and_semaphores_in_use() {
    use std::os::fd::AsFd;
    use vk_export::SyncFd;
    let ctx = vulkan(None);
    let mut binary = BinarySemaphore::new_local(&ctx).unwrap();
    let identity = |fd: std::os::fd::BorrowedFd<'_>| {
        let st = rustix::fs::fstat(fd).unwrap();
        (st.st_dev, st.st_ino)
    };
    let (read, _write) = rustix::pipe::pipe().unwrap();
    let before = identity(read.as_fd());
    let (e, back) = binary.import_sync_fd(SyncFd::Fd(read)).unwrap_err();
    assert!(
        matches!(&e, Error::Record(m) if m.contains("not a sync file")),
        "{e}"
    );
    match back {
        SyncFd::Fd(fd) => assert_eq!(identity(fd.as_fd()), before, "the same fd, open"),
        SyncFd::AlreadySignaled => panic!("the fd was not handed back"),
    }
    // A wait on the semaphore left queued by a helper that timed out.
    let timeline = TimelineSemaphore::new_local(&ctx).unwrap();
    let token = ctx.signal_binary(&binary, SubmitSync::new()).unwrap();
    let stuck = ctx.submit_and_wait(
        SubmitSync::new()
            .wait_timeline(&timeline, 1)
            .wait_binary(&binary, token)
            .timeout(Duration::from_millis(50)),
        |_, _| {},
    );
    assert!(matches!(stuck, Err(Error::Timeout(_))), "{stuck:?}");
    let (e, _) = binary.import_sync_fd(SyncFd::AlreadySignaled).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("has not completed")),
        "{e}"
    );
    println!("{e}");
    // Once the queued wait has run, the import gets past these checks.
    timeline.signal(1).unwrap();
    ctx.submit_and_wait(SubmitSync::new(), |_, _| {}).unwrap();
    if let Err((e, _)) = binary.import_sync_fd(SyncFd::AlreadySignaled) {
        assert!(!matches!(&e, Error::InvalidArgument(_)), "{e}");
    }
    assert_no_validation_errors(&ctx);
}

/// A host signal from inside the recording closure of a submission that
/// signals the same timeline would wait for the signal lock its own thread
/// holds: refused instead (found by review). Run on a thread with a bound,
/// so that a regression fails here rather than hanging the suite.
#[test]
fn a_host_signal_inside_a_recording_closure_that_signals_it_is_refused() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ctx = vulkan(None);
        let timeline = TimelineSemaphore::new_local(&ctx).unwrap();
        let mut inner = None;
        let outer = ctx.submit_and_wait(SubmitSync::new().signal_timeline(&timeline, 1), |_, _| {
            inner = Some(timeline.signal(2))
        });
        let after = timeline.signal(2);
        assert_no_validation_errors(&ctx);
        let result = (format!("{outer:?}"), format!("{inner:?}"), after.is_ok());
        // Dropped before the result is sent: the process may exit as soon as
        // it arrives, and must not tear the driver down under this thread.
        drop((timeline, ctx));
        tx.send(result).unwrap();
    });
    let (outer, inner, after) = rx.recv_timeout(Duration::from_secs(20)).expect(
        "submit_and_wait with a host signal in its closure did not return: a self-deadlock",
    );
    println!("submission: {outer}; signal inside: {inner}");
    assert_eq!(outer, "Ok(())");
    assert!(
        inner.contains("InvalidArgument") && inner.contains("would wait for itself"),
        "{inner}"
    );
    assert!(after, "the lock is free again once the submission returned");
}

/// A helper's host wait for its own submission, polled
/// (`SubmitSync::host_wait`, what a frame sender may choose for latency)
/// as blocked: each sees the submission complete, and a submission that
/// cannot complete (it waits for a timeline value nobody has signalled
/// yet) is given up at the bound with `Error::Timeout`, whichever way the
/// host waits.
#[test]
fn a_polled_wait_for_a_submission_sees_it_complete_and_is_bounded() {
    use vk_export::WaitStrategy;
    let ctx = vulkan(None);
    let spin_only = WaitStrategy::Poll {
        spin: Duration::from_secs(10),
        yield_until: Duration::from_secs(10),
        sleep: Duration::from_millis(1),
    };
    let sleep_only = WaitStrategy::Poll {
        spin: Duration::ZERO,
        yield_until: Duration::ZERO,
        sleep: Duration::from_millis(1),
    };
    for strategy in [
        WaitStrategy::Block,
        WaitStrategy::ADAPTIVE,
        spin_only,
        sleep_only,
    ] {
        ctx.submit_and_wait(SubmitSync::new().host_wait(strategy), |_, _| {})
            .unwrap_or_else(|e| panic!("{strategy:?}: {e}"));
        let timeline = TimelineSemaphore::new_local(&ctx).unwrap();
        let bound = Duration::from_millis(50);
        let result = ctx.submit_and_wait(
            SubmitSync::new()
                .wait_timeline(&timeline, 1)
                .timeout(bound)
                .host_wait(strategy),
            |_, _| {},
        );
        assert!(
            matches!(result, Err(Error::Timeout(d)) if d == bound),
            "{strategy:?}: {result:?}"
        );
        // The submission left pending completes once the value comes.
        timeline.signal(1).unwrap();
        timeline
            .wait(1, Duration::from_secs(10), WaitStrategy::ADAPTIVE)
            .unwrap();
    }
}
