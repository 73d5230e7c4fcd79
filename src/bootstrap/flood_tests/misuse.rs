//! Careless setups: a process that only makes an id, two jobs sharing a secret and an address.

use super::*;

/// A process that only makes an id (no context, so nothing else starts the logging) still
/// logs its listener's drops.
#[test]
fn a_process_that_only_makes_an_id_logs_its_listener() {
    let out = run_child("idlog", &[], Duration::from_secs(30));
    assert!(out.contains("bootstrap root at") && out.contains("failed the handshake"), "{out}");
}

pub(super) fn idlog_case() {
    let id = new_unique_id().unwrap();
    let addr = UniqueId::decode(&id).unwrap().addr;
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    std::thread::sleep(Duration::from_millis(100));
}

pub(super) const JOBS_SECRET: &str = "e83b0c5f9a1d47c26b8e3f0a5d9c1b74";

/// Two jobs that share a secret and an address: job B's rank 1 reaches job A's rank 0, and both
/// refuse, naming both jobs, instead of forming one team.
#[test]
fn two_jobs_with_one_secret_and_address_are_refused_not_mixed() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let env = [
        ON_LO[0],
        ("MCAST_BOOTSTRAP_ADDR", addr.as_str()),
        ("MCAST_BOOTSTRAP_SECRET", JOBS_SECRET),
        ("MCAST_BOOTSTRAP_JOB", "job-A"),
    ];
    let out = run_child_env("jobs", &[], &env, Duration::from_secs(30));
    eprintln!("{out}");
}

/// Job A's rank 0; job B's rank 1 is another process.
pub(super) fn jobs_case() {
    let id = new_unique_id().unwrap();
    let rank0 = std::thread::spawn(move || Bootstrap::init_id(&id, 2, 0, MAX, 4000, "one".into()));
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let b = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "bootstrap::flood_tests::child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "job-b")
        .env("MCAST_BOOTSTRAP_JOB", "job-B")
        .output()
        .unwrap();
    let b = format!("{}{}", String::from_utf8_lossy(&b.stdout), String::from_utf8_lossy(&b.stderr));
    let a = rank0.join().unwrap();
    let took = t.elapsed();
    eprintln!("job B's rank 1 said: {b}\njob A's rank 0: {a:?} after {took:?}");
    let told = b.find("JOB B").map(|i| &b[i..]).unwrap_or_else(|| panic!("job B said nothing: {b}"));
    assert!(told.contains("refused"), "job B's rank 1 joined job A's team: {told}");
    assert!(told.contains("\"job-A\"") && told.contains("\"job-B\"") && told.contains("two jobs"), "{told}");
    assert!(!told.contains("must stay alive"), "a refusal is no lost listener: {told}");
    let e = a.expect_err("job A's rank 0 formed a team with job B's rank 1");
    assert!(e.message.contains("\"job-A\"") && e.message.contains("\"job-B\""), "{}", e.message);
    assert!(took < Duration::from_secs(3), "job A's rank 0 waited {took:?}");
}

pub(super) fn job_b_case() {
    let id = new_unique_id().unwrap();
    match Bootstrap::init_id(&id, 2, 1, MAX, 3000, "two".into()) {
        Ok(_) => println!("JOB B joined"),
        Err(e) => println!("JOB B refused: {}", e.message),
    }
}
