//! Issue 18 item 9: two handles of one timeline in one process
//! ([`Semaphore::import_from`](vk_export::Semaphore::import_from)) share one
//! signal check, so "check and signal are one atomic step" holds per
//! semaphore, not per handle. Needs exportable timeline semaphores (not on
//! lavapipe): the GPU bundle runs it with `--ignored`.

use std::sync::{Arc, Barrier};
use std::thread;

use cuda_interop_testkit::vulkan;
use vk_export::{SubmitSync, TimelineSemaphore};

#[test]
#[ignore = "needs exportable timeline semaphores (NVIDIA): run by the GPU bundle"]
fn two_handles_of_one_timeline_share_one_signal_check() {
    let ctx = vulkan(None);
    let original = Arc::new(TimelineSemaphore::new(&ctx).unwrap());
    let second = Arc::new(TimelineSemaphore::import_from(&ctx, &original).unwrap());
    const ROUNDS: u64 = 2000;
    let barrier = Arc::new(Barrier::new(2));
    let racer = |handle: Arc<TimelineSemaphore>, barrier: Arc<Barrier>| {
        thread::spawn(move || {
            let mut won = Vec::new();
            for value in 1..=ROUNDS {
                barrier.wait();
                won.push(handle.signal(value).is_ok());
                barrier.wait();
            }
            won
        })
    };
    let a = racer(original.clone(), barrier.clone());
    let b = racer(second.clone(), barrier);
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    let both = a.iter().zip(&b).filter(|(x, y)| **x && **y).count();
    let neither = a.iter().zip(&b).filter(|(x, y)| !**x && !**y).count();
    println!(
        "{ROUNDS} rounds: both handles signalled the same value {both} times, neither {neither}; \
         validation errors {}",
        ctx.validation_errors()
    );
    assert_eq!(both, 0, "one value signalled twice through two handles");
    assert_eq!(neither, 0, "a round where no signal went through");
    assert_eq!(original.value().unwrap(), ROUNDS);
    // One submission may not signal one semaphore twice, through whichever
    // handles: refused, and nothing deadlocks on the shared lock.
    let err = ctx
        .submit_and_wait(
            SubmitSync::new()
                .signal_timeline(&original, ROUNDS + 1)
                .signal_timeline(&second, ROUNDS + 2),
            |_, _| {},
        )
        .unwrap_err();
    println!("{err}");
}
