//! Libraries named by environment variables (`MCAST_NVRTC_PATH`, `MCAST_NCCL_FALLBACK` of
//! `libmcast_nccl`, a tool's `NVTX_INJECTION64_PATH`): the one rule for loading code a variable
//! points at.
//!
//! - In a setuid or setgid program (`AT_SECURE` in the auxiliary vector) the variable is
//!   ignored, with a warning: its environment comes from a less privileged user, and the
//!   dynamic linker ignores `LD_LIBRARY_PATH` there for the same reason.
//! - Otherwise the value must be an absolute path: a relative path or a bare library name
//!   would be resolved against the current directory or the dynamic linker's search path,
//!   so what gets loaded would depend on where the program runs.
//!
//! A leaf: no other module of mcast is used here.

use std::path::Path;

/// What a variable naming a library says, under the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LibPath {
    /// Unset or empty: the caller's default applies.
    Unset,
    /// Set, but ignored because the process runs with `AT_SECURE`; the text says so.
    Ignored(String),
    /// An absolute path to load.
    Path(String),
}

/// The rule applied to `value`, the value of variable `var` (`None`: unset), in a process that
/// runs with `AT_SECURE` when `secure`. `Err` names the variable and the rule.
pub fn check(var: &str, value: Option<&str>, secure: bool) -> Result<LibPath, String> {
    let Some(v) = value.filter(|v| !v.is_empty()) else { return Ok(LibPath::Unset) };
    if secure {
        return Ok(LibPath::Ignored(format!(
            "{var} is ignored in a setuid or setgid program (AT_SECURE): its environment may come from a less \
             privileged user"
        )));
    }
    if !Path::new(v).is_absolute() {
        return Err(format!(
            "{var}={v}: must be an absolute path (starting with /); a relative path or a bare library name would be \
             looked up from the current directory or the dynamic linker's search path"
        ));
    }
    Ok(LibPath::Path(v.to_string()))
}

/// Whether this process runs with `AT_SECURE` (setuid, setgid or file capabilities).
pub fn secure() -> bool {
    // SAFETY: getauxval reads the auxiliary vector; an absent entry is 0.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Variable `var` of this process under [`check`]; an ignored value is logged as a warning.
pub fn from_env(var: &str) -> Result<LibPath, String> {
    let value = match std::env::var_os(var) {
        None => None,
        Some(v) => Some(v.into_string().map_err(|_| format!("{var} is not valid UTF-8"))?),
    };
    let got = check(var, value.as_deref(), secure())?;
    if let LibPath::Ignored(why) = &got {
        tracing::warn!("{why}");
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VAR: &str = "MCAST_TEST_LIB";

    #[test]
    fn unset_or_empty_is_unset_in_any_process() {
        for secure in [false, true] {
            assert_eq!(check(VAR, None, secure), Ok(LibPath::Unset));
            assert_eq!(check(VAR, Some(""), secure), Ok(LibPath::Unset));
        }
    }

    #[test]
    fn relative_paths_and_bare_names_are_refused_naming_the_variable_and_the_rule() {
        for v in ["libnccl.so.2", "./libnccl.so.2", "lib/libnccl.so.2", "../x/libnvrtc.so.13", " /abs/with/space"] {
            let e = check(VAR, Some(v), false).unwrap_err();
            assert!(e.starts_with(&format!("{VAR}={v}: must be an absolute path")), "{e}");
        }
    }

    #[test]
    fn absolute_paths_are_accepted() {
        for v in ["/usr/lib/x86_64-linux-gnu/libnccl.so.2", "/opt/nvrtc/lib"] {
            assert_eq!(check(VAR, Some(v), false), Ok(LibPath::Path(v.to_string())));
        }
    }

    #[test]
    fn under_at_secure_every_value_is_ignored_with_a_reason() {
        for v in ["/usr/lib/libnccl.so.2", "libnccl.so.2"] {
            match check(VAR, Some(v), true) {
                Ok(LibPath::Ignored(why)) => {
                    assert!(why.contains(VAR) && why.contains("AT_SECURE"), "{why}");
                    assert!(!why.contains(v), "{why}");
                }
                other => panic!("{v}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_test_process_is_not_secure() {
        assert!(!secure());
    }
}
