//! Output folders that tasks write into, and delete from, safely: a task
//! deletes only files it made (issue 18).
//!
//! # Contract
//!
//! * A task's output folder is missing, empty, or holds the task's marker
//!   file, which lists (one plain name a line) the files the task wrote
//!   there last time. [`clear_previous`] removes exactly those and the
//!   marker; a non-empty folder without the marker is refused and nothing
//!   in it is touched. A listed name with a `/` is refused.
//! * [`write_marker`] is called before the task writes its files, so a run
//!   that fails half-way still leaves a marker naming all it may have
//!   written.

use std::path::Path;

/// Makes `out` ready to be written: missing or empty is fine; holding
/// the marker `marker_name`, the files it lists are removed (and the marker); anything
/// else is refused, and nothing is deleted.
pub fn clear_previous(out: &Path, marker_name: &str, task: &str) -> Result<(), String> {
    let entries = match std::fs::read_dir(out) {
        Ok(entries) => entries.count(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot read {}: {e}", out.display())),
    };
    if entries == 0 {
        return Ok(());
    }
    let marker = out.join(marker_name);
    let listed = std::fs::read_to_string(&marker).map_err(|_| {
        format!(
            "{} is not empty and is not a folder `{task}` made (no {marker_name} in it); \
             nothing was deleted: pass an empty or new folder with --out (one made by an \
             older xtask has no marker: remove it yourself once)",
            out.display()
        )
    })?;
    for name in listed.lines().filter(|n| !n.is_empty()) {
        // Only plain names, as this task writes them: never a path.
        if name.contains('/') || name == ".." || name == "." {
            return Err(format!("{}: unexpected entry `{name}`", marker.display()));
        }
        let path = out.join(name);
        // A folder it listed is one it made whole (the bundle's `fake/`).
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match removed {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", out.join(name).display())),
        }
    }
    std::fs::remove_file(&marker).map_err(|e| format!("cannot remove {}: {e}", marker.display()))
}

/// Writes the marker `marker_name` into `out`, listing `names`.
pub fn write_marker(out: &Path, marker_name: &str, names: &[&str]) -> Result<(), String> {
    let text: String = names.iter().map(|n| format!("{n}\n")).collect();
    std::fs::write(out.join(marker_name), text)
        .map_err(|e| format!("cannot write {}: {e}", out.join(marker_name).display()))
}
