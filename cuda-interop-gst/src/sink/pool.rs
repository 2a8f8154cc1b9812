//! The buffer pool `cudainteropsink` offers upstream in system memory: each
//! buffer it hands out is a host-visible slot of the ring, lent
//! (`WriteSlot::lend`), so the element before the sink (a depayloader, a
//! decoder) writes the frame straight into the slot and the sink presents
//! it without a copy.
//!
//! # Contract
//!
//! * A buffer of the pool is one `GstMemory` over the lent slot's mapping,
//!   the caps' frame size long; it holds the [`LentSlot`] until the sink
//!   takes it ([`take_lent`]) or the buffer is freed, which gives the slot
//!   back to the ring. The pool never recycles buffers: a released one is
//!   freed.
//! * Where no slot can be lent at once (every slot held, the ring made
//!   anew for other caps, the frame larger than a slot), the pool hands out
//!   a plain system-memory buffer instead; the sink then copies it as any
//!   other buffer.
//! * The sink takes a slot out of a buffer only where nothing else can
//!   touch the bytes after the present: the buffer and its one memory held
//!   by the sink alone (writable), mapped from the slot's start. Any other
//!   buffer, a pool buffer shared by a `tee` or kept as the last sample
//!   included, is copied into a free slot as before.
//! * This module knows nothing of the ring: the sink gives the pool a
//!   function that lends a slot.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use cuda_interop_frames::sender::LentSlot;
use gst::glib;
use gst::subclass::prelude::*;

use crate::lock;

/// A lent slot while a pool buffer holds it; taken out by the sink (`None`
/// after that).
pub(crate) type LentCell = Mutex<Option<LentSlot>>;

/// What the pool calls for each buffer: a buffer of `size` bytes over a
/// lent slot ([`lent_buffer`]), or `None`.
pub(crate) type Lend = Box<dyn Fn(usize) -> Option<gst::Buffer> + Send + Sync>;

