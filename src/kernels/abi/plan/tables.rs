//! The collectives' tables, parsed from their files' docs and compared with [`plan`] row by row:
//! for teams of 2, 3, 4, 5 and 8 ranks, with and without the LL kernels, on P2P and multicast
//! teams, 16-byte aligned or not, at every size a table names (and 4 bytes either side) and at
//! every power of two, the plan chooses the first row whose condition holds and whose range
//! holds the size, with the row's grid. A table that no longer says what the plan does fails here.

use super::super::entry::{KernelId, KernelKind};
use super::{plan, GRID_MAX_BLOCKS};
use crate::kernels::abi::test_launch;
use crate::kernels::{Collective, DType, Path, RankPtrs, RedOp};

/// The team sizes of the tables' columns.
const RANKS: [u32; 5] = [2, 3, 4, 5, 8];

/// When a row may run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum When {
    Ll,
    Multicast,
    Aligned,
    /// Aligned, and S a multiple of 16 (every rank's block whole vectors).
    AlignedBlocks,
    Always,
}

/// The quantity a grid counts: S, or every rank's blocks (N S).
#[derive(Clone, Copy, Debug)]
struct Grid {
    per_rank: bool,
    /// Bytes per block at two ranks, and from three ranks on.
    two: u64,
    more: u64,
    /// The most blocks ("up to N"; else [`GRID_MAX_BLOCKS`]).
    max: u64,
}

#[derive(Debug)]
struct Row {
    kind: KernelKind,
    when: When,
    /// Sizes it serves per team size (of [`RANKS`]): an inclusive range, or none.
    ranges: Vec<Option<(u64, u64)>>,
    grid: Grid,
}

/// "256 KiB", "4 MiB" in bytes.
fn bytes(s: &str) -> u64 {
    let (num, unit) = s.trim().split_once(' ').unwrap_or_else(|| panic!("no unit in {s:?}"));
    let num: u64 = num.parse().unwrap_or_else(|_| panic!("not a number: {s:?}"));
    match unit {
        "KiB" => num << 10,
        "MiB" => num << 20,
        _ => panic!("unknown unit in {s:?}"),
    }
}

fn range(cell: &str) -> Option<(u64, u64)> {
    match cell {
        "never" => None,
        "any" => Some((1, u64::MAX)),
        _ => match (cell.strip_prefix("≤ "), cell.strip_prefix("≥ ")) {
            (Some(max), _) => Some((1, bytes(max))),
            (_, Some(min)) => Some((bytes(min), u64::MAX)),
            _ => panic!("a size range is never, any, ≤ X or ≥ X: {cell:?}"),
        },
    }
}

/// "⌈S / 32 KiB⌉" or "⌈N S / 32 KiB⌉": whether N S, and the bytes per block.
fn per_block(term: &str) -> (bool, u64) {
    let inner = term.trim().strip_prefix('⌈').and_then(|t| t.strip_suffix('⌉'));
    let (what, per) = inner.and_then(|t| t.split_once(" / ")).unwrap_or_else(|| panic!("grid term {term:?}"));
    let per_rank = match what {
        "S" => false,
        "N S" => true,
        _ => panic!("a grid counts S or N S: {term:?}"),
    };
    (per_rank, bytes(per))
}

fn grid(cell: &str) -> Grid {
    let (cell, max) = match cell.rsplit_once(" up to ") {
        Some((c, m)) => (c, m.parse().unwrap_or_else(|_| panic!("{cell:?}: 'up to N' blocks"))),
        None => (cell, u64::from(GRID_MAX_BLOCKS)),
    };
    let (first, more) = match cell.split_once(", ") {
        Some((first, more)) => {
            let more = more.strip_suffix(" from 3 ranks").unwrap_or_else(|| panic!("{cell:?}: ', X from 3 ranks'"));
            (first, Some(more))
        }
        None => (cell, None),
    };
    let (per_rank, two) = per_block(first);
    let more = more.map_or(two, |m| {
        let (r, b) = per_block(m);
        assert_eq!(r, per_rank, "{cell:?}");
        b
    });
    Grid { per_rank, two, more, max }
}

