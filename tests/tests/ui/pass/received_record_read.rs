// Twin of fail/received_record_swapped.rs: a received message is read, and its records are taken bound to their fds.
use vk_export::wire::Received;

fn tag(received: &Received) -> u64 {
    received.message().tag
}

fn main() {}
