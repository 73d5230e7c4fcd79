//! The kernel argument (`struct McastArgs` of `kernels/abi.cuh`), passed by value, the build
//! variants of the source, and the builder that fills the argument from a [`Launch`].

use crate::kernels::{Collective, Launch, MAX_RANKS};

/// The kernel argument (`struct McastArgs`), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelArgs {
    /// Per rank: byte `offset` of that rank's copy, valid on this device (unused ranks 0).
    pub data: [u64; MAX_RANKS],
    /// Per rank: its sync region, valid on this device.
    pub sync: [u64; MAX_RANKS],
    /// Multicast address of `data` (emulated build: `data[rank]`; P2P: 0).
    pub data_mc: u64,
    /// Multicast address of the sync region (emulated build: `sync[rank]`; P2P: 0).
    pub sync_mc: u64,
    /// Elements or bytes, as [`Launch::count`].
    pub count: u64,
    /// Barrier spin bound, 0 = forever.
    pub timeout_ns: u64,
    /// This rank.
    pub rank: u32,
    /// Team size.
    pub nranks: u32,
    /// Broadcast root (0 otherwise).
    pub root: u32,
    /// The push kernels' bytes per block and step ([`Plan::push_row`](super::Plan::push_row)); 0 otherwise.
    pub push_row: u32,
    /// Per rank: where the results for that rank's `data` go, in the layout of `data` (in place:
    /// equal to `data`).
    pub out: [u64; MAX_RANKS],
    /// Multicast address of `out` (emulated build: `out[rank]`; P2P: 0).
    pub out_mc: u64,
    /// This rank's call signature ([`signature`](super::signature)), compared with every
    /// peer's at the kernel's entry when `check` is 1.
    pub sig: [u64; 2],
    /// 1: publish and compare `sig` at the entry (barrier, LL lines, push flags); 0: not (the
    /// copy-engine forms' exit barrier kernel).
    pub check: u32,
    /// Padding (0).
    pub pad: u32,
    /// All-gather: bytes from one rank's block of `out` to the next ([`Launch::out_stride`]; 0:
    /// `count`, the layout of `data`).
    pub out_stride: u64,
}

/// Size of [`KernelArgs`] (`sizeof(McastArgs)`).
pub const KERNEL_ARGS_SIZE: usize = 88 + 24 * MAX_RANKS;
const _: () = assert!(std::mem::size_of::<KernelArgs>() == KERNEL_ARGS_SIZE);
const _: () = assert!(std::mem::align_of::<KernelArgs>() == 8);

/// Which build of the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// Real `multimem` instructions (sm_90+).
    Multimem,
    /// `-DMCAST_EMULATE_MULTIMEM`: multimem replaced by loops over peer pointers (any sm_75+).
    Emulated,
}

impl Variant {
    /// Both variants.
    pub const ALL: [Variant; 2] = [Variant::Multimem, Variant::Emulated];

    /// Short name used in cache keys and messages.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Multimem => "multimem",
            Variant::Emulated => "emulated",
        }
    }

    /// The NVRTC define selecting this variant.
    pub fn define(self) -> Option<&'static str> {
        match self {
            Variant::Multimem => None,
            Variant::Emulated => Some("-DMCAST_EMULATE_MULTIMEM"),
        }
    }
}