/// The bytes of a lent slot as a `GstMemory`'s data.
struct SlotBytes {
    /// Held for its drop: the last reference gives an untaken slot back.
    _cell: Arc<LentCell>,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: `base` is an address in the lent slot's mapping, which the
// `LentSlot` in `_cell` keeps alive until the sink takes it; it is
// dereferenced only by `as_mut` (below), once, while the slot is still in
// `_cell`. After the sink took the slot (`take_lent`: the memory referenced
// by its buffer alone, the buffer by the sink alone) no one can map the
// memory again before it is freed, right after `render`.
unsafe impl Send for SlotBytes {}

impl AsMut<[u8]> for SlotBytes {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `base` is the start of the lent slot's mapping, at least
        // `len` bytes (checked against `LentSlot::size` in `lent_buffer`),
        // live while the `LentSlot` is in `_cell`: GStreamer takes this
        // slice once, when the memory is made (`from_mut_slice`), and the
        // slot is lent then. The slot is out of the ring while lent: no
        // one else writes it; the sink presents it only once the buffer and
        // its memory are the sink's alone (`take_lent`), so no GStreamer
        // element writes or reads it through this memory after that.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }
}

/// A buffer of `size` bytes over `lent`'s slot, and the cell the sink finds
/// the slot in; `None` (the slot given back) if the slot is smaller.
pub(crate) fn lent_buffer(lent: LentSlot, size: usize) -> Option<(gst::Buffer, Weak<LentCell>)> {
    if size == 0 || size > lent.size() {
        return None;
    }
    let base = NonNull::new(lent.as_mut_ptr())?;
    let cell = Arc::new(Mutex::new(Some(lent)));
    let weak = Arc::downgrade(&cell);
    let memory = gst::Memory::from_mut_slice(SlotBytes {
        _cell: cell,
        base,
        len: size,
    });
    let mut buffer = gst::Buffer::new();
    buffer
        .get_mut()
        .expect("a buffer just made is writable")
        .append_memory(memory);
    Some((buffer, weak))
}

/// The slot `buffer` was lent over, taken out of its cell for the sink to
/// present, if `buffer` is a pool buffer the sink alone holds (see the
/// module contract). `cells` are the pool's buffers still alive (dead ones
/// are dropped from it).
pub(crate) fn take_lent(buffer: &gst::Buffer, cells: &mut Vec<Weak<LentCell>>) -> Option<LentSlot> {
    cells.retain(|c| c.strong_count() > 0);
    if cells.is_empty()
        || buffer.n_memory() != 1
        || !buffer.is_writable()
        || !buffer.is_all_memory_writable()
        || !held_by_its_buffer_alone(buffer.peek_memory(0))
    {
        return None;
    }
    let start = {
        let map = buffer.peek_memory(0).map_readable().ok()?;
        map.as_ptr()
    };
    cells.iter().find_map(|c| {
        let cell = c.upgrade()?;
        let mut lent = lock(&cell);
        if lent
            .as_ref()
            .is_some_and(|l| std::ptr::eq(l.as_mut_ptr(), start))
        {
            lent.take()
        } else {
            None
        }
    })
}

/// Whether `memory` has no reference but its buffer's: `GstMemory` is a
/// lockable object, so its writability counts the buffers that lock it,
/// not a plain reference someone kept (`gst_buffer_get_memory`), which
/// could still map it after the present.
fn held_by_its_buffer_alone(memory: &gst::MemoryRef) -> bool {
    let object = memory.as_ptr() as *mut gst::ffi::GstMemory;
    // SAFETY: `memory` is a live `GstMemory` (borrowed from a buffer the
    // caller holds); its refcount is an `int` that GStreamer changes only
    // with atomic operations, read here atomically, in place.
    let refcount = unsafe {
        std::sync::atomic::AtomicI32::from_ptr(std::ptr::addr_of_mut!(
            (*object).mini_object.refcount
        ))
        .load(std::sync::atomic::Ordering::Acquire)
    };
    refcount == 1 && memory.parent().is_none()
}

glib::wrapper! {
    /// The pool (see the module contract).
    pub struct SlotPool(ObjectSubclass<imp::SlotPool>)
        @extends gst::BufferPool, gst::Object;
}

impl SlotPool {
    /// A pool whose buffers are slots `lend` lends.
    pub(crate) fn new(lend: Lend) -> SlotPool {
        let pool: SlotPool = glib::Object::new();
        *lock(&pool.imp().lend) = Some(lend);
        pool
    }
}

mod imp {
    //! The pool's GObject implementation (the contract is the parent
    //! module's).

    use super::*;

    #[derive(Default)]
    pub struct SlotPool {
        pub(super) lend: Mutex<Option<Lend>>,
        /// The configured buffer size.
        size: Mutex<usize>,
    }

    #[glib::object_subclass]
    impl ObjectSubclass for SlotPool {
        const NAME: &'static str = "GstCudaInteropSlotPool";
        type Type = super::SlotPool;
        type ParentType = gst::BufferPool;
    }

    impl ObjectImpl for SlotPool {}
    impl GstObjectImpl for SlotPool {}

    impl BufferPoolImpl for SlotPool {
        fn set_config(&self, config: &mut gst::BufferPoolConfigRef) -> bool {
            let Some((_, size, _, _)) = config.params() else {
                return false;
            };
            *lock(&self.size) = size as usize;
            self.parent_set_config(config)
        }

        fn acquire_buffer(
            &self,
            _params: Option<&gst::BufferPoolAcquireParams>,
        ) -> Result<gst::Buffer, gst::FlowError> {
            let size = *lock(&self.size);
            let lent = lock(&self.lend).as_ref().and_then(|lend| lend(size));
            match lent {
                Some(buffer) => Ok(buffer),
                None => gst::Buffer::with_size(size).map_err(|_| gst::FlowError::Error),
            }
        }

        fn release_buffer(&self, buffer: gst::Buffer) {
            // Never recycled: freed, which gives a lent slot back.
            drop(buffer);
        }
    }
}

impl std::fmt::Debug for imp::SlotPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotPool").finish_non_exhaustive()
    }
}
