//! Listen and advertise addresses: which addresses another machine can dial (an advertise address
//! must be one), the wildcard a process listens on for a given advertise address, and whether a
//! socket bound to one family can dial another. Pure functions; no socket is opened here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Why other machines could not dial `addr`, or `None` when they can (as far as the address
/// alone tells). Refused: wildcards (`0.0.0.0`, `::`), port 0, the rest of `0.0.0.0/8`,
/// multicast, the IPv4 broadcast address and IPv6 link-local addresses, also when written as
/// IPv4-mapped IPv6. Loopback passes: a one-machine mesh (`meshctl dev`, the beds) advertises it;
/// mixing it with routable addresses is a config's check, not an address's.
pub fn advertise_problem(addr: SocketAddr) -> Option<String> {
    if addr.port() == 0 {
        return Some(format!(
            "`{addr}` has port 0, which means \"any port\" when listening and cannot be dialled; write the port the process listens on"
        ));
    }
    let ip = canonical(addr.ip());
    if ip.is_unspecified() {
        return Some(format!(
            "`{addr}` is a wildcard: a process listens there, no machine can dial it; write this process's own routable address (listen on the wildcard with `listen`)"
        ));
    }
    if ip.is_multicast() {
        return Some(format!(
            "`{addr}` is a multicast address, not one machine; write the machine's own unicast address"
        ));
    }
    match ip {
        IpAddr::V4(v4) if v4 == Ipv4Addr::BROADCAST => Some(format!(
            "`{addr}` is the broadcast address, not one machine; write the machine's own address"
        )),
        IpAddr::V4(v4) if v4.octets()[0] == 0 => Some(format!(
            "`{addr}` is in 0.0.0.0/8 (\"this network\"), which cannot be dialled; write the machine's own address"
        )),
        IpAddr::V6(v6) if is_link_local_v6(v6) => Some(format!(
            "`{addr}` is IPv6 link-local (fe80::/10): it needs an interface zone that differs on every machine; write a global or unique-local (fd00::/8) address"
        )),
        _ => None,
    }
}

/// Where a process listens when others reach it at `advertise`: a loopback advertise address
/// listens on itself (a one-machine mesh stays off the network); any other listens on the same
/// port of the wildcard, `[::]` when `dual_stack` (it must also dial IPv6 peers, or be dialled
/// over both families) or the advertise address is IPv6, else `0.0.0.0`.
pub fn listen_for(advertise: SocketAddr, dual_stack: bool) -> SocketAddr {
    let ip = canonical(advertise.ip());
    if ip.is_loopback() {
        return advertise;
    }
    let any = if dual_stack || ip.is_ipv6() {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    SocketAddr::new(any, advertise.port())
}

/// Why a socket bound to `listen` cannot dial `remote`, or `None`: an IPv4 socket cannot reach
/// an IPv6 address, IPv4-mapped ones included (an IPv6 socket reaches IPv4 ones through mapped
/// addresses).
pub fn dial_problem(listen: SocketAddr, remote: SocketAddr) -> Option<String> {
    if listen.is_ipv4() && remote.is_ipv6() {
        return Some(format!(
            "`{remote}` is IPv6 but `listen` is the IPv4 address `{listen}`, whose socket cannot dial it; listen on `[::]:{}` to reach both families",
            listen.port()
        ));
    }
    None
}

/// Whether `addr` is a loopback address (IPv4-mapped included).
pub fn is_loopback(addr: SocketAddr) -> bool {
    canonical(addr.ip()).is_loopback()
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is; any other unchanged.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn is_link_local_v6(ip: Ipv6Addr) -> bool {
    (ip.segments()[0] & 0xffc0) == 0xfe80
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("a socket address")
    }

    #[test]
    fn wildcards_and_other_undialable_addresses_are_refused_as_advertise_addresses() {
        // Issue 15: an advertise address is what other machines dial.
        for bad in [
            "0.0.0.0:7100",
            "[::]:7100",
            "[::ffff:0.0.0.0]:7100",
            "10.0.0.1:0",
            "255.255.255.255:7100",
            "0.1.2.3:7100",
            "224.0.0.1:7100",
            "[ff02::1]:7100",
            "[fe80::1]:7100",
        ] {
            assert!(advertise_problem(addr(bad)).is_some(), "{bad} passed");
        }
        for good in [
            "10.0.0.1:7100",
            "192.168.1.20:7200",
            "[fd00::5]:7200",
            "[2001:db8::1]:7100",
            "127.0.0.1:7101",
            "[::1]:7101",
        ] {
            assert_eq!(advertise_problem(addr(good)), None, "{good}");
        }
    }

    #[test]
    fn routable_advertise_addresses_listen_on_the_wildcard_of_their_family_loopback_on_itself() {
        // Issue 15: listen on 0.0.0.0/[::], advertise the routable address.
        assert_eq!(
            listen_for(addr("10.0.0.1:7100"), false),
            addr("0.0.0.0:7100")
        );
        assert_eq!(listen_for(addr("10.0.0.1:7100"), true), addr("[::]:7100"));
        assert_eq!(listen_for(addr("[fd00::1]:7100"), false), addr("[::]:7100"));
        assert_eq!(
            listen_for(addr("127.0.0.1:7101"), true),
            addr("127.0.0.1:7101")
        );
    }

    #[test]
    fn an_ipv4_socket_cannot_dial_an_ipv6_peer() {
        assert!(dial_problem(addr("0.0.0.0:7100"), addr("[fd00::2]:7100")).is_some());
        assert_eq!(dial_problem(addr("[::]:7100"), addr("10.0.0.2:7100")), None);
        assert!(dial_problem(addr("0.0.0.0:7100"), addr("[::ffff:10.0.0.2]:7100")).is_some());
        assert_eq!(
            dial_problem(addr("0.0.0.0:7100"), addr("10.0.0.2:7100")),
            None
        );
    }
}
