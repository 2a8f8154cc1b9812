//! Contexts made and used on several threads at once, each with exportable
//! timeline semaphores: every failure is a typed error (no crash, no hang),
//! and the counts say whether the transfer queue changes what the driver
//! does. GPU run 18a saw `vkCreateSemaphore` fail with
//! `ERROR_INITIALIZATION_FAILED` ("Failed to allocate semaphore device
//! memory", from the NVIDIA driver) in 1 of 3 parallel runs of
//! `semaphore_handles` (3 tests, 4 contexts at once), never in serial runs.
//! Needs exportable timeline semaphores (not on lavapipe). GPU run 18b: the
//! process **segfaulted** in its first pass (transfer queue off, validation
//! off: four threads each creating and dropping instances, devices and
//! exportable timelines), before any line was printed; not isolated yet
//! (the driver or the loader under concurrent instance creation and
//! teardown, or this crate). So it is not in the GPU bundle's list until it
//! is; run it by hand: `test-concurrent_contexts --ignored --nocapture`.

use std::sync::{Arc, Barrier};
use std::thread;

use vk_export::{
    Context, Error, HeadlessOptions, SubmitSync, TimelineSemaphore, TransferQueue, Validation,
};

const THREADS: usize = 4;
const ROUNDS: usize = 10;
const SEMAPHORES: usize = 8;

/// One thread's work: a context, `SEMAPHORES` exportable timelines, a
/// signal through a submission and on the host, and drops; the errors.
fn one_round(transfer: TransferQueue) -> Vec<String> {
    let mut errors = Vec::new();
    let ctx = match Context::headless(&HeadlessOptions {
        validation: Validation::Off,
        transfer_queue: transfer,
        ..HeadlessOptions::default()
    }) {
        Ok(c) => c,
        Err(e) => return vec![format!("context: {e}")],
    };
    let mut semaphores = Vec::new();
    for _ in 0..SEMAPHORES {
        match TimelineSemaphore::new(&ctx) {
            Ok(s) => semaphores.push(s),
            Err(e @ Error::Vulkan { .. }) => errors.push(format!("semaphore: {e}")),
            Err(e) => panic!("not a Vulkan error: {e}"),
        }
    }
    for s in &semaphores {
        let sync = SubmitSync::new().signal_timeline(s, 1);
        if let Err(e) = ctx.submit_and_wait(sync, |_, _| {}) {
            errors.push(format!("submit: {e}"));
        }
        if let Err(e) = s.signal(2) {
            errors.push(format!("host signal: {e}"));
        }
    }
    errors
}

fn run(transfer: TransferQueue) -> Vec<String> {
    let start = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                (0..ROUNDS)
                    .flat_map(|_| one_round(transfer))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().expect("no panic"))
        .collect()
}

#[test]
#[ignore = "needs exportable timeline semaphores (NVIDIA); segfaulted on the H200 (run 18b), not isolated: run by hand"]
fn contexts_on_four_threads_at_once_fail_only_with_typed_errors() {
    for transfer in [TransferQueue::Off, TransferQueue::IfAvailable] {
        let errors = run(transfer);
        println!(
            "{transfer:?}: {THREADS} threads x {ROUNDS} contexts x {SEMAPHORES} exportable timelines: {} errors{}",
            errors.len(),
            errors
                .first()
                .map(|e| format!(", first: {e}"))
                .unwrap_or_default()
        );
    }
}
