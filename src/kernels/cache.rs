//! Compiled-kernel cache: in memory (per process) and on disk.
//!
//! Key: FNV-1a hash of the source text the module compiles (the shared part of `kernels/` and
//! its collective, see [`super::source`]) and the NVRTC options (which select the module's entry
//! points, see [`super::select`]), NVRTC version, architecture, variant and module name.
//! Disk directory: `MCAST_CACHE_DIR`, else `$XDG_CACHE_HOME/mcast`, else `~/.cache/mcast`;
//! `MCAST_CACHE_DIR=off` disables the disk cache, and so does `AT_SECURE` (a setuid or setgid
//! program, whose environment may come from a less privileged user). Files are written atomically (temporary file in
//! the same directory, then rename) with a header and checksum; a file that fails the check is
//! ignored and rebuilt. The directory is trusted only when it is this user's and no one else
//! may write in it (as ssh treats its keys): the code in it runs on the GPU. Otherwise mcast
//! says so once and runs without a disk cache; a missing directory is made with mode 0700.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::abi::Variant;
use super::error::KernelError;
use super::nvrtc;
use super::select::Unit;

const MAGIC: &[u8; 8] = b"MCASTKC1";
const HEADER: usize = 24;

/// FNV-1a, 64 bits: stable across Rust releases (unlike `DefaultHasher`).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// What identifies one compiled image.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// Hash of the source and the NVRTC options.
    pub source_hash: u64,
    /// NVRTC major, minor.
    pub nvrtc: (i32, i32),
    /// `sm_90`.
    pub arch: String,
    /// Which build.
    pub variant: Variant,
    /// Which entry points: a [`Unit`] name, or `all`.
    pub module: String,
}

impl CacheKey {
    /// The key of `source` compiled with `options` by NVRTC `nvrtc` for `arch`.
    pub fn new(source: &str, options: &[String], nvrtc: (i32, i32), arch: &str, variant: Variant) -> CacheKey {
        let opts = options.join("\u{1}");
        CacheKey {
            source_hash: fnv1a(&[source.as_bytes(), opts.as_bytes()]),
            nvrtc,
            arch: arch.to_string(),
            variant,
            module: "all".to_string(),
        }
    }

    /// The same key for the module named `module` (its options must select it).
    pub fn module(mut self, module: &str) -> CacheKey {
        self.module = module.to_string();
        self
    }

    /// The cache file name.
    pub fn file_name(&self) -> String {
        format!(
            "kernels-{:016x}-nvrtc{}.{}-{}-{}-{}.cubin",
            self.source_hash,
            self.nvrtc.0,
            self.nvrtc.1,
            self.arch,
            self.variant.name(),
            self.module
        )
    }
}

/// The disk cache directory from the environment, `None` when disabled, when no home is known,
/// or when the directory is not to be trusted ([`check_dir`]).
pub fn cache_dir() -> Option<PathBuf> {
    let dir = cache_dir_unchecked()?;
    match check_dir(&dir) {
        Ok(()) => Some(dir),
        Err(why) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "the kernel disk cache is off: {why}; compiled kernels are loaded from it, so it must belong to \
                     this user and be writable by no one else (chmod go-w, or set MCAST_CACHE_DIR to a directory of \
                     your own)"
                )
            });
            None
        }
    }
}

/// Whether `dir` may hold code this process loads: made (mode 0700) when missing; then a
/// directory owned by this process's user, which neither the group nor others may write; and
/// the same holds for each file read from it ([`read`]).
pub fn check_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    }
    let m = std::fs::metadata(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    if !m.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    owned_and_private(dir, &m)
}

/// `path` (of metadata `m`) is this user's and writable by no one else.
fn owned_and_private(path: &Path, m: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        return Err(format!("{} belongs to user id {}, not to this user ({me})", path.display(), m.uid()));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!("{} is writable by its group or by others (mode {:o})", path.display(), m.mode() & 0o7777));
    }
    Ok(())
}

fn cache_dir_unchecked() -> Option<PathBuf> {
    let get = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let secure = crate::libpath::secure();
    if secure {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "the kernel disk cache is off in a setuid or setgid program (AT_SECURE): its directory comes from \
                 the environment (MCAST_CACHE_DIR, XDG_CACHE_HOME, HOME)"
            )
        });
    }
    cache_dir_from(secure, get("MCAST_CACHE_DIR"), get("XDG_CACHE_HOME"), get("HOME"))
}

/// [`cache_dir`] from explicit values of `MCAST_CACHE_DIR`, `XDG_CACHE_HOME` and `HOME`, in a
/// process that runs with `AT_SECURE` when `secure`: then none (the directory, and so the
/// code loaded from it, would be chosen by a less privileged user).
pub fn cache_dir_from(
    secure: bool,
    mcast: Option<std::ffi::OsString>,
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    if secure {
        return None;
    }
    if let Some(d) = mcast {
        if d == "off" {
            return None;
        }
        return Some(PathBuf::from(d));
    }
    if let Some(x) = xdg {
        return Some(PathBuf::from(x).join("mcast"));
    }
    home.map(|h| PathBuf::from(h).join(".cache").join("mcast"))
}

