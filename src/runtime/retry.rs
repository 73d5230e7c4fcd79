//! The one retry policy for steps that can run out of memory or find the system not ready:
//! trim caches, back off `retry_backoff_ms * 2^k`, retry up to `oom_retries` times; on final
//! failure an error that names the driver call, the bytes asked, the live multicast objects and
//! what to try. [`retry`] for one process, [`lockstep`] for the ranks of a multi-process team.

use std::time::Duration;

use super::comm::Comm;
use super::env::Env;
use super::error::{Error, Result};
use crate::driver::{CuResult, DResult, DriverError};

/// Codes a later attempt may not get: out of memory, system not ready, illegal state.
fn retryable(code: CuResult) -> bool {
    matches!(code, CuResult::ERROR_OUT_OF_MEMORY | CuResult::ERROR_SYSTEM_NOT_READY | CuResult::ERROR_ILLEGAL_STATE)
}

/// `"; asked for N bytes"`, or nothing for a step that allocates nothing.
fn asked(bytes: u64) -> String {
    if bytes > 0 {
        format!("; asked for {bytes} bytes")
    } else {
        String::new()
    }
}

/// Before attempt `attempt + 1`: frees what `trim` and every team of `env` keep cached, tells
/// `log` the bytes freed and the back-off, then sleeps `retry_backoff_ms * 2^attempt` ms.
fn back_off(env: &Env, attempt: u32, trim: &mut dyn FnMut() -> u64, log: impl FnOnce(u64, u64)) {
    let freed = trim() + env.trim_caches();
    let backoff = u64::from(env.config().retry_backoff_ms).saturating_mul(1u64 << attempt.min(16));
    log(freed, backoff);
    std::thread::sleep(Duration::from_millis(backoff));
}

/// Runs `step` under the retry policy of `env`. `what` describes the step for messages, `bytes`
/// is what it asks for (0 if not an allocation), and `trim` frees cached memory the caller holds
/// (the context's other teams are trimmed too).
pub fn retry<T>(
    env: &Env,
    what: &dyn Fn() -> String,
    bytes: u64,
    trim: &mut dyn FnMut() -> u64,
    mut step: impl FnMut() -> DResult<T>,
) -> Result<T> {
    let retries = env.config().oom_retries;
    let mut attempt = 0u32;
    loop {
        let err = match step() {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if !retryable(err.code) {
            return Err(Error::driver(err, what()));
        }
        if attempt >= retries {
            let live_mc = env.resources.counts().multicast_objects;
            let asked = asked(bytes);
            let tries = if retries > 0 { format!(" after {retries} retries") } else { String::new() };
            let hint = if err.code == CuResult::ERROR_OUT_OF_MEMORY {
                format!(
                    "free buffers or destroy teams, lower the request, or raise MCAST_OOM_RETRIES{}",
                    sim_hint(env, err.func)
                )
            } else {
                "check that the fabric manager and the NVIDIA driver daemons are running (nvidia-smi -q)".to_string()
            };
            let mut e = Error::driver(err, what());
            e.message = format!(
                "{}: {} returned {}{tries}{asked}; {live_mc} multicast object(s) live in this context; {hint}",
                what(),
                err.func,
                err.code
            );
            return Err(e);
        }
        back_off(env, attempt, trim, |freed, backoff| {
            tracing::info!("{} returned {}: freed {freed} cached bytes, retrying in {backoff} ms", err.func, err.code)
        });
        attempt += 1;
    }
}

/// On the simulator, where its budgets are settings: the one an out-of-memory of `func` ran
/// into, with its value and variable (`MCAST_SIM_DEVICE_MEMORY`, `MCAST_SIM_MULTICAST_SLOTS`).
fn sim_hint(env: &Env, func: &str) -> String {
    if env.driver().as_sim().is_none() {
        return String::new();
    }
    let c = env.config();
    if func.starts_with("cuMulticastCreate") {
        format!(
            "; the simulated fabric holds sim_multicast_slots = {} multicast objects (MCAST_SIM_MULTICAST_SLOTS)",
            c.sim_multicast_slots
        )
    } else {
        format!(
            "; each simulated device has sim_device_memory = {} bytes (MCAST_SIM_DEVICE_MEMORY, e.g. 4G)",
            c.sim_device_memory
        )
    }
}

/// The retry policy of a multi-process team, decided together: every rank runs `step` (until it
/// succeeded once; `keep` takes its result at once so that a later rollback finds it), then
/// all ranks exchange the outcome. All succeeded: done. Any rank failed with a code that is not
/// retryable, or the retries are spent: every rank returns an error (its own, or one naming the
/// rank that failed). Otherwise every rank trims, backs off and the ranks that failed try again.
#[allow(clippy::too_many_arguments)]
pub fn lockstep<T>(
    comm: &Comm,
    env: &Env,
    label: &str,
    what: &dyn Fn() -> String,
    bytes: u64,
    trim: &mut dyn FnMut() -> u64,
    mut step: impl FnMut() -> DResult<T>,
    mut keep: impl FnMut(T),
) -> Result<()> {
    let retries = env.config().oom_retries;
    let mut attempt = 0u32;
    let mut done = false;
    loop {
        let mut failed: Option<DriverError> = None;
        if !done {
            match step() {
                Ok(v) => {
                    keep(v);
                    done = true;
                }
                Err(e) => failed = Some(e),
            }
        }
        // Payload: 0 = ok, 1 = retryable failure, 2 = final failure.
        let verdict: u32 = match failed {
            None => 0,
            Some(e) if retryable(e.code) && attempt < retries => 1,
            Some(_) => 2,
        };
        let status = match (verdict, failed) {
            (2, Some(e)) => {
                let live_mc = env.resources.counts().multicast_objects;
                let asked = asked(bytes);
                let sim = if e.code == CuResult::ERROR_OUT_OF_MEMORY { sim_hint(env, e.func) } else { String::new() };
                Err(Error::driver(e, what()).context(format!(
                    "failed after {attempt} lockstep retries{asked}; {live_mc} multicast object(s) live in this \
                     context{sim}"
                )))
            }
            _ => Ok(()),
        };
        let parts = comm.exchange(label, status, &verdict.to_le_bytes(), &[])?;
        let any_retry = parts.iter().any(|p| p.bytes.first() == Some(&1));
        if !any_retry {
            return Ok(());
        }
        back_off(env, attempt, trim, |freed, backoff| {
            tracing::info!(
                "{label}: a rank ran out of memory; freed {freed} cached bytes, all ranks retry in {backoff} ms"
            )
        });
        attempt += 1;
    }
}
