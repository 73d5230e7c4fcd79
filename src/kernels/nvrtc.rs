//! NVRTC, loaded at run time.
//!
//! cudarc's NVRTC loader panics when the library or a symbol is missing and cannot be pointed at
//! a file, so the library is opened here with `dlopen` and its symbols looked up one by one:
//! a missing library or symbol is a [`KernelError::NvrtcUnavailable`], never a panic.
//!
//! Lookup order:
//! 1. `MCAST_NVRTC_PATH`, when set and not empty: a `libnvrtc.so.*` file, or a directory holding
//!    one (e.g. `.../site-packages/nvidia/cu13/lib` of the `nvidia-cuda-nvrtc` wheel), as an
//!    absolute path (see [`crate::libpath`]; ignored with a warning in a setuid or setgid
//!    program). Nothing else is tried when it is set: a wrong value is an error, not a silent
//!    fallback.
//! 2. cudarc's candidate names (`libnvrtc.so`, `libnvrtc.so.13`, ...) through the dynamic linker
//!    (`LD_LIBRARY_PATH`, ldconfig), then `/usr/local/cuda/lib64/libnvrtc.so`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::sync::OnceLock;

use super::error::KernelError;
use crate::libpath::{self, LibPath};

type Prog = *mut c_void;
type FnVersion = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type FnCreate = unsafe extern "C" fn(
    *mut Prog,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type FnDestroy = unsafe extern "C" fn(*mut Prog) -> c_int;
type FnCompile = unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int;
type FnSize = unsafe extern "C" fn(Prog, *mut usize) -> c_int;
type FnGet = unsafe extern "C" fn(Prog, *mut c_char) -> c_int;
type FnErrStr = unsafe extern "C" fn(c_int) -> *const c_char;

/// A loaded NVRTC library (never unloaded).
pub struct Nvrtc {
    path: String,
    version: (i32, i32),
    create: FnCreate,
    destroy: FnDestroy,
    compile: FnCompile,
    log_size: FnSize,
    log: FnGet,
    ptx_size: FnSize,
    ptx: FnGet,
    cubin_size: FnSize,
    cubin: FnGet,
    err_str: FnErrStr,
}

/// Output of one compilation.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The cubin for the requested architecture.
    pub cubin: Vec<u8>,
    /// The PTX NVRTC produced on the way.
    pub ptx: String,
    /// The compile log (warnings), possibly empty.
    pub log: String,
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn dlopen(name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| format!("{name:?}: NUL in path"))?;
    // SAFETY: valid C string; the handle is kept for the life of the process.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        Err(dlerror_text())
    } else {
        Ok(h)
    }
}

/// `libnvrtc.so*` files of a directory (not the builtins), best first.
fn libs_in_dir(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("libnvrtc.so"))
        .collect();
    v.sort_by(|a, b| b.cmp(a));
    v.into_iter().map(|n| dir.join(n).to_string_lossy().into_owned()).collect()
}

impl Nvrtc {
    /// Loads NVRTC: from `env_path` (the value of `MCAST_NVRTC_PATH`) when given and not empty,
    /// else from the default candidates. The error text names what was tried.
    pub fn load(env_path: Option<&str>) -> Result<Nvrtc, String> {
        let (candidates, explicit) = match env_path.filter(|p| !p.is_empty()) {
            Some(p) => {
                let path = Path::new(p);
                if path.is_dir() {
                    let libs = libs_in_dir(path);
                    if libs.is_empty() {
                        return Err(format!("MCAST_NVRTC_PATH={p}: no libnvrtc.so* in that directory"));
                    }
                    (libs, true)
                } else {
                    (vec![p.to_string()], true)
                }
            }
            None => {
                let mut c = cudarc::get_lib_name_candidates("nvrtc");
                c.push("/usr/local/cuda/lib64/libnvrtc.so".into());
                (c, false)
            }
        };
        let mut errors = Vec::new();
        for cand in &candidates {
            match dlopen(cand) {
                Ok(h) => {
                    return Self::from_handle(h, cand).map_err(|e| {
                        if explicit {
                            format!("MCAST_NVRTC_PATH={cand}: {e}")
                        } else {
                            e
                        }
                    })
                }
                Err(e) => errors.push(e),
            }
        }
        if explicit {
            Err(format!("MCAST_NVRTC_PATH={}: {}", env_path.unwrap_or(""), errors.join("; ")))
        } else {
            Err(format!("no NVRTC library found (tried {})", candidates.join(", ")))
        }
    }