/// The table at the top of `doc` (a file's text): its rows, in order.
fn table(file: &str, doc: &str) -> Vec<Row> {
    let kinds: Vec<KernelKind> = KernelId::all().into_iter().map(|k| k.kind).collect();
    let lines: Vec<&str> = doc.lines().filter_map(|l| l.strip_prefix("//! |")).collect();
    assert!(lines.len() >= 3, "{file}: no table");
    let header: Vec<&str> = lines[0].split('|').map(str::trim).collect();
    assert_eq!(
        &header[..8],
        ["algorithm (kernel)", "runs when", "2 ranks", "3 ranks", "4 ranks", "5 ranks", "8 ranks", "grid"],
        "{file}: header"
    );
    lines[2..]
        .iter()
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 9, "{file}: {line}");
            let name = cells[0].split('`').nth(1).unwrap_or_else(|| panic!("{file}: no `kernel` in {line}"));
            let kind = *kinds
                .iter()
                .find(|k| format!("{k:?}") == name)
                .unwrap_or_else(|| panic!("{file}: {name} is no kernel kind"));
            let when = match cells[1] {
                "LL team" => When::Ll,
                "multicast team" => When::Multicast,
                "16-byte aligned" => When::Aligned,
                "16-byte aligned blocks" => When::AlignedBlocks,
                "always" => When::Always,
                other => panic!("{file}: unknown condition {other:?}"),
            };
            Row { kind, when, ranges: cells[2..7].iter().map(|c| range(c)).collect(), grid: grid(cells[7]) }
        })
        .collect()
}

/// The collective a file plans, as the tests run it: bf16 sum for the reductions (no multicast
/// fallback for even sizes), root 1 for the broadcast; and its count for a size S.
fn check(file: &str, doc: &str, collective: Collective) {
    let rows = table(file, doc);
    let count = |s: u64| match collective {
        Collective::AllReduce { dtype, .. } | Collective::ReduceScatter { dtype, .. } => s / dtype.size() as u64,
        _ => s,
    };
    for (col, &n) in RANKS.iter().enumerate() {
        let mut sizes: Vec<u64> = (2..27).map(|p| 1u64 << p).collect();
        for row in &rows {
            for b in row.ranges[col].into_iter().flat_map(|(lo, hi)| [lo, hi]).filter(|&b| b < 1 << 40) {
                sizes.extend([b.saturating_sub(4), b, b + 4].into_iter().filter(|&s| s >= 4 && s % 4 == 0));
            }
        }
        for ll in [false, true] {
            for path in [Path::P2P, Path::Multicast] {
                for aligned in [true, false] {
                    for &s in &sizes {
                        let holds = |w: When| match w {
                            When::Ll => ll,
                            When::Multicast => path == Path::Multicast,
                            When::Aligned => aligned,
                            When::AlignedBlocks => aligned && s % 16 == 0,
                            When::Always => true,
                        };
                        let row = rows
                            .iter()
                            .find(|r| holds(r.when) && r.ranges[col].is_some_and(|(lo, hi)| (lo..=hi).contains(&s)))
                            .unwrap_or_else(|| panic!("{file}: no row for {s} B at {n} ranks"));
                        let blocks = if row.kind.is_ll() {
                            s.div_ceil(row.grid.two).clamp(1, row.grid.max)
                        } else {
                            let q = if row.grid.per_rank { s * u64::from(n) } else { s };
                            let per = if n >= 3 { row.grid.more } else { row.grid.two };
                            q.div_ceil(per).clamp(1, row.grid.max)
                        };
                        let mut l = test_launch(collective, path, count(s));
                        let offset = if aligned { 0 } else { 4 };
                        l.nranks = n;
                        l.data = RankPtrs::from(
                            (0..u64::from(n)).map(|r| 0x10_0000_0000 + (r << 28) + offset).collect::<Vec<_>>(),
                        );
                        l.sync =
                            RankPtrs::from((0..u64::from(n)).map(|r| 0x30_0000_0000 + (r << 28)).collect::<Vec<_>>());
                        l.data_mc = (path == Path::Multicast).then_some(0x90_0000_0000 + offset);
                        l.ll = ll;
                        for rank in [0, n - 1] {
                            l.rank = rank;
                            let p = plan(&l).unwrap().unwrap();
                            let what = format!("{file}: {s} B at {n} ranks (ll {ll}, {path:?}, aligned {aligned})");
                            assert_eq!(p.kernel.kind, row.kind, "{what}: the table says {row:?}");
                            assert_eq!(u64::from(p.blocks), blocks, "{what}: the table's grid {:?}", row.grid);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_all_reduce_table_is_the_plan() {
    check("all_reduce.rs", include_str!("all_reduce.rs"), Collective::AllReduce { dtype: DType::BF16, op: RedOp::Sum });
}

#[test]
fn the_reduce_scatter_table_is_the_plan() {
    let rs = Collective::ReduceScatter { dtype: DType::BF16, op: RedOp::Sum };
    check("reduce_scatter.rs", include_str!("reduce_scatter.rs"), rs);
}

#[test]
fn the_all_gather_table_is_the_plan() {
    check("all_gather.rs", include_str!("all_gather.rs"), Collective::AllGather);
}

#[test]
fn the_broadcast_table_is_the_plan() {
    check("broadcast.rs", include_str!("broadcast.rs"), Collective::Broadcast { root: 1 });
}
