//! Regressions of the adversarial review (R1-R6): semaphores in pending wgpu
//! submissions, signal values, refused submissions, the adapter's Drop and
//! re-entrant submissions. No sleeps: every pending submission waits on a
//! gate, a timeline the test signals itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_interop_testkit::Mem;
use cuda_interop_wgpu::{pattern, Error, InteropDevice, TimelinePoint};
use vk_export::{ExportableBuffer, ImageDesc, SubmitSync, TimelineSemaphore, WaitStrategy};

mod common;
use common::{assert_clean, device, Image};

fn idle(device: &InteropDevice) {
    pattern::wait_idle(device, Duration::from_secs(20)).unwrap();
}

/// A command buffer wgpu refuses at submission (a copy within one buffer).
fn invalid_commands(device: &InteropDevice) -> wgpu::CommandBuffer {
    let d = device.device();
    let b = d.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 256,
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let scope = d.push_error_scope(wgpu::ErrorFilter::Validation);
    let mut e = d.create_command_encoder(&Default::default());
    e.copy_buffer_to_buffer(&b, 0, &b, 0, 256);
    let c = e.finish();
    drop(scope.pop());
    c
}

/// R1: dropping a timeline that a pending (gated) wgpu submission signals
/// does not destroy it under the submission.
#[test]
fn a_timeline_dropped_under_a_pending_wgpu_signal_lives_until_it_completes() {
    let _serial = serial();
    let device = device();
    let gate = TimelineSemaphore::new_local(device.context()).unwrap();
    let t = TimelineSemaphore::new_local(device.context()).unwrap();
    device
        .queue()
        .submit_with(
            [],
            &[TimelinePoint::new(&gate, 1)],
            &[TimelinePoint::new(&t, 1)],
        )
        .unwrap();
    drop(t);
    gate.signal(1).unwrap();
    idle(&device);
    assert_clean(&device);
}

/// R2: vk-export learns of wgpu's pending signals: a host signal while one
/// is pending is refused (VUID 03259), and so is a second pending signal of
/// the same value (VUID 03242, then a hang) and a vk-export helper's.
#[test]
fn a_signal_at_or_below_a_pending_wgpu_signal_is_refused() {
    let _serial = serial();
    let device = device();
    let ctx = device.context().clone();
    let gate = TimelineSemaphore::new_local(&ctx).unwrap();
    let t = TimelineSemaphore::new_local(&ctx).unwrap();
    device
        .queue()
        .submit_with(
            [],
            &[TimelinePoint::new(&gate, 1)],
            &[TimelinePoint::new(&t, 3)],
        )
        .unwrap();
    assert!(t.signal(5).is_err(), "a host signal above a pending signal");
    let again = device
        .queue()
        .submit_with([], &[], &[TimelinePoint::new(&t, 3)]);
    assert!(
        matches!(again, Err(Error::Refused(_))),
        "{:?}",
        again.map(drop)
    );
    let buf = ExportableBuffer::<Mem>::new(&ctx, 256).unwrap();
    let helper = ctx.write_buffer(&buf, &[1; 256], SubmitSync::new().signal_timeline(&t, 2));
    assert!(helper.is_err(), "a vk-export signal below wgpu's pending 3");
    gate.signal(1).unwrap();
    t.wait(3, Duration::from_secs(20), WaitStrategy::Block)
        .unwrap();
    idle(&device);
    // Completed: a host signal is accepted again.
    t.signal(5).unwrap();
    assert_clean(&device);
}

/// R2: one call signalling one timeline twice is refused.
#[test]
fn one_timeline_signalled_twice_in_one_call_is_refused() {
    let _serial = serial();
    let device = device();
    let t = TimelineSemaphore::new_local(device.context()).unwrap();
    let r = device.queue().submit_with(
        [],
        &[],
        &[TimelinePoint::new(&t, 3), TimelinePoint::new(&t, 4)],
    );
    assert!(r.is_err());
    idle(&device);
    assert_clean(&device);
}

