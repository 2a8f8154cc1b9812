/* cuda_interop.h: the C ABI of libcuda_interop (crate cuda-interop-capi).
 *
 * DO NOT EDIT without editing cuda-interop-capi/src/ in the same change:
 * this header is written by hand from the Rust source (the first cut of
 * issue 33; cbindgen generation is still to come), and the crate's test
 * `header_matches_source` fails when an exported function, constant or
 * struct field of the source is missing here.
 *
 * Conventions (see cuda-interop-capi/README.md):
 * - Every function returns a ci_status and sets the calling thread's
 *   message (ci_last_error_message): "" after CI_OK, else what went wrong
 *   and what to do. Out-pointers are written only on CI_OK.
 * - Handles are checked: NULL is CI_NULL_POINTER; a freed handle, a value
 *   that never was a handle, or a handle of another kind is
 *   CI_WRONG_HANDLE. Handle values are never dereferenced by the library.
 * - *_free functions take NULL as a no-op.
 * - Every function may be called from any thread; calls on one sender are
 *   serialized; on one receiver, one thread receives at a time.
 * - Timeouts are seconds (double, 0 to 1e9).
 */
#ifndef CUDA_INTEROP_H
#define CUDA_INTEROP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version: libcuda_interop.so.0. */
#define CI_ABI_VERSION_MAJOR 0

/* What a call did. Values are stable; new ones may be added within 0.x
 * (treat an unknown value as an error). */
typedef enum ci_status {
    CI_OK = 0,
    CI_INVALID_ARGUMENT = 1,
    CI_NULL_POINTER = 2,
    CI_WRONG_HANDLE = 3,
    CI_TIMEOUT = 4,
    CI_DROPPED = 5,
    CI_CLOSED = 6,
    CI_NOT_FOUND = 7,
    CI_NAME_TAKEN = 8,
    CI_VULKAN = 9,
    CI_CUDA = 10,
    CI_UNSUPPORTED = 11,
    CI_PANIC = 12,
    CI_SKIPPED = 13,
    CI_BUSY = 14,
    CI_PROTOCOL = 15,
    CI_IO = 16,
    CI_BUFFER_TOO_SMALL = 17
} ci_status;

/* Opaque handles. */
typedef struct ci_context ci_context;
typedef struct ci_sender ci_sender;
typedef struct ci_receiver ci_receiver;
typedef struct ci_frame ci_frame;

/* ci_receiver_connect_named's delivery. */
#define CI_DELIVERY_LATEST 0u
#define CI_DELIVERY_LOSSLESS 1u

/* ci_context_options.validation. */
#define CI_VALIDATION_OFF 0u
#define CI_VALIDATION_IF_AVAILABLE 1u
#define CI_VALIDATION_REQUIRED 2u

/* Options of ci_context_new_headless (NULL options: the defaults). Set
 * struct_size to sizeof(ci_context_options). */
typedef struct ci_context_options {
    uint32_t struct_size;
    uint32_t validation;        /* CI_VALIDATION_* (0: off) */
    uint32_t has_device_uuid;   /* nonzero: pick the device of device_uuid */
    uint32_t no_transfer_queue; /* nonzero: everything on the main queue */
    uint8_t device_uuid[16];
} ci_context_options;

/* What a sender has done so far. */
typedef struct ci_sender_stats {
    uint64_t presented;
    uint64_t skipped;
    uint64_t backpressure_timeouts;
    uint64_t receivers;
    uint64_t connected;
    uint64_t dropped;
    uint64_t refused;
    double fps;
} ci_sender_stats;

/* A frame's description (ci_frame_get_info). */
typedef struct ci_frame_info {
    uint64_t sequence;       /* from 1, one per presented frame */
    uint64_t timestamp_ns;   /* CLOCK_MONOTONIC */
    uint64_t dropped_before; /* frames missed since this receiver's last */
    uint64_t row_pitch;      /* bytes from one row to the next */
    uint64_t frame_bytes;    /* row_pitch * height: what ci_receiver_read writes */
    uint32_t slot;
    uint32_t width;
    uint32_t height;
    uint32_t reserved;
} ci_frame_info;

/* The calling thread's message about its last call ("" after CI_OK); valid
 * until the thread's next call of another function; never NULL. */
const char *ci_last_error_message(void);

/* Nanoseconds of CLOCK_MONOTONIC now (the clock of frame timestamps). */
uint64_t ci_monotonic_ns(void);

/* A headless Vulkan context. Any thread. */
ci_status ci_context_new_headless(const ci_context_options *options, ci_context **out);
/* NULL: nothing. Senders made on it keep the device alive. Any thread. */
ci_status ci_context_free(ci_context *ctx);

/* A sender of `slots` RGBA8 buffers of width x height (rows width*4 bytes
 * apart), announced as `name` ($XDG_RUNTIME_DIR/cuda-interop-frames).
 * Device-local slots where the device has them, else host-visible;
 * timelines where the device exports semaphores. Any thread. */
ci_status ci_sender_new(ci_context *ctx, const char *name, uint32_t width, uint32_t height,
                        uint32_t slots, ci_sender **out);
/* Serves receivers until `count` are subscribed (CI_OK) or the timeout
 * (CI_TIMEOUT). Calls on one sender are serialized. */
ci_status ci_sender_wait_for_receivers(ci_sender *sender, uint32_t count, double timeout_s);
/* Serves receivers for up to timeout_s, returning after the first event. */
ci_status ci_sender_serve(ci_sender *sender, double timeout_s);
/* Presents a frame whose every 32-bit word is `value`; timestamp_ns 0 is
 * now. Waits up to timeout_s only for lossless receivers' releases.
 * CI_SKIPPED: every slot held by latest receivers, nothing presented.
 * sequence_out may be NULL. */
ci_status ci_sender_present_fill(ci_sender *sender, uint32_t value, uint64_t timestamp_ns,
                                 double timeout_s, uint64_t *sequence_out);
ci_status ci_sender_stats_get(ci_sender *sender, ci_sender_stats *stats);
/* NULL: nothing. Says goodbye to the receivers, removes the name. */
ci_status ci_sender_free(ci_sender *sender);

/* Connects a host receiver (any Vulkan driver; a ring of host-visible
 * buffers) to the sender named `name`, waiting up to timeout_s for it to
 * appear. Any thread. */
ci_status ci_receiver_connect_named(const char *name, uint32_t delivery, double timeout_s,
                                    ci_receiver **out);
/* The next frame; it holds its slot until ci_frame_release. A latest
 * receiver holds one frame at a time. One thread receives at a time (a
 * second gets CI_BUSY after its timeout). */
ci_status ci_receiver_next(ci_receiver *receiver, double timeout_s, ci_frame **out);
ci_status ci_frame_get_info(const ci_frame *frame, ci_frame_info *info);
/* Copies the frame's frame_bytes bytes into dst. CI_OK: they are the
 * frame's. CI_BUFFER_TOO_SMALL: dst_len < frame_bytes. */
ci_status ci_receiver_read(ci_receiver *receiver, const ci_frame *frame, void *dst,
                           size_t dst_len, double timeout_s);
/* Gives the frame back; the handle is consumed whatever the status, except
 * CI_NULL_POINTER, CI_WRONG_HANDLE, CI_INVALID_ARGUMENT (nothing changed). */
ci_status ci_frame_release(ci_receiver *receiver, ci_frame *frame);
/* NULL: nothing. Releases the frames it handed out (their handles go). */
ci_status ci_receiver_free(ci_receiver *receiver);

#ifdef __cplusplus
}
#endif

#endif /* CUDA_INTEROP_H */
