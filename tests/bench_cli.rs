//! `mcast-bench` as a user runs it: the built binary on the simulator with tiny sizes, for every
//! op; its table, CSV and JSON; and its usage errors.

use std::path::PathBuf;
use std::process::{Command, Output};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_mcast-bench");

/// The binary on the simulator, without the caller's variables that could change its choices
/// (kill switches, `MCAST_MULTICAST`: [`common::hermetic_command`], `MCAST_SIM_DEVICES`,
/// `MCAST_SIM_FAULTS`); a test sets what it needs on the result.
fn bench_command() -> Command {
    let mut c = Command::new(BIN);
    common::hermetic_command(&mut c)
        .env("MCAST_BACKEND", "sim")
        .env_remove("MCAST_SIM_DEVICES")
        .env_remove("MCAST_SIM_FAULTS");
    c
}

/// [`bench_command`] with `args`, run to the end.
fn bench(args: &[&str]) -> Output {
    bench_command().args(args).output().expect("mcast-bench runs")
}

fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bench_cli-{}-{name}", std::process::id()))
}

/// The result rows of the table on stdout, split into columns.
fn rows(out: &Output) -> Vec<Vec<String>> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn every_op_runs_checks_and_writes_csv_and_json() {
    let cases: &[(&str, &[&str], &str, &str)] = &[
        ("all_reduce", &["-d", "f32"], "sum", "-1"),
        ("broadcast", &["-d", "bf16", "--root", "2"], "none", "2"),
        ("reduce_scatter", &["-d", "i32", "--redop", "max"], "max", "-1"),
        ("all_gather", &["-d", "f16"], "none", "-1"),
    ];
    for &(op, extra, redop, root) in cases {
        let (csv_path, json_path) = (tmp(&format!("{op}.csv")), tmp(&format!("{op}.json")));
        let mut args = vec!["--op", op, "-b", "1K", "-e", "16K", "-f", "4", "--iters", "2", "--warmup", "1"];
        args.extend_from_slice(extra);
        let (csv_arg, json_arg) = (csv_path.to_str().unwrap(), json_path.to_str().unwrap());
        args.extend_from_slice(&["--csv", csv_arg, "--json", json_arg]);
        let out = bench(&args);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "{op}: {all}");
        assert!(all.contains("# transport: MULTICAST"), "{op}: 4 distinct simulated devices use multicast: {all}");

        // One row per size: 1K, 4K, 16K; all_gather and reduce_scatter sizes are totals.
        let rows = rows(&out);
        assert_eq!(rows.len(), 3, "{op}: {all}");
        for (row, size) in rows.iter().zip([1024u64, 4096, 16384]) {
            assert_eq!(row.len(), 9, "{op}: size count type redop root time algbw busbw #wrong: {row:?}");
            assert_eq!(row[0].parse::<u64>().unwrap(), size, "{op}: {row:?}");
            let esize = match row[2].as_str() {
                "f16" | "bf16" => 2,
                _ => 4,
            };
            let blocks = if matches!(op, "all_gather" | "reduce_scatter") { 4 } else { 1 };
            assert_eq!(row[1].parse::<u64>().unwrap(), size / esize / blocks, "{op}: count per rank: {row:?}");
            assert_eq!((row[3].as_str(), row[4].as_str()), (redop, root), "{op}: {row:?}");
            let time: f64 = row[5].parse().unwrap();
            let (algbw, busbw): (f64, f64) = (row[6].parse().unwrap(), row[7].parse().unwrap());
            assert!(time > 0.0 && algbw >= 0.0 && busbw >= 0.0, "{op}: {row:?}");
            assert_eq!(row[8], "0", "{op}: #wrong: {all}");
        }

        let csv = std::fs::read_to_string(&csv_path).expect("csv written");
        let mut lines = csv.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        assert_eq!(
            header[..10],
            ["op", "size", "count", "type", "redop", "root", "time_us", "algbw_gbps", "busbw_gbps", "wrong"]
        );
        let body: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        assert_eq!(body.len(), 3, "{csv}");
        for (line, row) in body.iter().zip(&rows) {
            assert_eq!(line.len(), header.len(), "{csv}");
            assert_eq!((line[0], line[1], line[9]), (op, row[0].as_str(), "0"), "{csv}");
            let col = |name: &str| line[header.iter().position(|h| *h == name).unwrap()];
            assert_eq!((col("nranks"), col("backend"), col("transport")), ("4", "sim", "MULTICAST"));
            line[6].parse::<f64>().expect("time_us is a number");
        }

        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json_path).expect("json written")).expect("valid JSON");
        assert_eq!(json["op"], op);
        assert_eq!(json["nranks"], 4);
        assert_eq!(json["backend"], "sim");
        assert_eq!(json["transport"], "MULTICAST");
        assert!(json["device"].is_string() && json["date"].is_string());
        let jrows = json["rows"].as_array().expect("rows");
        assert_eq!(jrows.len(), 3);
        for (j, row) in jrows.iter().zip(&rows) {
            assert_eq!(j["size"].as_u64().unwrap().to_string(), row[0]);
            assert_eq!(j["count"].as_u64().unwrap().to_string(), row[1]);
            assert_eq!(j["wrong"], 0);
            assert!(j["time_us"].as_f64().unwrap() > 0.0);
            assert!(j["busbw_gbps"].as_f64().is_some());
        }
        let _ = std::fs::remove_file(csv_path);
        let _ = std::fs::remove_file(json_path);
    }
}

