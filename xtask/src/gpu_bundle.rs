//! `cargo xtask gpu-bundle`: placeholder replaced below.
pub fn run(_args: &[String]) -> Result<(), String> {
    Err("gpu-bundle: not written yet".into())
}
