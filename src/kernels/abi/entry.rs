//! The kernel entry points: their kinds, dense ids and names (`mcast_<collective>_<path>...`),
//! as `kernels/entry.cuh` and each collective's file instantiate them.

use crate::kernels::{DType, RedOp};

/// The kind of a kernel entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// `mcast_all_reduce_p2p_<d>_<op>` (one-shot, pulling from peers).
    AllReduceP2p,
    /// `mcast_all_reduce_p2p_push_<d>_<op>` (one-shot, pushing into peers' scratch: one barrier).
    AllReduceP2pPush,
    /// `mcast_all_reduce_p2p_twoshot_<d>_<op>` (a reduce-scatter by loads, each reduced slice
    /// stored into every rank's out: two barriers).
    AllReduceP2pTwoShot,
    /// `mcast_all_reduce_p2p_twoshot_push_<d>_<op>` (the two-shot on the push protocol: each
    /// slice pushed into its owner's scratch, reduced there and stored into every rank's out; one
    /// barrier, at the exit).
    AllReduceP2pTwoShotPush,
    /// `mcast_reduce_scatter_p2p_<d>_<op>` (every rank pulls its block from every peer).
    ReduceScatterP2p,
    /// `mcast_reduce_scatter_p2p_push_<d>_<op>` (every rank pushes block p into rank p's scratch:
    /// no barrier).
    ReduceScatterP2pPush,
    /// `mcast_all_reduce_ll_<d>_<op>` (one-shot, flags carried in the data: no barrier).
    AllReduceLl,
    /// `mcast_reduce_scatter_ll_<d>_<op>`.
    ReduceScatterLl,
    /// `mcast_all_reduce_mc_<d>_<op>`.
    AllReduceMc,
    /// `mcast_reduce_scatter_mc_<d>_<op>`.
    ReduceScatterMc,
    /// `mcast_broadcast_p2p` (every rank pulls the whole message from the root).
    BroadcastP2p,
    /// `mcast_broadcast_p2p_scatter` (scatter then all-gather, pipelined by chunks: teams of
    /// three or more, large messages).
    BroadcastP2pScatter,
    /// `mcast_broadcast_mc`.
    BroadcastMc,
    /// `mcast_all_gather_p2p` (every rank pulls every peer's block: the pointer form's staged
    /// route, where the peers' outs are not their results).
    AllGatherP2p,
    /// `mcast_all_gather_p2p_push` (every rank stores its block into every rank's out).
    AllGatherP2pPush,
    /// `mcast_all_gather_mc`.
    AllGatherMc,
    /// `mcast_broadcast_ll`.
    BroadcastLl,
    /// `mcast_all_gather_ll`.
    AllGatherLl,
    /// `mcast_barrier_p2p`: one barrier across the team, nothing else (one block); the
    /// copy-engine forms of the collectives run it around their peer copies. Compiled with the
    /// all-gather module.
    BarrierP2p,
    /// `mcast_copy_out`: the pointer form's staged route copies its results out of the staging
    /// area with it, skipped when the rank's error word is set (no peer, no wait). Compiled with
    /// the all-gather module.
    CopyOut,
}

const REDUCING: [KernelKind; 10] = [
    KernelKind::AllReduceP2p,
    KernelKind::AllReduceP2pPush,
    KernelKind::AllReduceP2pTwoShot,
    KernelKind::AllReduceP2pTwoShotPush,
    KernelKind::ReduceScatterP2p,
    KernelKind::ReduceScatterP2pPush,
    KernelKind::AllReduceMc,
    KernelKind::ReduceScatterMc,
    KernelKind::AllReduceLl,
    KernelKind::ReduceScatterLl,
];
const COPYING: [KernelKind; 10] = [
    KernelKind::BroadcastP2p,
    KernelKind::BroadcastP2pScatter,
    KernelKind::BroadcastMc,
    KernelKind::AllGatherP2p,
    KernelKind::AllGatherP2pPush,
    KernelKind::AllGatherMc,
    KernelKind::BroadcastLl,
    KernelKind::AllGatherLl,
    KernelKind::BarrierP2p,
    KernelKind::CopyOut,
];

impl KernelKind {
    /// True for the LL kernels (`kernels/ll.cuh`): flags in the data, no barrier.
    pub fn is_ll(self) -> bool {
        matches!(
            self,
            KernelKind::AllReduceLl | KernelKind::ReduceScatterLl | KernelKind::AllGatherLl | KernelKind::BroadcastLl
        )
    }
}

/// Number of kernel ids (some reducing ids have no entry point, see [`KernelId::exists`]).
pub const KERNEL_IDS: usize = REDUCING.len() * 24 + COPYING.len();