    fn from_handle(h: *mut c_void, path: &str) -> Result<Nvrtc, String> {
        unsafe fn sym<T: Copy>(h: *mut c_void, name: &str) -> Result<T, String> {
            let c = CString::new(name).expect("symbol names have no NUL");
            // SAFETY: h is a live handle from dlopen.
            let p = unsafe { libc::dlsym(h, c.as_ptr()) };
            if p.is_null() {
                return Err(format!("symbol {name} missing"));
            }
            debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
            // SAFETY: T is the function pointer type of this NVRTC entry point.
            Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
        }
        // SAFETY: each type matches the NVRTC C prototype of that name.
        unsafe {
            let version: FnVersion = sym(h, "nvrtcVersion")?;
            let (mut major, mut minor) = (0, 0);
            let rc = version(&mut major, &mut minor);
            if rc != 0 {
                return Err(format!("nvrtcVersion failed ({rc})"));
            }
            Ok(Nvrtc {
                path: path.to_string(),
                version: (major, minor),
                create: sym(h, "nvrtcCreateProgram")?,
                destroy: sym(h, "nvrtcDestroyProgram")?,
                compile: sym(h, "nvrtcCompileProgram")?,
                log_size: sym(h, "nvrtcGetProgramLogSize")?,
                log: sym(h, "nvrtcGetProgramLog")?,
                ptx_size: sym(h, "nvrtcGetPTXSize")?,
                ptx: sym(h, "nvrtcGetPTX")?,
                cubin_size: sym(h, "nvrtcGetCUBINSize")?,
                cubin: sym(h, "nvrtcGetCUBIN")?,
                err_str: sym(h, "nvrtcGetErrorString")?,
            })
        }
    }

    /// The library file that was loaded.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `nvrtcVersion`.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    fn err(&self, what: &str, rc: c_int) -> KernelError {
        // SAFETY: nvrtcGetErrorString returns a static string.
        let s = unsafe { (self.err_str)(rc) };
        let text =
            if s.is_null() { String::new() } else { unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned() };
        KernelError::Compile { target: what.to_string(), log: format!("NVRTC error {rc} {text}") }
    }

    /// Compiles `source` with `options`; `target` names the build in errors. A failed compile
    /// returns [`KernelError::Compile`] with the log.
    pub fn compile(&self, source: &str, name: &str, options: &[String], target: &str) -> Result<Compiled, KernelError> {
        self.compile_with_headers(source, name, &[], options, target)
    }

    /// [`Nvrtc::compile`] with `headers`: (include name, text) pairs that `#include "name"` in
    /// the source finds without any include path (how an application hands NVRTC
    /// `mcast/device.h`).
    pub fn compile_with_headers(
        &self,
        source: &str,
        name: &str,
        headers: &[(&str, &str)],
        options: &[String],
        target: &str,
    ) -> Result<Compiled, KernelError> {
        let nul = |what: &str| KernelError::Unsupported(format!("NUL in {what}"));
        let htext: Vec<CString> =
            headers.iter().map(|h| CString::new(h.1)).collect::<Result<_, _>>().map_err(|_| nul("a header"))?;
        let hname: Vec<CString> =
            headers.iter().map(|h| CString::new(h.0)).collect::<Result<_, _>>().map_err(|_| nul("a header name"))?;
        let htextp: Vec<*const c_char> = htext.iter().map(|h| h.as_ptr()).collect();
        let hnamep: Vec<*const c_char> = hname.iter().map(|h| h.as_ptr()).collect();
        let src = CString::new(source).map_err(|_| KernelError::Unsupported("NUL in kernel source".into()))?;
        let cname = CString::new(name).map_err(|_| KernelError::Unsupported("NUL in source name".into()))?;
        let opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| KernelError::Unsupported("NUL in an NVRTC option".into()))?;
        let optp: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Prog = std::ptr::null_mut();
        let (hn, ht, hp) = if headers.is_empty() {
            (0, std::ptr::null(), std::ptr::null())
        } else {
            (headers.len() as c_int, htextp.as_ptr(), hnamep.as_ptr())
        };
        // SAFETY: valid C strings; `hn` headers and names, valid for the call.
        let rc = unsafe { (self.create)(&mut prog, src.as_ptr(), cname.as_ptr(), hn, ht, hp) };
        if rc != 0 {
            return Err(self.err(target, rc));
        }
        struct Guard<'a>(&'a Nvrtc, Prog);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                // SAFETY: a program created above, destroyed once.
                unsafe { (self.0.destroy)(&mut self.1) };
            }
        }
        let g = Guard(self, prog);
        // SAFETY: live program, option pointers valid for the call.
        let rc = unsafe { (self.compile)(g.1, optp.len() as c_int, optp.as_ptr()) };
        let log = self.get(g.1, self.log_size, self.log).map(|b| text(&b)).unwrap_or_default();
        if rc != 0 {
            let log = if log.is_empty() { self.err(target, rc).to_string() } else { log };
            return Err(KernelError::Compile { target: target.to_string(), log });
        }
        let cubin = self.get(g.1, self.cubin_size, self.cubin).map_err(|rc| self.err(target, rc))?;
        let ptx = self.get(g.1, self.ptx_size, self.ptx).map(|b| text(&b)).unwrap_or_default();
        if cubin.is_empty() {
            return Err(KernelError::Compile { target: target.to_string(), log: "NVRTC produced no cubin".into() });
        }
        Ok(Compiled { cubin, ptx, log })
    }

    fn get(&self, prog: Prog, size: FnSize, get: FnGet) -> Result<Vec<u8>, c_int> {
        let mut n = 0usize;
        // SAFETY: live program; the buffer has the size NVRTC reported.
        let rc = unsafe { size(prog, &mut n) };
        if rc != 0 {
            return Err(rc);
        }
        let mut buf = vec![0u8; n];
        if n > 0 {
            let rc = unsafe { get(prog, buf.as_mut_ptr().cast()) };
            if rc != 0 {
                return Err(rc);
            }
        }
        Ok(buf)
    }
}

fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim_end().to_string()
}

/// The process-wide NVRTC, loaded on first use (`MCAST_NVRTC_PATH` read then, under
/// [`crate::libpath`]'s rule).
pub fn nvrtc() -> Result<&'static Nvrtc, KernelError> {
    static NVRTC: OnceLock<Result<Nvrtc, String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| match libpath::from_env("MCAST_NVRTC_PATH")? {
            LibPath::Path(p) => Nvrtc::load(Some(&p)),
            LibPath::Unset | LibPath::Ignored(_) => Nvrtc::load(None),
        })
        .as_ref()
        .map_err(|e| KernelError::NvrtcUnavailable(e.clone()))
}

/// NVRTC options for `arch` (`"sm_90"`) and `variant`.
pub fn options(arch: &str, variant: super::abi::Variant) -> Vec<String> {
    let mut o = vec![format!("--gpu-architecture={arch}"), "-std=c++17".to_string()];
    if let Some(d) = variant.define() {
        o.push(d.to_string());
    }
    o
}

/// The architecture name for a compute capability (`sm_90`).
pub fn arch_for(cc_major: i32, cc_minor: i32) -> String {
    format!("sm_{cc_major}{cc_minor}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_nvrtc_path_is_an_error_with_a_hint() {
        let e = Nvrtc::load(Some("/nonexistent/libnvrtc.so.13")).err().expect("must fail");
        assert!(e.contains("MCAST_NVRTC_PATH=/nonexistent/libnvrtc.so.13"), "{e}");
        let ke = KernelError::NvrtcUnavailable(e);
        assert!(ke.is_unavailable());
        let msg = ke.to_string();
        assert!(msg.contains("pip install nvidia-cuda-nvrtc"), "{msg}");
        assert!(msg.contains("MCAST_NVRTC_PATH"), "{msg}");
        assert!(msg.contains("LD_LIBRARY_PATH"), "{msg}");
    }

    #[test]
    fn nvrtc_path_to_a_directory_without_nvrtc_or_a_non_library() {
        let dir = std::env::temp_dir();
        let e = Nvrtc::load(Some(dir.join("mcast-no-such-dir-xyz").to_str().unwrap())).err().unwrap();
        assert!(e.contains("MCAST_NVRTC_PATH"), "{e}");
        let empty = dir.join(format!("mcast-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let e = Nvrtc::load(Some(empty.to_str().unwrap())).err().unwrap();
        assert!(e.contains("no libnvrtc.so"), "{e}");
        let fake = empty.join("libnvrtc.so.99");
        std::fs::write(&fake, b"not an ELF").unwrap();
        let e = Nvrtc::load(Some(empty.to_str().unwrap())).err().unwrap();
        assert!(e.contains("MCAST_NVRTC_PATH"), "{e}");
        std::fs::remove_dir_all(&empty).unwrap();
    }

    #[test]
    fn options_and_arch() {
        assert_eq!(arch_for(9, 0), "sm_90");
        assert_eq!(arch_for(10, 0), "sm_100");
        let o = options("sm_90", super::super::abi::Variant::Emulated);
        assert!(o.contains(&"--gpu-architecture=sm_90".to_string()));
        assert!(o.contains(&"-DMCAST_EMULATE_MULTIMEM".to_string()));
        assert!(!options("sm_90", super::super::abi::Variant::Multimem).iter().any(|x| x.contains("EMULATE")));
    }
}
