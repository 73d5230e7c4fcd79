//! The kernel source: the pieces of `kernels/` concatenated in compile order (NVRTC gets no
//! headers), the whole for a full build and the shared part plus one collective's files for a
//! module.
//!
//! The shared part is the `*.cuh` files at the top of `kernels/`; each collective has a folder,
//! `kernels/<collective>/`, with one file per algorithm family (its device code and its entry
//! points), and a module of that collective ([`Family`]) compiles the shared part and those files.
//! Each piece starts with a `#line 1 "kernels/<piece>"` directive, so NVRTC messages name the
//! file and line a developer edits. The cache key hashes the text a module compiles, so a change
//! to any piece it holds gives a new key.

use super::select::Family;

/// The text of one piece of `kernels/`, preceded by its `#line` directive.
macro_rules! piece {
    ($file:literal) => {
        concat!("#line 1 \"kernels/", $file, "\"\n", include_str!(concat!("../../kernels/", $file)))
    };
}

/// The device API header, first: the library's barrier, waits, error recording and multimem
/// instructions are its code
/// (issue 27: one implementation of the protocol). The emulated build compiles it P2P-only, so
/// no multimem instruction appears there.
macro_rules! device_header {
    () => {
        concat!(
            "#if defined(MCAST_EMULATE_MULTIMEM) && !defined(MCAST_DEV_TRANSPORT)\n",
            "#define MCAST_DEV_TRANSPORT 1\n",
            "#endif\n",
            "#line 1 \"include/mcast/device.h\"\n",
            include_str!("../../include/mcast/device.h")
        )
    };
}

/// The device API header, then the shared part, then the given pieces.
macro_rules! source {
    ($($piece:expr),*) => {
        concat!(
            device_header!(),
            piece!("abi.cuh"),
            piece!("ptx.cuh"),
            piece!("dtype.cuh"),
            piece!("multimem.cuh"),
            piece!("sync.cuh"),
            piece!("layout.cuh"),
            piece!("push.cuh"),
            piece!("ll.cuh"),
            piece!("entry.cuh"),
            $($piece),*
        )
    };
}

// Each collective's files, in compile order (a file may use the ones before it: the scatter
// broadcast falls back to the pull), as one text. The same lists as `family_files`.
macro_rules! all_reduce {
    () => {
        concat!(
            piece!("all_reduce/one_shot.cu"),
            piece!("all_reduce/push.cu"),
            piece!("all_reduce/two_shot.cu"),
            piece!("all_reduce/ll.cu"),
            piece!("all_reduce/multicast.cu")
        )
    };
}
macro_rules! reduce_scatter {
    () => {
        concat!(
            piece!("reduce_scatter/p2p.cu"),
            piece!("reduce_scatter/push.cu"),
            piece!("reduce_scatter/ll.cu"),
            piece!("reduce_scatter/multicast.cu")
        )
    };
}
macro_rules! broadcast {
    () => {
        concat!(
            piece!("broadcast/pull.cu"),
            piece!("broadcast/scatter.cu"),
            piece!("broadcast/ll.cu"),
            piece!("broadcast/multicast.cu")
        )
    };
}
macro_rules! all_gather {
    () => {
        concat!(
            piece!("all_gather/pull.cu"),
            piece!("all_gather/push.cu"),
            piece!("all_gather/ll.cu"),
            piece!("all_gather/multicast.cu"),
            piece!("all_gather/service.cu")
        )
    };
}

/// The shared part of `kernels/`, in compile order.
pub const SHARED: [&str; 9] =
    ["abi.cuh", "ptx.cuh", "dtype.cuh", "multimem.cuh", "sync.cuh", "layout.cuh", "push.cuh", "ll.cuh", "entry.cuh"];

