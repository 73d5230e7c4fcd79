//! Which engine a team across NVLink domains uses between them (API.md, "Teams across NVLink
//! domains"): the one the application registered (`mcast_context_set_net`), else `MCAST_NET`
//! (`auto`, the default, and `nccl` load NCCL at run time; `none` is no engine). On the
//! simulator NCCL is loaded only from a library a variable names.

use std::sync::Arc;

use super::Engine;
use crate::runtime::config::{Config, NetMode};

/// The engine for a team made now in a context with `registered` (its registered engine) and
/// `config`, on the simulator when `sim`; or why there is none: each engine tried and why it
/// failed, for the `NOT_SUPPORTED` every rank returns.
pub fn choose(
    registered: Option<Arc<dyn Engine>>,
    config: &Config,
    sim: bool,
) -> std::result::Result<Arc<dyn Engine>, String> {
    if let Some(e) = registered {
        return Ok(e);
    }
    let mode = match config.net {
        NetMode::None => return Err("none registered (mcast_context_set_net), and MCAST_NET=none".into()),
        NetMode::Auto => "MCAST_NET=auto",
        NetMode::Nccl => "MCAST_NET=nccl",
    };
    let (explicit, fallback) = (named(&config.net_nccl), named(&config.nccl_fallback));
    // A real NCCL cannot move the simulator's memory: there only a library a variable names (the
    // tests' stand-in NCCL over MPI) is loaded, never libnccl.so.2 from the search path.
    if sim && explicit.is_none() && fallback.is_none() {
        return Err(format!(
            "none registered (mcast_context_set_net); NCCL ({mode}): on the simulator only a library named by \
             {} or {} is loaded (a real NCCL cannot move simulated memory)",
            super::nccl::ENV,
            super::nccl::FALLBACK_ENV
        ));
    }
    super::nccl::load(explicit, fallback)
        .map_err(|why| format!("none registered (mcast_context_set_net); NCCL ({mode}): {why}"))
}

/// A variable's value, `None` when unset or empty.
fn named(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}
