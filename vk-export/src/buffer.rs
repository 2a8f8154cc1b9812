use std::fmt;
use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use ash::vk;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::image::{
    allocate_imported, check_memory_type, check_same_device, export_memory_fd, KeepAlive, Owner,
};
use crate::markers::{DeviceLocal, MemoryLocation};
use crate::record::{BufferInfo, BufferRecord};
use crate::MEMORY_HANDLE_TYPE;

/// Usage of every exportable buffer: storage (shader access) and transfers.
pub const BUFFER_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw(),
);

pub(crate) struct BufferInner {
    pub(crate) ctx: Context,
    pub(crate) buffer: vk::Buffer,
    pub(crate) memory: vk::DeviceMemory,
    pub(crate) info: BufferInfo,
    pub(crate) owner: Mutex<Owner>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        let device = &self.ctx.inner.device;
        // SAFETY: created here; CUDA imports hold a KeepAlive, so none is left.
        unsafe {
            let _ = device.device_wait_idle();
            device.destroy_buffer(self.buffer, None);
            device.free_memory(self.memory, None);
        }
    }
}

/// A buffer whose memory can be exported as an OPAQUE_FD.
pub struct ExportableBuffer<M = DeviceLocal> {
    pub(crate) inner: Arc<BufferInner>,
    _types: PhantomData<fn() -> M>,
}

impl<M> fmt::Debug for ExportableBuffer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportableBuffer")
            .field("size", &self.inner.info.size)
            .field("allocation_size", &self.inner.info.allocation_size)
            .finish()
    }
}

fn preflight(ctx: &Context, size: u64) -> Result<bool> {
    if size == 0 {
        return Err(Error::InvalidArgument("a buffer of 0 bytes".into()));
    }
    let info = vk::PhysicalDeviceExternalBufferInfo::default()
        .usage(BUFFER_USAGE)
        .handle_type(MEMORY_HANDLE_TYPE);
    let mut props = vk::ExternalBufferProperties::default();
    // SAFETY: plain query.
    unsafe {
        ctx.inner
            .instance
            .get_physical_device_external_buffer_properties(ctx.inner.physical, &info, &mut props)
    };
    let features = props.external_memory_properties.external_memory_features;
    let need =
        vk::ExternalMemoryFeatureFlags::EXPORTABLE | vk::ExternalMemoryFeatureFlags::IMPORTABLE;
    if !features.contains(need) {
        return Err(Error::unsupported(
            "an exportable storage buffer (OPAQUE_FD)",
            format!("the driver reports external memory features {features:?}"),
        ));
    }
    Ok(features.contains(vk::ExternalMemoryFeatureFlags::DEDICATED_ONLY))
}

fn create_buffer(ctx: &Context, size: u64) -> Result<(vk::Buffer, vk::MemoryRequirements, bool)> {
    let device = &ctx.inner.device;
    let mut external =
        vk::ExternalMemoryBufferCreateInfo::default().handle_types(MEMORY_HANDLE_TYPE);
    let info = vk::BufferCreateInfo::default()
        .size(size)
        .usage(BUFFER_USAGE)
        .sharing_mode(vk::SharingMode::EXCLUSIVE)
        .push_next(&mut external);
    // SAFETY: the create info lives across the call.
    let buffer = unsafe { device.create_buffer(&info, None) }
        .map_err(Error::vk("vkCreateBuffer", "out of memory"))?;
    let mut dedicated = vk::MemoryDedicatedRequirements::default();
    let mut reqs = vk::MemoryRequirements2::default().push_next(&mut dedicated);
    // SAFETY: the buffer was just created.
    unsafe {
        device.get_buffer_memory_requirements2(
            &vk::BufferMemoryRequirementsInfo2::default().buffer(buffer),
            &mut reqs,
        )
    };
    let memory_requirements = reqs.memory_requirements;
    let wants = dedicated.requires_dedicated_allocation == vk::TRUE
        || dedicated.prefers_dedicated_allocation == vk::TRUE;
    Ok((buffer, memory_requirements, wants))
}

impl<M: MemoryLocation> ExportableBuffer<M> {
    /// Creates, allocates (exportable) and binds a buffer of `size` bytes.
    pub fn new(ctx: &Context, size: u64) -> Result<Self> {
        let dedicated_only = preflight(ctx, size)?;
        let (buffer, reqs, wants) = create_buffer(ctx, size)?;
        let dedicated = dedicated_only || wants;
        let device = &ctx.inner.device;
        let Some(memory_type_index) =
            ctx.memory_type(reqs.memory_type_bits, M::REQUIRED, M::EXCLUDED)
        else {
            // SAFETY: unused buffer.
            unsafe { device.destroy_buffer(buffer, None) };
            return Err(Error::unsupported(
                "an exportable buffer",
                format!("no memory type with {:?}", M::REQUIRED),
            ));
        };
        let mut export = vk::ExportMemoryAllocateInfo::default().handle_types(MEMORY_HANDLE_TYPE);
        let mut dedicated_info = vk::MemoryDedicatedAllocateInfo::default().buffer(buffer);
        let mut alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(reqs.size)
            .memory_type_index(memory_type_index)
            .push_next(&mut export);
        if dedicated {
            alloc = alloc.push_next(&mut dedicated_info);
        }
        // SAFETY: the chain lives across the call.
        let memory = unsafe { device.allocate_memory(&alloc, None) }.map_err(|e| {
            // SAFETY: unused buffer.
            unsafe { device.destroy_buffer(buffer, None) };
            Error::Vulkan {
                call: "vkAllocateMemory",
                result: e,
                hint: "out of device memory for the exportable allocation",
            }
        })?;
        Self::finish(
            ctx,
            buffer,
            memory,
            size,
            reqs,
            memory_type_index,
            dedicated,
        )
    }

