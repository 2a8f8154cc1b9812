//! Threads and CUDA contexts: handles work and drop on any thread whatever
//! context is current (fake and real driver), a context guard restores the
//! previous context after a pop mismatch, and a sticky fault poisons the
//! process and later calls say so.
//!
//! The tests ignored as "needs an NVIDIA GPU" need the real CUDA driver; on the
//! GPU machine: `cargo test -p cuda-interop-tests --test context -- --ignored
//! --skip child_`. The others run everywhere (lavapipe, the fake driver).
//!
//! The fake-driver tests run their body in a `child_fake_*` process whose
//! `libcuda.so.1` is the testkit's fake (`cuda_interop_testkit::fake`): what
//! they show is what the crate does before and around the driver, never the
//! real driver's answer (that is the GPU tests').
//!
//! `child_*` tests are entry points of child processes, run by their parent
//! test of this binary by exact name (`cuda_interop_testkit::child`); they fail
//! when run by hand.
//!
//! Fd checks: some tests compare the fd table or count open fds, which are
//! process-wide, so every test of this binary that is not a `child_*` entry
//! point holds `fds::lock()` for its whole run (a `child_*` test runs alone in
//! a process of its own).

use std::ffi::{c_uint, c_void};

use cuda_interop::{drop_errors, kernels, sys, CudaDevice, Error as CudaError, Module, Stream};
use cuda_interop_testkit::gpu::{current, driver_function, pair};
use cuda_interop_testkit::{assert_no_validation_errors, child, fake, fds, pattern, TIMEOUT};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, DeviceLocal};
use vk_export::{ExportableBuffer, ExportableImage, ImageDesc, SubmitSync, TimelineSemaphore};

/// Cases 43, 44, against the fake driver (which refuses any call without a
/// current context, and any call on a handle outside the context that made
/// it): handles used on a thread with no context, and on a thread where
/// another context is current, work in the device's primary context, and
/// afterwards the thread's previous context (none, or the other one) is
/// current again; imports, mappings and semaphores dropped on fresh threads
/// are destroyed in the right context, with no drop error.
#[test]
fn handles_work_and_drop_on_any_thread_whatever_context_is_current() {
    let _fds = fds::lock();
    fake::run("child_fake_threads_and_contexts", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of context.rs, with a fake libcuda: run by handles_work_and_drop_on_any_thread_whatever_context_is_current"]
fn child_fake_threads_and_contexts() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let primary = fake::shown(cuda.raw_context());
    let errors = cuda_interop::drop_errors();
    assert_eq!(fake.current(), 0, "calls leave no context current");
    // SAFETY: the driver is the fake: it records, holds the fds, reads nothing.
    let (image, buffer, timeline) = unsafe {
        (
            cuda.import_image_fd(
                fake::image::<Rgba8Unorm, usage::Storage>([16, 16, 1], 1, 1, false),
                fake::some_fd(),
            ),
            cuda.import_buffer_fd(fake::buffer(false), fake::some_fd()),
            cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()),
        )
    };
    let (image, mut buffer, timeline) = (
        image.map_err(|e| e.error).unwrap(),
        buffer.map_err(|e| e.error).unwrap(),
        timeline.map_err(|e| e.error).unwrap(),
    );
    let driver = sys::Driver::global().unwrap();
    let push = driver.fns().cuCtxPushCurrent.unwrap();
    let pop = driver.fns().cuCtxPopCurrent.unwrap();
    // Another context, as another library would make current: the fake
    // accepts any non-null handle.
    let intruder = 0xdead_0000usize;
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(fake.current(), 0);
            let mapped = buffer.map().unwrap();
            assert_eq!(
                fake.last("cuExternalMemoryGetMappedBuffer").get("ctx"),
                primary
            );
            assert_eq!(fake.current(), 0, "no context left current");
            drop(mapped);
            assert_eq!(fake.last("cuMemFree").get("ctx"), primary);
            assert_eq!(fake.current(), 0);
        })
        .join()
        .unwrap();
        s.spawn(|| {
            // SAFETY: pushes a handle on this thread's (fake) context stack;
            // popped below.
            let pushed = unsafe { push(intruder as sys::CUcontext) };
            assert_eq!(pushed, sys::CUresult::CUDA_SUCCESS);
            let array = image.map_array().unwrap();
            assert_eq!(
                fake.last("cuExternalMemoryGetMappedMipmappedArray")
                    .get("ctx"),
                primary
            );
            assert_eq!(
                fake.current(),
                intruder,
                "the other context is current again"
            );
            let stream = Stream::new(&cuda).unwrap();
            timeline.signal(&stream, 1).unwrap();
            assert_eq!(
                fake.last("cuSignalExternalSemaphoresAsync").get("ctx"),
                primary
            );
            drop(array);
            drop(stream);
            assert_eq!(fake.last("cuMipmappedArrayDestroy").get("ctx"), primary);
            assert_eq!(fake.current(), intruder);
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops this thread's stack; writes one handle.
            assert_eq!(unsafe { pop(&mut popped) }, sys::CUresult::CUDA_SUCCESS);
            assert_eq!(popped as usize, intruder);
        })
        .join()
        .unwrap();
    });
    // Dropped on fresh threads, one with the other context current.
    std::thread::spawn(move || drop(timeline)).join().unwrap();
    assert_eq!(fake.last("cuDestroyExternalSemaphore").get("ctx"), primary);
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: as above; popped below.
            let pushed = unsafe { push(intruder as sys::CUcontext) };
            assert_eq!(pushed, sys::CUresult::CUDA_SUCCESS);
            drop(image);
            assert_eq!(fake.current(), intruder);
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops this thread's stack; writes one handle.
            assert_eq!(unsafe { pop(&mut popped) }, sys::CUresult::CUDA_SUCCESS);
        })
        .join()
        .unwrap();
    });
    assert_eq!(fake.last("cuDestroyExternalMemory").get("ctx"), primary);
    std::thread::spawn(move || drop(buffer)).join().unwrap();
    assert_eq!(fake.calls("cuDestroyExternalMemory").len(), 2);
    assert!(!fake.log().contains("error="), "{}", fake.log());
    assert_eq!(cuda_interop::drop_errors(), errors, "no destroy failed");
    assert_eq!(fake.all_live(), []);
}

