//! Which interface the bootstrap listens on, by `NCCL_SOCKET_IFNAME`'s rules (NCCL
//! `src/misc/socket.cc`, `matchIfList`; the user guide's "NCCL_SOCKET_IFNAME"):
//!
//! - `MCAST_SOCKET_IFNAME` is a comma list of interface name prefixes (`eth,ib` takes any
//!   interface whose name starts with `eth` or `ib`);
//! - a leading `^` inverts the whole list (`^docker,lo`: any interface but those);
//! - a leading `=` (after a `^`, if any) matches whole names instead of prefixes (`=eth0`,
//!   `^=docker0`);
//! - unset or empty: interfaces that are up, except loopback, `docker*` and `veth*`; if there
//!   is none, a `docker*` or `veth*` one (a container's or a network namespace's only link);
//!   loopback only if nothing else is up;
//! - a list that selects nothing is an error naming the interfaces that are up.
//!
//! Among the addresses selected, the first IPv4 one is preferred, else the first.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{BootError, Kind};

/// One interface address.
#[derive(Clone, Debug)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Its address.
    pub ip: IpAddr,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
}

/// Every address of every interface that is up (IPv4 and IPv6, no link-local IPv6).
pub fn interfaces() -> Vec<Interface> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` or fails; freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: a node of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: a NUL-terminated name.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        // SAFETY: the family field of a valid sockaddr.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = if family == libc::AF_INET {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
        } else if family == libc::AF_INET6 {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            if ip.segments()[0] & 0xffc0 == 0xfe80 {
                continue;
            }
            IpAddr::V6(ip)
        } else {
            continue;
        };
        out.push(Interface { name, ip, loopback: ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0 });
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The address to listen on: the interface `MCAST_SOCKET_IFNAME` selects (by
/// `NCCL_SOCKET_IFNAME`'s rules, see this module), else the first that is up but for
/// loopback, `docker*` and `veth*`, else loopback.
pub fn pick_ip() -> Result<IpAddr, BootError> {
    pick_ip_from(&interfaces(), std::env::var("MCAST_SOCKET_IFNAME").ok().as_deref())
}

/// [`pick_ip`] over a given interface list.
pub fn pick_ip_from(ifs: &[Interface], wanted: Option<&str>) -> Result<IpAddr, BootError> {
    choose(ifs, wanted).map_err(|why| BootError::new(Kind::InvalidArgument, why))
}

/// A parsed `MCAST_SOCKET_IFNAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfList {
    /// `^`: the names listed are the ones *not* to use.
    pub exclude: bool,
    /// `=`: whole names, not prefixes.
    pub exact: bool,
    /// The names or prefixes (empty entries dropped).
    pub names: Vec<String>,
}

impl IfList {
    /// Parses `spec` (`^` then `=` then a comma list; spaces around entries ignored).
    pub fn parse(spec: &str) -> IfList {
        let s = spec.trim();
        let (exclude, s) = match s.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let (exact, s) = match s.strip_prefix('=') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let names = s.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_string).collect();
        IfList { exclude, exact, names }
    }

    /// True when the list selects interface `name`.
    pub fn selects(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| if self.exact { name == n } else { name.starts_with(n.as_str()) });
        listed != self.exclude
    }
}

/// Interfaces skipped unless nothing else is up: bridges of containers and the host ends of
/// virtual pairs.
fn virtual_link(name: &str) -> bool {
    name.starts_with("docker") || name.starts_with("veth")
}

/// The first IPv4 address of `c`, else its first address.
fn best<'a>(c: impl Iterator<Item = &'a Interface> + Clone) -> Option<IpAddr> {
    c.clone().find(|i| i.ip.is_ipv4()).or_else(|| c.clone().next()).map(|i| i.ip)
}

