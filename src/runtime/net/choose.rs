//! Which engine a team across NVLink domains uses between them (API.md, "Teams across NVLink
//! domains"): the one the application registered (`mcast_context_set_net`), else `MCAST_NET`
//! (`auto`, the default, and `nccl` load NCCL at run time; `none` is no engine).

use std::sync::Arc;

use super::Engine;
use crate::runtime::config::NetMode;
use crate::runtime::env::Env;

/// The engine for a team made now in `env`, or why there is none: each engine tried and why it
/// failed, for the `NOT_SUPPORTED` every rank returns.
pub fn choose(env: &Env) -> std::result::Result<Arc<dyn Engine>, String> {
    if let Some(e) = env.registered_net() {
        return Ok(e);
    }
    let config = env.config();
    let mode = match config.net {
        NetMode::None => return Err("none registered (mcast_context_set_net), and MCAST_NET=none".into()),
        NetMode::Auto => "MCAST_NET=auto",
        NetMode::Nccl => "MCAST_NET=nccl",
    };
    super::nccl::load(config.net_nccl.as_deref(), config.nccl_fallback.as_deref())
        .map_err(|why| format!("none registered (mcast_context_set_net); NCCL ({mode}): {why}"))
}