/// The files of `family` in `kernels/`, in compile order: one per algorithm family of the
/// collective (LL's entry points in `ll.cu`, its protocol in the shared `ll.cuh`).
pub fn family_files(family: Family) -> &'static [&'static str] {
    match family {
        Family::AllReduce => &[
            "all_reduce/one_shot.cu",
            "all_reduce/push.cu",
            "all_reduce/two_shot.cu",
            "all_reduce/ll.cu",
            "all_reduce/multicast.cu",
        ],
        Family::ReduceScatter => {
            &["reduce_scatter/p2p.cu", "reduce_scatter/push.cu", "reduce_scatter/ll.cu", "reduce_scatter/multicast.cu"]
        }
        Family::Broadcast => {
            &["broadcast/pull.cu", "broadcast/scatter.cu", "broadcast/ll.cu", "broadcast/multicast.cu"]
        }
        Family::AllGather => &[
            "all_gather/pull.cu",
            "all_gather/push.cu",
            "all_gather/ll.cu",
            "all_gather/multicast.cu",
            "all_gather/service.cu",
        ],
    }
}

/// Every piece of `kernels/`, in compile order: the shared part, then each collective's files.
pub fn pieces() -> Vec<&'static str> {
    let mut v = SHARED.to_vec();
    for f in FAMILY_LENS.map(|(f, _)| f) {
        v.extend_from_slice(family_files(f));
    }
    v
}

/// The whole kernel source (header-free CUDA C++, compiled with NVRTC): every entry point.
pub const SOURCE: &str = source!(all_reduce!(), reduce_scatter!(), broadcast!(), all_gather!());
/// Name given to the source in NVRTC messages (each piece's `#line` names the file itself).
pub const SOURCE_NAME: &str = "mcast-kernels.cu";

/// Where each part of [`SOURCE`] ends: the shared part, then the collectives' files in order.
/// Only lengths are taken at compile time, so the binary holds the text once; a module's source
/// is put together from slices of it on first use.
const SHARED_END: usize = source!().len();
const FAMILY_LENS: [(Family, usize); 4] = [
    (Family::AllReduce, all_reduce!().len()),
    (Family::ReduceScatter, reduce_scatter!().len()),
    (Family::Broadcast, broadcast!().len()),
    (Family::AllGather, all_gather!().len()),
];
const _: () =
    assert!(SHARED_END + FAMILY_LENS[0].1 + FAMILY_LENS[1].1 + FAMILY_LENS[2].1 + FAMILY_LENS[3].1 == SOURCE.len());