/// A kernel writes to an illegal address in a child process: the error is
/// reported, and every later call says the context is poisoned.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test context -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn a_sticky_fault_poisons_the_process_and_later_calls_say_so() {
    let _fds = fds::lock();
    let stdout = child::run_marked("child_poisoned", "CUDA_INTEROP_POISON_CHILD");
    assert!(stdout.contains("poisoned:"), "{stdout}");
}

#[test]
#[ignore = "entry point of the child process of a_sticky_fault_poisons_the_process_and_later_calls_say_so"]
fn child_poisoned() {
    assert!(
        std::env::var_os("CUDA_INTEROP_POISON_CHILD").is_some(),
        "started by the parent test"
    );
    let (_ctx, cuda) = pair();
    let module = Module::load_ptx(&cuda, kernels::PTX).unwrap();
    let store = module.function("store_u32").unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let (mut ptr, mut value) = (16u64, 7u32);
    // SAFETY: deliberately not: the address is illegal. This is the fault
    // being injected, in a process of its own; the GPU reports it.
    unsafe {
        stream.launch(
            &store,
            [1, 1, 1],
            [1, 1, 1],
            0,
            &mut [
                (&mut ptr as *mut u64).cast(),
                (&mut value as *mut u32).cast(),
            ],
        )
    }
    .unwrap();
    let err = stream.synchronize(TIMEOUT).unwrap_err();
    println!("fault: {err}");
    assert!(
        err.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{err}"
    );
    let later = cuda.memory_info().unwrap_err();
    assert!(matches!(later, CudaError::Poisoned(_)), "{later}");
    println!("poisoned: {later}");
}

/// Code inside a guard's scope creates (and so pushes) another context and
/// leaves it current: the guard's drop reports the unbalanced stack, leaves
/// that context current, and removes its own from beneath it, so once the
/// other context is popped the previous context is current again.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test context -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn a_context_guard_restores_the_previous_context_after_a_pop_mismatch() {
    let _fds = fds::lock();
    child::run_marked("child_context_pop_mismatch", "CUDA_INTEROP_CONTEXT_CHILD");
}