/// Reads a cached image; `None` when absent, unreadable or corrupt (bad header, length or sum).
pub fn read(dir: &Path, key: &CacheKey) -> Option<Vec<u8>> {
    let path = dir.join(key.file_name());
    let file = std::fs::File::open(&path).ok()?;
    if let Err(why) = file.metadata().map_err(|e| e.to_string()).and_then(|m| owned_and_private(&path, &m)) {
        tracing::warn!("ignoring kernel cache file: {why}");
        return None;
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut &file, &mut bytes).ok()?;
    match decode(&bytes) {
        Some(payload) => Some(payload.to_vec()),
        None => {
            tracing::debug!("ignoring corrupt kernel cache file {}", path.display());
            None
        }
    }
}

fn decode(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().ok()?) as usize;
    let sum = u64::from_le_bytes(bytes[16..24].try_into().ok()?);
    let payload = &bytes[HEADER..];
    (payload.len() == len && len > 0 && fnv1a(&[payload]) == sum).then_some(payload)
}

/// Writes an image atomically (temporary file, then rename over the final name).
pub fn write(dir: &Path, key: &CacheKey, image: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut buf = Vec::with_capacity(HEADER + image.len());
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&(image.len() as u64).to_le_bytes());
    buf.extend_from_slice(&fnv1a(&[image]).to_le_bytes());
    buf.extend_from_slice(image);
    let final_path = dir.join(key.file_name());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let tmp = dir.join(format!(".{}.tmp.{}.{nanos}", key.file_name(), std::process::id()));
    let r = std::fs::write(&tmp, &buf).and_then(|_| std::fs::rename(&tmp, &final_path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Returns the image for `key`, from memory, else disk (`dir`), else by calling `build` (and
/// storing the result in both).
pub fn get_or_build(
    dir: Option<&Path>,
    key: &CacheKey,
    build: impl FnOnce() -> Result<Vec<u8>, KernelError>,
) -> Result<Arc<Vec<u8>>, KernelError> {
    static MEM: OnceLock<Mutex<HashMap<CacheKey, Arc<Vec<u8>>>>> = OnceLock::new();
    let mem = MEM.get_or_init(Default::default);
    if let Some(img) = mem.lock().get(key) {
        return Ok(img.clone());
    }
    let from_disk = dir.and_then(|d| read(d, key));
    let img = match from_disk {
        Some(img) => img,
        None => {
            let img = build()?;
            if let Some(d) = dir {
                if let Err(e) = write(d, key, &img) {
                    tracing::debug!("cannot write kernel cache in {}: {e}", d.display());
                }
            }
            img
        }
    };
    let img = Arc::new(img);
    mem.lock().insert(key.clone(), img.clone());
    Ok(img)
}

/// The cubin of the kernel source for `arch` and `variant`, compiled with NVRTC or cached: every
/// entry point (`unit` `None`), or only those of `unit` (seconds instead of tens of seconds).
pub fn cubin(arch: &str, variant: Variant, unit: Option<Unit>) -> Result<Arc<Vec<u8>>, KernelError> {
    let nv = nvrtc::nvrtc()?;
    let mut options = nvrtc::options(arch, variant);
    let module = unit.map_or_else(|| "all".to_string(), Unit::name);
    if let Some(u) = unit {
        options.extend(u.defines());
    }
    // A module compiles the shared part and its collective's file only; the key hashes that text.
    let source = unit.map_or(super::source::SOURCE, |u| super::source::family_source(u.family));
    let key = CacheKey::new(source, &options, nv.version(), arch, variant).module(&module);
    let dir = cache_dir();
    get_or_build(dir.as_deref(), &key, || {
        let target = format!("{arch} {} {module}", variant.name());
        let out = nv.compile(source, super::source::SOURCE_NAME, &options, &target)?;
        if !out.log.is_empty() {
            tracing::debug!("NVRTC log for {target}:\n{}", out.log);
        }
        Ok(out.cubin)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mcast-cache-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn key_covers_source_nvrtc_arch_variant_and_options() {
        let o = vec!["--gpu-architecture=sm_90".to_string()];
        let k = CacheKey::new("src", &o, (13, 0), "sm_90", Variant::Multimem);
        assert_eq!(k, CacheKey::new("src", &o, (13, 0), "sm_90", Variant::Multimem));
        assert_ne!(k, CacheKey::new("src2", &o, (13, 0), "sm_90", Variant::Multimem));
        assert_ne!(k, CacheKey::new("src", &o, (13, 1), "sm_90", Variant::Multimem));
        assert_ne!(k, CacheKey::new("src", &o, (13, 0), "sm_100", Variant::Multimem));
        assert_ne!(k, CacheKey::new("src", &o, (13, 0), "sm_90", Variant::Emulated));
        assert_ne!(k, CacheKey::new("src", &o, (13, 0), "sm_90", Variant::Multimem).module("broadcast"));
        assert_ne!(
            k.source_hash,
            CacheKey::new("src", &["-DX".to_string()], (13, 0), "sm_90", Variant::Multimem).source_hash
        );
        let names: std::collections::HashSet<String> = [
            k.file_name(),
            CacheKey::new("src", &o, (13, 1), "sm_90", Variant::Multimem).file_name(),
            CacheKey::new("src", &o, (13, 0), "sm_90", Variant::Emulated).file_name(),
            CacheKey::new("src", &o, (13, 0), "sm_90", Variant::Emulated).module("all_reduce-bf16-sum").file_name(),
        ]
        .into();
        assert_eq!(names.len(), 4);
        assert_eq!(fnv1a(&[b"a"]), fnv1a(&[b"a"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }

    #[test]
    fn cache_dir_from_environment() {
        let s = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(cache_dir_from(false, s("off"), s("/x"), s("/h")), None);
        assert_eq!(cache_dir_from(false, s("/c"), s("/x"), s("/h")), Some(PathBuf::from("/c")));
        assert_eq!(cache_dir_from(false, None, s("/x"), s("/h")), Some(PathBuf::from("/x/mcast")));
        assert_eq!(cache_dir_from(false, None, None, s("/h")), Some(PathBuf::from("/h/.cache/mcast")));
        assert_eq!(cache_dir_from(false, None, None, None), None);
        // Under AT_SECURE no directory from the environment is used.
        assert_eq!(cache_dir_from(true, s("/c"), s("/x"), s("/h")), None);
        assert_eq!(cache_dir_from(true, None, None, s("/h")), None);
    }

    /// A directory writable by the group or others, or another user's, is refused, naming why; a
    /// missing one is made private; a file another could have written is not read.
    #[test]
    fn a_directory_others_may_write_is_not_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tmpdir("perm").join("made");
        check_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        for mode in [0o775, 0o757, 0o777] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = check_dir(&dir).unwrap_err();
            assert!(e.contains("writable by its group or by others") && e.contains(&format!("{mode:o}")), "{e}");
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_dir(&dir).unwrap();
        let key = CacheKey::new("perm-test", &[], (1, 2), "sm_90", Variant::Emulated);
        write(&dir, &key, b"image").unwrap();
        assert!(read(&dir, &key).is_some());
        let file = dir.join(key.file_name());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(read(&dir, &key), None, "a file others may write was read");
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // Root can hand the directory to another user (nobody).
            std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
            let e = check_dir(&dir).unwrap_err();
            assert!(e.contains("belongs to user id 65534"), "{e}");
        }
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }

    #[test]
    fn round_trip_and_corrupt_files_are_rebuilt() {
        let dir = tmpdir("corrupt");
        let key = CacheKey::new("corrupt-test", &[], (1, 2), "sm_90", Variant::Emulated);
        assert_eq!(read(&dir, &key), None);
        write(&dir, &key, b"cubin-bytes").unwrap();
        assert_eq!(read(&dir, &key).as_deref(), Some(&b"cubin-bytes"[..]));
        // No temporary files left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        let path = dir.join(key.file_name());
        let good = std::fs::read(&path).unwrap();
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        for bad in [&b""[..], &b"garbage"[..], &good[..good.len() - 1], &flipped[..], &good[..HEADER]] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(read(&dir, &key), None);
        }
        // get_or_build ignores the corrupt file, builds and rewrites it.
        let mut built = 0;
        let img = get_or_build(Some(&dir), &key, || {
            built += 1;
            Ok(b"rebuilt".to_vec())
        })
        .unwrap();
        assert_eq!((img.as_slice(), built), (&b"rebuilt"[..], 1));
        assert_eq!(read(&dir, &key).as_deref(), Some(&b"rebuilt"[..]));
        // Now in memory: no rebuild, even with the disk copy gone.
        std::fs::remove_dir_all(&dir).unwrap();
        let img = get_or_build(Some(&dir), &key, || panic!("rebuilt from memory")).unwrap();
        assert_eq!(img.as_slice(), b"rebuilt");
    }

    #[test]
    fn disk_hit_skips_build_and_errors_propagate() {
        let dir = tmpdir("hit");
        let key = CacheKey::new("hit-test", &[], (1, 2), "sm_90", Variant::Multimem);
        write(&dir, &key, b"from-disk").unwrap();
        let img = get_or_build(Some(&dir), &key, || panic!("should come from disk")).unwrap();
        assert_eq!(img.as_slice(), b"from-disk");
        let key2 = CacheKey::new("err-test", &[], (1, 2), "sm_90", Variant::Multimem);
        let e = get_or_build(None, &key2, || Err(KernelError::Unsupported("x".into()))).unwrap_err();
        assert_eq!(e, KernelError::Unsupported("x".into()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