/// The address to listen on among `ifs` (the interfaces that are up) for
/// `MCAST_SOCKET_IFNAME = spec`; an error naming the variable and the interfaces that are up
/// when a list selects nothing.
pub fn choose(ifs: &[Interface], spec: Option<&str>) -> Result<IpAddr, String> {
    if let Some(spec) = spec.filter(|s| !s.trim().is_empty()) {
        let list = IfList::parse(spec);
        return best(ifs.iter().filter(|i| list.selects(&i.name))).ok_or_else(|| {
            let mut up: Vec<&str> = ifs.iter().map(|i| i.name.as_str()).collect();
            up.dedup();
            format!(
                "MCAST_SOCKET_IFNAME={spec} selects no interface that is up with an address (up: {}); name one of \
                 them, a prefix of one (eth), several (eth,ib), exclude with ^ (^docker,lo) or match whole names \
                 with = (=eth0)",
                if up.is_empty() { "none".to_string() } else { up.join(", ") }
            )
        });
    }
    let plain = |i: &&Interface| !i.loopback && i.name != "lo" && !virtual_link(&i.name);
    let virt = |i: &&Interface| !i.loopback && i.name != "lo" && virtual_link(&i.name);
    Ok(best(ifs.iter().filter(plain))
        .or_else(|| best(ifs.iter().filter(virt)))
        .or_else(|| best(ifs.iter().filter(|i| i.loopback || i.name == "lo")))
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, ip: &str) -> Interface {
        Interface { name: name.into(), ip: ip.parse().unwrap(), loopback: name == "lo" }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn host() -> Vec<Interface> {
        vec![
            iface("lo", "127.0.0.1"),
            iface("docker0", "172.17.0.1"),
            iface("veth12ab", "169.254.3.1"),
            iface("eth0", "fd00::1"),
            iface("eth0", "10.0.0.1"),
            iface("eth10", "10.0.10.1"),
            iface("ib0", "10.1.0.1"),
        ]
    }

    #[test]
    fn lists_parse_like_nccl_socket_ifname() {
        assert_eq!(
            IfList::parse("eth,ib"),
            IfList { exclude: false, exact: false, names: vec!["eth".into(), "ib".into()] }
        );
        assert_eq!(
            IfList::parse("^docker, lo"),
            IfList { exclude: true, exact: false, names: vec!["docker".into(), "lo".into()] }
        );
        assert_eq!(IfList::parse("^=docker0"), IfList { exclude: true, exact: true, names: vec!["docker0".into()] });
        assert_eq!(IfList::parse("=eth0,"), IfList { exclude: false, exact: true, names: vec!["eth0".into()] });
    }

    /// Prefixes, `=` for whole names, `^` to exclude; IPv4 preferred among the matches.
    #[test]
    fn prefixes_exact_names_and_exclusions() {
        let ifs = host();
        assert_eq!(choose(&ifs, Some("ib")).unwrap(), ip("10.1.0.1"));
        assert_eq!(choose(&ifs, Some("eth")).unwrap(), ip("10.0.0.1"), "eth0's IPv4 before its IPv6");
        assert_eq!(choose(&ifs, Some("=eth10")).unwrap(), ip("10.0.10.1"));
        assert_eq!(choose(&ifs, Some("ib,eth")).unwrap(), ip("10.0.0.1"), "interface order, not list order");
        assert_eq!(choose(&ifs, Some("^lo,docker,veth,eth")).unwrap(), ip("10.1.0.1"));
        assert_eq!(choose(&ifs, Some("^=eth0,lo,docker0,veth12ab")).unwrap(), ip("10.0.10.1"));
        // A user's list may name what the default skips.
        assert_eq!(choose(&ifs, Some("docker")).unwrap(), ip("172.17.0.1"));
        assert_eq!(choose(&ifs, Some("lo")).unwrap(), ip("127.0.0.1"));
        // "=eth" is a whole name: eth0 and eth10 are not it.
        assert!(choose(&ifs, Some("=eth")).is_err());
    }

    /// Default: not lo, docker* or veth*; those only when nothing else is up, loopback last.
    #[test]
    fn the_default_skips_loopback_and_virtual_links() {
        let mut ifs = host();
        assert_eq!(choose(&ifs, None).unwrap(), ip("10.0.0.1"));
        assert_eq!(choose(&ifs, Some(" ")).unwrap(), ip("10.0.0.1"), "empty is unset");
        ifs.retain(|i| !i.name.starts_with("eth") && !i.name.starts_with("ib"));
        assert_eq!(choose(&ifs, None).unwrap(), ip("172.17.0.1"), "a container's only link");
        ifs.retain(|i| i.name == "lo");
        assert_eq!(choose(&ifs, None).unwrap(), ip("127.0.0.1"));
        assert_eq!(choose(&[], None).unwrap(), ip("127.0.0.1"));
    }

    /// A list that selects nothing names the variable, the list and the interfaces that are up.
    #[test]
    fn nothing_selected_names_the_interfaces_up() {
        let e = choose(&host(), Some("wlan")).unwrap_err();
        assert!(e.contains("MCAST_SOCKET_IFNAME=wlan"), "{e}");
        assert!(e.contains("up: lo, docker0, veth12ab, eth0, eth10, ib0"), "{e}");
        let e = choose(&host(), Some("^lo,docker,veth,eth,ib")).unwrap_err();
        assert!(e.contains("^lo,docker,veth,eth,ib"), "{e}");
        assert!(choose(&[], Some("eth")).unwrap_err().contains("up: none"));
    }

    #[test]
    fn interface_choice() {
        let ifs = vec![
            Interface { name: "lo".into(), ip: "127.0.0.1".parse().unwrap(), loopback: true },
            Interface { name: "eth0".into(), ip: "fd00::1".parse().unwrap(), loopback: false },
            Interface { name: "eth0".into(), ip: "10.0.0.1".parse().unwrap(), loopback: false },
            Interface { name: "ib0".into(), ip: "10.1.0.1".parse().unwrap(), loopback: false },
        ];
        assert_eq!(pick_ip_from(&ifs, None).unwrap(), "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(pick_ip_from(&ifs, Some("ib")).unwrap(), "10.1.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(pick_ip_from(&ifs, Some("lo")).unwrap(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert!(pick_ip_from(&ifs, Some("wlan")).unwrap_err().message.contains("wlan"));
        assert_eq!(pick_ip_from(&ifs[..1], None).unwrap(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(pick_ip_from(&[], None).unwrap(), "127.0.0.1".parse::<IpAddr>().unwrap());
    }
}
