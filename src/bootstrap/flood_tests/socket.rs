//! The host-local descriptor socket: strangers, replays and other users.

use super::*;

/// A fresh abstract socket name for one test's hub.
pub(super) fn fd_name(tag: &str) -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    format!("mcast-fd-floodtest-{}-{tag}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Waits until the abstract socket `name` is in /proc/net/unix (at most 4 s); its listed name.
pub(super) fn wait_bound(name: &str) -> String {
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
pub(super) fn connect_fd(name: &str) -> OwnedFd {
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
pub(super) fn recv_within(s: &OwnedFd, ms: u64) -> Option<Vec<u8>> {
    let ready = fdpass::wait_readable(s.as_raw_fd(), None, Deadline::after_ms(ms));
    assert_eq!(ready, Ready::Readable, "nothing arrived within {ms} ms");
    fdpass::recv_msg(s.as_raw_fd()).unwrap().map(|(m, _)| m)
}

/// Forms the descriptor channel of `members` (thread ranks) at `name`; how long it took.
pub(super) fn form_local(name: &str, members: &[usize], secret: &[u8; SECRET_BYTES]) -> Duration {
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
pub(super) fn nobody_case() {
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
