//! DLPack tensors: the C structures (DLPack 1.0, `DLManagedTensorVersioned`,
//! and the legacy unversioned `DLManagedTensor`) and a builder that hands a
//! tensor's ownership to a consumer (PyTorch, CuPy, JAX) with a deleter that
//! runs exactly once.
//!
//! # Contract
//!
//! * The structures are `#[repr(C)]` copies of `dlpack.h` 1.0 (layout-tested
//!   in `tests/tests/dlpack.rs`); nothing here is generated.
//! * [`ManagedTensor::new`] checks shape, strides and the dtype before
//!   anything is handed out: every element the shape and strides reach lies
//!   inside the `len` bytes the owner keeps alive.
//! * A [`ManagedTensor`] owns its memory's keeper (`owner`, for example an
//!   import and its mapping) until [`ManagedTensor::into_versioned`] or
//!   [`ManagedTensor::into_legacy`] hands it to a consumer; from then on the
//!   consumer's one call of the deleter drops the owner. A tensor dropped
//!   before it is handed out drops its owner at once.
//! * Block-linear CUDA arrays are not strided tensors: only linear memory
//!   (mapped buffers, pitched linear images) is exported; an array level must
//!   be copied to linear memory first.

use std::any::Any;
use std::ffi::c_void;

use crate::error::{Error, Result};

/// `DLDeviceType::kDLCUDA`.
pub const DL_CUDA: i32 = 2;
/// `DLDeviceType::kDLCPU` (for tests of the structures without a GPU).
pub const DL_CPU: i32 = 1;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub const DLPACK_FLAG_READ_ONLY: u64 = 1 << 0;
/// The DLPack version these structures follow.
pub const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

/// `DLDataTypeCode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum DLDataTypeCode {
    /// `kDLInt`.
    Int = 0,
    /// `kDLUInt`.
    UInt = 1,
    /// `kDLFloat`.
    Float = 2,
}

/// `DLDevice`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct DLDevice {
    /// `DLDeviceType`.
    pub device_type: i32,
    /// The device ordinal (CUDA: the ordinal in this process).
    pub device_id: i32,
}

/// `DLDataType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct DLDataType {
    /// `DLDataTypeCode` as a byte.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (vector width).
    pub lanes: u16,
}

impl DLDataType {
    /// `code` with `bits` bits and one lane.
    pub const fn scalar(code: DLDataTypeCode, bits: u8) -> DLDataType {
        DLDataType {
            code: code as u8,
            bits,
            lanes: 1,
        }
    }
    /// Bytes of one element (all lanes).
    pub fn bytes(self) -> u64 {
        (u64::from(self.bits) * u64::from(self.lanes)).div_ceil(8)
    }
}

/// `DLTensor`.
#[derive(Debug)]
#[repr(C)]
pub struct DLTensor {
    /// The first byte (with `byte_offset`).
    pub data: *mut c_void,
    /// Where the memory is.
    pub device: DLDevice,
    /// Dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements (never null here).
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLPackVersion`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct DLPackVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack 1.0).
#[derive(Debug)]
#[repr(C)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it is done.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*`.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// `DLManagedTensor` (the legacy, unversioned capsule).
#[derive(Debug)]
#[repr(C)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it is done.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What a handed-out tensor keeps alive, and the arrays its `DLTensor`
/// points into.
struct Keeper {
    _owner: Box<dyn Any + Send>,
    _shape: Box<[i64]>,
    _strides: Box<[i64]>,
}

/// A tensor ready to be handed to a DLPack consumer, owning what keeps its
/// memory alive.
pub struct ManagedTensor {
    keeper: Box<Keeper>,
    tensor: DLTensor,
    read_only: bool,
}

impl std::fmt::Debug for ManagedTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedTensor")
            .field("tensor", &self.tensor)
            .field("read_only", &self.read_only)
            .finish()
    }
}

// SAFETY: the raw pointers point into `keeper`'s boxed arrays and into device
// memory that `keeper.owner` (Send) keeps alive; nothing is shared.
unsafe impl Send for ManagedTensor {}

