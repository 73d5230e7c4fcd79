//! Gives the shared library its SONAME, `libmcast.so.<major>`.
fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the version");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmcast.so.{major}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
