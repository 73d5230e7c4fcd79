//! Host identity: which ranks can pass file descriptors to each other (and reach each other's
//! abstract Unix sockets). Two processes are on one host when they share the kernel (hostname
//! and `/proc/sys/kernel/random/boot_id`) and the network namespace (the inode of
//! `/proc/self/ns/net`). `MCAST_HOST_ID` overrides it, like `NCCL_HOSTID`.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// This process's host identity: `MCAST_HOST_ID` when set and not empty, else
/// `<hostname>/<boot id>/netns:<inode>`.
pub fn host_id() -> String {
    if let Some(id) = std::env::var("MCAST_HOST_ID").ok().filter(|s| !s.trim().is_empty()) {
        return id.trim().to_string();
    }
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let netns = std::fs::metadata("/proc/self/ns/net").map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap_or(0);
    format!("{}/{}/netns:{netns}", hostname.trim(), boot.trim())
}

/// A short stable digest of this process's host identity (16 hex digits), read once.
pub fn host_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| tag_of(&host_id()))
}

/// The digest [`host_tag`] gives for `id`.
pub fn tag_of(id: &str) -> String {
    Sha256::digest(id.as_bytes())[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_names_the_namespace_and_is_stable() {
        if std::env::var_os("MCAST_HOST_ID").is_none() {
            let id = host_id();
            assert!(id.contains("/netns:"), "{id}");
            assert_eq!(id, host_id());
        }
        assert_eq!(host_tag().len(), 16);
        assert_ne!(tag_of("a"), tag_of("b"));
    }
}
