// Twin of fail/record_field_written.rs: a record's fields are read through getters.
use vk_export::ImageInfo;

fn size(info: &ImageInfo) -> u64 {
    info.allocation_size()
}

fn main() {}
