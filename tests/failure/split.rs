//! Split into every color pattern of 4 and 8 ranks, sub-teams that share no failure, and bad
//! colors.

use super::*;

/// Every partition of `n` ranks into colors, as restricted growth strings.
fn partitions(n: usize) -> Vec<Vec<i32>> {
    let mut out = Vec::new();
    let mut a = vec![0i32; n];
    fn go(i: usize, max: i32, a: &mut Vec<i32>, out: &mut Vec<Vec<i32>>) {
        if i == a.len() {
            out.push(a.clone());
            return;
        }
        for c in 0..=max + 1 {
            a[i] = c;
            go(i + 1, max.max(c), a, out);
        }
    }
    go(1, 0, &mut a, &mut out);
    out
}

/// Splits a single-process team of `devices.len()` ranks by `colors` (with keys reversing the
/// order where `reverse`), checks each new team's ranks and order, and runs an all-reduce and
/// an all-gather in every new team.
fn check_split(ctx: &Arc<Context>, parent: &Arc<Team>, colors: &[i32], reverse: bool) {
    let n = colors.len();
    let keys: Vec<i32> = (0..n as i32).map(|r| if reverse { -r } else { 0 }).collect();
    let made = parent.split(colors, &keys).unwrap();
    assert_eq!(made.len(), n);
    let mut seen: Vec<Arc<Team>> = Vec::new();
    for (r, t) in made.iter().enumerate() {
        match (colors[r], t) {
            (SPLIT_NOCOLOR, None) => {}
            (SPLIT_NOCOLOR, Some(_)) | (_, None) => panic!("rank {r} of color {} got {}", colors[r], t.is_some()),
            (c, Some(t)) => {
                let mut members: Vec<usize> = (0..n).filter(|&q| colors[q] == c).collect();
                if reverse {
                    members.reverse();
                }
                let want: Vec<Device> = members.iter().map(|&q| parent.devices()[q]).collect();
                assert_eq!(t.devices(), &want[..], "colors {colors:?}");
                if !seen.iter().any(|s| Arc::ptr_eq(s, t)) {
                    seen.push(t.clone());
                }
            }
        }
    }
    for t in seen {
        let m = t.size();
        let buf = Buffer::alloc(&t, 4096).unwrap();
        for r in 0..m {
            buf.write(r as i32, 0, &(10 + r as i32).to_ne_bytes()).unwrap();
        }
        let s = rank_streams(&t);
        for r in 0..m {
            run(&buf, r as i32, 0, 1, Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum }, s[r]).unwrap();
        }
        let want: i32 = (0..m as i32).map(|r| 10 + r).sum();
        for r in 0..m {
            synchronize(&t, r as i32, s[r]).unwrap();
            let mut got = [0u8; 4];
            buf.read(r as i32, 0, &mut got).unwrap();
            assert_eq!(i32::from_ne_bytes(got), want, "colors {colors:?}, new rank {r}");
        }
        // All-gather of each rank's new rank number: the order is the new rank order.
        for r in 0..m {
            buf.write(r as i32, 64 + 4 * r, &(r as u32).to_ne_bytes()).unwrap();
        }
        for r in 0..m {
            run(&buf, r as i32, 64, 4, Collective::AllGather, s[r]).unwrap();
        }
        for r in 0..m {
            synchronize(&t, r as i32, s[r]).unwrap();
            let mut got = vec![0u8; 4 * m];
            buf.read(r as i32, 64, &mut got).unwrap();
            let ranks: Vec<u32> = got.chunks(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect();
            assert_eq!(ranks, (0..m as u32).collect::<Vec<_>>());
        }
        drop_rank_streams(&t, s);
        buf.free().unwrap();
        t.destroy().unwrap();
    }
    let _ = ctx;
}

#[test]
fn split_into_every_color_pattern_of_4_ranks() {
    if on_gpu() {
        return;
    }
    for multicast in [false, true] {
        let ctx = sim_context(4, 5000, multicast);
        let parent = Team::create(&ctx, &[0, 1, 2, 3]).unwrap();
        let patterns = partitions(4);
        assert_eq!(patterns.len(), 15);
        for colors in &patterns {
            check_split(&ctx, &parent, colors, false);
            check_split(&ctx, &parent, colors, true);
            // The highest color left out.
            let top = *colors.iter().max().unwrap();
            let some: Vec<i32> = colors.iter().map(|&c| if c == top { SPLIT_NOCOLOR } else { c }).collect();
            check_split(&ctx, &parent, &some, false);
        }
        parent.destroy().unwrap();
        assert_clean(&ctx);
    }
}

#[test]
fn split_into_every_color_pattern_of_8_ranks() {
    if on_gpu() {
        return;
    }
    let ctx = sim_context(8, 5000, false);
    let parent = Team::create(&ctx, &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    let patterns = partitions(8);
    assert_eq!(patterns.len(), 4140);
    for (i, colors) in patterns.iter().enumerate() {
        check_split(&ctx, &parent, colors, i % 2 == 1);
    }
    parent.destroy().unwrap();
    assert_clean(&ctx);
}

#[test]
fn sub_teams_share_no_failure() {
    if on_gpu() {
        return;
    }
    let ctx = sim_context(4, LONG_MS, false);
    let parent = Team::create(&ctx, &[0, 1, 2, 3]).unwrap();
    let made = parent.split(&[0, 1, 0, 1], &[0, 0, 0, 0]).unwrap();
    let (a, b) = (made[0].clone().unwrap(), made[1].clone().unwrap());
    a.abort();
    assert_eq!(a.async_error(), Some(ErrorKind::Aborted));
    assert_eq!(b.async_error(), None);
    assert_eq!(parent.async_error(), None);
    for t in [&b, &parent] {
        let buf = Buffer::alloc(t, 4096).unwrap();
        let s = rank_streams(t);
        for r in 0..t.size() {
            run(&buf, r as i32, 0, 16, AR, s[r]).unwrap();
        }
        for r in 0..t.size() {
            synchronize(t, r as i32, s[r]).unwrap();
        }
        drop_rank_streams(t, s);
        buf.free().unwrap();
    }
    // An aborted parent does not reach its sub-teams either.
    parent.abort();
    assert_eq!(b.async_error(), None);
    for t in [a, b, parent] {
        t.destroy().unwrap();
    }
    assert_clean(&ctx);
}

#[test]
fn split_rejects_bad_colors_and_failed_teams() {
    if on_gpu() {
        return;
    }
    let ctx = sim_context(4, LONG_MS, false);
    let parent = Team::create(&ctx, &[0, 1]).unwrap();
    let e = parent.split(&[0, -2], &[0, 0]).err().unwrap();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("colors[1] is -2"), "{e}");
    let all_out = parent.split(&[SPLIT_NOCOLOR, SPLIT_NOCOLOR], &[0, 0]).unwrap();
    assert!(all_out.iter().all(Option::is_none));
    parent.abort();
    assert_eq!(parent.split(&[0, 0], &[0, 0]).err().unwrap().kind, ErrorKind::Aborted);
    parent.destroy().unwrap();
    assert_clean(&ctx);
}
