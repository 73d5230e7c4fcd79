//! Splitting a team (`mcast_team_split`, MPI_Comm_split semantics) into new teams made afresh.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Team, SPLIT_NOCOLOR};
use crate::runtime::comm::{Dec, Enc, ID_BYTES};
use crate::runtime::error::{Error, Result};

use crate::runtime::comm::Comm;

/// Checks the arguments of a split: `usable` (the team's own state) first, then every color of
/// this process's ranks (>= 0 or [`SPLIT_NOCOLOR`]).
pub fn check_colors(usable: Result<()>, colors: &[i32]) -> Result<()> {
    usable?;
    for (i, &c) in colors.iter().enumerate() {
        if c < 0 && c != SPLIT_NOCOLOR {
            return Err(Error::invalid_argument(format!(
                "colors[{i}] is {c}: a color is >= 0, or MCAST_SPLIT_NOCOLOR ({SPLIT_NOCOLOR})"
            )));
        }
    }
    Ok(())
}

/// The split of a team whose ranks are processes, over its connections `comm`: every rank's
/// `(color, key)` gathered (`valid`: this rank's arguments, whose failure fails every rank), the
/// ranks of each color ordered by key, then rank; the new rank 0 of each color makes its team's
/// id (a fresh root-mode id, never env mode: every color, and every split, gets its own address
/// and secret, not the job's `MCAST_BOOTSTRAP_ADDR`), which travels over `comm`; `join(id,
/// nranks, rank)` then makes this rank's new team. `None` for [`SPLIT_NOCOLOR`].
pub fn split_over<T>(
    comm: &Comm,
    valid: Result<()>,
    color: i32,
    key: i32,
    join: impl FnOnce(&[u8; ID_BYTES], i32, i32) -> Result<T>,
) -> Result<Option<T>> {
    let mut e = Enc::default();
    e.u32(color as u32).u32(key as u32);
    let parts = comm.exchange("split: colors and keys", valid, &e.0, &[])?;
    let mut all = Vec::with_capacity(parts.len());
    for p in &parts {
        let mut d = Dec(&p.bytes);
        all.push((d.u32()? as i32, d.u32()? as i32));
    }
    let groups = groups(&all);
    let r = comm.rank();
    let members = groups.get(&color);
    let new_rank = members.and_then(|m| m.iter().position(|&q| q == r));
    let id = if new_rank == Some(0) { Some(crate::bootstrap::new_root_id().map_err(Error::from)) } else { None };
    let mut e = Enc::default();
    if let Some(Ok(id)) = &id {
        e.bytes(id);
    } else {
        e.bytes(&[]);
    }
    let status = match &id {
        Some(Err(err)) => Err(err.clone()),
        _ => Ok(()),
    };
    // Confirmed: no rank goes on to join a new team while another gave up on the split.
    let parts = comm.exchange_confirmed("split: team ids", status, &e.0)?;
    let (Some(members), Some(new_rank)) = (members, new_rank) else { return Ok(None) };
    let bytes = Dec(&parts[members[0]].bytes).bytes()?;
    let id: [u8; ID_BYTES] = bytes.try_into().map_err(|_| Error::internal("split: a team id of the wrong size"))?;
    let team = join(&id, members.len() as i32, new_rank as i32)
        .map_err(|e| e.context(format!("joining the team of color {color} as rank {new_rank}")))?;
    Ok(Some(team))
}

/// Each color's members (by `all[r] = (color, key)`), in new-rank order.
fn groups(all: &[(i32, i32)]) -> BTreeMap<i32, Vec<usize>> {
    let mut groups: BTreeMap<i32, Vec<usize>> = Default::default();
    for (r, &(c, _)) in all.iter().enumerate() {
        if c != SPLIT_NOCOLOR {
            groups.entry(c).or_default().push(r);
        }
    }
    for members in groups.values_mut() {
        members.sort_by_key(|&r| (all[r].1, r));
    }
    groups
}

impl Team {
    /// Splits the team (`mcast_team_split`, MPI_Comm_split semantics): the ranks with the same
    /// color form a new team, ordered by key, then by rank in this team; [`SPLIT_NOCOLOR`]
    /// joins none. `colors[i]` and `keys[i]` belong to the i-th rank this process holds (every
    /// rank of a single-process team, the one rank of a multi-process team); the result has the
    /// new team of each of them (`None` for no color), the same `Arc` for ranks of one color.
    /// Each new team is made afresh (its own transport, memory, state words and, for processes,
    /// its own rendezvous whose id the new rank 0 sends over this team's: [`split_over`]), so a
    /// failure of one never reaches another or this one. Collective over every rank of the team.
    pub fn split(self: &Arc<Self>, colors: &[i32], keys: &[i32]) -> Result<Vec<Option<Arc<Team>>>> {
        let mine = self.own_ranks();
        if colors.len() != mine.len() || keys.len() != mine.len() {
            return Err(Error::internal("split: one color and one key per rank this process holds"));
        }
        let valid = check_colors(self.check_usable("splitting the team"), colors);
        let Some(comm) = self.comm.as_ref() else {
            valid?;
            let all: Vec<(i32, i32)> = colors.iter().copied().zip(keys.iter().copied()).collect();
            let mut made: Vec<(i32, Arc<Team>)> = Vec::new();
            for (&c, members) in &groups(&all) {
                let devices: Vec<i32> = members.iter().map(|&r| self.devices[r]).collect();
                match Team::create(&self.env, &devices) {
                    Ok(t) => made.push((c, t)),
                    Err(e) => {
                        for (_, t) in made {
                            if let Err(undo) = t.destroy() {
                                tracing::error!("rolling back a split: {undo}");
                            }
                        }
                        return Err(e.context(format!("making the team of color {c} (devices {devices:?})")));
                    }
                }
            }
            return Ok(all
                .iter()
                .map(|&(c, _)| made.iter().find(|(mc, _)| *mc == c).map(|(_, t)| t.clone()))
                .collect());
        };
        let device = self.devices[mine[0]];
        let team =
            split_over(comm, valid, colors[0], keys[0], |id, n, r| Team::init_rank(&self.env, id, n, r, device))?;
        Ok(vec![team])
    }
}