/// One kernel entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelId {
    /// Which kernel.
    pub kind: KernelKind,
    /// Element type and operator, for the reducing kinds.
    pub red: Option<(DType, RedOp)>,
}

/// True when `multimem.ld_reduce` has a form for `dtype` and `op` (f32/f64 min/max have none).
pub fn multimem_has_reduction(dtype: DType, op: RedOp) -> bool {
    !matches!((dtype, op), (DType::F32 | DType::F64, RedOp::Min | RedOp::Max))
}

impl KernelId {
    /// Every id, in [`KernelId::index`] order.
    pub fn all() -> Vec<KernelId> {
        let mut v = Vec::with_capacity(KERNEL_IDS);
        for kind in REDUCING {
            for dtype in DType::ALL {
                for op in RedOp::ALL {
                    v.push(KernelId { kind, red: Some((dtype, op)) });
                }
            }
        }
        for kind in COPYING {
            v.push(KernelId { kind, red: None });
        }
        v
    }

    /// Dense index in `0..KERNEL_IDS`.
    pub fn index(self) -> usize {
        match (REDUCING.iter().position(|k| *k == self.kind), self.red) {
            (Some(k), Some((d, o))) => k * 24 + d as usize * 3 + o as usize,
            _ => REDUCING.len() * 24 + COPYING.iter().position(|k| *k == self.kind).unwrap_or(0),
        }
    }

    /// True when the source defines this entry point (the multicast f32/f64 min/max do not).
    pub fn exists(self) -> bool {
        match (self.kind, self.red) {
            (KernelKind::AllReduceMc | KernelKind::ReduceScatterMc, Some((d, o))) => multimem_has_reduction(d, o),
            (k, red) => REDUCING.contains(&k) == red.is_some(),
        }
    }

