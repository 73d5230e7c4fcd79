//! Gives libmcast_nccl.so its SONAME and exports only NCCL's names: the mcast runtime linked
//! inside stays private, so a program may link libmcast and libmcast_nccl side by side.
fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the version");
    if std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default() == "linux" {
        let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets the manifest dir");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmcast_nccl.so.{major}");
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/exports.map");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=exports.map");
}
