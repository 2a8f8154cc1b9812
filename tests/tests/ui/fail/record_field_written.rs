// Invariant: records are values only the crate makes; their fields cannot be written (E0616). Twin: pass/record_field_read.rs
use vk_export::ImageInfo;

fn forge(info: &mut ImageInfo) {
    info.allocation_size = 1 << 30;
}

fn main() {}