#[test]
fn p2p_odd_sizes_and_no_check() {
    // A device twice: P2P; 3000 bytes of bf16 over 2 ranks: 750 elements per block.
    let out =
        bench(&["--devices", "0,0", "--op", "reduce_scatter", "-d", "bf16", "-b", "3000", "-e", "3000", "-n", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("# transport: P2P ("), "{}", text(&out));
    let row = rows(&out);
    assert_eq!(row.len(), 1, "{}", text(&out));
    assert_eq!(row[0][..5], ["3000", "750", "bf16", "sum", "-1"], "{}", text(&out));
    assert_eq!(row[0][8], "0");

    // The environment's multicast policy is honoured and shown.
    let out = bench_command()
        .args(["-b", "1K", "-e", "1K", "--check", "0", "-q"])
        .env("MCAST_MULTICAST", "off")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("# transport: P2P (multicast is off"), "{}", text(&out));
    assert_eq!(rows(&out)[0][8], "N/A", "--check 0 reports no count");
}

/// `-G N`: each rank's iterations captured in a CUDA graph and replayed N times; the rows, CSV
/// and JSON name the mode; a driver that cannot capture or replay fails cleanly (exit 1, the
/// driver call named, nothing left behind, no rank left waiting).
#[test]
fn graph_mode_replays_and_reports_its_mode() {
    for (devices, transport) in [("0,1,2,3", "MULTICAST"), ("0,0", "P2P")] {
        let (csv_path, json_path) = (tmp(&format!("graph-{transport}.csv")), tmp(&format!("graph-{transport}.json")));
        let out = bench(&[
            "--devices",
            devices,
            "-d",
            "bf16",
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "8",
            "-n",
            "3",
            "-G",
            "4",
            "--csv",
            csv_path.to_str().unwrap(),
            "--json",
            json_path.to_str().unwrap(),
        ]);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "{all}");
        assert!(all.contains(&format!("# transport: {transport}")), "{all}");
        assert!(
            all.contains("# mode: graph (each rank's 3 iteration(s) captured in a CUDA graph, replayed 4 time(s)"),
            "{all}"
        );
        let rows = rows(&out);
        assert_eq!(rows.len(), 3, "1K, 8K, 64K: {all}");
        for row in &rows {
            assert_eq!(row.len(), 9, "the eager columns: {row:?}");
            assert!(row[5].parse::<f64>().unwrap() > 0.0, "{row:?}");
            assert_eq!(row[8], "0", "{all}");
        }
        let csv = std::fs::read_to_string(&csv_path).expect("csv written");
        let mut lines = csv.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let col = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("{name}: {csv}"));
        for line in lines {
            let line: Vec<&str> = line.split(',').collect();
            assert_eq!((line[col("mode")], line[col("graph_launches")]), ("graph", "4"), "{csv}");
        }
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
        assert_eq!((json["mode"].as_str(), json["graph_launches"].as_u64()), (Some("graph"), Some(4)));
        let _ = std::fs::remove_file(csv_path);
        let _ = std::fs::remove_file(json_path);
    }
    // Eager stays the default, and says so.
    let out = bench(&["-b", "1K", "-e", "1K", "-n", "1", "--csv", tmp("eager.csv").to_str().unwrap()]);
    assert!(text(&out).contains("# mode: eager"), "{}", text(&out));
    let csv = std::fs::read_to_string(tmp("eager.csv")).unwrap();
    assert!(csv.lines().nth(1).unwrap().ends_with(",eager,0"), "{csv}");
    let _ = std::fs::remove_file(tmp("eager.csv"));
    // No capture (a driver without graphs), or failing replays: exit 1, named, nothing leaked.
    for (fault, names) in [
        ("cuStreamBeginCapture=NOT_SUPPORTED@1+", "beginning a CUDA graph capture: cuStreamBeginCapture returned"),
        ("cuGraphLaunch=LAUNCH_FAILED@5+", "replaying the CUDA graph: cuGraphLaunch returned"),
    ] {
        let out = bench_command()
            .args(["-b", "1K", "-e", "1K", "-n", "2", "-G", "3", "-q"])
            .env("MCAST_SIM_FAULTS", fault)
            .env("MCAST_TIMEOUT_MS", "3000")
            .output()
            .unwrap();
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{fault}: {all}");
        assert!(all.contains(names), "{fault}: {all}");
        assert!(!all.contains("left behind"), "{fault}: {all}");
    }
}

