//! What the bench prints and writes: the table's column header and rows (device time, or host
//! time per call in host-overhead mode), the summary lines, CSV and JSON, and the date. The
//! device-time formats are parsed by bench/compare.py, bench/run.sh and
//! tests/bench_cli.rs: keep them as they are.

use std::fmt::Write as _;

use crate::args::{DType, HostLaunch, Memory, Op, RedOp};
use crate::timing::HostTimes;

/// One line of results.
pub struct Row {
    pub size: usize,
    pub count: usize,
    /// Device time per iteration (0 in host-overhead mode).
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub wrong: Option<u64>,
    /// Host-overhead mode: the host time per call.
    pub host: Option<HostTimes>,
}

/// What the header, CSV and JSON say about the run.
pub struct RunInfo {
    pub op: Op,
    pub dtype: DType,
    pub redop: Option<RedOp>,
    pub root: i64,
    pub backend: &'static str,
    pub transport: &'static str,
    pub transport_reason: String,
    pub devices: Vec<i32>,
    pub device_name: String,
    pub date: String,
    pub iters: u32,
    pub warmup: u32,
    /// Graph replays per size; 0: eager.
    pub graph: u32,
    pub check: bool,
    /// Host-overhead mode: timed calls per rank and size, and where the kernels went.
    pub host: Option<(u32, HostLaunch)>,
    pub memory: Memory,
    pub inplace: bool,
}

impl RunInfo {
    /// `"eager"` or `"graph"`; in host-overhead mode `"host-capture"` or `"host-eager"`.
    pub fn mode(&self) -> &'static str {
        match (self.host, self.graph) {
            (Some((_, HostLaunch::Capture)), _) => "host-capture",
            (Some((_, HostLaunch::Eager)), _) => "host-eager",
            (None, 0) => "eager",
            (None, _) => "graph",
        }
    }

    fn redop_name(&self) -> &'static str {
        self.redop.map_or("none", RedOp::name)
    }
}

/// The `# mode:` line.
pub fn mode_line(info: &RunInfo) -> String {
    match (info.host, info.graph) {
        (Some((calls, launch)), _) => format!(
            "# mode: host overhead ({calls} call(s) per rank and size, each timed alone on its rank's thread; {})",
            match launch {
                HostLaunch::Capture =>
                    "made inside a stream capture, so the kernels are recorded and never run: the no-op launch path",
                HostLaunch::Eager => "the kernels run; each rank's stream is synchronized between batches, untimed",
            }
        ),
        (None, 0) => "# mode: eager (a launch per iteration)".to_string(),
        (None, g) => format!(
            "# mode: graph (each rank's {} iteration(s) captured in a CUDA graph, replayed {g} time(s); time per \
             iteration = elapsed / {})",
            info.iters,
            u64::from(info.iters) * u64::from(g)
        ),
    }
}

/// The table's column header.
pub fn columns(info: &RunInfo) -> String {
    if info.host.is_some() {
        format!(
            "# {:>10} {:>12} {:>6} {:>6} {:>5} {:>10} {:>10} {:>10} {:>11} {:>7}",
            "size", "count", "type", "redop", "root", "median(ns)", "p99(ns)", "mean(ns)", "allocs/call", "#wrong"
        )
    } else {
        format!(
            "# {:>10} {:>12} {:>6} {:>6} {:>5} {:>10} {:>12} {:>12} {:>7}",
            "size", "count", "type", "redop", "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"
        )
    }
}

/// One row of the table.
pub fn row_line(info: &RunInfo, row: &Row) -> String {
    let wrong = row.wrong.map_or("N/A".to_string(), |w| w.to_string());
    match row.host {
        Some(h) => format!(
            "  {:>10} {:>12} {:>6} {:>6} {:>5} {:>10.0} {:>10.0} {:>10.0} {:>11.2} {:>7}",
            row.size,
            row.count,
            info.dtype.name(),
            info.redop_name(),
            info.root,
            h.median_ns,
            h.p99_ns,
            h.mean_ns,
            h.allocs_per_call,
            wrong
        ),
        None => format!(
            "  {:>10} {:>12} {:>6} {:>6} {:>5} {:>10.2} {:>12.3} {:>12.3} {:>7}",
            row.size,
            row.count,
            info.dtype.name(),
            info.redop_name(),
            info.root,
            row.time_us,
            row.algbw,
            row.busbw,
            wrong
        ),
    }
}