/// The argument struct for `l` built for `variant` (no allocation).
pub fn kernel_args(l: &Launch, variant: Variant) -> KernelArgs {
    let mut a = KernelArgs {
        data: [0; MAX_RANKS],
        sync: [0; MAX_RANKS],
        data_mc: 0,
        sync_mc: 0,
        count: l.count,
        timeout_ns: l.timeout_ns,
        rank: l.rank,
        nranks: l.nranks,
        root: match l.collective {
            Collective::Broadcast { root } => root,
            _ => 0,
        },
        push_row: 0,
        out: [0; MAX_RANKS],
        out_mc: 0,
        sig: l.signature.unwrap_or_default(),
        check: u32::from(l.signature.is_some()),
        pad: 0,
        out_stride: l.out_stride,
    };
    for (i, (d, s)) in l.data.iter().zip(&l.sync).take(MAX_RANKS).enumerate() {
        a.data[i] = *d;
        a.sync[i] = *s;
        a.out[i] = l.out.get(i).copied().unwrap_or(*d);
    }
    let me = (l.rank as usize).min(MAX_RANKS - 1);
    match variant {
        Variant::Emulated => {
            a.data_mc = a.data[me];
            a.sync_mc = a.sync[me];
            a.out_mc = a.out[me];
        }
        Variant::Multimem => {
            a.data_mc = l.data_mc.unwrap_or(0);
            a.sync_mc = l.sync_mc.unwrap_or(0);
            a.out_mc = l.out_mc.or(l.data_mc).unwrap_or(0);
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::super::test_launch as launch;
    use super::*;
    use crate::kernels::source::SOURCE;
    use crate::kernels::Path;
    use std::mem::offset_of;

    #[test]
    fn kernel_args_layout() {
        assert_eq!(std::mem::size_of::<KernelArgs>(), 88 + 24 * MAX_RANKS);
        assert_eq!(std::mem::size_of::<KernelArgs>(), 1816);
        assert_eq!(offset_of!(KernelArgs, data), 0);
        assert_eq!(offset_of!(KernelArgs, sync), 576);
        assert_eq!(offset_of!(KernelArgs, data_mc), 1152);
        assert_eq!(offset_of!(KernelArgs, sync_mc), 1160);
        assert_eq!(offset_of!(KernelArgs, count), 1168);
        assert_eq!(offset_of!(KernelArgs, timeout_ns), 1176);
        assert_eq!(offset_of!(KernelArgs, rank), 1184);
        assert_eq!(offset_of!(KernelArgs, nranks), 1188);
        assert_eq!(offset_of!(KernelArgs, root), 1192);
        assert_eq!(offset_of!(KernelArgs, push_row), 1196);
        assert_eq!(offset_of!(KernelArgs, out), 48 + 16 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, out_mc), 48 + 24 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, sig), 56 + 24 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, check), 72 + 24 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, out_stride), 80 + 24 * MAX_RANKS);
        // CUDA's kernel parameter limit (4 KiB before 12.1's large-argument support).
        assert!(std::mem::size_of::<KernelArgs>() <= 4096);
        // The C struct states the same offsets in comments; check they are there.
        for (field, off) in [("data_mc", 1152), ("count", 1168), ("rank", 1184), ("root", 1192), ("check", 1800)] {
            assert!(
                SOURCE.lines().any(|l| l.contains(&format!("u64 {field};"))
                    || l.contains(&format!("u32 {field};")) && l.contains(&format!("// {off}"))),
                "{field}"
            );
        }
    }

    #[test]
    fn kernel_args_from_launch() {
        let mut l = launch(Collective::Broadcast { root: 1 }, Path::Multicast, 64);
        let a = kernel_args(&l, Variant::Emulated);
        assert_eq!((a.data[0], a.data[1], a.data[2]), (0x1000_0000, 0x2000_0000, 0));
        assert_eq!((a.data_mc, a.sync_mc), (0x2000_0000, 0x4000_0000));
        assert_eq!((a.rank, a.nranks, a.root, a.count, a.timeout_ns), (1, 2, 1, 64, 5));
        assert_eq!((a.out[0], a.out[1], a.out_mc), (0x1000_0000, 0x2000_0000, 0x2000_0000), "in place: out == data");
        l.data_mc = Some(0x9000_0000);
        l.sync_mc = Some(0xa000_0000);
        let a = kernel_args(&l, Variant::Multimem);
        assert_eq!((a.data_mc, a.sync_mc, a.out_mc), (0x9000_0000, 0xa000_0000, 0x9000_0000));
        l.out = vec![0x5000_0000, 0x6000_0000].into();
        l.out_mc = Some(0xb000_0000);
        let a = kernel_args(&l, Variant::Multimem);
        assert_eq!((a.out[0], a.out[1], a.out_mc), (0x5000_0000, 0x6000_0000, 0xb000_0000));
        let a = kernel_args(&l, Variant::Emulated);
        assert_eq!((a.out_mc, a.data_mc), (0x6000_0000, 0x2000_0000));
    }
}