impl ManagedTensor {
    /// A tensor of `shape` with element `strides` (row-major dense when
    /// `None`) over the `len` bytes at `data`, kept alive by `owner`.
    ///
    /// Every element the shape and strides can reach must lie inside the
    /// `len` bytes; strides must be positive; otherwise
    /// [`Error::InvalidArgument`] and nothing is handed out.
    ///
    /// # Safety
    /// `data` is the address of `len` bytes of memory on `device` that stay
    /// valid (and, unless `read_only`, writable) for as long as `owner`
    /// lives.
    #[allow(
        clippy::too_many_arguments,
        reason = "the DLTensor fields, each a distinct fact the caller knows"
    )]
    pub unsafe fn new(
        owner: Box<dyn Any + Send>,
        data: u64,
        len: u64,
        device: DLDevice,
        dtype: DLDataType,
        shape: &[i64],
        strides: Option<&[i64]>,
        read_only: bool,
    ) -> Result<ManagedTensor> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if shape.is_empty() || shape.len() > 8 {
            return bad(format!("{} dimensions (1 to 8 allowed)", shape.len()));
        }
        if dtype.bits == 0 || dtype.lanes == 0 {
            return bad(format!("dtype {dtype:?}"));
        }
        if shape.iter().any(|&e| e <= 0) {
            return bad(format!("shape {shape:?}: extents must be positive"));
        }
        let strides: Vec<i64> = match strides {
            Some(s) if s.len() != shape.len() => {
                return bad(format!(
                    "{} strides for {} dimensions",
                    s.len(),
                    shape.len()
                ))
            }
            Some(s) if s.iter().any(|&x| x <= 0) => {
                return bad(format!("strides {s:?}: must be positive"))
            }
            Some(s) => s.to_vec(),
            None => {
                let mut out = vec![1i64; shape.len()];
                for i in (0..shape.len().saturating_sub(1)).rev() {
                    out[i] = out[i + 1].checked_mul(shape[i + 1]).ok_or_else(|| {
                        Error::InvalidArgument(format!("shape {shape:?} overflows"))
                    })?;
                }
                out
            }
        };
        // The last element reached, in elements from the first, plus one.
        let reach = shape
            .iter()
            .zip(&strides)
            .try_fold(1u64, |acc, (&e, &s)| {
                (e as u64 - 1)
                    .checked_mul(s as u64)
                    .and_then(|x| acc.checked_add(x))
            })
            .and_then(|elements| elements.checked_mul(dtype.bytes()));
        match reach {
            Some(bytes) if bytes <= len => {}
            _ => {
                return bad(format!(
                    "shape {shape:?} with strides {strides:?} of {}-byte elements reaches past the {len} bytes",
                    dtype.bytes()
                ))
            }
        }
        let mut keeper = Box::new(Keeper {
            _owner: owner,
            _shape: shape.to_vec().into_boxed_slice(),
            _strides: strides.into_boxed_slice(),
        });
        let tensor = DLTensor {
            data: data as *mut c_void,
            device,
            ndim: shape.len() as i32,
            dtype,
            shape: keeper._shape.as_mut_ptr(),
            strides: keeper._strides.as_mut_ptr(),
            byte_offset: 0,
        };
        Ok(ManagedTensor {
            keeper,
            tensor,
            read_only,
        })
    }

    /// The tensor as it will be handed out.
    pub fn tensor(&self) -> &DLTensor {
        &self.tensor
    }

    /// Hands the tensor out as a DLPack 1.0 `DLManagedTensorVersioned`: the
    /// consumer owns it and must call its deleter exactly once.
    pub fn into_versioned(self) -> *mut DLManagedTensorVersioned {
        let managed = Box::new(DLManagedTensorVersioned {
            version: DLPACK_VERSION,
            manager_ctx: Box::into_raw(self.keeper).cast(),
            deleter: Some(delete_versioned),
            flags: if self.read_only {
                DLPACK_FLAG_READ_ONLY
            } else {
                0
            },
            dl_tensor: self.tensor,
        });
        Box::into_raw(managed)
    }

    /// Hands the tensor out as a legacy `DLManagedTensor` (no read-only
    /// flag exists there: a read-only tensor is refused).
    pub fn into_legacy(self) -> Result<*mut DLManagedTensor> {
        if self.read_only {
            return Err(Error::InvalidArgument(
                "a read-only tensor cannot be handed out as a legacy DLManagedTensor (it has no read-only flag)"
                    .into(),
            ));
        }
        let managed = Box::new(DLManagedTensor {
            dl_tensor: self.tensor,
            manager_ctx: Box::into_raw(self.keeper).cast(),
            deleter: Some(delete_legacy),
        });
        Ok(Box::into_raw(managed))
    }
}

/// The deleter of a versioned tensor made by [`ManagedTensor::into_versioned`].
///
/// # Safety
/// `managed` came from `into_versioned` and this is its one deleter call.
unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` and its `manager_ctx` were made by Box::into_raw in
    // into_versioned, and the consumer calls the deleter once.
    unsafe {
        let managed = Box::from_raw(managed);
        drop(Box::from_raw(managed.manager_ctx.cast::<Keeper>()));
    }
}

/// The deleter of a legacy tensor made by [`ManagedTensor::into_legacy`].
///
/// # Safety
/// `managed` came from `into_legacy` and this is its one deleter call.
unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as in delete_versioned.
    unsafe {
        let managed = Box::from_raw(managed);
        drop(Box::from_raw(managed.manager_ctx.cast::<Keeper>()));
    }
}
