//! Connections that trickle a byte at a time, and a process out of descriptors.

use super::*;

/// 200 connections that each send a byte every 100 ms: against a listener, a rank still gets
/// through at once, the process's threads stay bounded and every trickling connection is closed
/// by the handshake deadline; against the root listener while a team forms through it, the team
/// forms about as fast as alone.
#[test]
fn trickling_connections_are_cut_at_the_deadline() {
    let out = run_child("trickle", &[], Duration::from_secs(60));
    eprintln!("{out}");
}

pub(super) const TRICKLERS: usize = 200;

/// Opens [`TRICKLERS`] connections to `addr`, says so on `ready`, then sends each a byte every
/// 100 ms (a proof frame, slowly) until every one is closed or 8 s passed. Returns when each
/// was closed after its connect (`None`: never) and the most threads this process had.
pub(super) fn trickle(
    addr: std::net::SocketAddr,
    ready: std::sync::mpsc::Sender<()>,
) -> (Vec<Option<Duration>>, usize) {
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

pub(super) fn trickle_case() {
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
pub(super) fn rests_out_of_descriptors<T>(what: &str, connect: impl FnOnce() -> T) -> T {
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

pub(super) fn emfile_case() {
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
