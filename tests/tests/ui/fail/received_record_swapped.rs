// Invariant: a received message's records cannot be swapped before they are bound to their fds (E0616). Twin: pass/received_record_read.rs
use vk_export::wire::{Received, Resource};
use vk_export::ImageInfo;

fn swap(received: &mut Received, mine: ImageInfo) {
    received.message.resources[0] = Resource::Image(mine);
}

fn main() {}
