//! The validation layer's errors are counted (`ValidationMessenger`, which
//! every headless `Context` uses): an invalid call made on purpose with raw
//! ash (a buffer of size 0, `VUID-VkBufferCreateInfo-size-00912`) is one
//! error with its id, and a valid one adds none. Without the counter every
//! "0 validation errors" assertion of the other tests would pass vacuously.

use ash::vk;
use cuda_interop_testkit::vulkan;

#[test]
fn an_invalid_call_is_counted_with_its_id_and_a_valid_one_is_not() {
    let ctx = vulkan(None);
    assert!(ctx.validation_enabled(), "the tests require the layer");
    assert_eq!(ctx.validation_errors(), 0);
    let create = |size| {
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(vk::BufferUsageFlags::TRANSFER_SRC);
        // SAFETY: a plain creation on the context's live device; size 0 is
        // invalid usage on purpose (the layer reports it before the driver,
        // which creates a buffer or fails, either way destroyed below).
        let made = unsafe { ctx.device().create_buffer(&info, None) };
        if let Ok(buffer) = made {
            // SAFETY: unused, destroyed once.
            unsafe { ctx.device().destroy_buffer(buffer, None) };
        }
    };
    create(64);
    assert_eq!(ctx.validation_errors(), 0, "a valid buffer is no error");
    create(0);
    assert_eq!(
        ctx.validation_errors(),
        1,
        "{:?}",
        ctx.validation_error_ids()
    );
    assert_eq!(
        ctx.validation_error_ids(),
        ["VUID-VkBufferCreateInfo-size-00912"]
    );
}