/// R2: waiting for a value at or above one the same call signals would
/// never complete: refused.
#[test]
fn a_wait_at_or_above_a_signal_of_the_same_call_is_refused() {
    let _serial = serial();
    let device = device();
    let t = TimelineSemaphore::new_local(device.context()).unwrap();
    for (wait, signal) in [(1, 1), (2, 1)] {
        let r = device.queue().submit_with(
            [],
            &[TimelinePoint::new(&t, wait)],
            &[TimelinePoint::new(&t, signal)],
        );
        assert!(matches!(r, Err(Error::Refused(_))), "{wait} {signal}");
    }
    // A wait below the signal is fine.
    t.signal(1).unwrap();
    device
        .queue()
        .submit_with(
            [],
            &[TimelinePoint::new(&t, 1)],
            &[TimelinePoint::new(&t, 2)],
        )
        .unwrap();
    t.wait(2, Duration::from_secs(20), WaitStrategy::Block)
        .unwrap();
    idle(&device);
    assert_clean(&device);
}

/// R3: a submission wgpu refuses (its error handler returns) returns `Err`
/// and leaves no semaphore staged for the next submission, which would
/// otherwise carry the dropped semaphore.
#[test]
fn a_refused_submission_leaves_no_semaphore_staged() {
    let _serial = serial();
    let device = device();
    device
        .device()
        .on_uncaptured_error(Arc::new(|_| { /* expected: the invalid copy */ }));
    let t = TimelineSemaphore::new_local(device.context()).unwrap();
    let r = device.queue().submit_with(
        [invalid_commands(&device)],
        &[],
        &[TimelinePoint::new(&t, 1)],
    );
    assert!(matches!(r, Err(Error::Wgpu(_))), "{:?}", r.map(drop));
    drop(t);
    device.queue().submit([]).unwrap();
    idle(&device);
    assert_clean(&device);
}

/// R3: the same when wgpu's default error handler panics inside the
/// submission (caught): unstaged on unwind.
#[test]
fn a_submission_that_panics_leaves_no_semaphore_staged() {
    let _serial = serial();
    let device = device();
    let gate = TimelineSemaphore::new_local(device.context()).unwrap();
    let t = TimelineSemaphore::new_local(device.context()).unwrap();
    let commands = invalid_commands(&device);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        device.queue().submit_with(
            [commands],
            &[TimelinePoint::new(&gate, 1)],
            &[TimelinePoint::new(&t, 1)],
        )
    }));
    assert!(r.is_err(), "wgpu's default handler panics");
    drop(gate);
    drop(t);
    device.queue().submit([]).unwrap();
    idle(&device);
    assert_clean(&device);
}

/// Held by every test of this binary, one at a time: some read the
/// process-wide `vk_export::drop_errors()` count (one leaks on purpose and
/// counts it, another asserts its drops count nothing), and any test's
/// teardown beside them can land in their window (a CI flake while only two
/// of them took it).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// R5: the adapter's Drop with a submission that never completes (a wait on
/// a gate nobody signals yet) returns within a bound, leaking (reported)
/// rather than waiting for ever; then the gate opens. In a process of its
/// own: what it leaks on purpose may be reported after it returns, in
/// another test's `drop_errors()` window.
#[test]
fn dropping_the_adapter_under_a_never_completing_submission_returns() {
    let _serial = serial();
    cuda_interop_testkit::child::run_marked(
        "child_dropping_the_adapter_under_a_never_completing_submission",
        "CIW_R5_CHILD",
    );
}

#[test]
#[ignore = "a child process of dropping_the_adapter_under_a_never_completing_submission_returns"]
fn child_dropping_the_adapter_under_a_never_completing_submission() {
    cuda_interop_testkit::child::started_as_child("CIW_R5_CHILD");
    let device = device();
    let gate = TimelineSemaphore::new_local(device.context()).unwrap();
    device
        .queue()
        .submit_with([], &[TimelinePoint::new(&gate, 1)], &[])
        .unwrap();
    let before = vk_export::drop_errors();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(device);
        let _ = tx.send(());
    });
    let returned = rx.recv_timeout(vk_export::DROP_WAIT + Duration::from_secs(60));
    gate.signal(1).unwrap();
    assert!(returned.is_ok(), "the adapter's Drop did not return");
    assert!(vk_export::drop_errors() > before, "the leak is reported");
}

