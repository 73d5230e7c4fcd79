//! Floods of the TCP listeners from another source address: a far rank, threads, a
//! descriptor limit.

use super::*;

/// The source address of the floods: another loopback address than the ranks' 127.0.0.1.
pub(super) const FLOOD_SRC: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Raises this process's descriptor limit to `n` (at most the hard limit).
pub(super) fn raise_nofile(n: u64) {
    // SAFETY: rlimit is plain old data; getrlimit/setrlimit of this (child) process.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim.rlim_cur = n.min(lim.rlim_max);
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

/// A non-blocking connection from `src` to `dst` (its connect under way); `None` when no
/// socket can be made.
pub(super) fn connect_from(src: Ipv4Addr, dst: SocketAddr) -> Option<OwnedFd> {
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
pub(super) struct Flood {
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
pub(super) fn delay_relay(target: SocketAddr, delay: Duration) -> SocketAddr {
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
pub(super) const ON_LO: [(&str, &str); 1] = [("MCAST_SOCKET_IFNAME", "lo")];

/// 1000 silent connections from one address held open on the root listener while a team of 4
/// forms, one rank of which is 5 ms away each way: the team forms every time (10 of 10).
#[test]
fn a_flood_from_one_address_keeps_no_far_rank_out() {
    let out = run_child_env("far", &[], &ON_LO, Duration::from_secs(80));
    eprintln!("{out}");
}

pub(super) fn far_case() {
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
pub(super) fn most_threads_during<T>(busy: impl FnOnce() -> T) -> (T, usize) {
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
pub(super) fn own_listeners() -> Vec<SocketAddr> {
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

pub(super) fn threads_case() {
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

pub(super) fn fdlimit_case() {
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
pub(super) fn trickler_case() {
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
