//! The listeners under attack: connections that trickle, a process out of descriptors, and
//! other users at the host-local descriptor socket. Each case runs in a child process (this
//! test binary run again with `FLOOD_CHILD` naming the case), so its thread count, CPU time and
//! descriptor limit are its own and not those of the tests running beside it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use super::tcp::{self, kind, SECRET_BYTES};
use super::*;

const CHILD: &str = "FLOOD_CHILD";
const MAX: usize = 72;

/// Runs the case `case` in a child process, killed after `limit`; returns its output after
/// asserting it passed.
fn run_child(case: &str, prefix: &[&str], limit: Duration) -> String {
    run_child_env(case, prefix, &[], limit)
}

/// [`run_child`] with variables `env` set in the child.
fn run_child_env(case: &str, prefix: &[&str], env: &[(&str, &str)], limit: Duration) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut c = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    c.args(["--exact", "bootstrap::flood_tests::child", "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let out = match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) of the child this test started (not yet reaped: the waiting
            // thread still holds it).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let out = rx.recv().unwrap().unwrap();
            panic!("case {case} ran past {limit:?}:\n{}", String::from_utf8_lossy(&out.stderr));
        }
    };
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "case {case} failed:\n{text}");
    assert!(text.contains("1 passed"), "case {case} did not run:\n{text}");
    text
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// CPU time (user + system) of this process so far.
fn cpu_time() -> Duration {
    // SAFETY: rusage is plain old data filled by getrusage.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// `n` thread ranks join the team of `id`; every rank on one host.
fn form(id: &[u8; ID_BYTES], n: usize) -> Vec<Bootstrap> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| s.spawn(move || Bootstrap::init_id(id, n as i64, r as i64, MAX, 10_000, "one".into()).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// 200 connections that each send a byte every 100 ms: against a listener, a rank still gets
/// through at once, the process's threads stay bounded and every trickling connection is closed
/// by the handshake deadline; against the root listener while a team forms through it, the team
/// forms about as fast as alone.
#[test]
fn trickling_connections_are_cut_at_the_deadline() {
    let out = run_child("trickle", &[], Duration::from_secs(60));
    eprintln!("{out}");
}

const TRICKLERS: usize = 200;

/// Opens [`TRICKLERS`] connections to `addr`, says so on `ready`, then sends each a byte every
/// 100 ms (a proof frame, slowly) until every one is closed or 8 s passed. Returns when each
/// was closed after its connect (`None`: never) and the most threads this process had.
fn trickle(addr: std::net::SocketAddr, ready: std::sync::mpsc::Sender<()>) -> (Vec<Option<Duration>>, usize) {
    let mut frame = vec![64, 0, 0, 0, kind::PROOF];
    frame.resize(5 + 64, 0);
    let mut conns: Vec<(TcpStream, Instant, Option<Duration>)> = (0..TRICKLERS)
        .map(|_| {
            // As an attacker would, retry when the backlog is full.
            let t = Instant::now();
            let s = loop {
                match TcpStream::connect(addr) {
                    Ok(s) => break s,
                    Err(e) if t.elapsed() > Duration::from_secs(3) => panic!("{e}"),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            };
            s.set_nonblocking(true).unwrap();
            (s, Instant::now(), None)
        })
        .collect();
    let _ = ready.send(());
    let mut most = 0;
    let start = Instant::now();
    for tick in 0.. {
        most = most.max(threads());
        for (s, since, closed) in conns.iter_mut().filter(|c| c.2.is_none()) {
            let mut buf = [0u8; 256];
            let gone = loop {
                match s.read(&mut buf) {
                    Ok(0) => break true,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                    Err(_) => break true,
                }
            };
            if gone || s.write(&frame[tick % frame.len()..][..1]).is_err() {
                *closed = Some(since.elapsed());
            }
        }
        if conns.iter().all(|c| c.2.is_some()) || start.elapsed() > Duration::from_secs(8) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (conns.into_iter().map(|c| c.2).collect(), most)
}

fn trickle_case() {
    // Against a listener that outlives the trickle.
    let secret = [5u8; SECRET_BYTES];
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let acc = tcp::Acceptor::start(l, secret, tcp::Bind::default(), "test listener").unwrap();
    let before = threads();
    let (tx, rx) = std::sync::mpsc::channel();
    let trickler = std::thread::spawn(move || trickle(addr, tx));
    rx.recv().unwrap();
    let t = Instant::now();
    let mut s = tcp::connect(addr, &secret, &tcp::Bind::default(), Deadline::after_ms(3000)).unwrap();
    s.send(kind::JOIN, b"rank").unwrap();
    let (_, join) = acc.next(Deadline::after_ms(3000)).expect("the rank got through").unwrap();
    let through = t.elapsed();
    assert_eq!(join, b"rank");
    let (closed, most) = trickler.join().unwrap();
    let mut ms: Vec<u128> = closed.iter().map(|c| c.map_or(u128::MAX, |d| d.as_millis())).collect();
    ms.sort_unstable();
    eprintln!(
        "{TRICKLERS} trickling connections: a rank got through in {through:?}; threads {before} before, {most} at \
         most; closed after (ms) min {} median {} max {}",
        ms[0],
        ms[TRICKLERS / 2],
        ms[TRICKLERS - 1]
    );
    assert!(through < Duration::from_millis(500), "{through:?}");
    // The trickling thread and nothing more: one thread serves every handshake.
    assert!(most <= before + 2, "{most} threads (from {before})");
    let late = ms.iter().filter(|&&m| m > u128::from(tcp::HANDSHAKE_MS) + 600).count();
    assert_eq!(late, 0, "{late} of {TRICKLERS} connections were not closed by the deadline");
    drop(acc);

    // Against the root listener while a team forms through it.
    let t = Instant::now();
    drop(form(&new_unique_id().unwrap(), 4));
    let alone = t.elapsed();
    let id = new_unique_id().unwrap();
    let addr = UniqueId::decode(&id).unwrap().addr;
    let before = threads();
    let (tx, rx) = std::sync::mpsc::channel();
    let trickler = std::thread::spawn(move || trickle(addr, tx));
    rx.recv().unwrap();
    let t = Instant::now();
    let boots = form(&id, 4);
    let formed = t.elapsed();
    let (_, most) = trickler.join().unwrap();
    eprintln!("a team of 4: alone {alone:?}, with {TRICKLERS} trickling connections {formed:?}; threads {before} before, {most} at most");
    assert!(formed < alone * 3 + Duration::from_millis(500), "formation took {formed:?} (alone: {alone:?})");
    // The team's own (4 ranks, readers, hub, the trickler) and slack.
    assert!(most <= before + 24, "{most} threads (from {before})");
    drop(boots);
}

/// Holds every descriptor but one, lets `connect` take that one (a connection the listener then
/// cannot accept: its accept fails with EMFILE), and checks that `what` rests instead of
/// spinning: under 100 ms of the process's CPU in a second. Returns what `connect` made.
fn rests_out_of_descriptors<T>(what: &str, connect: impl FnOnce() -> T) -> T {
    let mut hog = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        hog.push(f);
    }
    hog.pop();
    let stranger = connect();
    assert!(std::fs::File::open("/dev/null").is_err(), "the descriptors are exhausted");
    std::thread::sleep(Duration::from_millis(100));
    let (c0, t0) = (cpu_time(), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let cpu = cpu_time() - c0;
    let wall = t0.elapsed();
    drop(hog);
    eprintln!("{what} out of descriptors: {cpu:?} of CPU in {wall:?}");
    assert!(cpu < Duration::from_millis(100), "{what} used {cpu:?} of CPU in {wall:?}");
    stranger
}

/// Out of descriptors while a stranger's connection waits, at the root listener and then at
/// the host's descriptor socket: the accept loop rests instead of spinning (the process's CPU
/// time over 1 s stays low), the waiting connection is served once descriptors free up, and
/// the ranks form.
#[test]
fn out_of_descriptors_the_accept_loop_rests() {
    let out = run_child("emfile", &[], Duration::from_secs(60));
    eprintln!("{out}");
}

fn emfile_case() {
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let lim = libc::rlimit { rlim_cur: open + 64, rlim_max: open + 64 };
    // SAFETY: setrlimit of this (child) process.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let id = new_unique_id().unwrap();
    let addr = UniqueId::decode(&id).unwrap().addr;
    let mut stranger = rests_out_of_descriptors("the accept loop", || TcpStream::connect(addr).unwrap());
    // The connection waited in the backlog and gets its challenge now.
    stranger.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let (k, _) = tcp::read_frame(&mut stranger, tcp::MAX_HANDSHAKE_FRAME).unwrap();
    assert_eq!(k, kind::HELLO);
    let t = Instant::now();
    let boots = form(&id, 2);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(boots);
    let _ = stranger.write_all(b"x");
    drop(stranger);

    // The same at the host's descriptor socket.
    let secret = [2u8; SECRET_BYTES];
    let name = fd_name("emfile");
    let hub = {
        let name = name.clone();
        std::thread::spawn(move || Local::form(&name, vec![0, 1], 0, &secret, Deadline::after_ms(10_000)))
    };
    wait_bound(&name);
    let stranger = rests_out_of_descriptors("the hub's accept", || connect_fd(&name));
    let ch = recv_within(&stranger, 3000).expect("the waiting connection gets its challenge");
    assert_eq!(&ch[..8], fdpass::CHALLENGE_MAGIC);
    Local::form(&name, vec![0, 1], 1, &secret, Deadline::after_ms(5000)).unwrap();
    hub.join().unwrap().unwrap();
}

// ---- the host-local descriptor socket ----

use super::fdpass::{self, Local, Ready};
use std::os::fd::{AsRawFd, OwnedFd};

/// A fresh abstract socket name for one test's hub.
fn fd_name(tag: &str) -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    format!("mcast-fd-floodtest-{}-{tag}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Waits until the abstract socket `name` is in /proc/net/unix (at most 4 s); its listed name.
fn wait_bound(name: &str) -> String {
    let t = Instant::now();
    loop {
        let table = std::fs::read_to_string("/proc/net/unix").unwrap();
        let found =
            table.lines().filter_map(|l| l.split_whitespace().nth(7)).find(|p| p.strip_prefix('@') == Some(name));
        if let Some(p) = found {
            return p[1..].to_string();
        }
        assert!(t.elapsed() < Duration::from_secs(4), "{name} is not in /proc/net/unix");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Connects to the abstract socket `name`, retrying until it is bound (at most 3 s).
fn connect_fd(name: &str) -> OwnedFd {
    let t = Instant::now();
    loop {
        let s = fdpass::seqpacket().unwrap();
        let (addr, len) = fdpass::abstract_addr(name);
        // SAFETY: addr is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::connect(s.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) } == 0 {
            return s;
        }
        assert!(t.elapsed() < Duration::from_secs(3), "{name} was never bound");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The next message on `s` within `ms` (`None`: closed; panics on a timeout).
fn recv_within(s: &OwnedFd, ms: u64) -> Option<Vec<u8>> {
    let ready = fdpass::wait_readable(s.as_raw_fd(), None, Deadline::after_ms(ms));
    assert_eq!(ready, Ready::Readable, "nothing arrived within {ms} ms");
    fdpass::recv_msg(s.as_raw_fd()).unwrap().map(|(m, _)| m)
}

/// Forms the descriptor channel of `members` (thread ranks) at `name`; how long it took.
fn form_local(name: &str, members: &[usize], secret: &[u8; SECRET_BYTES]) -> Duration {
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = members
            .iter()
            .map(|&r| {
                let m = members.to_vec();
                s.spawn(move || Local::form(name, m, r, secret, Deadline::after_ms(5000)).map(|_| ()))
            })
            .collect();
        for (h, r) in hs.into_iter().zip(members) {
            if let Err(e) = h.join().unwrap() {
                panic!("rank {r}: {}", e.message);
            }
        }
    });
    t.elapsed()
}

/// Same user, no secret: a silent connection, a wrong answer and a replayed answer (a genuine
/// answer to another connection's challenge) are refused while the hub keeps serving, and the
/// ranks still form at once. A hub that does not know the secret is refused by the rank.
#[test]
fn the_descriptor_socket_refuses_strangers_and_replays() {
    let secret = [9u8; SECRET_BYTES];
    let alone = form_local(&fd_name("alone"), &[0, 1, 2], &secret);
    let name = fd_name("strangers");
    let members = vec![0, 1, 2];
    std::thread::scope(|s| {
        let hub = {
            let (name, members) = (name.clone(), members.clone());
            s.spawn(move || Local::form(&name, members, 0, &secret, Deadline::after_ms(5000)))
        };
        let silent = connect_fd(&name);
        // A wrong secret.
        let wrong = connect_fd(&name);
        let ch = recv_within(&wrong, 1000).expect("a challenge");
        assert_eq!(&ch[..8], fdpass::CHALLENGE_MAGIC);
        fdpass::send_msg(wrong.as_raw_fd(), &fdpass::answer(&[1; SECRET_BYTES], &name, 1, &ch[8..], &[0; 32]), &[])
            .unwrap();
        // A replay: rank 1's genuine answer to connection a's challenge, sent on connection b.
        let a = connect_fd(&name);
        let b = connect_fd(&name);
        let ch_a = recv_within(&a, 1000).expect("a challenge");
        let ch_b = recv_within(&b, 1000).expect("a challenge");
        assert_ne!(ch_a, ch_b, "every challenge is fresh");
        let captured = fdpass::answer(&secret, &name, 1, &ch_a[8..], &[3; fdpass::NONCE]);
        fdpass::send_msg(b.as_raw_fd(), &captured, &[]).unwrap();
        // Both are closed at once, without a proof from the hub.
        assert_eq!(recv_within(&wrong, 1000), None, "the wrong secret was answered");
        assert_eq!(recv_within(&b, 1000), None, "the replayed answer was accepted");
        // The silent connections (`silent`, `a`) delay no one.
        let t = Instant::now();
        let joins: Vec<_> = [1, 2]
            .into_iter()
            .map(|r| {
                let (name, members) = (name.clone(), members.clone());
                s.spawn(move || Local::form(&name, members, r, &secret, Deadline::after_ms(5000)))
            })
            .collect();
        for j in joins {
            j.join().unwrap().unwrap();
        }
        hub.join().unwrap().unwrap();
        let with = t.elapsed();
        eprintln!("3 ranks: alone {alone:?}, with strangers {with:?}");
        assert!(with < alone * 3 + Duration::from_millis(500), "{with:?} (alone {alone:?})");
        drop((silent, a));
    });

    // A hub that does not know the secret: the rank refuses it.
    let name = fd_name("fakehub");
    let listener = fdpass::seqpacket().unwrap();
    let (addr, len) = fdpass::abstract_addr(&name);
    // SAFETY: a valid sockaddr_un of `len` bytes; a fresh socket.
    unsafe {
        assert_eq!(libc::bind(listener.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len), 0);
        assert_eq!(libc::listen(listener.as_raw_fd(), 8), 0);
    }
    let rank = std::thread::spawn({
        let name = name.clone();
        move || Local::form(&name, vec![0, 1], 1, &secret, Deadline::after_ms(3000))
    });
    let ready = fdpass::wait_readable(listener.as_raw_fd(), None, Deadline::after_ms(3000));
    assert_eq!(ready, Ready::Readable, "the rank did not connect");
    // SAFETY: accept on a listening socket with a connection waiting.
    let c = unsafe { libc::accept(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
    assert!(c >= 0);
    // SAFETY: a fresh descriptor.
    let c = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(c) };
    let mut ch = fdpass::CHALLENGE_MAGIC.to_vec();
    ch.extend_from_slice(&[4; fdpass::NONCE]);
    fdpass::send_msg(c.as_raw_fd(), &ch, &[]).unwrap();
    assert!(recv_within(&c, 3000).is_some(), "the rank answers");
    fdpass::send_msg(c.as_raw_fd(), &[0u8; 32], &[]).unwrap();
    let e = rank.join().unwrap().err().expect("the rank refuses a hub without the secret");
    assert!(e.message.contains("does not know the team's secret"), "{}", e.message);
}

/// As root: a process of uid `nobody` finds the hub's socket in `/proc/net/unix`, as an
/// attacker would, and holds 40 silent connections to it while 4 ranks form: they form as
/// fast as alone and every one of those connections is closed at once.
#[test]
fn another_users_connections_to_the_descriptor_socket_are_closed_at_once() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run a process as uid nobody");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let as_nobody = ["--reuid=nobody", "--regid=nogroup", "--clear-groups"];
    match Command::new("setpriv").args(as_nobody).arg("test").arg("-x").arg(&exe).status() {
        Err(e) => {
            eprintln!("skipped: no setpriv to run a process as uid nobody ({e})");
            return;
        }
        Ok(st) if !st.success() => {
            eprintln!("skipped: uid nobody cannot run {} (a directory above it is closed to others)", exe.display());
            return;
        }
        Ok(_) => {}
    }
    let secret = [6u8; SECRET_BYTES];
    let members = vec![0, 1, 2, 3];
    let alone = form_local(&fd_name("alone"), &members, &secret);
    let name = fd_name("nobody");
    let mut child = Command::new("setpriv")
        .args(as_nobody)
        .arg(&exe)
        .args(["--exact", "bootstrap::flood_tests::child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "nobody")
        .env("FLOOD_SOCKET", &name)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line_with = |what: &str, ms: u64| -> Option<String> {
        let t = Instant::now();
        while let Some(left) = Duration::from_millis(ms).checked_sub(t.elapsed()) {
            match rx.recv_timeout(left) {
                Ok(l) if l.contains(what) => return Some(l),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        None
    };
    let result = std::thread::scope(|s| {
        let hub = {
            let (name, members) = (name.clone(), members.clone());
            s.spawn(move || Local::form(&name, members, 0, &secret, Deadline::after_ms(5000)))
        };
        let Some(ready) = line_with("FLOOD connected", 5000) else {
            // SAFETY: kill(2) of our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return Err("the nobody process did not connect".to_string());
        };
        let t = Instant::now();
        let joins: Vec<_> = members[1..]
            .iter()
            .map(|&r| {
                let (name, members) = (name.clone(), members.clone());
                s.spawn(move || Local::form(&name, members, r, &secret, Deadline::after_ms(5000)))
            })
            .collect();
        let mut errors: Vec<String> =
            joins.into_iter().filter_map(|j| j.join().unwrap().err()).map(|e| e.message).collect();
        errors.extend(hub.join().unwrap().err().map(|e| e.message));
        let with = t.elapsed();
        let closed = line_with("FLOOD closed", 5000);
        Ok((ready, with, closed, errors))
    });
    // SAFETY: kill(2) of our own child (a no-op if it already exited).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let status = child.wait().unwrap();
    let (ready, with, closed, errors) = result.unwrap();
    eprintln!("4 ranks: alone {alone:?}, with uid nobody's connections {with:?}; {ready}; {closed:?}; {status:?}");
    assert!(errors.is_empty(), "{errors:?}");
    assert!(with < alone * 3 + Duration::from_millis(500), "{with:?} (alone {alone:?})");
    let closed = closed.expect("the nobody process reports its connections");
    assert!(closed.contains("FLOOD closed 40 of 40"), "{closed}");
}

/// The attacker: as uid nobody, finds `FLOOD_SOCKET` in /proc/net/unix, connects 40 times
/// without a word, reports how many of its connections the hub closed within 1 s, and holds
/// the others open.
fn nobody_case() {
    // SAFETY: getuid cannot fail.
    assert_ne!(unsafe { libc::getuid() }, 0, "runs as nobody");
    let name = wait_bound(&std::env::var("FLOOD_SOCKET").unwrap());
    let conns: Vec<OwnedFd> = (0..40).map(|_| connect_fd(&name)).collect();
    println!("FLOOD connected 40 to @{name}");
    let t = Instant::now();
    let mut closed = vec![false; conns.len()];
    while t.elapsed() < Duration::from_secs(1) && closed.iter().any(|c| !c) {
        for (c, done) in conns.iter().zip(closed.iter_mut()) {
            let mut p = libc::pollfd { fd: c.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            if !*done && unsafe { libc::poll(&mut p, 1, 0) } > 0 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                *done = true;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("FLOOD closed {} of 40 in {:?}", closed.iter().filter(|&&c| c).count(), t.elapsed());
    // Hold what is still open until the test ends (it kills this process).
    std::thread::sleep(Duration::from_secs(10));
    drop(conns);
}

/// The child side: runs the case named by `FLOOD_CHILD`; nothing without it.
#[test]
fn child() {
    // A process that only makes an id must log its listener's drops without this ("idlog").
    if std::env::var_os(CHILD).is_some_and(|c| c != "idlog") {
        crate::logging::init();
    }
    match std::env::var(CHILD).as_deref() {
        Ok("trickle") => trickle_case(),
        Ok("far") => far_case(),
        Ok("threads") => threads_case(),
        Ok("fdlimit") => fdlimit_case(),
        Ok("trickler") => trickler_case(),
        Ok("idlog") => idlog_case(),
        Ok("jobs") => jobs_case(),
        Ok("job-b") => job_b_case(),
        Ok("emfile") => emfile_case(),
        Ok("nobody") => nobody_case(),
        Ok(other) => panic!("unknown case {other}"),
        Err(_) => {}
    }
}

// ---- floods of the TCP listeners from another source address ----

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// The source address of the floods: another loopback address than the ranks' 127.0.0.1.
const FLOOD_SRC: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Raises this process's descriptor limit to `n` (at most the hard limit).
fn raise_nofile(n: u64) {
    // SAFETY: rlimit is plain old data; getrlimit/setrlimit of this (child) process.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim.rlim_cur = n.min(lim.rlim_max);
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

/// A non-blocking connection from `src` to `dst` (its connect under way); `None` when no
/// socket can be made.
fn connect_from(src: Ipv4Addr, dst: SocketAddr) -> Option<OwnedFd> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(dst) = dst else { panic!("IPv4 only") };
    let sin = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: socket(2); checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor.
    let s = unsafe { OwnedFd::from_raw_fd(fd) };
    let (a, b) = (sin(src, 0), sin(*dst.ip(), dst.port()));
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: valid sockaddr_in values of `len` bytes.
    unsafe {
        if libc::bind(fd, (&a as *const libc::sockaddr_in).cast(), len) != 0 {
            return None;
        }
        libc::connect(fd, (&b as *const libc::sockaddr_in).cast(), len);
    }
    Some(s)
}

/// One thread that keeps `per_target` silent connections from [`FLOOD_SRC`] open to each of
/// `targets` (which the test may change), opening a new one for each the listener closes.
struct Flood {
    targets: Arc<parking_lot::Mutex<Vec<SocketAddr>>>,
    live: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    fn start(per_target: usize) -> Flood {
        let targets: Arc<parking_lot::Mutex<Vec<SocketAddr>>> = Arc::default();
        let (live, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (t, l, st) = (targets.clone(), live.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut conns: Vec<(SocketAddr, OwnedFd)> = Vec::new();
            while !st.load(Ordering::Relaxed) {
                let want = t.lock().clone();
                conns.retain(|c| want.contains(&c.0));
                // Drop the connections the listener closed (read what it sent; 0 is the end).
                conns.retain(|(_, fd)| {
                    let mut buf = [0u8; 256];
                    loop {
                        // SAFETY: reads into a local buffer.
                        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                        if n > 0 {
                            continue;
                        }
                        let again = n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock;
                        return again;
                    }
                });
                for target in &want {
                    let have = conns.iter().filter(|c| c.0 == *target).count();
                    for _ in have..per_target {
                        match connect_from(FLOOD_SRC, *target) {
                            Some(fd) => conns.push((*target, fd)),
                            None => break,
                        }
                    }
                }
                l.store(conns.len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Flood { targets, live, stop, thread: Some(thread) }
    }

    /// Floods `targets` from now on, once at least `min` connections are open (at most 3 s).
    fn aim(&self, targets: &[SocketAddr], min: usize) {
        *self.targets.lock() = targets.to_vec();
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        while self.live.load(Ordering::Relaxed) < min && t.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TCP relay on loopback to `target` that holds every byte `delay` each way (a rank on
/// another node, a few switches away).
fn delay_relay(target: SocketAddr, delay: Duration) -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in l.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(target) else { continue };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            for (from, to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
                let mut from = from;
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 || tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                });
                let mut to = to;
                std::thread::spawn(move || {
                    for (due, bytes) in rx {
                        std::thread::sleep(due.saturating_duration_since(Instant::now()));
                        if to.write_all(&bytes).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    addr
}

/// Loopback only, so that the floods' other source address reaches the listeners.
const ON_LO: [(&str, &str); 1] = [("MCAST_SOCKET_IFNAME", "lo")];

/// 1000 silent connections from one address held open on the root listener while a team of 4
/// forms, one rank of which is 5 ms away each way: the team forms every time (10 of 10).
#[test]
fn a_flood_from_one_address_keeps_no_far_rank_out() {
    let out = run_child_env("far", &[], &ON_LO, Duration::from_secs(80));
    eprintln!("{out}");
}

fn far_case() {
    raise_nofile(4096);
    let flood = Flood::start(1000);
    let n = 4;
    let mut formed = 0;
    let mut report = Vec::new();
    for trial in 0..10 {
        let id = new_unique_id().unwrap();
        let mut far = UniqueId::decode(&id).unwrap();
        flood.aim(&[far.addr], 900);
        let flooding = flood.live.load(Ordering::Relaxed);
        far.addr = delay_relay(far.addr, Duration::from_millis(5));
        let far = far.encode();
        let t = Instant::now();
        let results: Vec<Result<Bootstrap, BootError>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let id = if r == n - 1 { &far } else { &id };
                    s.spawn(move || Bootstrap::init_id(id, n as i64, r as i64, MAX, 5000, "one".into()))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let took = t.elapsed();
        let errors: Vec<String> = results.iter().filter_map(|r| r.as_ref().err()).map(|e| e.message.clone()).collect();
        if errors.is_empty() {
            formed += 1;
        }
        report.push(format!("trial {trial}: {flooding} flooding, {took:?}, errors {errors:?}"));
    }
    drop(flood);
    eprintln!("{}", report.join("\n"));
    eprintln!("formed {formed} of 10 behind 1000 silent connections from one address, the far rank 5 ms away");
    assert_eq!(formed, 10, "{}", report.join("\n"));
}

/// The most threads this process had while `busy` ran, sampled every 5 ms.
fn most_threads_during<T>(busy: impl FnOnce() -> T) -> (T, usize) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut most = threads();
            while !stop.load(Ordering::Relaxed) {
                most = most.max(threads());
                std::thread::sleep(Duration::from_millis(5));
            }
            most
        });
        let out = busy();
        stop.store(true, Ordering::Relaxed);
        (out, sampler.join().unwrap())
    })
}

/// The TCP listening sockets of this process on 127.0.0.1 (from /proc/net/tcp and its
/// descriptors).
fn own_listeners() -> Vec<SocketAddr> {
    let inodes: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_string))
        .collect();
    let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(3) != Some(&"0A") || !inodes.iter().any(|i| Some(&i.as_str()) == f.get(9)) {
                return None;
            }
            let (ip, port) = f[1].split_once(':')?;
            let ip = Ipv4Addr::from(u32::from_be(u32::from_str_radix(ip, 16).ok()?));
            Some(SocketAddr::new(ip.into(), u16::from_str_radix(port, 16).ok()?))
        })
        .collect()
}

/// Threads stay few: a process that made an id, with 200 trickling connections at its root
/// listener, and an env-mode rank 0 with both its listeners (root and hub) flooded, stay below
/// 16 threads; the team then forms.
#[test]
fn the_listeners_threads_stay_few_under_floods() {
    let env = [
        ON_LO[0],
        ("MCAST_BOOTSTRAP_ADDR", "127.0.0.1:0"),
        ("MCAST_BOOTSTRAP_SECRET", "7c2e91b04fd8a3651e0b9c47d2a8f36e"),
    ];
    let out = run_child_env("threads", &[], &env, Duration::from_secs(60));
    eprintln!("{out}");
}

fn threads_case() {
    raise_nofile(4096);
    // A root listener, 200 trickling connections (their thread included).
    let id = new_root_id().unwrap();
    let root = UniqueId::decode(&id).unwrap().addr;
    let ((closed, _), most) = most_threads_during(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || trickle(root, tx));
        rx.recv().unwrap();
        t.join().unwrap()
    });
    let open = closed.iter().filter(|c| c.is_none()).count();
    eprintln!("a root listener under {TRICKLERS} trickling connections: {most} threads at most; {open} never closed");
    assert!(most < 16, "{most} threads");
    assert_eq!(open, 0, "{open} trickling connections were never closed");

    // An env-mode rank 0 (its own root and hub), both flooded, then rank 1.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    std::env::set_var("MCAST_BOOTSTRAP_ADDR", format!("127.0.0.1:{port}"));
    let id = new_unique_id().unwrap();
    let before = own_listeners();
    let flood = Flood::start(200);
    let (boots, most) = most_threads_during(|| {
        let rank0 = std::thread::spawn(move || Bootstrap::init_id(&id, 2, 0, MAX, 8000, "one".into()));
        let t = Instant::now();
        let ours = loop {
            let now: Vec<SocketAddr> = own_listeners().into_iter().filter(|a| !before.contains(a)).collect();
            if now.len() >= 2 || t.elapsed() > Duration::from_secs(3) {
                break now;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(ours.len(), 2, "rank 0's root and hub listen: {ours:?}");
        flood.aim(&ours, 380);
        std::thread::sleep(Duration::from_millis(1000));
        let flooding = flood.live.load(Ordering::Relaxed);
        let rank1 = Bootstrap::init_id(&id, 2, 1, MAX, 5000, "one".into());
        (rank0.join().unwrap(), rank1, flooding)
    });
    drop(flood);
    let (b0, b1, flooding) = boots;
    eprintln!("an env-mode rank 0 with both listeners flooded ({flooding} connections): {most} threads at most");
    b0.unwrap();
    b1.unwrap();
    assert!(most < 16, "{most} threads");
}

/// With a limit of 64 descriptors above those it holds, and 200 connections trickling into
/// its root listener from another process (each one closed is opened again), a team of 2
/// still forms: the listener sheds the idle connections so ranks get in, and keeps a few
/// descriptors for the rest of the process.
#[test]
fn a_64_descriptor_limit_with_a_trickle_still_forms() {
    let out = run_child_env("fdlimit", &[], &ON_LO, Duration::from_secs(60));
    eprintln!("{out}");
}

fn fdlimit_case() {
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let lim = libc::rlimit { rlim_cur: open + 64, rlim_max: open + 64 };
    // SAFETY: setrlimit of this (child) process.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let id = new_unique_id().unwrap();
    let addr = UniqueId::decode(&id).unwrap().addr;
    let mut trickler = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "bootstrap::flood_tests::child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "trickler")
        .env("TRICKLE_ADDR", addr.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(trickler.stdout.take().unwrap());
    let said = std::io::BufRead::lines(out).map_while(Result::ok).find(|l| l.contains("TRICKLING"));
    assert!(said.is_some(), "the trickler did not start");
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let n = 2;
    let results: Vec<Result<Bootstrap, BootError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| s.spawn(move || Bootstrap::init_id(&id, n as i64, r as i64, MAX, 10_000, "one".into())))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = t.elapsed();
    let _ = trickler.kill();
    let _ = trickler.wait();
    eprintln!("a team of {n} under a 64-descriptor limit with {TRICKLERS} trickling connections: {took:?}");
    for (r, b) in results.into_iter().enumerate() {
        if let Err(e) = b {
            panic!("rank {r}: {}", e.message);
        }
    }
    assert!(took < Duration::from_secs(8), "{took:?}");
}

/// The trickler of [`fdlimit_case`]: keeps [`TRICKLERS`] connections to `TRICKLE_ADDR`, each
/// sending a byte every 100 ms, opening a new one for each closed, for 15 s.
fn trickler_case() {
    raise_nofile(4096);
    let addr: SocketAddr = std::env::var("TRICKLE_ADDR").unwrap().parse().unwrap();
    let mut conns: Vec<TcpStream> = Vec::new();
    let t = Instant::now();
    let mut said = false;
    while t.elapsed() < Duration::from_secs(15) {
        conns.retain_mut(|s| {
            let mut buf = [0u8; 256];
            let gone = loop {
                match s.read(&mut buf) {
                    Ok(0) => break true,
                    Ok(_) => {}
                    Err(e) => break e.kind() != std::io::ErrorKind::WouldBlock,
                }
            };
            !gone && s.write(&[0]).is_ok()
        });
        while conns.len() < TRICKLERS {
            let Some(fd) = connect_from(Ipv4Addr::LOCALHOST, addr) else { break };
            conns.push(TcpStream::from(fd));
        }
        if !said {
            println!("TRICKLING {}", conns.len());
            said = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A process that only makes an id (no context, so nothing else starts the logging) still
/// logs its listener's drops.
#[test]
fn a_process_that_only_makes_an_id_logs_its_listener() {
    let out = run_child("idlog", &[], Duration::from_secs(30));
    assert!(out.contains("bootstrap root at") && out.contains("failed the handshake"), "{out}");
}

fn idlog_case() {
    let id = new_unique_id().unwrap();
    let addr = UniqueId::decode(&id).unwrap().addr;
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    std::thread::sleep(Duration::from_millis(100));
}

const JOBS_SECRET: &str = "e83b0c5f9a1d47c26b8e3f0a5d9c1b74";

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
fn jobs_case() {
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

fn job_b_case() {
    let id = new_unique_id().unwrap();
    match Bootstrap::init_id(&id, 2, 1, MAX, 3000, "two".into()) {
        Ok(_) => println!("JOB B joined"),
        Err(e) => println!("JOB B refused: {}", e.message),
    }
}
