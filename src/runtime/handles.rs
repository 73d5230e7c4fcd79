//! The process-wide tables behind the C handles. Destroying a context removes its teams and
//! buffers, so their handles become invalid with it. A team handle holds either kind of team
//! ([`AnyTeam`]); a buffer handle, the buffer with the team whose handle made it.
//!
//! Each table is read-mostly: a look-up (every call, from every rank's thread) takes it shared,
//! so concurrent calls never wait for each other; only create and destroy take it exclusively.

use std::sync::Arc;

use parking_lot::RwLock;

use super::context::Context;
use super::error::{Error, ErrorKind, Result};
use super::registry::{HandleKind, HandleMap};
use super::teams::{AnyBuffer, AnyTeam};

static CONTEXTS: RwLock<HandleMap<Arc<Context>>> = RwLock::new(HandleMap::new(HandleKind::Context));
static TEAMS: RwLock<HandleMap<AnyTeam>> = RwLock::new(HandleMap::new(HandleKind::Team));
static BUFFERS: RwLock<HandleMap<AnyBuffer>> = RwLock::new(HandleMap::new(HandleKind::Buffer));

fn describe(id: u64, what: &str) -> Error {
    if id == 0 {
        Error::invalid_handle(format!("the {what} handle is zero"))
    } else {
        Error::invalid_handle(format!(
            "{what} handle {id:#x} is not live: destroyed, stale, of another kind, or its parent was destroyed"
        ))
    }
}

/// Registers a context.
pub fn insert_context(ctx: Arc<Context>) -> u64 {
    CONTEXTS.write().insert(ctx)
}

/// The context behind `id`.
pub fn context(id: u64) -> Result<Arc<Context>> {
    CONTEXTS.read().get(id).ok_or_else(|| describe(id, "context"))
}

/// Unregisters a context and every team and buffer in it; returns it.
pub fn remove_context(id: u64) -> Result<Arc<Context>> {
    let ctx = CONTEXTS.write().remove(id).ok_or_else(|| describe(id, "context"))?;
    BUFFERS.write().remove_where(|b| Arc::ptr_eq(b.buf.team().context(), ctx.env()));
    TEAMS.write().remove_where(|t| Arc::ptr_eq(t.context(), ctx.env()));
    Ok(ctx)
}

/// Registers a team.
pub fn insert_team(team: impl Into<AnyTeam>) -> u64 {
    TEAMS.write().insert(team.into())
}

/// The team behind `id`.
pub fn team(id: u64) -> Result<AnyTeam> {
    TEAMS.read().get(id).ok_or_else(|| describe(id, "team"))
}

/// The handle of `team`, if it has one (a linear search: for names and messages, not for a
/// call's path).
pub fn team_id(team: &AnyTeam) -> Option<u64> {
    TEAMS.read().find(|t| t.same(team))
}

/// The handle of the team of buffer `id`, if both are live (for names, as [`team_id`]).
pub fn buffer_team_id(id: u64) -> Option<u64> {
    buffer(id).ok().and_then(|b| team_id(&b.team))
}

/// Destroys the team behind `id` (refused while it has buffers, unless it failed: then its
/// buffers' handles go with it). The table is not locked while the team waits for its work,
/// so an abort from another thread can reach the team and end that wait; of racing destroys
/// one succeeds and the others get `InvalidHandle`.
pub fn destroy_team(id: u64) -> Result<()> {
    let team = TEAMS.read().get(id).ok_or_else(|| describe(id, "team"))?;
    match team.destroy() {
        Err(e) if e.kind == ErrorKind::InUse => Err(e),
        Err(e) if e.kind == ErrorKind::InvalidHandle => Err(describe(id, "team")),
        result => {
            TEAMS.write().remove(id);
            BUFFERS.write().remove_where(|b| b.team.same(&team));
            result
        }
    }
}

/// Registers a buffer.
pub fn insert_buffer(buf: AnyBuffer) -> u64 {
    BUFFERS.write().insert(buf)
}

/// The buffer behind `id`.
pub fn buffer(id: u64) -> Result<AnyBuffer> {
    BUFFERS.read().get(id).ok_or_else(|| describe(id, "buffer"))
}

/// Frees the buffer behind `id`.
pub fn free_buffer(id: u64) -> Result<()> {
    let buf = BUFFERS.write().remove(id).ok_or_else(|| describe(id, "buffer"))?;
    buf.free()
}
