//! The root listener of a unique id ends when its team cannot form within the timeout
//! (`MCAST_TIMEOUT_MS`): ids that nobody uses keep no socket and no thread. Its own test
//! binary, so the environment variable and the thread count are this test's alone.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use mcast::bootstrap::{new_unique_id, UniqueId};

fn mcast_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("mcast-"))
        .count()
}

#[test]
fn unused_ids_close_their_root_listener_after_the_timeout() {
    // Set before any thread of ours reads the environment.
    std::env::set_var("MCAST_TIMEOUT_MS", "300");
    std::env::remove_var("MCAST_BOOTSTRAP_ADDR");
    let before = mcast_threads();
    let addrs: Vec<SocketAddr> = (0..20).map(|_| UniqueId::decode(&new_unique_id().unwrap()).unwrap().addr).collect();
    assert!(mcast_threads() >= before + 20, "{} mcast threads", mcast_threads());
    let t = Instant::now();
    while mcast_threads() > before {
        assert!(t.elapsed() < Duration::from_secs(5), "{} mcast threads remain", mcast_threads() - before);
        std::thread::sleep(Duration::from_millis(20));
    }
    for a in addrs {
        assert!(TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_err(), "{a} still accepts");
    }
}
