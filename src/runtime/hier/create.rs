//! Making a team across NVLink domains: on every rank of the whole team's connections, the
//! engine and the layout, then the domain team (a flat team over this rank's domain), then this
//! rank's rail communicator.

use std::sync::Arc;

use super::Across;
use crate::bootstrap::ID_BYTES;
use crate::runtime::comm::{Comm, Dec, Enc};
use crate::runtime::env::{Env, Member};
use crate::runtime::error::{Error, Result};
use crate::runtime::team::{spanning, Domains, Team};

impl Across {
    /// A team across NVLink domains, on every rank of `global` (the whole team's connections,
    /// formed; `domains` and `why` as [`crate::runtime::team::Joined::AcrossDomains`] gives
    /// them): the engine and the layout, then the domain team (a flat team over this rank's
    /// domain, its fresh root id made by the domain's first rank and sent over `global`, never
    /// env mode), then this rank's rail communicator. Every step is voted over `global`, so one
    /// rank's failure is every rank's; what was made is released on failure. The context holds
    /// the team made (in place of its domain team, which it releases with it).
    pub fn create(env: &Arc<Env>, global: Arc<Comm>, device: i32, domains: &Domains, why: &str) -> Result<Arc<Across>> {
        let spanning = spanning(domains);
        let (engine, layout) = Across::prepare(env, &global, &domains.of_rank, &domains.names, &spanning, why)?;
        let r = global.rank();
        let (d, local) = layout.place[r];
        let id = (local == 0).then(|| crate::bootstrap::new_root_id().map_err(Error::from));
        let mut e = Enc::default();
        match &id {
            Some(Ok(id)) => e.bytes(id),
            _ => e.bytes(&[]),
        };
        let status = match &id {
            Some(Err(err)) => Err(err.clone()),
            _ => Ok(()),
        };
        let parts = global.exchange("domain team ids", status, &e.0, &[])?;
        let bytes = Dec(&parts[layout.rank_of(d, 0)].bytes).bytes()?;
        let id: [u8; ID_BYTES] = bytes.try_into().map_err(|_| Error::internal("a domain team id of the wrong size"))?;
        let size = layout.domain_size() as i32;
        let made = Team::init_rank(env, &id, size, local as i32, device)
            .map_err(|e| e.context(format!("rank {r} joining the team of {} as its rank {local}", domains.names[d])));
        let status = made.as_ref().map(|_| ()).map_err(Clone::clone);
        let undo = |team: &Arc<Team>| {
            if let Err(e) = team.destroy() {
                tracing::error!("rolling back a team across NVLink domains: {e}");
            }
        };
        if let Err(e) = global.vote("domain teams", status) {
            if let Ok(team) = &made {
                undo(team);
            }
            return Err(e);
        }
        let team = made?;
        // An engine that runs on the GPU (NCCL) makes its communicator on the calling thread's
        // current device; on failure the engine's own call fails, and that is voted.
        if let Err(e) = env.driver().bind_thread(device) {
            tracing::warn!("rank {r}: making device {device} current for the rail communicator: {e}");
        }
        match Across::connect(team.clone(), global, engine, layout, domains.names.clone(), device) {
            Ok(a) => {
                tracing::debug!("rank {r}: a team across NVLink domains ({spanning}), engine \"{}\"", a.engine_name());
                let a = Arc::new(a);
                a.watch_aborts();
                env.leave(&*team);
                env.join(a.clone() as Arc<dyn Member>);
                Ok(a)
            }
            Err(e) => {
                undo(&team);
                Err(e)
            }
        }
    }
}