    fn finish(
        ctx: &Context,
        buffer: vk::Buffer,
        memory: vk::DeviceMemory,
        size: u64,
        reqs: vk::MemoryRequirements,
        memory_type_index: u32,
        dedicated: bool,
    ) -> Result<Self> {
        let device = &ctx.inner.device;
        // SAFETY: fresh objects; offset 0.
        if let Err(e) = unsafe { device.bind_buffer_memory(buffer, memory, 0) } {
            // SAFETY: unused.
            unsafe {
                device.destroy_buffer(buffer, None);
                device.free_memory(memory, None);
            }
            return Err(Error::Vulkan {
                call: "vkBindBufferMemory",
                result: e,
                hint: "the memory does not fit the buffer",
            });
        }
        let identity = &ctx.inner.identity;
        Ok(ExportableBuffer {
            inner: Arc::new(BufferInner {
                ctx: ctx.clone(),
                buffer,
                memory,
                info: BufferInfo {
                    size,
                    usage: BUFFER_USAGE,
                    allocation_size: reqs.size,
                    memory_type_index,
                    memory_flags: ctx.memory_type_flags(memory_type_index).unwrap_or_default(),
                    dedicated,
                    alignment: reqs.alignment,
                    device_uuid: identity.device_uuid,
                    driver_uuid: identity.driver_uuid,
                },
                owner: Mutex::new(Owner::Vulkan(vk::ImageLayout::UNDEFINED)),
            }),
            _types: PhantomData,
        })
    }

    /// Imports an exported buffer, created from the record. `fd` is consumed
    /// on success and closed on failure.
    pub fn import(ctx: &Context, record: &BufferRecord<M>, fd: OwnedFd) -> Result<Self> {
        let info = &record.info;
        check_same_device(ctx, &info.device_uuid, &info.driver_uuid)?;
        let dedicated_only = preflight(ctx, info.size)?;
        if dedicated_only && !info.dedicated {
            return Err(Error::Record(
                "the driver requires dedicated allocations, but the record's is not".into(),
            ));
        }
        check_memory_type(ctx, info.memory_type_index, info.memory_flags)?;
        let (buffer, reqs, _) = create_buffer(ctx, info.size)?;
        let device = &ctx.inner.device;
        if reqs.size > info.allocation_size
            || reqs.memory_type_bits & (1 << info.memory_type_index) == 0
        {
            // SAFETY: unused buffer.
            unsafe { device.destroy_buffer(buffer, None) };
            return Err(Error::Record(format!(
                "the buffer needs {} bytes in types {:#b}, the record offers {} bytes in type {}",
                reqs.size, reqs.memory_type_bits, info.allocation_size, info.memory_type_index
            )));
        }
        let dedicated_to = info
            .dedicated
            .then(|| vk::MemoryDedicatedAllocateInfo::default().buffer(buffer));
        let memory = match allocate_imported(
            ctx,
            fd,
            info.allocation_size,
            info.memory_type_index,
            dedicated_to,
        ) {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: unused buffer.
                unsafe { device.destroy_buffer(buffer, None) };
                return Err(e);
            }
        };
        let mut reqs = reqs;
        reqs.size = info.allocation_size;
        Self::finish(
            ctx,
            buffer,
            memory,
            info.size,
            reqs,
            info.memory_type_index,
            info.dedicated,
        )
    }

    /// Exports the memory as a new OPAQUE_FD, owned by the caller.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        export_memory_fd(&self.inner.ctx, self.inner.memory)
    }

    /// What an importer needs, typed.
    pub fn record(&self) -> BufferRecord<M> {
        BufferRecord {
            info: self.inner.info.clone(),
            _types: PhantomData,
        }
    }

    /// The plain record.
    pub fn info(&self) -> &BufferInfo {
        &self.inner.info
    }

    /// The size in bytes.
    pub fn size(&self) -> u64 {
        self.inner.info.size
    }

    /// The context this buffer belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The `VkBuffer`.
    pub fn raw(&self) -> vk::Buffer {
        self.inner.buffer
    }

    /// A handle that keeps this buffer (and its device) alive.
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive::new(self.inner.clone())
    }
}
