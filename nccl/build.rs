//! Gives libmcast_nccl.so its SONAME, and binds its calls into the mcast runtime it contains to
//! that copy (`-Bsymbolic-functions`), so a program may link libmcast and libmcast_nccl side by
//! side without one library's calls landing in the other's runtime.
fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the version");
    if std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default() == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmcast_nccl.so.{major}");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