/// R4: `Texture::destroy` on one thread while the adapter drops on another
/// with a (gated) submission that writes the texture pending: the image is
/// not freed under the GPU (the Drop keeps wgpu's queue until wgpu is idle).
#[test]
fn a_texture_destroyed_while_the_adapter_drops_is_not_freed_under_the_gpu() {
    let _serial = serial();
    let device = device();
    let image = Image::new(device.context(), ImageDesc::new_2d(64, 64)).unwrap();
    // SAFETY: only wgpu uses the image while the texture lives.
    let texture = unsafe { device.texture_from_image(&image) }.unwrap();
    let gate = TimelineSemaphore::new_local(device.context()).unwrap();
    let buf = ExportableBuffer::<Mem>::new(device.context(), 4096).unwrap();
    let wbuf = device.buffer_from_buffer(&buf).unwrap();
    let mut e = device.device().create_command_encoder(&Default::default());
    e.clear_buffer(&wbuf, 0, None);
    let clear = e.finish();
    device
        .queue()
        .submit_with(
            [pattern::encode_pattern(&device, &texture, 1), clear],
            &[TimelinePoint::new(&gate, 1)],
            &[],
        )
        .unwrap();
    let before = vk_export::drop_errors();
    let drop_started = std::time::Instant::now();
    let dropping = std::thread::spawn(move || drop(device));
    texture.destroy();
    wbuf.destroy();
    drop(texture);
    drop(wbuf);
    drop(image);
    drop(buf);
    gate.signal(1).unwrap();
    let gate_opened = drop_started.elapsed();
    dropping.join().unwrap();
    // The Drop waits for wgpu's last submission up to DROP_WAIT, then leaks
    // it (reported): never a free under the GPU either way. Which one
    // happens depends on how soon this thread opened the gate (a machine
    // under load can take seconds): with the gate opened well within the
    // bound, the submission completed and nothing leaked; later, a leak
    // report is the right outcome too.
    if gate_opened < vk_export::DROP_WAIT / 2 {
        assert_eq!(
            vk_export::drop_errors(),
            before,
            "the gate opened {gate_opened:?} after the drop began: the Drop should have waited"
        );
    }
}

/// R6: a wgpu error handler that submits again on the same thread gets
/// `Err` instead of waiting for the lock its own thread holds.
#[test]
fn an_error_handler_that_submits_again_is_refused() {
    let _serial = serial();
    let device = Arc::new(device());
    let seen: Arc<Mutex<Option<bool>>> = Arc::default();
    let weak = Arc::downgrade(&device);
    let record = seen.clone();
    device.device().on_uncaptured_error(Arc::new(move |_| {
        if let Some(d) = weak.upgrade() {
            let r = d.queue().submit([]);
            *record.lock().unwrap() = Some(r.is_err());
        }
    }));
    let _ = device.queue().submit([invalid_commands(&device)]);
    assert_eq!(*seen.lock().unwrap(), Some(true));
    idle(&device);
    assert_clean(&device);
}

