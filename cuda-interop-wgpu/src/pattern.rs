//! A known RGBA8 pattern written by a wgpu compute shader, and a wgpu
//! readback: what the tests and the `wgpu_to_cuda` example check.
//!
//! # Contract
//!
//! * [`encode_pattern`] writes every texel of an `Rgba8Unorm` storage
//!   texture with [`expected`] through a storage-texture access, so the
//!   texture ends in `GENERAL` layout (where CUDA can use it).
//! * [`read_texture`] copies a 2D `Rgba8Unorm` texture into a mappable
//!   buffer, submits through the [`InteropQueue`], waits (bounded) and
//!   returns the texels tightly packed, row by row.

use std::time::Duration;

use crate::{Error, InteropDevice, InteropQueue, Result};

/// The texel at `(x, y)` of frame `frame`: exact in `Rgba8Unorm`.
pub fn expected(x: u32, y: u32, frame: u32) -> [u8; 4] {
    [
        (x & 0xff) as u8,
        (y & 0xff) as u8,
        ((x ^ y).wrapping_add(frame) & 0xff) as u8,
        0xff,
    ]
}

const SHADER: &str = r#"
@group(0) @binding(0) var target_texture: texture_storage_2d<rgba8unorm, write>;
@group(0) @binding(1) var<uniform> frame: vec4<u32>;

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let size = textureDimensions(target_texture);
    if (id.x >= size.x || id.y >= size.y) {
        return;
    }
    let texel = vec4<u32>(id.x & 255u, id.y & 255u, ((id.x ^ id.y) + frame.x) & 255u, 255u);
    textureStore(target_texture, vec2<i32>(id.xy), vec4<f32>(texel) / 255.0);
}
"#;

/// Encodes a compute pass writing [`expected`] (frame `frame`) into every
/// texel of `texture` (2D, `Rgba8Unorm`, `STORAGE_BINDING`).
pub fn encode_pattern(
    device: &InteropDevice,
    texture: &wgpu::Texture,
    frame: u32,
) -> wgpu::CommandBuffer {
    let device_w = device.device();
    let module = device_w.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("pattern"),
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    });
    let pipeline = device_w.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("pattern"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let uniform = device_w.create_buffer(&wgpu::BufferDescriptor {
        label: Some("frame"),
        size: 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut bytes = [0u8; 16];
    bytes[..4].copy_from_slice(&frame.to_le_bytes());
    device.queue().write_buffer(&uniform, 0, &bytes);
    let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
    let bind = device_w.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("pattern"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::TextureView(&view),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: uniform.as_entire_binding(),
            },
        ],
    });
    let mut encoder = device_w.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(texture.width().div_ceil(8), texture.height().div_ceil(8), 1);
    }
    encoder.finish()
}

/// Waits (at most `timeout`) for every submission so far.
pub fn wait_idle(device: &InteropDevice, timeout: Duration) -> Result<()> {
    device
        .device()
        .poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: Some(timeout),
        })
        .map(drop)
        .map_err(|e| Error::Wgpu(e.to_string()))
}

/// Reads a 2D `Rgba8Unorm` texture (with `COPY_SRC`) back through wgpu.
pub fn read_texture(
    device: &InteropDevice,
    queue: &InteropQueue,
    texture: &wgpu::Texture,
) -> Result<Vec<u8>> {
    let (width, height) = (texture.width(), texture.height());
    let row = width * 4;
    let padded =
        row.div_ceil(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT) * wgpu::COPY_BYTES_PER_ROW_ALIGNMENT;
    let readback = device.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size: u64::from(padded) * u64::from(height),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.device().create_command_encoder(&Default::default());
    encoder.copy_texture_to_buffer(
        texture.as_image_copy(),
        wgpu::TexelCopyBufferInfo {
            buffer: &readback,
            layout: wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(padded),
                rows_per_image: Some(height),
            },
        },
        texture.size(),
    );
    queue.submit([encoder.finish()])?;
    read_mapped(device, &readback, padded, row, height)
}

/// Maps `buffer` (with `MAP_READ`), waits, and returns `height` rows of
/// `row` bytes, each read at a multiple of `padded`.
pub fn read_mapped(
    device: &InteropDevice,
    buffer: &wgpu::Buffer,
    padded: u32,
    row: u32,
    height: u32,
) -> Result<Vec<u8>> {
    let slice = buffer.slice(..);
    slice.map_async(wgpu::MapMode::Read, |_| {});
    wait_idle(device, Duration::from_secs(10))?;
    let mapped = slice
        .get_mapped_range()
        .map_err(|e| Error::Wgpu(format!("map: {e:?}")))?;
    let mut out = Vec::with_capacity((row * height) as usize);
    for y in 0..height as usize {
        let start = y * padded as usize;
        out.extend_from_slice(&mapped[start..start + row as usize]);
    }
    drop(mapped);
    buffer.unmap();
    Ok(out)
}

/// The first texel that differs from [`expected`], as `(x, y, got, want)`.
pub fn first_mismatch(
    pixels: &[u8],
    width: u32,
    frame: u32,
) -> Option<(u32, u32, [u8; 4], [u8; 4])> {
    pixels.chunks_exact(4).enumerate().find_map(|(i, px)| {
        let (x, y) = (i as u32 % width, i as u32 / width);
        let want = expected(x, y, frame);
        (px != want).then(|| (x, y, [px[0], px[1], px[2], px[3]], want))
    })
}
