//! The kernel source: the pieces of `kernels/` concatenated in compile order (NVRTC gets no
//! headers), the whole for a full build and the shared part plus one collective for a module.
//!
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

/// The device API header, then the shared part, then the given collective files.
macro_rules! source {
    ($($file:literal),*) => {
        concat!(
            device_header!(),
            piece!("abi.cuh"),
            piece!("ptx.cuh"),
            piece!("dtype.cuh"),
            piece!("multimem.cuh"),
            piece!("sync.cuh"),
            piece!("layout.cuh"),
            piece!("ll.cuh"),
            piece!("entry.cuh"),
            $(piece!($file)),*
        )
    };
}

/// Every piece of `kernels/`, in compile order: the shared part, then one file per collective.
pub const PIECES: [&str; 12] = [
    "abi.cuh",
    "ptx.cuh",
    "dtype.cuh",
    "multimem.cuh",
    "sync.cuh",
    "layout.cuh",
    "ll.cuh",
    "entry.cuh",
    "all_reduce.cu",
    "reduce_scatter.cu",
    "broadcast.cu",
    "all_gather.cu",
];

/// The whole kernel source (header-free CUDA C++, compiled with NVRTC): every entry point.
pub const SOURCE: &str = source!("all_reduce.cu", "reduce_scatter.cu", "broadcast.cu", "all_gather.cu");
/// Name given to the source in NVRTC messages (each piece's `#line` names the file itself).
pub const SOURCE_NAME: &str = "mcast-kernels.cu";

/// Where each part of [`SOURCE`] ends: the shared part, then the collectives' files in order.
/// Only lengths are taken at compile time, so the binary holds the text once; a module's source
/// is put together from slices of it on first use.
const SHARED_END: usize = source!().len();
const FAMILY_LENS: [(Family, usize); 4] = [
    (Family::AllReduce, piece!("all_reduce.cu").len()),
    (Family::ReduceScatter, piece!("reduce_scatter.cu").len()),
    (Family::Broadcast, piece!("broadcast.cu").len()),
    (Family::AllGather, piece!("all_gather.cu").len()),
];
const _: () =
    assert!(SHARED_END + FAMILY_LENS[0].1 + FAMILY_LENS[1].1 + FAMILY_LENS[2].1 + FAMILY_LENS[3].1 == SOURCE.len());

/// The source a module of `family` compiles: the shared part and that collective's file.
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
    let i = FAMILY_LENS.iter().position(|&(f, _)| f == family).expect("every family has a file");
    &sources[i]
}

/// The file of `family` in `kernels/`.
pub fn family_file(family: Family) -> &'static str {
    match family {
        Family::AllReduce => "all_reduce.cu",
        Family::ReduceScatter => "reduce_scatter.cu",
        Family::Broadcast => "broadcast.cu",
        Family::AllGather => "all_gather.cu",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `#line` directives of `source`, in order.
    fn lines(source: &str) -> Vec<&str> {
        source.lines().filter_map(|l| l.strip_prefix("#line 1 \"kernels/")).map(|l| l.trim_end_matches('"')).collect()
    }

    #[test]
    fn every_file_in_kernels_is_a_piece_in_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".cu") || f.ends_with(".cuh"))
            .collect();
        files.sort();
        let mut pieces: Vec<String> = PIECES.iter().map(|p| p.to_string()).collect();
        pieces.sort();
        assert_eq!(files, pieces, "a file of kernels/ is missing from PIECES (or the reverse)");
        assert_eq!(lines(SOURCE), PIECES);
        for p in PIECES {
            let text = std::fs::read_to_string(format!("{dir}/{p}")).unwrap();
            assert!(text.ends_with('\n'), "{p} does not end with a newline");
            assert!(text.starts_with(&format!("// kernels/{p}: ")), "{p} does not open with its doc line");
            assert!(!text.lines().any(|l| l.trim_start().starts_with("#include")), "{p}: NVRTC gets no headers");
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
        for p in PIECES {
            let text = std::fs::read_to_string(format!("{dir}/{p}")).unwrap();
            let code: String =
                text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
            for own in ["ld.acquire", "red.release", "st.release", "atom.global.cas", "%globaltimer", "multimem.red"] {
                assert!(!code.contains(own), "{p} has its own {own}: use mcast/device.h's");
            }
        }
    }

    #[test]
    fn a_family_compiles_the_shared_part_and_its_own_file() {
        let shared = &PIECES[..8];
        for f in Family::ALL {
            let mut want = shared.to_vec();
            want.push(family_file(f));
            assert_eq!(lines(family_source(f)), want, "{f:?}");
            assert!(family_source(f).len() < SOURCE.len());
        }
        // Put together from slices of SOURCE, the text is exactly the concatenation of its files.
        assert_eq!(family_source(Family::AllReduce), source!("all_reduce.cu"));
        assert_eq!(family_source(Family::ReduceScatter), source!("reduce_scatter.cu"));
        assert_eq!(family_source(Family::Broadcast), source!("broadcast.cu"));
        assert_eq!(family_source(Family::AllGather), source!("all_gather.cu"));
    }
}
