//! Small PTX kernels (hand-written, JIT-compiled by the driver), used by the
//! tests and the examples, and usable as templates.
//!
//! * `invert_rgba8(surface: u64, width: u32, height: u32)`: `rgb = 255 - rgb`
//!   through a surface, alpha kept. Launch with 16x16 blocks covering the image.
//! * `fill_b32(surface: u64, width: u32, height: u32, seed: u32)`: writes the
//!   32-bit texel `(y * width + x) ^ seed` at every pixel of a surface whose
//!   texels are 4 bytes (RGBA8, R32F, R32UI…).
//! * `xor_bytes(ptr: u64, len: u64, key: u32)`: `byte ^= key` for `len` bytes.
//!   Launch with 256-thread blocks covering `len`.
//! * `store_u32(ptr: u64, value: u32)`: one thread stores `value` at `ptr`
//!   (used by the tests to inject an illegal-address fault).
//! * `spin_ns(ns: u64, out: u64)`: spins on `%globaltimer` until `ns`
//!   nanoseconds have passed (GPU work of a known length, for host-wait
//!   tests and benchmarks); if `out` is not 0, stores the start and end
//!   `%globaltimer` values (two `u64`, nanoseconds) there. Launch one thread.

/// The PTX of the crate's array <-> linear copy kernels
/// (`array_to_linear_{4,8,16}b_r{1,4,8}`, `linear_to_array_…`), generated
/// from `kernels/copy.cu` by `cargo xtask codegen ptx`; for code that launches
/// them itself (a benchmark's C loop).
pub const COPY_PTX: &str = crate::generated::copy_ptx::COPY_PTX;

/// The PTX of the crate's colour conversion kernels (`convert_*`, see
/// the `convert` module), generated from `kernels/convert.cu`.
pub const CONVERT_PTX: &str = crate::generated::convert_ptx::CONVERT_PTX;

/// The PTX module holding the kernels above.
pub const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry invert_rgba8(.param .u64 surf, .param .u32 width, .param .u32 height)
{
    .reg .pred %p<3>;
    .reg .b16 %rs<8>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [surf];
    ld.param.u32 %r1, [width];
    ld.param.u32 %r2, [height];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r6, %r3, %r4, %r5;
    mov.u32 %r7, %ctaid.y;
    mov.u32 %r8, %ntid.y;
    mov.u32 %r9, %tid.y;
    mad.lo.s32 %r10, %r7, %r8, %r9;
    setp.ge.u32 %p1, %r6, %r1;
    setp.ge.u32 %p2, %r10, %r2;
    or.pred %p1, %p1, %p2;
    @%p1 bra DONE;
    shl.b32 %r11, %r6, 2;
    suld.b.2d.v4.b8.trap {%rs1, %rs2, %rs3, %rs4}, [%rd1, {%r11, %r10}];
    xor.b16 %rs1, %rs1, 255;
    xor.b16 %rs2, %rs2, 255;
    xor.b16 %rs3, %rs3, 255;
    sust.b.2d.v4.b8.trap [%rd1, {%r11, %r10}], {%rs1, %rs2, %rs3, %rs4};
DONE:
    ret;
}

.visible .entry fill_b32(.param .u64 surf, .param .u32 width, .param .u32 height, .param .u32 seed)
{
    .reg .pred %p<3>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [surf];
    ld.param.u32 %r1, [width];
    ld.param.u32 %r2, [height];
    ld.param.u32 %r12, [seed];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r6, %r3, %r4, %r5;
    mov.u32 %r7, %ctaid.y;
    mov.u32 %r8, %ntid.y;
    mov.u32 %r9, %tid.y;
    mad.lo.s32 %r10, %r7, %r8, %r9;
    setp.ge.u32 %p1, %r6, %r1;
    setp.ge.u32 %p2, %r10, %r2;
    or.pred %p1, %p1, %p2;
    @%p1 bra DONE;
    mad.lo.s32 %r13, %r10, %r1, %r6;
    xor.b32 %r13, %r13, %r12;
    shl.b32 %r11, %r6, 2;
    sust.b.2d.b32.trap [%rd1, {%r11, %r10}], {%r13};
DONE:
    ret;
}

.visible .entry xor_bytes(.param .u64 ptr, .param .u64 len, .param .u32 key)
{
    .reg .pred %p<2>;
    .reg .b16 %rs<3>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [ptr];
    ld.param.u64 %rd2, [len];
    ld.param.u32 %r1, [key];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.wide.u32 %rd3, %r2, %r3, 0;
    cvt.u64.u32 %rd4, %r4;
    add.u64 %rd3, %rd3, %rd4;
    setp.ge.u64 %p1, %rd3, %rd2;
    @%p1 bra DONE;
    add.u64 %rd5, %rd1, %rd3;
    cvt.u16.u32 %rs2, %r1;
    ld.global.u8 %rs1, [%rd5];
    xor.b16 %rs1, %rs1, %rs2;
    st.global.u8 [%rd5], %rs1;
DONE:
    ret;
}

.visible .entry store_u32(.param .u64 ptr, .param .u32 value)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [ptr];
    ld.param.u32 %r1, [value];
    st.global.u32 [%rd1], %r1;
    ret;
}

.visible .entry spin_ns(.param .u64 ns, .param .u64 out)
{
    .reg .pred %p<3>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [ns];
    ld.param.u64 %rd2, [out];
    mov.u64 %rd3, %globaltimer;
    add.u64 %rd4, %rd3, %rd1;
SPIN:
    mov.u64 %rd5, %globaltimer;
    setp.lt.u64 %p1, %rd5, %rd4;
    @%p1 bra SPIN;
    setp.eq.u64 %p2, %rd2, 0;
    @%p2 bra DONE;
    st.global.u64 [%rd2], %rd3;
    st.global.u64 [%rd2+8], %rd5;
DONE:
    ret;
}
"#;

/// The value `fill_b32` writes at `(x, y)`.
pub fn fill_b32_value(x: u32, y: u32, width: u32, seed: u32) -> u32 {
    (y.wrapping_mul(width).wrapping_add(x)) ^ seed
}
