//! Fault injection: `MCAST_SIM_FAULTS` plans and per-function call counting, and the simulator's
//! API over them (inject, clear, the call log and counts).

use std::collections::HashMap;

use crate::driver::CuResult;

/// Every driver function name the simulator counts (and a fault rule may name).
pub const FUNCTION_NAMES: &[&str] = &[
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemRetainAllocationHandle",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuMemGetAddressRange",
    "cuPointerGetAttribute",
    "cuMemAlloc",
    "cuMemFree",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMulticastGetGranularity",
    "cuMulticastCreate",
    "cuMulticastAddDevice",
    "cuMulticastBindMem",
    "cuMulticastBindMem_v2",
    "cuMulticastBindAddr",
    "cuMulticastBindAddr_v2",
    "cuMulticastUnbind",
    "cuStreamCreate",
    "cuStreamDestroy",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuCtxSetCurrent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventElapsedTime",
    "cuEventDestroy",
    "cuMemcpyHtoD",
    "cuMemcpyDtoH",
    "cuMemsetD8",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    "cuStreamBeginCapture",
    "cuThreadExchangeStreamCaptureMode",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// What a faulted call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Returns this code (never `CUDA_SUCCESS`) without any effect.
    Fail(CuResult),
    /// Panics with "injected panic in FUNC", before taking any simulator lock and without any
    /// effect: for testing the panic boundary of the C API (`PANIC` in `MCAST_SIM_FAULTS`).
    Panic,
}

/// One rule: calls `first ..= first + count - 1` of `func` (1-based) do `action`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    /// The CUDA function name, e.g. `"cuMulticastBindMem"`.
    pub func: String,
    /// What the faulted calls do.
    pub action: FaultAction,
    /// The first failing call, 1-based.
    pub first: u64,
    /// How many calls fail; `None`: every call from `first` on.
    pub count: Option<u64>,
}

impl FaultRule {
    /// True when the `n`th call (1-based) fails.
    pub fn hits(&self, n: u64) -> bool {
        n >= self.first
            && match self.count {
                None => true,
                Some(c) => n - self.first < c,
            }
    }
}

/// A set of fault rules (the parsed form of `MCAST_SIM_FAULTS`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// The rules, in the order given.
    pub rules: Vec<FaultRule>,
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> FaultPlan {
        FaultPlan::default()
    }

    /// Parses `MCAST_SIM_FAULTS` from the environment; unset or empty gives no faults.
    pub fn from_env() -> Result<FaultPlan, String> {
        match std::env::var("MCAST_SIM_FAULTS") {
            Ok(spec) => parse_faults(&spec),
            Err(_) => Ok(FaultPlan::none()),
        }
    }
}

/// Parses a fault specification: comma-separated `funcName=CODE@N` (fail the Nth call),
/// `funcName=CODE@NxM` (fail M calls from the Nth) or `funcName=CODE@N+` (fail every call from the
/// Nth on). `CODE` is anything [`CuResult::from_name`] accepts except success, or `PANIC` (the
/// call panics: [`FaultAction::Panic`]). The error message names the offending item.
pub fn parse_faults(spec: &str) -> Result<FaultPlan, String> {
    let mut rules = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        rules.push(parse_item(item).map_err(|why| format!("MCAST_SIM_FAULTS item `{item}`: {why}"))?);
    }
    Ok(FaultPlan { rules })
}

fn parse_item(item: &str) -> Result<FaultRule, String> {
    let (func, rest) = item.split_once('=').ok_or("expected funcName=CODE@N")?;
    let func = func.trim();
    if !FUNCTION_NAMES.contains(&func) {
        return Err(format!("unknown driver function `{func}`"));
    }
    let (code, when) = rest.split_once('@').ok_or("expected CODE@N after `=`")?;
    let action = if code.trim() == "PANIC" {
        FaultAction::Panic
    } else {
        let code = CuResult::from_name(code).ok_or_else(|| format!("unknown CUresult `{}`", code.trim()))?;
        if code == CuResult::SUCCESS {
            return Err("CUDA_SUCCESS is not a fault".into());
        }
        FaultAction::Fail(code)
    };
    let when = when.trim();
    let number = |text: &str| -> Result<u64, String> {
        match text.parse::<u64>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!("`{text}` is not a call number >= 1")),
        }
    };
    let (first, count) = if let Some(first) = when.strip_suffix('+') {
        (number(first)?, None)
    } else if let Some((first, count)) = when.split_once(['x', 'X']) {
        (number(first)?, Some(number(count)?))
    } else {
        (number(when)?, Some(1))
    };
    Ok(FaultRule { func: func.to_string(), action, first, count })
}

/// A rule with the call count at which it was armed (0 for the configured plan).
#[derive(Debug)]
struct Armed {
    rule: FaultRule,
    base: u64,
}

/// Per-function call counts, the call log and the armed rules.
#[derive(Debug, Default)]
pub(super) struct Calls {
    counts: HashMap<&'static str, u64>,
    log: Vec<&'static str>,
    armed: Vec<Armed>,
}

impl Calls {
    pub(super) fn new(plan: &FaultPlan) -> Calls {
        Calls {
            armed: plan.rules.iter().map(|rule| Armed { rule: rule.clone(), base: 0 }).collect(),
            ..Calls::default()
        }
    }

    /// Counts one call of `func`; returns the injected fault, if any.
    pub(super) fn enter(&mut self, func: &'static str) -> Option<FaultAction> {
        let n = self.counts.entry(func).or_insert(0);
        *n += 1;
        let n = *n;
        self.log.push(func);
        self.armed.iter().find(|a| a.rule.func == func && a.rule.hits(n - a.base)).map(|a| a.rule.action)
    }

    pub(super) fn arm(&mut self, rule: FaultRule) {
        let base = self.counts.get(rule.func.as_str()).copied().unwrap_or(0);
        self.armed.push(Armed { rule, base });
    }

    pub(super) fn clear_faults(&mut self) {
        self.armed.clear();
    }

    pub(super) fn log(&self) -> Vec<&'static str> {
        self.log.clone()
    }

    pub(super) fn reset_log(&mut self) {
        self.log.clear();
    }

    pub(super) fn count(&self, func: &str) -> u64 {
        self.counts.get(func).copied().unwrap_or(0)
    }
}

impl super::SimDriver {
    /// Makes calls of `func` fail with `code`: the `nth` call from now (1 = the next one) and the
    /// `count - 1` after it, or every call from the `nth` on when `count` is `None`.
    pub fn inject(&self, func: &str, code: CuResult, nth: u64, count: Option<u64>) {
        self.calls.lock().arm(FaultRule {
            func: func.to_string(),
            action: FaultAction::Fail(code),
            first: nth.max(1),
            count,
        });
    }

    /// Removes every fault rule, configured or injected.
    pub fn clear_faults(&self) {
        self.calls.lock().clear_faults();
    }

    /// Every driver function called since creation (or the last [`Self::reset_call_log`]), in
    /// order, including calls that failed.
    pub fn call_log(&self) -> Vec<&'static str> {
        self.calls.lock().log()
    }

    /// Empties the call log (the per-function counts that fault rules use are kept).
    pub fn reset_call_log(&self) {
        self.calls.lock().reset_log();
    }

    /// How many times `func` was called since creation.
    pub fn call_count(&self, func: &str) -> u64 {
        self.calls.lock().count(func)
    }
}
