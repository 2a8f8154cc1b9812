//! Soundness rules of issue 18 that live on the Vulkan side: every helper's
//! bound holds, whatever the caller asks for.

use std::time::Duration;

use cuda_interop_tests::{assert_no_validation_errors, vulkan};
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