#[test]
#[ignore = "entry point of the child process of a_context_guard_restores_the_previous_context_after_a_pop_mismatch"]
fn child_context_pop_mismatch() {
    assert!(
        std::env::var_os("CUDA_INTEROP_CONTEXT_CHILD").is_some(),
        "started by the parent test"
    );
    type CtxCreate =
        unsafe extern "C" fn(*mut sys::CUcontext, c_uint, sys::CUdevice) -> sys::CUresult;
    type CtxDestroy = unsafe extern "C" fn(sys::CUcontext) -> sys::CUresult;
    let (_ctx, cuda) = pair();
    // SAFETY: cuCtxCreate_v2's C signature is CUresult (CUcontext *,
    // unsigned int, CUdevice).
    let create = unsafe {
        std::mem::transmute::<*mut c_void, CtxCreate>(driver_function(c"cuCtxCreate_v2"))
    };
    // SAFETY: cuCtxDestroy_v2, CUresult (CUcontext).
    let destroy = unsafe {
        std::mem::transmute::<*mut c_void, CtxDestroy>(driver_function(c"cuCtxDestroy_v2"))
    };
    let driver = sys::Driver::global().unwrap();
    let get_current = driver.fns().cuCtxGetCurrent.unwrap();
    let pop = driver.fns().cuCtxPopCurrent.unwrap();
    let current = || {
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle.
        let status = unsafe { get_current(&mut context) };
        assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        context
    };
    let before = current();
    assert!(
        before.is_null(),
        "a fresh test thread has no current context"
    );
    let errors_before = drop_errors();

    let mut intruder: sys::CUcontext = std::ptr::null_mut();
    {
        let guard = cuda.enter().unwrap();
        assert_eq!(current(), cuda.raw_context());
        // SAFETY: writes one context handle; cuCtxCreate pushes the new
        // context on this thread's stack, above the guard's.
        let status = unsafe { create(&mut intruder, 0, cuda.raw_device()) };
        assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        assert_eq!(current(), intruder);
        drop(guard);
    }
    let errors_after = drop_errors();
    println!(
        "primary {:?}, intruder {intruder:?}; drop errors {errors_before} -> {errors_after}",
        cuda.raw_context()
    );
    assert_eq!(
        errors_after,
        errors_before + 1,
        "the guard reported the unbalanced stack"
    );
    assert_eq!(current(), intruder, "the intruder was pushed back, current");
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops this thread's stack; writes one handle.
    let status = unsafe { pop(&mut popped) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
    assert_eq!(popped, intruder);
    assert_eq!(
        current(),
        before,
        "beneath the intruder, the previous context: the guard removed its own"
    );
    // SAFETY: the context this test created, popped, used by nothing else.
    let status = unsafe { destroy(intruder) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);

    // Balanced use afterwards: nothing reported, the previous context restored.
    {
        let _guard = cuda.enter().unwrap();
        assert_eq!(current(), cuda.raw_context());
        let (free, total) = cuda.memory_info().unwrap();
        assert!(free > 0 && free <= total);
    }
    assert_eq!(current(), before);
    assert_eq!(drop_errors(), errors_after);

    // Code inside the scope pops the guard's own context: the guard finds
    // nothing to pop, reports it, and pushes nothing.
    {
        let guard = cuda.enter().unwrap();
        // SAFETY: pops this thread's stack; writes one handle.
        let status = unsafe { pop(&mut popped) };
        assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        assert_eq!(popped, cuda.raw_context());
        drop(guard);
    }
    println!(
        "after an inner pop of the guard's context: {} drop errors",
        drop_errors()
    );
    assert!(drop_errors() > errors_after, "the empty stack was reported");
    assert_eq!(current(), before);
    println!("the guard restored the previous context after a pop mismatch");
}

/// Cases 43, 44: handles used on a thread with no context and on a thread
/// where another context is current, and dropped on fresh threads. Run in a
/// child process (it creates a context of its own).
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test context -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn handles_work_and_drop_on_threads_with_no_or_another_context() {
    let _fds = fds::lock();
    let stdout = child::run_with(
        "child_threads_and_contexts",
        &[("CUDA_INTEROP_FAULTS_CHILD", "1")],
    );
    assert!(stdout.contains("every thread"), "{stdout}");
}

#[test]
#[ignore = "entry point of the child process of handles_work_and_drop_on_threads_with_no_or_another_context"]
fn child_threads_and_contexts() {
    child::started_as_child("CUDA_INTEROP_FAULTS_CHILD");
    type CtxCreate =
        unsafe extern "C" fn(*mut sys::CUcontext, c_uint, sys::CUdevice) -> sys::CUresult;
    type CtxDestroy = unsafe extern "C" fn(sys::CUcontext) -> sys::CUresult;
    let (ctx, cuda) = pair();
    // SAFETY: cuCtxCreate_v2's C signature is CUresult (CUcontext *,
    // unsigned int, CUdevice).
    let create = unsafe {
        std::mem::transmute::<*mut c_void, CtxCreate>(driver_function(c"cuCtxCreate_v2"))
    };
    // SAFETY: cuCtxDestroy_v2, CUresult (CUcontext).
    let destroy = unsafe {
        std::mem::transmute::<*mut c_void, CtxDestroy>(driver_function(c"cuCtxDestroy_v2"))
    };
    let errors = drop_errors();
    let (w, h) = (64u32, 64u32);
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
    let pixels = pattern((w * h * 4) as usize, 43);
    ctx.write_image(&image, 0, 0, &pixels, SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, 1 << 20).unwrap();
    let bytes = pattern(1 << 20, 44);
    ctx.write_buffer(&buffer, &bytes, SubmitSync::new())
        .unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
    let imported_image = cuda.import_image(&image).unwrap();
    let mut imported_buffer = cuda.import_buffer(&buffer).unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let imported_timeline = cuda.import_semaphore(&timeline).unwrap();
    std::thread::scope(|s| {
        // No context current.
        s.spawn(|| {
            assert!(current().is_null(), "a fresh thread has no context");
            let mapped = imported_buffer.map().unwrap();
            let stream = Stream::new(&cuda).unwrap();
            let mut out = vec![0u8; 1 << 20];
            mapped.copy_to_host(&stream, &mut out).unwrap();
            assert!(out == bytes);
            assert!(current().is_null(), "still none afterwards");
            drop((mapped, stream));
            assert!(current().is_null());
        })
        .join()
        .unwrap();
        // Another context current.
        s.spawn(|| {
            let mut intruder: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: writes one context handle; cuCtxCreate pushes the new
            // context on this thread's stack (it is current afterwards);
            // destroyed below.
            let status = unsafe { create(&mut intruder, 0, cuda.raw_device()) };
            assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
            assert_eq!(current(), intruder);
            {
                let array = imported_image.map_array().unwrap();
                let level = array.level(0).unwrap();
                let stream = Stream::new(&cuda).unwrap();
                let mut out = vec![0u8; level.byte_len().unwrap()];
                level.copy_to_host(&stream, &mut out).unwrap();
                assert!(out == pixels);
                imported_timeline.signal(&stream, 1).unwrap();
                stream.synchronize(TIMEOUT).unwrap();
                assert_eq!(current(), intruder, "the other context is current again");
            }
            assert_eq!(current(), intruder, "also after the drops");
            // SAFETY: the context this thread created, current and used by
            // nothing else; destroying it pops it.
            let status = unsafe { destroy(intruder) };
            assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        })
        .join()
        .unwrap();
    });
    timeline
        .wait(1, TIMEOUT, vk_export::WaitStrategy::ADAPTIVE)
        .unwrap();
    // Dropped on fresh threads that never touched CUDA.
    std::thread::spawn(move || drop(imported_timeline))
        .join()
        .unwrap();
    std::thread::spawn(move || drop(imported_image))
        .join()
        .unwrap();
    std::thread::spawn(move || drop(imported_buffer))
        .join()
        .unwrap();
    assert_eq!(drop_errors(), errors, "every destroy succeeded");
    cuda.memory_info().unwrap();
    println!("every thread: the work was exact and the previous context current again");
    assert_no_validation_errors(&ctx);
}
