//! The Khronos validation layer's messages, counted: a
//! `VK_EXT_debug_utils` messenger on an instance that writes every warning
//! and error to stderr and counts the errors with their message ids (VUIDs).
//!
//! # Contract
//!
//! * One messenger per instance that wants its errors counted: the
//!   headless [`crate::Context`]'s, an adapter's (`cuda-interop-wgpu`), an
//!   application's own.
//! * [`ValidationMessenger::new`] is `unsafe`: the instance must outlive the
//!   messenger (drop it before `vkDestroyInstance`), which only the owner of
//!   the instance can promise.
//! * The callback never panics and never unwinds: it writes with
//!   `writeln!` (ignoring a closed stderr) and counts under a lock that a
//!   poisoned holder cannot block.
//! * Performance warnings (messages of the performance kind that are not
//!   errors, such as a readback from a `GENERAL` image, repeated for every
//!   frame) are written only when [`PERFORMANCE_ENV`]
//!   (`CUDA_INTEROP_VALIDATION_PERF`) is `1` in the environment when the
//!   messenger is made. Every error is written and counted, whatever its
//!   kind.

use std::ffi::c_void;
use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use ash::vk;

use crate::error::{vk_error, Result};

/// The environment variable that, set to `1`, has the messenger write the
/// validation layer's performance warnings too.
const PERFORMANCE_ENV: &str = "CUDA_INTEROP_VALIDATION_PERF";

/// What the callback writes: the error count and each error's message id.
#[derive(Default)]
struct MessengerState {
    errors: AtomicU32,
    error_ids: Mutex<Vec<String>>,
    /// Read once, at creation: the callback must not touch the environment.
    show_performance: bool,
}

/// A debug-utils messenger that counts the validation layer's errors and
/// writes its warnings and errors to stderr (performance warnings only with
/// `CUDA_INTEROP_VALIDATION_PERF=1` in the environment when it is made);
/// destroyed on drop.
///
/// ```no_run
/// # fn f(entry: &ash::Entry, instance: &ash::Instance) -> vk_export::Result<()> {
/// // SAFETY: `instance` was created from `entry` with VK_EXT_debug_utils
/// // enabled, and is destroyed only after `messenger` is dropped.
/// let messenger = unsafe { vk_export::ValidationMessenger::new(entry, instance)? };
/// // ... Vulkan work ...
/// assert_eq!(messenger.errors(), 0, "{:?}", messenger.error_ids());
/// # Ok(()) }
/// ```
pub struct ValidationMessenger {
    loader: ash::ext::debug_utils::Instance,
    messenger: vk::DebugUtilsMessengerEXT,
    // Boxed: the callback holds its address until the messenger is destroyed.
    state: Box<MessengerState>,
}

impl fmt::Debug for ValidationMessenger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValidationMessenger")
            .field("errors", &self.errors())
            .finish_non_exhaustive()
    }
}

impl ValidationMessenger {
    /// Creates the messenger on `instance` (warnings and errors, of the
    /// validation, general and performance kinds).
    ///
    /// # Safety
    /// `instance` was created from `entry` with `VK_EXT_debug_utils`
    /// enabled, and is not destroyed until the returned messenger is
    /// dropped.
    pub unsafe fn new(entry: &ash::Entry, instance: &ash::Instance) -> Result<Self> {
        let loader = ash::ext::debug_utils::Instance::new(entry, instance);
        let state = Box::new(MessengerState {
            show_performance: std::env::var_os(PERFORMANCE_ENV).is_some_and(|v| v == "1"),
            ..MessengerState::default()
        });
        let info = vk::DebugUtilsMessengerCreateInfoEXT::default()
            .message_severity(
                vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                    | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
            )
            .message_type(
                vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                    | vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                    | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
            )
            .pfn_user_callback(Some(on_validation_message))
            .user_data(&*state as *const MessengerState as *mut c_void);
        // SAFETY: the instance is live with debug utils (the caller's
        // promise); the callback's state outlives the messenger (the box is
        // dropped after the messenger is destroyed, in Drop).
        let messenger =
            unsafe { loader.create_debug_utils_messenger(&info, None) }.map_err(vk_error(
                "vkCreateDebugUtilsMessengerEXT",
                "the validation layer failed to start",
            ))?;
        Ok(ValidationMessenger {
            loader,
            messenger,
            state,
        })
    }

    /// Validation errors reported so far.
    pub fn errors(&self) -> u32 {
        self.state.errors.load(Ordering::SeqCst)
    }

    /// The message ids (VUIDs) of those errors, in order: for a test that
    /// allows one known false positive by its exact id.
    pub fn error_ids(&self) -> Vec<String> {
        self.state
            .error_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for ValidationMessenger {
    fn drop(&mut self) {
        // SAFETY: the instance is still live (`new`'s contract); the
        // messenger is this one's, destroyed once; its callback's state is
        // dropped after this.
        unsafe {
            self.loader
                .destroy_debug_utils_messenger(self.messenger, None)
        };
    }
}

unsafe extern "system" fn on_validation_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: the layer passes valid callback data (or null) for the call.
    let (message, id) = unsafe {
        let d = data.as_ref();
        (
            d.and_then(|d| d.message_as_c_str())
                .map(|m| m.to_string_lossy().into_owned())
                .unwrap_or_default(),
            d.and_then(|d| d.message_id_name_as_c_str())
                .map(|m| m.to_string_lossy().into_owned())
                .unwrap_or_else(|| "(no id)".into()),
        )
    };
    if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        // SAFETY: `user` is the messenger's MessengerState, which outlives
        // the messenger (dropped after it is destroyed).
        if let Some(state) = unsafe { (user as *const MessengerState).as_ref() } {
            state.errors.fetch_add(1, Ordering::SeqCst);
            state
                .error_ids
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(id);
        }
        // Not `eprintln!`: a panic (stderr gone) cannot unwind out of this
        // callback, which the loader calls through extern "system".
        let _ = writeln!(std::io::stderr(), "[vulkan validation error] {message}");
    } else {
        // SAFETY: `user` is the messenger's MessengerState, which outlives
        // the messenger (dropped after it is destroyed).
        let state = unsafe { (user as *const MessengerState).as_ref() };
        if writes_warning(types, state.is_some_and(|s| s.show_performance)) {
            let _ = writeln!(std::io::stderr(), "[vulkan validation warning] {message}");
        }
    }
    vk::FALSE
}

/// Whether a warning of `types` is written: a performance-only one only
/// when asked for (the same advice for every frame would bury the rest).
fn writes_warning(types: vk::DebugUtilsMessageTypeFlagsEXT, show_performance: bool) -> bool {
    types != vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE || show_performance
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn performance_warnings_are_written_only_when_asked_for() {
        let kind = vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE;
        assert!(!writes_warning(kind, false));
        assert!(writes_warning(kind, true));
        let validation = vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION;
        assert!(writes_warning(validation, false));
        assert!(writes_warning(validation | kind, false));
        assert!(writes_warning(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL,
            false
        ));
    }
}
