//! Layouts of the descriptor structs the safe crate fills. bindgen's own
//! compile-time checks cover every generated struct; these pin the ones whose
//! sizes `cuda.h` 12.9 fixes by its `reserved` padding, in case a regeneration
//! changes them.

use cuda_interop_sys as sys;
use static_assertions::{assert_eq_align, assert_eq_size};

assert_eq_size!(sys::CUDA_EXTERNAL_MEMORY_HANDLE_DESC, [u8; 104]);
assert_eq_size!(sys::CUDA_EXTERNAL_MEMORY_BUFFER_DESC, [u8; 88]);
assert_eq_size!(sys::CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC, [u8; 120]);
assert_eq_size!(sys::CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC, [u8; 96]);
assert_eq_size!(sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, [u8; 144]);
assert_eq_size!(sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, [u8; 144]);
assert_eq_size!(sys::CUDA_ARRAY3D_DESCRIPTOR, [u8; 40]);
assert_eq_size!(sys::CUDA_MEMCPY2D, [u8; 128]);
assert_eq_size!(sys::CUuuid, [u8; 16]);
assert_eq_align!(sys::CUDA_EXTERNAL_MEMORY_HANDLE_DESC, u64);
assert_eq_size!(sys::CUresult, u32);

#[test]
fn descriptor_defaults_are_zeroed() {
    // The driver requires every `reserved` word to be zero; `Default` must give that.
    let d = sys::CUDA_EXTERNAL_MEMORY_HANDLE_DESC::default();
    assert_eq!(d.flags, 0);
    assert!(d.reserved.iter().all(|&r| r == 0));
    let m = sys::CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC::default();
    assert!(m.reserved.iter().all(|&r| r == 0));
    assert_eq!(m.numLevels, 0);
}
