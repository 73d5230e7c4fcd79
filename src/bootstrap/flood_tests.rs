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
    let acc = tcp::Acceptor::start(l, secret, "test listener").unwrap();
    let before = threads();
    let (tx, rx) = std::sync::mpsc::channel();
    let trickler = std::thread::spawn(move || trickle(addr, tx));
    rx.recv().unwrap();
    let t = Instant::now();
    let mut s = tcp::connect(addr, &secret, Deadline::after_ms(3000)).unwrap();
    s.send(kind::JOIN, b"rank").unwrap();
    let (_, join) = acc.next(Deadline::after_ms(3000)).expect("the rank got through");
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
    assert!(most <= before + tcp::MAX_PENDING + tcp::MAX_PENDING / 4 + 8, "{most} threads (from {before})");
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
    // The handshake threads, the team's own (4 ranks, readers, hub) and slack.
    assert!(most <= before + tcp::MAX_PENDING + tcp::MAX_PENDING / 4 + 24, "{most} threads (from {before})");
    drop(boots);
}

/// A rank that connects behind a flood of silent connections gets through while the handshake
/// threads of the evicted ones are slow to end (a loaded machine; here each lingers 300 ms):
/// their connections wait in the backlog until threads free up, instead of being closed at
/// once as the rank's was.
#[test]
fn a_rank_behind_a_flood_gets_through_while_evicted_handshakes_linger() {
    let out = run_child("linger", &[], Duration::from_secs(60));
    eprintln!("{out}");
}

fn linger_case() {
    tcp::acceptor::CUT_LINGER_MS.store(300, std::sync::atomic::Ordering::Relaxed);
    let secret = [6u8; SECRET_BYTES];
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let acc = tcp::Acceptor::start(l, secret, "test listener").unwrap();
    let before = threads();
    // More silent connections than pending handshakes and handshake threads together.
    let silent: Vec<TcpStream> = (0..TRICKLERS).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let t = Instant::now();
    let mut most = threads();
    let rank = std::thread::spawn(move || {
        let mut s = tcp::connect(addr, &secret, Deadline::after_ms(5000))?;
        s.send(kind::JOIN, b"rank").map_err(|e| e.to_string())
    });
    let join = loop {
        most = most.max(threads());
        match acc.next(Deadline::after_ms(10)) {
            Some((_, join)) => break join,
            None if t.elapsed() < Duration::from_secs(5) && !rank.is_finished() => {}
            None => panic!("the rank did not get through: {:?}", rank.join().unwrap()),
        }
    };
    assert_eq!(join, b"rank");
    rank.join().unwrap().unwrap();
    eprintln!(
        "behind {TRICKLERS} silent connections a rank got through in {:?}; threads {before} before, {most} at most",
        t.elapsed()
    );
    assert!(most <= before + tcp::MAX_PENDING + tcp::MAX_PENDING / 4 + 8, "{most} threads (from {before})");
    drop(silent);
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
    if std::env::var_os(CHILD).is_some() {
        crate::runtime::logging::init();
    }
    match std::env::var(CHILD).as_deref() {
        Ok("trickle") => trickle_case(),
        Ok("linger") => linger_case(),
        Ok("emfile") => emfile_case(),
        Ok("nobody") => nobody_case(),
        Ok(other) => panic!("unknown case {other}"),
        Err(_) => {}
    }
}
