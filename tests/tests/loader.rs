//! The libcuda loader's error paths, on machines with no GPU: a path that does
//! not exist, a library that is not a driver, and one that lacks functions.

use cuda_interop_sys::{CUresult, Driver, LoadError};

#[test]
fn missing_library_is_an_error_naming_what_was_tried() {
    // SAFETY: the path does not exist, so no library is opened and nothing is called.
    let err = unsafe { Driver::load_from("/nonexistent/libcuda.so.1") }.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LoadError::Library { .. }), "{err:?}");
    assert!(text.contains("/nonexistent/libcuda.so.1"), "{text}");
    assert!(text.contains("install the NVIDIA driver"), "{text}");
}

#[test]
fn a_library_without_cuda_symbols_is_not_a_driver() {
    // SAFETY: the fixture (fixtures/not_a_driver.c) has no initialisers and
    // exports no CUDA symbol, so the loader calls nothing in it.
    let err = unsafe { Driver::load_from(env!("FIXTURE_NOT_A_DRIVER")) }.unwrap_err();
    assert!(matches!(err, LoadError::NotADriver { .. }), "{err:?}");
    assert!(err.to_string().contains("not the NVIDIA driver library"));
}

#[test]
fn missing_functions_are_errors_and_present_ones_work() {
    // SAFETY: the fixture (fixtures/partial_driver.c) has no initialisers and
    // exports cuDriverGetVersion, cuInit and cuDeviceGetCount with cuda.h's
    // signatures; the loader calls only cuDriverGetVersion, which writes one int.
    let driver =
        unsafe { Driver::load_from(env!("FIXTURE_PARTIAL_DRIVER")) }.expect("fixture loads");
    assert_eq!(driver.version().map(|v| v.0), Some(11020));

    // Present: callable and returns what the library returns.
    let init = driver
        .get(|f| f.cuInit, "cuInit")
        .expect("cuInit is exported");
    // SAFETY: the fixture's cuInit takes one unsigned int and returns an int.
    assert_eq!(unsafe { init(0) }, CUresult::CUDA_SUCCESS);
    // SAFETY: as above.
    assert_eq!(unsafe { init(7) }, CUresult::CUDA_ERROR_INVALID_VALUE);
    let count = driver
        .get(|f| f.cuDeviceGetCount, "cuDeviceGetCount")
        .unwrap();
    let mut n = -1;
    // SAFETY: writes one int.
    assert_eq!(unsafe { count(&mut n) }, CUresult::CUDA_SUCCESS);
    assert_eq!(n, 0);

    // Missing: an error with the versioned symbol and the driver version.
    let err = driver.get(|f| f.cuMemAlloc, "cuMemAlloc").unwrap_err();
    assert_eq!(err.symbol, "cuMemAlloc_v2");
    let text = err.to_string();
    assert!(text.contains("cuMemAlloc_v2"), "{text}");
    assert!(text.contains("CUDA 11.2"), "{text}");
    assert!(text.contains("update the NVIDIA driver"), "{text}");

    // Exactly the three exported functions resolved.
    let resolved: Vec<_> = driver
        .fns()
        .presence()
        .iter()
        .filter(|p| p.2)
        .map(|p| p.0)
        .collect();
    assert_eq!(
        resolved,
        ["cuInit", "cuDriverGetVersion", "cuDeviceGetCount"]
    );
}

#[test]
fn result_codes_from_newer_drivers_are_still_values() {
    // A code this header does not know is a valid newtype value, not UB.
    let unknown = CUresult(12345);
    assert_ne!(unknown, CUresult::CUDA_SUCCESS);
    assert_eq!(format!("{unknown:?}"), "cudaError_enum(12345)");
}