    /// The entry point name, e.g. `mcast_all_reduce_p2p_bf16_sum`.
    pub fn name(self) -> String {
        let stem = match self.kind {
            KernelKind::AllReduceP2p => "all_reduce_p2p",
            KernelKind::AllReduceP2pPush => "all_reduce_p2p_push",
            KernelKind::AllReduceP2pTwoShot => "all_reduce_p2p_twoshot",
            KernelKind::AllReduceP2pTwoShotPush => "all_reduce_p2p_twoshot_push",
            KernelKind::ReduceScatterP2p => "reduce_scatter_p2p",
            KernelKind::ReduceScatterP2pPush => "reduce_scatter_p2p_push",
            KernelKind::AllReduceMc => "all_reduce_mc",
            KernelKind::ReduceScatterMc => "reduce_scatter_mc",
            KernelKind::BroadcastP2p => "broadcast_p2p",
            KernelKind::BroadcastP2pScatter => "broadcast_p2p_scatter",
            KernelKind::BroadcastMc => "broadcast_mc",
            KernelKind::AllGatherP2p => "all_gather_p2p",
            KernelKind::AllGatherP2pPush => "all_gather_p2p_push",
            KernelKind::AllGatherMc => "all_gather_mc",
            KernelKind::AllReduceLl => "all_reduce_ll",
            KernelKind::ReduceScatterLl => "reduce_scatter_ll",
            KernelKind::BroadcastLl => "broadcast_ll",
            KernelKind::AllGatherLl => "all_gather_ll",
            KernelKind::BarrierP2p => "barrier_p2p",
            KernelKind::CopyOut => "copy_out",
        };
        match self.red {
            Some((d, o)) => format!("mcast_{stem}_{}_{}", d.name(), o.name()),
            None => format!("mcast_{stem}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::source::SOURCE;
    use std::collections::HashSet;

    #[test]
    fn kernel_names_every_combination() {
        let all = KernelId::all();
        assert_eq!(all.len(), KERNEL_IDS);
        let mut names = HashSet::new();
        for (i, id) in all.iter().enumerate() {
            assert_eq!(id.index(), i, "{id:?}");
            assert!(names.insert(id.name()), "duplicate {}", id.name());
        }
        let existing: Vec<KernelId> = all.iter().copied().filter(|k| k.exists()).collect();
        assert_eq!(existing.len(), 8 * 24 + 2 * 20 + 10);
        let name = |kind, d, o| KernelId { kind, red: Some((d, o)) }.name();
        assert_eq!(name(KernelKind::AllReduceP2p, DType::BF16, RedOp::Sum), "mcast_all_reduce_p2p_bf16_sum");
        assert_eq!(
            name(KernelKind::AllReduceP2pTwoShot, DType::F32, RedOp::Max),
            "mcast_all_reduce_p2p_twoshot_f32_max"
        );
        assert_eq!(name(KernelKind::ReduceScatterMc, DType::I64, RedOp::Min), "mcast_reduce_scatter_mc_i64_min");
        assert_eq!(KernelId { kind: KernelKind::AllGatherMc, red: None }.name(), "mcast_all_gather_mc");
        assert_eq!(KernelId { kind: KernelKind::AllGatherP2pPush, red: None }.name(), "mcast_all_gather_p2p_push");
        assert!(!KernelId { kind: KernelKind::AllReduceMc, red: Some((DType::F64, RedOp::Min)) }.exists());
        assert!(KernelId { kind: KernelKind::AllReduceMc, red: Some((DType::F16, RedOp::Min)) }.exists());
    }

    /// The text of the macro defined by the line starting with `head`, continuation lines joined.
    fn macro_body(head: &str) -> String {
        let mut lines = SOURCE.lines().skip_while(|l| !l.starts_with(head));
        let mut body = String::new();
        for line in lines.by_ref() {
            body.push_str(line.trim_end_matches('\\'));
            body.push(' ');
            if !line.ends_with('\\') {
                break;
            }
        }
        assert!(!body.is_empty(), "no {head} in the source");
        body[head.len()..].to_string()
    }

    /// The arguments of every call `name(...)` in `text`.
    fn calls<'a>(text: &'a str, name: &str) -> Vec<Vec<&'a str>> {
        let pat = format!("{name}(");
        text.match_indices(&pat)
            .filter(|(i, _)| !text[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
            .map(|(i, _)| {
                let rest = &text[i + pat.len()..];
                rest[..rest.find(')').unwrap()].split(',').map(str::trim).collect()
            })
            .collect()
    }

    /// The (dtype, operator) pairs of the list macro `name`: its `M(...)` calls, its
    /// `MCAST_EACH_OP` calls (one per operator of `each_op`) and the lists in `nested` it expands.
    fn list(name: &str, each_op: &[String], nested: &[(&str, &[(String, String)])]) -> Vec<(String, String)> {
        let body = macro_body(&format!("#define {name}(M)"));
        let mut pairs = vec![];
        for a in calls(&body, "MCAST_EACH_OP") {
            pairs.extend(each_op.iter().map(|o| (a[1].to_string(), o.clone())));
        }
        for a in calls(&body, "M") {
            pairs.push((a[0].to_string(), a[2].to_string()));
        }
        for (inner, inner_pairs) in nested {
            if !calls(&body, inner).is_empty() {
                pairs.extend(inner_pairs.iter().cloned());
            }
        }
        pairs
    }

    #[test]
    fn source_defines_exactly_the_existing_entry_points() {
        // Expand the entry-point macros of the source textually: the (dtype, operator) lists of
        // entry.cuh, each collective's per-pair macro instantiated over one list, and the copy
        // kernels.
        let each_op: Vec<String> =
            calls(&macro_body("#define MCAST_EACH_OP(M, DN, D)"), "M").into_iter().map(|a| a[2].to_string()).collect();
        assert_eq!(each_op, ["sum", "min", "max"]);
        let multimem = list("MCAST_EACH_MULTIMEM_REDUCTION", &each_op, &[]);
        let every = list("MCAST_EACH_REDUCTION", &each_op, &[("MCAST_EACH_MULTIMEM_REDUCTION", &multimem)]);
        assert_eq!(every.len(), 24);
        let list = |name: &str| if name == "MCAST_EACH_REDUCTION" { every.clone() } else { multimem.clone() };
        let mut defined = HashSet::new();
        for line in SOURCE.lines() {
            for list_name in ["MCAST_EACH_REDUCTION", "MCAST_EACH_MULTIMEM_REDUCTION"] {
                let Some(m) = line.strip_prefix(&format!("{list_name}(")) else { continue };
                let m = &m[..m.find(')').unwrap()];
                let body = macro_body(&format!("#define {m}(DN, D, ON, O)"));
                let stems: Vec<&str> = body
                    .match_indices("KERNEL mcast_")
                    .map(|(i, p)| {
                        let rest = &body[i + p.len()..];
                        &rest[..rest.find("_##DN##_##ON(").unwrap()]
                    })
                    .collect();
                assert!(!stems.is_empty(), "{m} defines no entry point");
                for (d, o) in list(list_name) {
                    for s in &stems {
                        assert!(defined.insert(format!("mcast_{s}_{d}_{o}")), "mcast_{s}_{d}_{o} twice");
                    }
                }
            }
            if let Some(rest) = line.trim().strip_prefix("KERNEL mcast_").filter(|r| !r.contains("##")) {
                defined.insert(format!("mcast_{}", &rest[..rest.find('(').unwrap()]));
            }
        }
        let expected: HashSet<String> = KernelId::all().into_iter().filter(|k| k.exists()).map(|k| k.name()).collect();
        assert_eq!(defined, expected);
    }
}
