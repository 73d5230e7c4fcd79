//! Which entry points one compiled module holds.
//!
//! Compiling every entry point of `kernels/` takes NVRTC tens of seconds on a fresh machine, so
//! a call compiles (or finds in the cache) only its [`Unit`]: one collective for one dtype and
//! operator, with every algorithm the kernel plan may pick for it (LL, P2P one-shot, push
//! all-reduce, two-shot, multicast), so a change of message size never waits for a compile. The source keeps
//! its entry points behind `MCAST_WHEN(MCAST_SEL_<collective>, MCAST_SEL_<dtype>, MCAST_SEL_<op>)`
//! guards; [`Unit::defines`] selects one unit, and no selection compiles everything (what
//! `scripts/check-kernels` checks).

use super::abi::{KernelId, KernelKind};
use super::{Collective, DType, RedOp};

/// A collective, as the source's selection flags name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// `all_reduce`: the P2P one-shot, push all-reduce and two-shot kernels and the multicast one.
    AllReduce,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `broadcast`.
    Broadcast,
    /// `all_gather`.
    AllGather,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 4] = [Family::AllReduce, Family::ReduceScatter, Family::Broadcast, Family::AllGather];

    /// The source's name, as in `MCAST_SEL_all_reduce`.
    pub fn name(self) -> &'static str {
        match self {
            Family::AllReduce => "all_reduce",
            Family::ReduceScatter => "reduce_scatter",
            Family::Broadcast => "broadcast",
            Family::AllGather => "all_gather",
        }
    }

    /// True for the families whose kernels are instantiated per dtype and operator.
    pub fn reduces(self) -> bool {
        matches!(self, Family::AllReduce | Family::ReduceScatter)
    }

    /// The family of a kernel kind.
    pub fn of(kind: KernelKind) -> Family {
        match kind {
            KernelKind::AllReduceP2p
            | KernelKind::AllReduceP2pPush
            | KernelKind::AllReduceP2pTwoShot
            | KernelKind::AllReduceP2pTwoShotPush
            | KernelKind::AllReduceMc
            | KernelKind::AllReduceLl => Family::AllReduce,
            KernelKind::ReduceScatterP2p
            | KernelKind::ReduceScatterP2pPush
            | KernelKind::ReduceScatterMc
            | KernelKind::ReduceScatterLl => Family::ReduceScatter,
            KernelKind::BroadcastP2p
            | KernelKind::BroadcastP2pScatter
            | KernelKind::BroadcastMc
            | KernelKind::BroadcastLl => Family::Broadcast,
            // The barrier and copy-out kernels live in the all-gather module (the copy-engine
            // all-gather is the barrier's main user).
            KernelKind::AllGatherP2p
            | KernelKind::AllGatherP2pPush
            | KernelKind::AllGatherMc
            | KernelKind::AllGatherLl
            | KernelKind::BarrierP2p
            | KernelKind::CopyOut => Family::AllGather,
        }
    }
}

/// The entry points of one module: a family, for the reducing ones a dtype and operator, and
/// whether the LL kernels are in (teams that run them; the others do not compile them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Unit {
    /// The collective.
    pub family: Family,
    /// Dtype and operator (reducing families only).
    pub red: Option<(DType, RedOp)>,
    /// The LL entry points are in the module.
    pub ll: bool,
}

impl Unit {
    /// The unit holding every kernel of `collective` for a team with the LL kernels (`ll`) or
    /// not: the module a call of it loads on first use.
    pub fn of_collective(collective: Collective, ll: bool) -> Unit {
        let (family, red) = match collective {
            Collective::AllReduce { dtype, op } => (Family::AllReduce, Some((dtype, op))),
            Collective::ReduceScatter { dtype, op } => (Family::ReduceScatter, Some((dtype, op))),
            Collective::AllGather => (Family::AllGather, None),
            Collective::Broadcast { .. } => (Family::Broadcast, None),
        };
        Unit { family, red, ll }
    }

    /// The unit holding `kernel` for a team that runs the LL kernels (`ll`) or not (an LL
    /// kernel is only in units with them).
    pub fn of(kernel: KernelId, ll: bool) -> Unit {
        let family = Family::of(kernel.kind);
        Unit { family, red: if family.reduces() { kernel.red } else { None }, ll: ll || kernel.kind.is_ll() }
    }

    /// Every unit with the LL kernels (each holds every entry point of its family, dtype and
    /// operator): each reducing family for every dtype and operator, and the copying families.
    pub fn all() -> Vec<Unit> {
        let mut v = vec![];
        for family in Family::ALL {
            if family.reduces() {
                for dtype in DType::ALL {
                    for op in RedOp::ALL {
                        v.push(Unit { family, red: Some((dtype, op)), ll: true });
                    }
                }
            } else {
                v.push(Unit { family, red: None, ll: true });
            }
        }
        v
    }

    /// True when the module of this unit defines `kernel`'s entry point (if the source has one).
    pub fn contains(self, kernel: KernelId) -> bool {
        let of = Unit::of(kernel, self.ll);
        (of.family, of.red) == (self.family, self.red) && (self.ll || !kernel.kind.is_ll())
    }

    /// The entry points of this unit that the source defines.
    pub fn kernels(self) -> Vec<KernelId> {
        KernelId::all().into_iter().filter(|k| k.exists() && self.contains(*k)).collect()
    }

    /// Short name for cache files and messages: `all_reduce-bf16-sum`, `broadcast`; `-noll`
    /// appended without the LL kernels.
    pub fn name(self) -> String {
        let base = match self.red {
            Some((d, o)) => format!("{}-{}-{}", self.family.name(), d.name(), o.name()),
            None => self.family.name().to_string(),
        };
        if self.ll {
            base
        } else {
            base + "-noll"
        }
    }