#[test]
fn default_command_finishes_on_the_simulator() {
    let out = bench(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // 1K..1M by 4.
    assert_eq!(rows(&out).len(), 6, "{}", text(&out));
    assert!(rows(&out).iter().all(|r| r[8] == "0"));
}

/// `--memory buffer|registered|pointer` x `--inplace 0|1`: every op checks clean (the pointer
/// form on plain memory serves all four), both transports, and nothing is left behind (exit 0).
#[test]
fn memory_kinds_in_and_out_of_place() {
    for mc in ["auto", "off"] {
        for memory in ["buffer", "registered", "pointer"] {
            for inplace in ["1", "0"] {
                for op in ["all_reduce", "reduce_scatter", "all_gather", "broadcast"] {
                    let out = bench_command()
                        .args(["--op", op, "--memory", memory, "--inplace", inplace, "--devices", "0,1,2"])
                        .args(["-b", "1020", "-e", "70K", "-f", "8", "--iters", "1", "--warmup", "0", "-d", "bf16"])
                        .env("MCAST_MULTICAST", mc)
                        .output()
                        .expect("mcast-bench runs");
                    let all = text(&out);
                    let what = format!("{mc} {memory} inplace={inplace} {op}");
                    assert_eq!(out.status.code(), Some(0), "{what}: {all}");
                    assert!(all.contains("# wrong elements: 0"), "{what}: {all}");
                    assert!(all.contains(&format!("# memory: {memory}")), "{what}: {all}");
                }
            }
        }
    }
}

#[test]
fn bad_usage_exits_2_with_a_message() {
    for args in [
        &["--bogus"][..],
        &["--op", "all_to_all"],
        &["-b", "0"],
        &["-b", "4K", "-e", "1K"],
        &["-f", "1"],
        &["--iters", "0"],
        &["--iters"],
        &["-G", "x"],
        &["--graph", "-1"],
        &["--check", "2"],
        &["--dtype", "f8"],
        &["--devices", "0,x"],
        &["--devices", "0,99"],
        &["--op", "broadcast", "--root", "4"],
        &["--backend", "gpu"],
        &["--memory", "host"],
        &["--inplace", "2"],
    ] {
        let out = bench(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("mcast-bench: ") && err.contains("--help"), "{args:?}: {err}");
    }
    let out = bench(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--op",
        "--dtype",
        "--redop",
        "--root",
        "-b",
        "-e",
        "-f",
        "--iters",
        "--warmup",
        "--graph",
        "--check",
        "--devices",
        "--backend",
        "--csv",
        "--json",
        "--quiet",
        "--memory",
        "--inplace",
        "--host-overhead",
        "--host-launch",
    ] {
        assert!(help.contains(flag), "--help documents {flag}");
    }
}

/// `--host-overhead N`: the host time of each call, per size, for every memory kind and both
/// launch modes; its own columns, summary lines, CSV and JSON; the device-time columns stay
/// as they are without it.
#[test]
fn host_overhead_mode_times_the_calls() {
    for (memory, inplace, launch) in [
        ("buffer", "1", "capture"),
        ("registered", "0", "eager"),
        ("pointer", "1", "capture"),
        ("pointer", "0", "eager"),
    ] {
        let what = format!("{memory} inplace={inplace} {launch}");
        let (csv_path, json_path) = (tmp(&format!("host-{memory}-{launch}.csv")), tmp(&format!("host-{memory}.json")));
        let out = bench(&[
            "--devices",
            "0,1",
            "--memory",
            memory,
            "--inplace",
            inplace,
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "8",
            "--host-overhead",
            "40",
            "--host-launch",
            launch,
            "--csv",
            csv_path.to_str().unwrap(),
            "--json",
            json_path.to_str().unwrap(),
        ]);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "{what}: {all}");
        assert!(all.contains("# mode: host overhead (40 call(s) per rank and size"), "{what}: {all}");
        assert!(all.contains("median(ns)    p99(ns)   mean(ns) allocs/call"), "{what}: {all}");
        assert!(all.contains("# host overhead per call: median "), "{what}: {all}");
        assert!(all.contains("# the call's entry alone (count 0"), "{what}: {all}");
        let rows = rows(&out);
        assert_eq!(rows.len(), 3, "1K, 8K, 64K: {what}: {all}");
        for row in &rows {
            assert_eq!(row.len(), 10, "size count type redop root median p99 mean allocs #wrong: {row:?}");
            let (median, p99, mean): (f64, f64, f64) =
                (row[5].parse().unwrap(), row[6].parse().unwrap(), row[7].parse().unwrap());
            assert!(median > 0.0 && p99 >= median && mean > 0.0, "{what}: {row:?}");
            assert!(row[8].parse::<f64>().unwrap() >= 0.0, "{what}: {row:?}");
            assert_eq!(row[9], "0", "{what}: checked before timing: {all}");
        }
        let csv = std::fs::read_to_string(&csv_path).expect("csv written");
        let mut lines = csv.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        assert_eq!(header[6..11], ["median_ns", "p99_ns", "mean_ns", "allocs_per_call", "wrong"], "{csv}");
        let col = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("{name}: {csv}"));
        for line in lines {
            let line: Vec<&str> = line.split(',').collect();
            assert_eq!(line.len(), header.len(), "{csv}");
            assert_eq!(line[col("mode")], format!("host-{launch}"), "{csv}");
            assert_eq!((line[col("calls")], line[col("memory")], line[col("inplace")]), ("40", memory, inplace));
        }
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
        assert_eq!(json["mode"], format!("host-{launch}"));
        assert_eq!(json["host_calls"], 40);
        assert!(json["rows"][0]["median_ns"].as_f64().unwrap() > 0.0, "{json}");
        let _ = std::fs::remove_file(csv_path);
        let _ = std::fs::remove_file(json_path);
    }
    for bad in [&["--host-overhead", "10", "-G", "2"][..], &["--host-launch", "eager"], &["--host-overhead", "x"]] {
        let out = bench(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out));
    }
}

/// The pointer form's staged route writes a pulling kernel's result straight into the caller's
/// memory; the scatter-then-gather broadcast (teams of three or more, large messages) reads the
/// peers' slices from their outputs, so there it must run in the staging areas: 4 ranks, 4 MiB
/// from root 2 (above the staging area's 1 MiB and the scatter form's threshold), in and out
/// of place, every element checked.
#[test]
fn pointer_form_broadcast_of_four_ranks_across_staging_chunks() {
    for inplace in ["1", "0"] {
        let out = bench(&[
            "--devices",
            "0,0,0,0",
            "--op",
            "broadcast",
            "--memory",
            "pointer",
            "--inplace",
            inplace,
            "-d",
            "bf16",
            "--root",
            "2",
            "-b",
            "4M",
            "-e",
            "4M",
            "-n",
            "1",
            "-w",
            "0",
        ]);
        assert_eq!(out.status.code(), Some(0), "in place {inplace}: {}", text(&out));
    }
}
