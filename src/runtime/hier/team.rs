//! What a team across NVLink domains does its own way, besides its collectives: its ranks are
//! the whole team's (the application's numbering), mapped to the domain team's at each call; its
//! failures are the domain team's and the whole team's (told by ranks of other domains, and
//! told to them); it aborts, synchronizes, describes itself and is destroyed over both.

use std::sync::Arc;

use super::Across;
use crate::driver::{Device, Stream};
use crate::runtime::collective;
use crate::runtime::env::Member;
use crate::runtime::error::{Error, ErrorKind, Result};
use crate::runtime::team::{Team, TeamInfo};

impl Across {
    /// Ranks of the whole team.
    pub fn size(&self) -> usize {
        self.layout.size()
    }

    /// The domain team, once it has heard what the whole team's connections say (see
    /// [`Across::error`]): what a call on the domain team's memory or state goes through.
    pub fn domain_team(&self) -> &Arc<Team> {
        self.hear();
        &self.team
    }

    /// Records in the domain team a failure ranks of other domains told over the whole team's
    /// connections (first: the whole team's failure names its cause; a domain peer's exit after
    /// it, only that), so the domain team's own checks find it.
    pub(super) fn hear(&self) {
        if !self.team.is_failed() {
            if let Some((kind, why)) = self.global.failure() {
                self.team.told(kind, &why);
            }
        }
    }

    /// Tells every rank of the whole team of a timeout the domain team found here (only the
    /// first failure travels).
    fn tell(&self) {
        if let Some(what) = self.team.timeout_cause() {
            self.global.timed_out(what);
        }
    }

    /// The sticky error (see [`Team::error`]): the domain team's, which hears the whole team's
    /// first.
    pub fn error(&self) -> Option<Error> {
        self.domain_team().error()
    }

    /// Fails with the team's sticky error; `what` names the call.
    pub fn check_usable(&self, what: impl std::fmt::Display) -> Result<()> {
        self.domain_team().check_usable(what)
    }

    /// The asynchronous error without waiting (`mcast_team_get_error`; see
    /// [`Team::async_error`]); a timeout found on the device is told to the whole team.
    pub fn async_error(&self) -> Option<ErrorKind> {
        let kind = self.domain_team().async_error();
        self.tell();
        kind
    }

    /// Waits for rank `rank`'s (of the whole team) work on `stream` and reports the team's error
    /// (see `runtime::collective::synchronize`); a timeout is told to the whole team.
    pub fn synchronize(&self, rank: i32, stream: Stream) -> Result<()> {
        let local = self.own(rank, "rank")?;
        let done = collective::synchronize(self.domain_team(), local as i32, stream);
        self.tell();
        done?;
        match self.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Makes an abort heard on the whole team's connections abort the domain team here too, at
    /// once, whether or not a call runs: its device waits end and its domain peers are told. A
    /// rank of another domain that aborts reaches this domain's waits only so (its own abort
    /// writes the state words of its domain's ranks alone).
    pub(super) fn watch_aborts(&self) {
        let team = Arc::downgrade(&self.team);
        self.global.bootstrap().on_abort(Box::new(move |why| {
            if let Some(t) = team.upgrade() {
                t.abort_by(why);
            }
        }));
    }

    /// Aborts the team (`mcast_team_abort`): the domain team (its device waits, its
    /// connections), the rail communicator and the whole team's connections.
    pub fn abort(&self) {
        let who = format!("mcast_team_abort by rank {}'s process", self.global.rank());
        self.team.abort_by(&who);
        self.abort_rails(&who);
    }

    /// What `mcast_team_get_info` reports: the domain team's, for the whole team.
    pub fn info(&self) -> TeamInfo {
        TeamInfo {
            size: self.layout.size(),
            domains: self.layout.domains(),
            domain_size: self.layout.domain_size(),
            net_engine: self.engine_name().to_string(),
            ..self.team.info()
        }
    }

    /// Destroys the team (see [`Team::destroy`]): the domain team, then the rail communicator,
    /// the rail stream and the scratch.
    pub fn destroy(self: &Arc<Self>) -> Result<()> {
        self.hear();
        let destroyed = self.team.destroy();
        if destroyed.as_ref().is_err_and(|e| matches!(e.kind, ErrorKind::InUse | ErrorKind::InvalidHandle)) {
            return destroyed;
        }
        let errors = self.release_rails();
        self.team.context().leave(&**self);
        match (destroyed, errors.into_iter().next()) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(e)) => Err(e.context("destroying the team")),
            (Ok(()), None) => Ok(()),
        }
    }

    /// The device API reaches a team's memory by NVLink: a team across NVLink domains has none
    /// between its domains, so its handles are refused (`NotSupported`).
    pub fn refuse_device_api(&self) -> Error {
        Error::not_supported(format!(
            "the team spans {} NVLink domains (engine \"{}\" between them): the device API needs every rank's memory \
             over NVLink; use a team over one domain (e.g. mcast_team_split by domain) for device-side work",
            self.layout.domains(),
            self.engine_name()
        ))
    }
}

/// What the context asks of its teams: the domain team's, and at shutdown the rails too.
impl Member for Across {
    fn trim_cache(&self) -> u64 {
        self.team.trim_cache()
    }

    fn live_buffers(&self) -> usize {
        self.team.live_buffers()
    }

    fn size(&self) -> usize {
        self.team.size()
    }

    fn devices(&self) -> &[Device] {
        self.team.devices()
    }

    fn release_all(&self) -> Vec<Error> {
        let mut errors = self.team.release_all();
        errors.extend(self.release_rails());
        errors
    }
}
