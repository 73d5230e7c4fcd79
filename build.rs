//! Nothing to do at build time: the shared library's SONAME (`libmcast.so.<major>`) is set by
//! `scripts/install`, which links the installed library with it. (A `rustc-cdylib-link-arg`
//! here would also be passed by cargo to the cdylib of every crate depending on this one, giving
//! `libmcast_nccl.so` this library's SONAME.)
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