/// Issue 28 (7): a submission wgpu refuses that names one timeline twice
/// (two wait values; a wait and a signal; both) is counted as not made at
/// all, entry by entry: no signal of it is recorded as pending, so every
/// timeline it named takes host signals and submissions afterwards (and
/// the gate it waited on is not left staged for the next submission).
#[test]
fn a_refused_submission_naming_one_timeline_twice_leaves_every_timeline_usable() {
    let _serial = serial();
    let device = device();
    device
        .device()
        .on_uncaptured_error(Arc::new(|_| { /* expected: the invalid copy */ }));
    let ctx = device.context();
    // (waits, signals) as indices into [gate, t]: gate waited twice with t
    // signalled; gate waited and signalled; gate waited twice and signalled.
    type Points = &'static [(usize, u64)];
    let cases: [(Points, Points); 3] = [
        (&[(0, 1), (0, 2)], &[(1, 1)]),
        (&[(0, 1)], &[(0, 2)]),
        (&[(0, 1), (0, 2)], &[(0, 3), (1, 1)]),
    ];
    for (case, (waits, signals)) in cases.iter().enumerate() {
        let timelines = [
            TimelineSemaphore::new_local(ctx).unwrap(),
            TimelineSemaphore::new_local(ctx).unwrap(),
        ];
        let points = |of: &[(usize, u64)]| -> Vec<TimelinePoint<'_>> {
            of.iter()
                .map(|&(i, v)| TimelinePoint::new(&timelines[i], v))
                .collect()
        };
        let r = device.queue().submit_with(
            [invalid_commands(&device)],
            &points(waits),
            &points(signals),
        );
        match r {
            Err(Error::Wgpu(m)) => assert!(m.contains("refused"), "case {case}: {m}"),
            r => panic!("case {case}: {:?}", r.map(drop)),
        }
        for (i, t) in timelines.iter().enumerate() {
            // A host signal: refused while a signal is (wrongly) pending.
            t.signal(1)
                .unwrap_or_else(|e| panic!("case {case}, timeline {i}: host signal: {e}"));
            // A submission that signals it, and completes (no stale wait
            // on a value nobody signals is staged in front of it).
            device
                .queue()
                .submit_with([], &[], &[TimelinePoint::new(t, 2)])
                .unwrap_or_else(|e| panic!("case {case}, timeline {i}: submission: {e}"));
            t.wait(2, Duration::from_secs(20), WaitStrategy::Block)
                .unwrap();
        }
    }
    // Accepted, the same two waits gate the submission until the higher.
    let gate = TimelineSemaphore::new_local(ctx).unwrap();
    let t = TimelineSemaphore::new_local(ctx).unwrap();
    device
        .queue()
        .submit_with(
            [],
            &[TimelinePoint::new(&gate, 1), TimelinePoint::new(&gate, 2)],
            &[TimelinePoint::new(&t, 1)],
        )
        .unwrap();
    gate.signal(2).unwrap();
    t.wait(1, Duration::from_secs(20), WaitStrategy::Block)
        .unwrap();
    idle(&device);
    assert_clean(&device);
}

/// `submit_with` takes the timelines' signal locks before the shared
/// queue's lock, as vk-export's own submissions do: one thread signalling a
/// timeline through wgpu and another signalling the same timeline through
/// vk-export (a clear) both finish. In the other order the two could wait
/// for each other for good (found in the vulkano adapter, the same shape);
/// the bound only turns such a hang into a failure.
#[test]
fn wgpu_and_vk_export_signalling_one_timeline_do_not_deadlock() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const EACH: u64 = 200;
    let _serial = serial();
    let device = Arc::new(device());
    let timeline = Arc::new(TimelineSemaphore::new_local(device.context()).unwrap());
    let next = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let by_wgpu = {
        let (device, timeline, next, tx) =
            (device.clone(), timeline.clone(), next.clone(), tx.clone());
        std::thread::spawn(move || {
            for _ in 0..EACH {
                let v = next.fetch_add(1, Ordering::SeqCst) + 1;
                // Refused by the bookkeeping if the other thread signalled
                // higher already: either way it returns.
                let _ = device
                    .queue()
                    .submit_with([], &[], &[TimelinePoint::new(&timeline, v)]);
            }
            tx.send(()).unwrap();
        })
    };
    let by_vk_export = {
        let (device, timeline, next) = (device.clone(), timeline.clone(), next.clone());
        std::thread::spawn(move || {
            let ctx = device.context().clone();
            let image = Image::new(&ctx, ImageDesc::new_2d(4, 4)).unwrap();
            for _ in 0..EACH {
                let v = next.fetch_add(1, Ordering::SeqCst) + 1;
                let _ = ctx.clear_image(
                    &image,
                    vk_export::ash::vk::ClearColorValue { float32: [0.0; 4] },
                    SubmitSync::new().signal_timeline(&timeline, v),
                );
            }
            tx.send(()).unwrap();
        })
    };
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(120))
            .expect("both threads finish: no lock-order deadlock");
    }
    by_wgpu.join().unwrap();
    by_vk_export.join().unwrap();
    idle(&device);
    assert_clean(&device);
}
