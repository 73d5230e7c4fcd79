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

use std::net::{IpAddr, Ipv4Addr};

use super::tcp::Interface;

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
}
