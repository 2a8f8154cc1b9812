// A multi-image present copies only what the crate knows how to copy: an
// application image of a part's format or a depth attachment. PartSource
// is sealed: a type of the user's own cannot claim to be one.
use cuda_interop_frames::sender::PartSource;
use vk_export::ash::vk;

struct Mine;

impl PartSource for Mine {
    fn part_format(&self) -> vk::Format {
        vk::Format::R32_SFLOAT
    }
    fn check_copy(
        &self,
        _ctx: &vk_export::Context,
        _extent: [u32; 2],
    ) -> vk_export::Result<vk_export::QueueRole> {
        Ok(vk_export::QueueRole::Main)
    }
    fn sharing(&self) -> vk_export::SourceSharing {
        vk_export::SourceSharing::Concurrent
    }
    fn is_depth(&self) -> bool {
        false
    }
    unsafe fn record(
        &self,
        _device: &vk_export::ash::Device,
        _cmd: vk::CommandBuffer,
        _family: u32,
        _dst: vk::Image,
        _extent: [u32; 2],
        _staging: Option<(vk::Buffer, u64)>,
    ) {
    }
}

fn main() {
    let _ = Mine;
}