/// The source a module of `family` compiles: the shared part and that collective's files.
pub fn family_source(family: Family) -> &'static str {
    static SOURCES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let sources = SOURCES.get_or_init(|| {
        let mut start = SHARED_END;
        FAMILY_LENS
            .iter()
            .map(|&(_, len)| {
                let end = start + len;
                let s = format!("{}{}", &SOURCE[..SHARED_END], &SOURCE[start..end]);
                start = end;
                s
            })
            .collect()
    });
    let i = FAMILY_LENS.iter().position(|&(f, _)| f == family).expect("every family has its files");
    &sources[i]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `#line` directives of `source`, in order.
    fn lines(source: &str) -> Vec<&str> {
        source.lines().filter_map(|l| l.strip_prefix("#line 1 \"kernels/")).map(|l| l.trim_end_matches('"')).collect()
    }

    /// The `.cu` and `.cuh` files under `dir`, as paths relative to `kernels/`.
    fn files_under(dir: &std::path::Path, rel: &str, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = format!("{rel}{}", e.file_name().to_string_lossy());
            if e.file_type().unwrap().is_dir() {
                files_under(&e.path(), &format!("{name}/"), out);
            } else if name.ends_with(".cu") || name.ends_with(".cuh") {
                out.push(name);
            }
        }
    }

    #[test]
    fn every_file_in_kernels_is_a_piece_in_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
        let mut files = Vec::new();
        files_under(std::path::Path::new(dir), "", &mut files);
        files.sort();
        let mut sorted: Vec<String> = pieces().iter().map(|p| p.to_string()).collect();
        sorted.sort();
        assert_eq!(files, sorted, "a file of kernels/ is missing from the pieces (or the reverse)");
        assert_eq!(lines(SOURCE), pieces());
        for p in pieces() {
            let text = std::fs::read_to_string(format!("{dir}/{p}")).unwrap();
            assert!(text.ends_with('\n'), "{p} does not end with a newline");
            assert!(text.starts_with(&format!("// kernels/{p}: ")), "{p} does not open with its doc line");
            assert!(!text.lines().any(|l| l.trim_start().starts_with("#include")), "{p}: NVRTC gets no headers");
            // The shared part at the top; each collective's files in its folder.
            assert_eq!(p.ends_with(".cuh"), !p.contains('/'), "{p}: shared pieces are .cuh at the top");
        }
        for f in Family::ALL {
            for p in family_files(f) {
                assert!(p.starts_with(&format!("{}/", f.name())), "{p} is not in kernels/{}/", f.name());
            }
        }
    }

    /// Issue 27, item 4: the collectives' barrier, waits, error recording and memory-order
    /// primitives are mcast/device.h's code, compiled first; no piece of kernels/ has its own
    /// Every multimem instruction the collectives issue is one of the header's raw-address forms
    /// too (multimem.cuh only chooses them per dtype and operator, and emulates them).
    #[test]
    fn the_collectives_use_the_device_api_protocol() {
        assert!(SOURCE.contains(include_str!("../../include/mcast/device.h")));
        assert!(SOURCE.find("mcast/device.h\"").unwrap() < SOURCE.find("kernels/abi.cuh").unwrap());
        let sync = include_str!("../../kernels/sync.cuh");
        for f in [
            "mcast_dev__barrier_cta",
            "mcast_dev__barrier_arrive",
            "mcast_dev__barrier_await",
            "mcast_dev__wait_count",
            "mcast_dev__record",
        ] {
            assert!(sync.contains(f), "kernels/sync.cuh does not use {f}");
        }
        let mm = include_str!("../../kernels/multimem.cuh");
        for f in
            ["mcast_dev__hw_st16", "mcast_dev__hw_st4", "mcast_dev__hw_ld16_add_bf16x8", "mcast_dev__hw_ld8_min_s64"]
        {
            assert!(mm.contains(f), "kernels/multimem.cuh does not use {f}");
        }
        let mm_code = mm.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
        assert!(!mm_code.contains("multimem."), "kernels/multimem.cuh has a multimem instruction of its own");
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
        for p in pieces() {
            let text = std::fs::read_to_string(format!("{dir}/{p}")).unwrap();
            let code: String =
                text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
            for own in ["ld.acquire", "red.release", "st.release", "atom.global.cas", "%globaltimer", "multimem.red"] {
                assert!(!code.contains(own), "{p} has its own {own}: use mcast/device.h's");
            }
        }
    }

    #[test]
    fn a_family_compiles_the_shared_part_and_its_own_files() {
        for f in Family::ALL {
            let mut want = SHARED.to_vec();
            want.extend_from_slice(family_files(f));
            assert_eq!(lines(family_source(f)), want, "{f:?}");
            assert!(family_source(f).len() < SOURCE.len());
        }
        // Put together from slices of SOURCE, the text is exactly the concatenation of its files.
        assert_eq!(family_source(Family::AllReduce), source!(all_reduce!()));
        assert_eq!(family_source(Family::ReduceScatter), source!(reduce_scatter!()));
        assert_eq!(family_source(Family::Broadcast), source!(broadcast!()));
        assert_eq!(family_source(Family::AllGather), source!(all_gather!()));
        // Every file of a family (its own entry points' definitions, whose module must hold them).
        for f in Family::ALL {
            for p in family_files(f) {
                let text = std::fs::read_to_string(format!("{}/kernels/{p}", env!("CARGO_MANIFEST_DIR"))).unwrap();
                assert!(family_source(f).contains(&text), "{p} is not in the {f:?} module's source");
            }
        }
    }
}
