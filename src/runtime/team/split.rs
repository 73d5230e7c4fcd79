//! Splitting a team (`mcast_team_split`, MPI_Comm_split semantics) into new teams made afresh.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Team, SPLIT_NOCOLOR};
use crate::runtime::comm::{Dec, Enc, ID_BYTES};
use crate::runtime::error::{Error, Result};

impl Team {
    /// Splits the team (`mcast_team_split`, MPI_Comm_split semantics): the ranks with the same
    /// color form a new team, ordered by key, then by rank in this team; [`SPLIT_NOCOLOR`]
    /// joins none. `colors[i]` and `keys[i]` belong to the i-th rank this process holds (every
    /// rank of a single-process team, the one rank of a multi-process team); the result has the
    /// new team of each of them (`None` for no color), the same `Arc` for ranks of one color.
    /// Each new team is made afresh (its own transport, memory, state words and, for processes,
    /// its own rendezvous whose id the new rank 0 sends over this team's), so a failure of one
    /// never reaches another or this one. Collective over every rank of the team.
    pub fn split(self: &Arc<Self>, colors: &[i32], keys: &[i32]) -> Result<Vec<Option<Arc<Team>>>> {
        let mine = self.own_ranks();
        if colors.len() != mine.len() || keys.len() != mine.len() {
            return Err(Error::internal("split: one color and one key per rank this process holds"));
        }
        let mut valid = self.check_usable("splitting the team");
        for (i, &c) in colors.iter().enumerate() {
            if c < 0 && c != SPLIT_NOCOLOR && valid.is_ok() {
                valid = Err(Error::invalid_argument(format!(
                    "colors[{i}] is {c}: a color is >= 0, or MCAST_SPLIT_NOCOLOR ({SPLIT_NOCOLOR})"
                )));
            }
        }
        // Every rank's (color, key): local, or gathered over the rendezvous (where a bad
        // argument on one rank fails every rank).
        // A team across NVLink domains splits over the whole team's connections.
        let comm = self.hier().map(|h| &h.global).or(self.comm.as_ref());
        let all: Vec<(i32, i32)> = match comm {
            None => {
                valid?;
                colors.iter().copied().zip(keys.iter().copied()).collect()
            }
            Some(comm) => {
                let mut e = Enc::default();
                e.u32(colors[0] as u32).u32(keys[0] as u32);
                let parts = comm.exchange("split: colors and keys", valid, &e.0, &[])?;
                let mut all = Vec::with_capacity(parts.len());
                for p in &parts {
                    let mut d = Dec(&p.bytes);
                    all.push((d.u32()? as i32, d.u32()? as i32));
                }
                all
            }
        };
        // Each color's members, in new-rank order.
        let mut groups: BTreeMap<i32, Vec<usize>> = Default::default();
        for (r, &(c, _)) in all.iter().enumerate() {
            if c != SPLIT_NOCOLOR {
                groups.entry(c).or_default().push(r);
            }
        }
        for members in groups.values_mut() {
            members.sort_by_key(|&r| (all[r].1, r));
        }
        match comm {
            None => {
                let mut made: Vec<(i32, Arc<Team>)> = Vec::new();
                for (&c, members) in &groups {
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
                Ok(all.iter().map(|&(c, _)| made.iter().find(|(mc, _)| *mc == c).map(|(_, t)| t.clone())).collect())
            }
            Some(comm) => {
                let r = comm.rank();
                let color = all[r].0;
                let members = groups.get(&color);
                let new_rank = members.and_then(|m| m.iter().position(|&q| q == r));
                // The new rank 0 of each color makes its team's id; it travels over this team. A
                // fresh root-mode id, never env mode: every color (and every split) must get its
                // own address and secret, not the job's `MCAST_BOOTSTRAP_ADDR`.
                let id =
                    if new_rank == Some(0) { Some(crate::bootstrap::new_root_id().map_err(Error::from)) } else { None };
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
                let parts = comm.exchange("split: team ids", status, &e.0, &[])?;
                let (Some(members), Some(new_rank)) = (members, new_rank) else { return Ok(vec![None]) };
                let bytes = Dec(&parts[members[0]].bytes).bytes()?;
                let id: [u8; ID_BYTES] =
                    bytes.try_into().map_err(|_| Error::internal("split: a team id of the wrong size"))?;
                let device = self.devices[mine[0]];
                let team = Team::init_rank(&self.env, &id, members.len() as i32, new_rank as i32, device)
                    .map_err(|e| e.context(format!("joining the team of color {color} as rank {new_rank}")))?;
                Ok(vec![Some(team)])
            }
        }
    }
}