/// The summary lines after the table.
pub fn summary(info: &RunInfo, rows: &[Row], entry: Option<HostTimes>) -> Vec<String> {
    let mut out = vec![];
    if rows.is_empty() {
        return out;
    }
    let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
    out.push(format!("# wrong elements: {}", if info.check { wrong.to_string() } else { "not checked".into() }));
    if info.host.is_some() {
        let mut medians: Vec<f64> = rows.iter().filter_map(|r| r.host).map(|h| h.median_ns).collect();
        medians.sort_by(f64::total_cmp);
        let p99 = rows.iter().filter_map(|r| r.host).map(|h| h.p99_ns).fold(0.0, f64::max);
        let allocs = rows.iter().filter_map(|r| r.host).map(|h| h.allocs_per_call).fold(0.0, f64::max);
        let sim = rows.iter().filter_map(|r| r.host).map(|h| h.sim_allocs_per_call).fold(0.0, f64::max);
        let sim_part = if info.backend == "sim" {
            format!(" (the simulated device's own work, not counted there: up to {sim:.2} more)")
        } else {
            String::new()
        };
        out.push(format!(
            "# host overhead per call: median {:.0} ns (median of the sizes' medians), p99 up to {p99:.0} ns, up to \
             {allocs:.2} heap allocation(s) per call in mcast's code{sim_part}",
            medians[medians.len() / 2]
        ));
        if let Some(e) = entry {
            out.push(format!(
                "# the call's entry alone (count 0: handle lookup and checks, no launch): median {:.0} ns, p99 {:.0} \
                 ns, {:.2} heap allocation(s) per call",
                e.median_ns, e.p99_ns, e.allocs_per_call
            ));
        }
    } else {
        let avg = rows.iter().map(|r| r.busbw).sum::<f64>() / rows.len() as f64;
        out.push(format!("# avg bus bandwidth: {avg:.3} GB/s"));
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The CSV file: device-time columns (bench/compare.py reads them), or in host-overhead mode
/// the host-time columns.
pub fn csv(info: &RunInfo, rows: &[Row]) -> String {
    let host = info.host.is_some();
    let mut out = String::from(if host {
        "op,size,count,type,redop,root,median_ns,p99_ns,mean_ns,allocs_per_call,wrong,nranks,backend,transport,device,\
         date,mode,calls,memory,inplace,sim_allocs_per_call\n"
    } else {
        "op,size,count,type,redop,root,time_us,algbw_gbps,busbw_gbps,wrong,nranks,backend,transport,device,date,mode,\
         graph_launches\n"
    });
    for r in rows {
        let _ = write!(
            out,
            "{},{},{},{},{},{},",
            info.op.name(),
            r.size,
            r.count,
            info.dtype.name(),
            info.redop_name(),
            info.root
        );
        match r.host {
            Some(h) => {
                let _ = write!(out, "{:.0},{:.0},{:.1},{:.3},", h.median_ns, h.p99_ns, h.mean_ns, h.allocs_per_call);
            }
            None => {
                let _ = write!(out, "{:.3},{:.6},{:.6},", r.time_us, r.algbw, r.busbw);
            }
        }
        let _ = write!(
            out,
            "{},{},{},{},{},{},{},",
            r.wrong.map_or(String::new(), |w| w.to_string()),
            info.devices.len(),
            info.backend,
            info.transport,
            csv_field(&info.device_name),
            info.date,
            info.mode(),
        );
        match info.host {
            Some((calls, _)) => {
                let sim = r.host.map_or(0.0, |h| h.sim_allocs_per_call);
                let _ = writeln!(out, "{calls},{},{},{sim:.3}", info.memory.name(), u8::from(info.inplace));
            }
            None => {
                let _ = writeln!(out, "{}", info.graph);
            }
        }
    }
    out
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

/// The JSON file: the run, then its rows.
pub fn json(info: &RunInfo, rows: &[Row]) -> String {
    let mut out = String::from("{\n");
    let devices = info.devices.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
    let _ = writeln!(out, "  \"tool\": \"mcast-bench\",");
    let _ = writeln!(out, "  \"version\": {},", json_str(env!("CARGO_PKG_VERSION")));
    let _ = writeln!(out, "  \"date\": {},", json_str(&info.date));
    let _ = writeln!(out, "  \"op\": {},", json_str(info.op.name()));
    let _ = writeln!(out, "  \"type\": {},", json_str(info.dtype.name()));
    let _ = writeln!(out, "  \"redop\": {},", json_str(info.redop_name()));
    let _ = writeln!(out, "  \"root\": {},", info.root);
    let _ = writeln!(out, "  \"nranks\": {},", info.devices.len());
    let _ = writeln!(out, "  \"devices\": [{devices}],");
    let _ = writeln!(out, "  \"device\": {},", json_str(&info.device_name));
    let _ = writeln!(out, "  \"backend\": {},", json_str(info.backend));
    let _ = writeln!(out, "  \"transport\": {},", json_str(info.transport));
    let _ = writeln!(out, "  \"transport_reason\": {},", json_str(&info.transport_reason));
    let _ = writeln!(out, "  \"iters\": {},", info.iters);
    let _ = writeln!(out, "  \"warmup\": {},", info.warmup);
    let _ = writeln!(out, "  \"mode\": {},", json_str(info.mode()));
    let _ = writeln!(out, "  \"graph_launches\": {},", info.graph);
    if let Some((calls, _)) = info.host {
        let _ = writeln!(out, "  \"host_calls\": {calls},");
        let _ = writeln!(out, "  \"memory\": {},", json_str(info.memory.name()));
        let _ = writeln!(out, "  \"inplace\": {},", info.inplace);
    }
    let _ = writeln!(out, "  \"check\": {},", info.check);
    out.push_str("  \"rows\": [");
    for (i, r) in rows.iter().enumerate() {
        let wrong = r.wrong.map_or("null".to_string(), |w| w.to_string());
        let sep = if i == 0 { "" } else { "," };
        match r.host {
            Some(h) => {
                let _ = write!(
                    out,
                    "{sep}\n    {{\"size\": {}, \"count\": {}, \"median_ns\": {}, \"p99_ns\": {}, \"mean_ns\": {}, \
                     \"allocs_per_call\": {}, \"sim_allocs_per_call\": {}, \"wrong\": {wrong}}}",
                    r.size,
                    r.count,
                    json_num(h.median_ns),
                    json_num(h.p99_ns),
                    json_num(h.mean_ns),
                    json_num(h.allocs_per_call),
                    json_num(h.sim_allocs_per_call),
                );
            }
            None => {
                let _ = write!(
                    out,
                    "{sep}\n    {{\"size\": {}, \"count\": {}, \"time_us\": {}, \"algbw_gbps\": {}, \"busbw_gbps\": \
                     {}, \"wrong\": {wrong}}}",
                    r.size,
                    r.count,
                    json_num(r.time_us),
                    json_num(r.algbw),
                    json_num(r.busbw),
                );
            }
        }
    }
    out.push_str(if rows.is_empty() { "]\n}\n" } else { "\n  ]\n}\n" });
    out
}

/// Now, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(host: Option<(u32, HostLaunch)>) -> RunInfo {
        RunInfo {
            op: Op::AllReduce,
            dtype: DType::BF16,
            redop: Some(RedOp::Sum),
            root: -1,
            backend: "sim",
            transport: "P2P",
            transport_reason: "x".into(),
            devices: vec![0, 1],
            device_name: "Sim, \"GPU\"".into(),
            date: "2026-01-01T00:00:00Z".into(),
            iters: 5,
            warmup: 1,
            graph: 0,
            check: true,
            host,
            memory: Memory::Buffer,
            inplace: true,
        }
    }

    #[test]
    fn device_time_formats_are_unchanged() {
        let i = info(None);
        let row =
            Row { size: 1024, count: 512, time_us: 6.5, algbw: 0.157538, busbw: 0.157538, wrong: Some(0), host: None };
        assert_eq!(
            columns(&i),
            "#       size        count   type  redop  root   time(us)  algbw(GB/s)  busbw(GB/s)  #wrong"
        );
        assert_eq!(
            row_line(&i, &row),
            "        1024          512   bf16    sum    -1       6.50        0.158        0.158       0"
        );
        assert_eq!(
            csv(&i, &[row]),
            "op,size,count,type,redop,root,time_us,algbw_gbps,busbw_gbps,wrong,nranks,backend,transport,device,date,\
             mode,graph_launches\nall_reduce,1024,512,bf16,sum,-1,6.500,0.157538,0.157538,0,2,sim,P2P,\"Sim, \
             \"\"GPU\"\"\",2026-01-01T00:00:00Z,eager,0\n"
        );
        assert_eq!(mode_line(&i), "# mode: eager (a launch per iteration)");
    }

    #[test]
    fn host_rows_carry_the_host_columns() {
        let i = info(Some((100, HostLaunch::Capture)));
        let h = HostTimes {
            median_ns: 1500.0,
            p99_ns: 4000.0,
            mean_ns: 1700.25,
            allocs_per_call: 6.0,
            sim_allocs_per_call: 2.5,
        };
        let row = Row { size: 1024, count: 512, time_us: 0.0, algbw: 0.0, busbw: 0.0, wrong: None, host: Some(h) };
        let line = row_line(&i, &row);
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            ["1024", "512", "bf16", "sum", "-1", "1500", "4000", "1700", "6.00", "N/A"]
        );
        let c = csv(&i, &[row]);
        let mut lines = c.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let body: Vec<&str> = lines.next().unwrap().split(',').collect();
        assert_eq!(header[6..10], ["median_ns", "p99_ns", "mean_ns", "allocs_per_call"]);
        assert_eq!(body.len(), header.len() + 1, "the device name holds a comma: {c}");
        assert_eq!(body[6..10], ["1500", "4000", "1700.2", "6.000"]);
        assert!(c.trim_end().ends_with(",host-capture,100,buffer,1,2.500"), "{c}");
        let j = json(&i, &[Row { host: Some(h), wrong: Some(0), ..row_zero() }]);
        assert!(j.contains("\"mode\": \"host-capture\"") && j.contains("\"median_ns\": 1500"), "{j}");
    }

    fn row_zero() -> Row {
        Row { size: 8, count: 2, time_us: 0.0, algbw: 0.0, busbw: 0.0, wrong: None, host: None }
    }

    #[test]
    fn dates_are_iso_8601() {
        let d = utc_now();
        assert_eq!(d.len(), 20, "{d}");
        assert!(d.starts_with("20") && d.ends_with('Z'));
    }
}