    /// The NVRTC options that compile only this unit: `-DMCAST_SELECT` and every
    /// `MCAST_SEL_<name>` flag as 1 or 0 (copying families select every dtype and operator, which
    /// they do not use).
    pub fn defines(self) -> Vec<String> {
        let mut v = vec!["-DMCAST_SELECT".to_string()];
        let flag = |name: &str, on: bool| format!("-DMCAST_SEL_{name}={}", u8::from(on));
        for f in Family::ALL {
            v.push(flag(f.name(), f == self.family));
        }
        for d in DType::ALL {
            v.push(flag(d.name(), self.red.is_none_or(|(x, _)| x == d)));
        }
        for o in RedOp::ALL {
            v.push(flag(o.name(), self.red.is_none_or(|(_, x)| x == o)));
        }
        v.push(flag("ll", self.ll));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_collectives_unit_holds_every_kernel_of_it() {
        for k in KernelId::all()
            .into_iter()
            .filter(|k| k.exists() && !matches!(k.kind, KernelKind::BarrierP2p | KernelKind::CopyOut))
        {
            let family = Family::of(k.kind);
            let c = match (family, k.red) {
                (Family::AllReduce, Some((dtype, op))) => Collective::AllReduce { dtype, op },
                (Family::ReduceScatter, Some((dtype, op))) => Collective::ReduceScatter { dtype, op },
                (Family::AllGather, None) => Collective::AllGather,
                (Family::Broadcast, None) => Collective::Broadcast { root: 0 },
                other => panic!("{k:?}: {other:?}"),
            };
            for ll in [false, true] {
                if ll || !k.kind.is_ll() {
                    assert_eq!(Unit::of(k, ll), Unit::of_collective(c, ll), "{k:?}, ll {ll}");
                    assert!(Unit::of_collective(c, ll).contains(k));
                }
            }
        }
    }

    #[test]
    fn every_entry_point_is_in_exactly_one_unit() {
        let units = Unit::all();
        assert_eq!(units.len(), 2 * 24 + 2);
        let mut seen = HashSet::new();
        for u in &units {
            for k in u.kernels() {
                assert!(seen.insert(k.name()), "{} in two units", k.name());
                assert_eq!(Unit::of(k, true), *u);
            }
            assert!(!u.kernels().is_empty(), "{} is empty", u.name());
        }
        let all: HashSet<String> = KernelId::all().into_iter().filter(|k| k.exists()).map(|k| k.name()).collect();
        assert_eq!(seen, all);
        let names: HashSet<String> = units.iter().map(|u| u.name()).collect();
        assert_eq!(names.len(), units.len());
    }

    #[test]
    fn an_all_reduce_unit_holds_every_algorithm_of_its_dtype_and_op() {
        let u = Unit { family: Family::AllReduce, red: Some((DType::BF16, RedOp::Sum)), ll: true };
        let names: Vec<String> = u.kernels().iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "mcast_all_reduce_p2p_bf16_sum",
                "mcast_all_reduce_p2p_push_bf16_sum",
                "mcast_all_reduce_p2p_twoshot_bf16_sum",
                "mcast_all_reduce_p2p_twoshot_push_bf16_sum",
                "mcast_all_reduce_mc_bf16_sum",
                "mcast_all_reduce_ll_bf16_sum"
            ]
        );
        assert_eq!(u.name(), "all_reduce-bf16-sum");
        let d = u.defines();
        assert_eq!(d.len(), 1 + 4 + 8 + 3 + 1);
        for on in ["-DMCAST_SEL_all_reduce=1", "-DMCAST_SEL_bf16=1", "-DMCAST_SEL_sum=1", "-DMCAST_SEL_ll=1"] {
            assert!(d.contains(&on.to_string()), "{d:?}");
        }
        assert_eq!(d.iter().filter(|x| x.ends_with("=1")).count(), 4, "{d:?}");
        // Without LL (CUDA teams by default): the same unit less the LL kernel, under its own name.
        let plain = Unit { ll: false, ..u };
        assert_eq!(plain.kernels().len(), 5);
        assert!(plain.kernels().iter().all(|k| !k.kind.is_ll()));
        assert_eq!(plain.name(), "all_reduce-bf16-sum-noll");
        assert!(plain.defines().contains(&"-DMCAST_SEL_ll=0".to_string()));
        let ll = u.kernels()[5];
        assert_eq!(Unit::of(ll, false), u, "an LL kernel is only in units with LL");
        assert_eq!(Unit::of(u.kernels()[0], false), plain);
        // f32 min has no multicast form: its unit holds the P2P kernels the plan falls back to.
        let u = Unit { family: Family::AllReduce, red: Some((DType::F32, RedOp::Min)), ll: true };
        assert_eq!(u.kernels().len(), 5);
        let b = Unit { family: Family::Broadcast, red: None, ll: true };
        assert_eq!(
            b.kernels().iter().map(|k| k.name()).collect::<Vec<_>>(),
            ["mcast_broadcast_p2p", "mcast_broadcast_p2p_scatter", "mcast_broadcast_mc", "mcast_broadcast_ll"]
        );
        assert_eq!(b.defines().iter().filter(|x| x.ends_with("=1")).count(), 1 + 8 + 3 + 1);
    }

    #[test]
    fn the_source_guards_every_flag_the_host_sets() {
        let source = super::super::source::SOURCE;
        let unit = Unit { family: Family::AllReduce, red: None, ll: true };
        for d in unit.defines().iter().skip(1) {
            let name = &d[2..d.find('=').unwrap()];
            assert!(source.contains(&format!("#define {name} 1")), "{name} has no default in the source");
        }
    }
}
