//! DLPack structures and the hand-out of tensors, without a GPU: layout
//! against `dlpack.h` 1.0 (64-bit), shapes and strides, bounds, and the
//! deleter running exactly once whoever lets go first.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuda_interop::dlpack::{
    DLDataType, DLDataTypeCode, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion,
    DLTensor, ManagedTensor, DLPACK_FLAG_READ_ONLY, DL_CPU,
};
use cuda_interop::Error;

#[test]
fn layout_matches_dlpack_h() {
    assert_eq!(size_of::<DLDevice>(), 8);
    assert_eq!(size_of::<DLDataType>(), 4);
    assert_eq!(size_of::<DLPackVersion>(), 8);
    assert_eq!(offset_of!(DLTensor, data), 0);
    assert_eq!(offset_of!(DLTensor, device), 8);
    assert_eq!(offset_of!(DLTensor, ndim), 16);
    assert_eq!(offset_of!(DLTensor, dtype), 20);
    assert_eq!(offset_of!(DLTensor, shape), 24);
    assert_eq!(offset_of!(DLTensor, strides), 32);
    assert_eq!(offset_of!(DLTensor, byte_offset), 40);
    assert_eq!(size_of::<DLTensor>(), 48);
    assert_eq!(offset_of!(DLManagedTensorVersioned, version), 0);
    assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
    assert_eq!(offset_of!(DLManagedTensorVersioned, deleter), 16);
    assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
    assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
    assert_eq!(size_of::<DLManagedTensorVersioned>(), 80);
    assert_eq!(offset_of!(DLManagedTensor, dl_tensor), 0);
    assert_eq!(offset_of!(DLManagedTensor, manager_ctx), 48);
    assert_eq!(offset_of!(DLManagedTensor, deleter), 56);
    assert_eq!(size_of::<DLManagedTensor>(), 64);
}

/// Counts drops of the owner.
struct Owner(Arc<AtomicUsize>);
impl Drop for Owner {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

const U8: DLDataType = DLDataType::scalar(DLDataTypeCode::UInt, 8);
const CPU: DLDevice = DLDevice {
    device_type: DL_CPU,
    device_id: 0,
};

fn tensor(
    memory: &mut [u8],
    shape: &[i64],
    strides: Option<&[i64]>,
    read_only: bool,
) -> (Result<ManagedTensor, Error>, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    // SAFETY: `memory` outlives every use in these tests (each tensor is
    // handed out and deleted, or dropped, before it goes).
    let t = unsafe {
        ManagedTensor::new(
            Box::new(Owner(drops.clone())),
            memory.as_mut_ptr() as u64,
            memory.len() as u64,
            CPU,
            U8,
            shape,
            strides,
            read_only,
        )
    };
    (t, drops)
}

#[test]
fn dense_and_pitched_strides() {
    let mut memory = vec![0u8; 64 * 48 * 4];
    let (t, _) = tensor(&mut memory, &[48, 64, 4], None, false);
    let t = t.unwrap();
    let dl = t.tensor();
    assert_eq!(dl.ndim, 3);
    // SAFETY: three strides, kept alive by `t`.
    let strides = unsafe { std::slice::from_raw_parts(dl.strides, 3) };
    assert_eq!(strides, [256, 4, 1]);
    // A linear image with a 320-byte row pitch for 64 RGBA8 texels.
    let mut memory = vec![0u8; 320 * 48];
    let (t, _) = tensor(&mut memory, &[48, 64, 4], Some(&[320, 4, 1]), false);
    assert!(t.is_ok());
    // One byte short of the last row's last texel.
    let mut memory = vec![0u8; 320 * 47 + 64 * 4 - 1];
    let (t, drops) = tensor(&mut memory, &[48, 64, 4], Some(&[320, 4, 1]), false);
    assert!(matches!(t, Err(Error::InvalidArgument(_))), "{t:?}");
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "a refused tensor drops its owner"
    );
    for (shape, strides) in [
        (&[0i64, 4][..], None),
        (&[4, 4][..], Some(&[4i64][..])),
        (&[4, 4][..], Some(&[0i64, 1][..])),
        (&[i64::MAX, 2][..], None),
    ] {
        let mut memory = vec![0u8; 64];
        assert!(
            tensor(&mut memory, shape, strides, false).0.is_err(),
            "{shape:?} {strides:?}"
        );
    }
}

#[test]
fn the_deleter_runs_exactly_once_whoever_lets_go_first() {
    let mut memory = vec![0u8; 16];
    // Versioned: the consumer deletes.
    let (t, drops) = tensor(&mut memory, &[16], None, true);
    let managed = t.unwrap().into_versioned();
    assert_eq!(drops.load(Ordering::SeqCst), 0, "the consumer owns it now");
    // SAFETY: made by into_versioned just above; read, then deleted once.
    unsafe {
        assert_eq!((*managed).version, DLPackVersion { major: 1, minor: 0 });
        assert_eq!(
            (*managed).flags & DLPACK_FLAG_READ_ONLY,
            DLPACK_FLAG_READ_ONLY
        );
        ((*managed).deleter.unwrap())(managed);
    }
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    // Legacy: the consumer deletes.
    let (t, drops) = tensor(&mut memory, &[16], None, false);
    let managed = t.unwrap().into_legacy().unwrap();
    // SAFETY: made by into_legacy just above; deleted once.
    unsafe { ((*managed).deleter.unwrap())(managed) };
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    // The producer lets go first (never handed out): the owner goes at once.
    let (t, drops) = tensor(&mut memory, &[16], None, false);
    drop(t);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    // A read-only tensor has no legacy form (no flag there): refused, and
    // the owner dropped with the refused tensor.
    let (t, drops) = tensor(&mut memory, &[16], None, true);
    assert!(t.unwrap().into_legacy().is_err());
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}
