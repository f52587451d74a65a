//! Which connections a serving endpoint lets in (issue 23 part 3, decision 0300): handshakes in
//! progress counted apart from established connections, with their own bound and deadline and a
//! QUIC Retry for unvalidated addresses under load; established connections capped per
//! principal and per source address, and the last slots kept for replicas and admin operators.
//! [`Table`] is the whole decision, with the time handed in; [`Admission`] only locks it, counts
//! and logs.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quinn::{Connection, VarInt};

use crate::principal::{Principal, Role};
use crate::serve::Counters;

/// Most established connections served at once. A leader serves every host of its fleet on a
/// connection the host keeps open (10,000 hosts in issue 14, decision 0215), plus replicas and
/// operators. Handshakes in progress are not counted here (see [`handshakes_max`]).
pub const connections_max: usize = 16_384;

/// Fewest of the [`connections_max`] slots always left for replicas and admin operators (a
/// certificate stating role admin, or no role, which is admin, decision 0295): hosts and other
/// operators together hold at most `connections_max - connections_reserved_min`, so a flood of
/// them cannot lock out Raft or the `meshctl certs revoke` that stops it. Nine replicas (`meshctl
/// init`'s most) at [`connections_per_replica_max`] each take 144; the rest is room for many
/// admin `meshctl` runs at once.
pub const connections_reserved_min: usize = 256;

/// Most established connections one replica holds to this endpoint. A replica keeps one
/// connection per peer address; a restart or a re-dial after a stale connection leaves the old
/// one open until its idle timeout, so a few at once are normal. 16 is far above that.
pub const connections_per_replica_max: usize = 16;

/// Most established connections one host holds to this endpoint. `mesh-host` keeps one
/// connection per replica for its reports; as for a replica, a restarting or re-dialling host
/// briefly holds a second and a crash-looping one a few more. One host certificate can never
/// hold more than this, whatever it does.
pub const connections_per_host_max: usize = 16;

/// Most established connections one operator holds to this endpoint. One `meshctl` run opens
/// one connection per replica it tries, but `meshctl bench` opens one per client with the same
/// certificate, up to its `clients_max` (1,000) on one replica when the others are down; the
/// rest is room for other runs alongside. The reserve, not this cap, keeps a viewer from
/// locking out the admins.
pub const connections_per_operator_max: usize = 1_100;

/// Most established connections from one source address (IP and port: one peer socket). A mesh
/// process dials from one socket and keeps one connection per server address, so a legitimate
/// socket holds one, two during a re-dial. Counted per socket and not per IP because a fleet
/// behind one NAT, `meshctl bench --reports` (10,000 hosts from one machine, decision 0215) and
/// `meshctl bench` all share an IP legitimately; what bounds one machine is the cap per
/// principal and the reserve.
pub const connections_per_address_max: usize = 8;

/// Most handshakes in progress at once; another is refused (the peer's dial fails and it dials
/// again after its backoff). A handshake costs a TLS exchange and the server's first flight, not
/// an established slot; 1,024 lets a fleet re-dial a new leader in a few waves.
pub const handshakes_max: usize = 1_024;

/// Most handshakes in progress from one validated IP (one that answered a Retry or came back
/// with a token). `meshctl bench` and `bench --reports` dial 32 at once from one machine;
/// twice that leaves room. Unvalidated handshakes are not counted per IP, so a spoofed flood
/// naming a victim's address cannot use up the victim's share: they are bounded by
/// [`handshakes_without_retry_max`] instead.
pub const handshakes_per_ip_max: usize = 64;

/// Handshakes in progress from which a new one from an address not yet validated is answered
/// with a QUIC Retry instead: it costs the server one stateless packet, and a spoofed source
/// never sees it, so a flood from made-up addresses holds no handshake slot. Below this, a
/// handshake starts at once (a Retry costs a real peer one more round trip).
pub const handshakes_without_retry_max: usize = 128;

/// Longest a handshake may take once started, in milliseconds; then its slot goes back. A
/// handshake is 1.5 round trips and a certificate check each way: 3 s lets its first flight be
/// lost and sent again twice (QUIC's first probe waits about 1 s, then 2 s), and `meshctl` gives
/// up dialling after 3 s (`dial_timeout_ms`) anyway.
pub const handshake_ms_max: u64 = 3_000;

/// Shortest time between two warnings for refusals by the same cap, in milliseconds; each
/// warning says how many were refused since the last one. Every refusal is counted in
/// [`crate::Counts`].
pub const refusal_log_interval_ms: u64 = 10_000;

/// Connection close code: the connection was established but a cap on connections refused it;
/// the close reason names the cap and what to do.
pub const close_over_cap: u32 = 8;

/// The admission limits one endpoint serves with. The binaries serve with the defaults (the
/// constants above); tests narrow them so a handful of connections reach a cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    pub connections_max: usize,
    pub connections_reserved_min: usize,
    pub connections_per_replica_max: usize,
    pub connections_per_host_max: usize,
    pub connections_per_operator_max: usize,
    pub connections_per_address_max: usize,
    pub handshakes_max: usize,
    pub handshakes_per_ip_max: usize,
    pub handshakes_without_retry_max: usize,
    pub handshake_ms_max: u64,
    pub refusal_log_interval_ms: u64,
}

impl Default for ConnLimits {
    fn default() -> ConnLimits {
        ConnLimits {
            connections_max,
            connections_reserved_min,
            connections_per_replica_max,
            connections_per_host_max,
            connections_per_operator_max,
            connections_per_address_max,
            handshakes_max,
            handshakes_per_ip_max,
            handshakes_without_retry_max,
            handshake_ms_max,
            refusal_log_interval_ms,
        }
    }
}

/// [`ConnLimits`] that do not make sense together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("connection limits: {field} is 0; every cap must let at least one in")]
    Zero { field: &'static str },
    #[error(
        "connection limits: connections_reserved_min ({reserved}) must be below connections_max ({max}), or hosts and other operators get no slot"
    )]
    ReserveNotBelowMax { reserved: usize, max: usize },
    #[error(
        "connection limits: {field} ({value}) is above handshakes_max ({max}); it could never be reached"
    )]
    AboveHandshakes {
        field: &'static str,
        value: usize,
        max: usize,
    },
}

/// [`ConnLimits`] that passed [`ConnLimits::check`]; the defaults pass it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckedLimits {
    limits: ConnLimits,
}

impl ConnLimits {
    /// Checks the limits once; the result is what [`crate::Endpoint::serve_limited`] takes.
    pub fn check(self) -> Result<CheckedLimits, LimitsError> {
        let l = &self;
        for (field, value) in [
            ("connections_max", l.connections_max as u64),
            (
                "connections_per_replica_max",
                l.connections_per_replica_max as u64,
            ),
            (
                "connections_per_host_max",
                l.connections_per_host_max as u64,
            ),
            (
                "connections_per_operator_max",
                l.connections_per_operator_max as u64,
            ),
            (
                "connections_per_address_max",
                l.connections_per_address_max as u64,
            ),
            ("handshakes_max", l.handshakes_max as u64),
            ("handshakes_per_ip_max", l.handshakes_per_ip_max as u64),
            ("handshake_ms_max", l.handshake_ms_max),
            ("refusal_log_interval_ms", l.refusal_log_interval_ms),
        ] {
            if value == 0 {
                return Err(LimitsError::Zero { field });
            }
        }
        if l.connections_reserved_min >= l.connections_max {
            return Err(LimitsError::ReserveNotBelowMax {
                reserved: l.connections_reserved_min,
                max: l.connections_max,
            });
        }
        for (field, value) in [
            ("handshakes_per_ip_max", l.handshakes_per_ip_max),
            (
                "handshakes_without_retry_max",
                l.handshakes_without_retry_max,
            ),
        ] {
            if value > l.handshakes_max {
                return Err(LimitsError::AboveHandshakes {
                    field,
                    value,
                    max: l.handshakes_max,
                });
            }
        }
        Ok(CheckedLimits { limits: self })
    }
}

impl CheckedLimits {
    /// The checked values.
    pub fn values(&self) -> &ConnLimits {
        &self.limits
    }

    pub fn handshake_deadline(&self) -> Duration {
        Duration::from_millis(self.limits.handshake_ms_max)
    }
}

/// Whether a verified peer may use the reserved slots: a replica, or an operator whose
/// certificate states role admin or states none (a certificate from before roles, which may ask
/// everything: the mesh crate's `controller::roles::role_unstated`, decision 0295).
pub fn is_reserved(principal: &Principal, role: Option<Role>) -> bool {
    match principal {
        Principal::Replica(_) => true,
        Principal::Operator(_) => matches!(role, None | Some(Role::Admin)),
        Principal::Host(_) => false,
    }
}

/// Which cap refused a connection or a handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cap {
    /// [`handshakes_max`] handshakes were in progress.
    Handshakes,
    /// [`handshakes_per_ip_max`] validated handshakes from the same IP were in progress.
    HandshakesPerIp,
    /// The principal held its cap ([`connections_per_host_max`] and its siblings).
    PerPrincipal,
    /// The source address held [`connections_per_address_max`].
    PerAddress,
    /// Only the reserved slots were left and the peer is neither a replica nor an admin.
    Reserve,
    /// All [`connections_max`] slots were in use.
    Total,
}

impl Cap {
    fn index(self) -> usize {
        match self {
            Cap::Handshakes => 0,
            Cap::HandshakesPerIp => 1,
            Cap::PerPrincipal => 2,
            Cap::PerAddress => 3,
            Cap::Reserve => 4,
            Cap::Total => 5,
        }
    }
}

/// A refusal by a cap, as the close reason and the log say it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverCap {
    pub cap: Cap,
    /// The peer, as far as it is known: a principal once verified, else its address.
    pub who: String,
    /// The cap's value.
    pub max: usize,
    /// The cap's name, as its constant and [`ConnLimits`] field are named.
    pub field: &'static str,
}

impl fmt::Display for OverCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (who, max, field) = (&self.who, self.max, self.field);
        match self.cap {
            Cap::Handshakes => write!(
                f,
                "handshake from {who} refused: {max} handshakes in progress ({field}); dial again after a backoff"
            ),
            Cap::HandshakesPerIp => write!(
                f,
                "handshake from {who} refused: {max} handshakes in progress from that IP ({field}); dial fewer at once"
            ),
            Cap::PerPrincipal => write!(
                f,
                "connection refused: {who} already holds {max} connections here ({field}); one kept connection per process is enough, so look for a runaway process with this certificate, and revoke it with `meshctl certs revoke` if it is not yours"
            ),
            Cap::PerAddress => write!(
                f,
                "connection refused: {who} already holds {max} connections here from one socket ({field}); a process needs one connection per server, so close the idle ones"
            ),
            Cap::Reserve => write!(
                f,
                "connection refused: {who} may not take the last {max} slots ({field}), kept for replicas and admin operators; too many hosts or operators are connected: see mesh_connections_open (mesh_host_connections_open on a host) in /metrics, and revoke a runaway certificate with `meshctl certs revoke`"
            ),
            Cap::Total => write!(
                f,
                "connection refused: all {max} connection slots are in use ({field}); see mesh_connections_open (mesh_host_connections_open on a host) in /metrics, and revoke a runaway certificate with `meshctl certs revoke`"
            ),
        }
    }
}

/// What to do with a new QUIC `Incoming`.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    /// Start the handshake; its slot is counted until [`Table::handshake_done`].
    Accept,
    /// Answer with a Retry: the address is not validated and handshakes are many.
    Retry,
    /// Refuse it; the refusal says which cap.
    Refuse(OverCap),
}

/// Who an established connection's slot belongs to, to give it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    principal: Principal,
    addr: SocketAddr,
    reserved: bool,
}

/// Refusals by one cap since its last warning.
#[derive(Clone, Copy, Debug, Default)]
struct Quiet {
    last: Option<Instant>,
    unlogged: u64,
}

/// Every count the admission decisions read: handshakes in progress (in all, and validated ones
/// per IP) and established connections (in all, outside the reserve, per principal, per
/// address). Maps hold only keys with a count above 0, so each is bounded by its cap's total.
#[derive(Debug)]
pub struct Table {
    limits: ConnLimits,
    handshakes: usize,
    handshakes_by_ip: HashMap<IpAddr, usize>,
    open: usize,
    open_unreserved: usize,
    by_principal: HashMap<Principal, usize>,
    by_address: HashMap<SocketAddr, usize>,
    quiet: [Quiet; 6],
}

impl Table {
    pub fn new(limits: &CheckedLimits) -> Table {
        Table {
            limits: limits.limits.clone(),
            handshakes: 0,
            handshakes_by_ip: HashMap::new(),
            open: 0,
            open_unreserved: 0,
            by_principal: HashMap::new(),
            by_address: HashMap::new(),
            quiet: [Quiet::default(); 6],
        }
    }

    /// Handshakes in progress.
    pub fn handshakes(&self) -> usize {
        self.handshakes
    }

    /// Established connections holding a slot.
    pub fn open(&self) -> usize {
        self.open
    }

    /// Decides on a new `Incoming` from `addr`. `validated`: its address answered a Retry or
    /// came back with a token (then a Retry is not allowed, and not needed).
    pub fn incoming(&mut self, addr: SocketAddr, validated: bool) -> Incoming {
        let l = &self.limits;
        let over = |cap, max, field| {
            Incoming::Refuse(OverCap {
                cap,
                who: addr.to_string(),
                max,
                field,
            })
        };
        if !validated && self.handshakes >= l.handshakes_without_retry_max {
            return Incoming::Retry;
        }
        if self.handshakes >= l.handshakes_max {
            return over(Cap::Handshakes, l.handshakes_max, "handshakes_max");
        }
        if validated {
            let from_ip = self.handshakes_by_ip.get(&addr.ip()).copied().unwrap_or(0);
            if from_ip >= l.handshakes_per_ip_max {
                return over(
                    Cap::HandshakesPerIp,
                    l.handshakes_per_ip_max,
                    "handshakes_per_ip_max",
                );
            }
            *self.handshakes_by_ip.entry(addr.ip()).or_insert(0) += 1;
        }
        self.handshakes += 1;
        Incoming::Accept
    }

    /// A handshake [`Table::incoming`] accepted has ended, however it ended.
    pub fn handshake_done(&mut self, addr: SocketAddr, validated: bool) {
        assert!(self.handshakes > 0, "a handshake ended that never started");
        self.handshakes -= 1;
        if validated {
            take(&mut self.handshakes_by_ip, &addr.ip());
        }
    }

    /// Decides on a connection whose handshake named `principal` (with `role`) at `addr`: a
    /// slot, or the cap that refuses it. Caps per principal and per address first, so a peer
    /// over its own cap is told so even when the endpoint is also full.
    pub fn establish(
        &mut self,
        principal: &Principal,
        role: Option<Role>,
        addr: SocketAddr,
    ) -> Result<Holder, OverCap> {
        let l = &self.limits;
        let reserved = is_reserved(principal, role);
        let over = |cap, max, field| OverCap {
            cap,
            who: principal.to_string(),
            max,
            field,
        };
        let (principal_max, field) = match principal {
            Principal::Replica(_) => (l.connections_per_replica_max, "connections_per_replica_max"),
            Principal::Host(_) => (l.connections_per_host_max, "connections_per_host_max"),
            Principal::Operator(_) => (
                l.connections_per_operator_max,
                "connections_per_operator_max",
            ),
        };
        if self.by_principal.get(principal).copied().unwrap_or(0) >= principal_max {
            return Err(over(Cap::PerPrincipal, principal_max, field));
        }
        if self.by_address.get(&addr).copied().unwrap_or(0) >= l.connections_per_address_max {
            return Err(OverCap {
                who: format!("{principal} at {addr}"),
                ..over(
                    Cap::PerAddress,
                    l.connections_per_address_max,
                    "connections_per_address_max",
                )
            });
        }
        if self.open >= l.connections_max {
            return Err(over(Cap::Total, l.connections_max, "connections_max"));
        }
        let unreserved_max = l.connections_max - l.connections_reserved_min;
        if !reserved && self.open_unreserved >= unreserved_max {
            return Err(over(
                Cap::Reserve,
                l.connections_reserved_min,
                "connections_reserved_min",
            ));
        }
        self.open += 1;
        if !reserved {
            self.open_unreserved += 1;
        }
        *self.by_principal.entry(principal.clone()).or_insert(0) += 1;
        *self.by_address.entry(addr).or_insert(0) += 1;
        Ok(Holder {
            principal: principal.clone(),
            addr,
            reserved,
        })
    }

    /// An established connection's slot goes back.
    pub fn release(&mut self, holder: &Holder) {
        assert!(
            self.open > 0,
            "a connection slot went back that was never taken"
        );
        self.open -= 1;
        if !holder.reserved {
            assert!(
                self.open_unreserved > 0,
                "an unreserved slot went back twice"
            );
            self.open_unreserved -= 1;
        }
        take(&mut self.by_principal, &holder.principal);
        take(&mut self.by_address, &holder.addr);
    }

    /// Counts a refusal by `cap`; says how many to name in a warning now (this one and those not
    /// yet named), or `None` when one was logged less than the interval ago.
    pub fn refused(&mut self, cap: Cap, now: Instant) -> Option<u64> {
        let interval = Duration::from_millis(self.limits.refusal_log_interval_ms);
        let quiet = &mut self.quiet[cap.index()];
        quiet.unlogged += 1;
        if let Some(last) = quiet.last
            && now.saturating_duration_since(last) < interval
        {
            return None;
        }
        quiet.last = Some(now);
        Some(std::mem::take(&mut quiet.unlogged))
    }
}

/// Takes one from `key`'s count, and the key out when it reaches 0.
fn take<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    let count = map.get_mut(key);
    assert!(count.is_some(), "a count went back that was never taken");
    let Some(count) = count else { return };
    *count -= 1;
    if *count == 0 {
        map.remove(key);
    }
}

/// Counts of the admission decisions, part of [`crate::Counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnCounts {
    /// Handshakes in progress now.
    pub handshakes_in_progress: u64,
    /// Established connections holding a slot now.
    pub connections_open: u64,
    /// Retry packets sent to unvalidated addresses under load.
    pub retries_sent: u64,
    /// Handshakes refused because too many were in progress, in all or from one IP.
    pub refused_handshakes: u64,
    /// Connections refused by a principal's cap.
    pub refused_per_principal: u64,
    /// Connections refused by the cap per source address.
    pub refused_per_address: u64,
    /// Connections of hosts and non-admin operators refused because only the reserve was left.
    pub refused_reserve: u64,
    /// Connections refused because every slot was in use.
    pub refused_full: u64,
}

#[derive(Debug, Default)]
pub(crate) struct ConnCounters {
    handshakes_in_progress: AtomicU64,
    connections_open: AtomicU64,
    retries_sent: AtomicU64,
    refused: [AtomicU64; 6],
}

impl ConnCounters {
    pub(crate) fn snapshot(&self) -> ConnCounts {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let refused = |cap: Cap| load(&self.refused[cap.index()]);
        ConnCounts {
            handshakes_in_progress: load(&self.handshakes_in_progress),
            connections_open: load(&self.connections_open),
            retries_sent: load(&self.retries_sent),
            refused_handshakes: refused(Cap::Handshakes) + refused(Cap::HandshakesPerIp),
            refused_per_principal: refused(Cap::PerPrincipal),
            refused_per_address: refused(Cap::PerAddress),
            refused_reserve: refused(Cap::Reserve),
            refused_full: refused(Cap::Total),
        }
    }
}

/// The [`Table`] of one serving endpoint behind its lock, with its counters. Locked only to
/// count, never across an await.
pub(crate) struct Admission {
    limits: CheckedLimits,
    table: Mutex<Table>,
    counters: Arc<Counters>,
}

/// What the accept loop does with a new `Incoming`.
pub(crate) enum Start {
    /// Start the handshake; the slot goes back when it is dropped.
    Handshake(HandshakeSlot),
    Retry,
    Refuse,
}

/// A handshake in progress; its slot goes back when this is dropped.
pub(crate) struct HandshakeSlot {
    admission: Arc<Admission>,
    addr: SocketAddr,
    validated: bool,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut table = self.admission.lock();
        table.handshake_done(self.addr, self.validated);
        self.admission.publish(&table);
    }
}

/// An established connection's slot; it goes back when this is dropped.
pub(crate) struct ConnSlot {
    admission: Arc<Admission>,
    holder: Holder,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut table = self.admission.lock();
        table.release(&self.holder);
        self.admission.publish(&table);
    }
}

impl Admission {
    pub(crate) fn new(limits: CheckedLimits, counters: Arc<Counters>) -> Admission {
        Admission {
            table: Mutex::new(Table::new(&limits)),
            limits,
            counters,
        }
    }

    pub(crate) fn handshake_deadline(&self) -> Duration {
        self.limits.handshake_deadline()
    }

    /// Decides on a new `Incoming` from `addr`; a refusal is counted and warned of.
    pub(crate) fn incoming(self: &Arc<Self>, addr: SocketAddr, validated: bool) -> Start {
        let mut table = self.lock();
        let verdict = table.incoming(addr, validated);
        self.publish(&table);
        match verdict {
            Incoming::Accept => Start::Handshake(HandshakeSlot {
                admission: self.clone(),
                addr,
                validated,
            }),
            Incoming::Retry => {
                let retries = &self.counters.conns.retries_sent;
                retries.fetch_add(1, Ordering::Relaxed);
                Start::Retry
            }
            Incoming::Refuse(over) => {
                self.refused(&mut table, &over);
                Start::Refuse
            }
        }
    }

    /// Decides on a verified connection: its slot, or the refusal (counted and warned of) to
    /// close it with.
    pub(crate) fn establish(
        self: &Arc<Self>,
        principal: &Principal,
        role: Option<Role>,
        addr: SocketAddr,
    ) -> Result<ConnSlot, OverCap> {
        let mut table = self.lock();
        let decided = table.establish(principal, role, addr);
        self.publish(&table);
        match decided {
            Ok(holder) => Ok(ConnSlot {
                admission: self.clone(),
                holder,
            }),
            Err(over) => {
                self.refused(&mut table, &over);
                Err(over)
            }
        }
    }

    fn refused(&self, table: &mut Table, over: &OverCap) {
        self.counters.conns.refused[over.cap.index()].fetch_add(1, Ordering::Relaxed);
        if let Some(count) = table.refused(over.cap, Instant::now()) {
            let interval_ms = self.limits.limits.refusal_log_interval_ms;
            tracing::warn!(cap = ?over.cap, refused = count, interval_ms, reason = %over, "connections refused by a cap (at most one warning per cap per interval; `refused` counts those since the last)");
        }
    }

    /// Copies the table's gauges to the counters, under the table's lock so they never go back.
    fn publish(&self, table: &Table) {
        let conns = &self.counters.conns;
        conns
            .handshakes_in_progress
            .store(table.handshakes() as u64, Ordering::Relaxed);
        conns
            .connections_open
            .store(table.open() as u64, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Closes an established connection a cap refused, naming the cap in the close reason.
pub(crate) fn close_refused(conn: &Connection, over: &OverCap) {
    conn.close(
        VarInt::from_u32(close_over_cap),
        over.to_string().as_bytes(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> CheckedLimits {
        ConnLimits {
            connections_max: 6,
            connections_reserved_min: 2,
            connections_per_replica_max: 2,
            connections_per_host_max: 2,
            connections_per_operator_max: 3,
            connections_per_address_max: 2,
            handshakes_max: 4,
            handshakes_per_ip_max: 2,
            handshakes_without_retry_max: 2,
            handshake_ms_max: 1000,
            refusal_log_interval_ms: 1000,
        }
        .check()
        .expect("valid limits")
    }

    fn at(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    fn host(name: &str) -> Principal {
        Principal::Host(name.into())
    }

    fn operator(name: &str) -> Principal {
        Principal::Operator(name.into())
    }

    #[test]
    fn defaults_pass_their_own_check_and_bad_limits_are_refused_by_name() {
        // Decision 0300: the constants are a valid set; a reserve as large as the whole, or a
        // cap of 0, is refused naming the field.
        assert_eq!(ConnLimits::default().check(), Ok(CheckedLimits::default()));
        let whole = ConnLimits {
            connections_reserved_min: connections_max,
            ..ConnLimits::default()
        };
        assert!(matches!(
            whole.check(),
            Err(LimitsError::ReserveNotBelowMax { .. })
        ));
        let zero = ConnLimits {
            connections_per_host_max: 0,
            ..ConnLimits::default()
        };
        let text = zero
            .check()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(text.contains("connections_per_host_max"), "{text}");
    }

    #[test]
    fn replicas_and_admin_or_unstated_operators_are_the_reserved_class() {
        // Decision 0300 with 0295: no role stated is admin.
        assert!(is_reserved(&Principal::Replica(1), None));
        assert!(is_reserved(&operator("root"), None));
        assert!(is_reserved(&operator("root"), Some(Role::Admin)));
        assert!(!is_reserved(&operator("ops"), Some(Role::Operator)));
        assert!(!is_reserved(&operator("eyes"), Some(Role::Viewer)));
        assert!(!is_reserved(&host("ace"), None));
    }

    #[test]
    fn a_principal_past_its_cap_is_refused_and_its_slot_comes_back_when_one_closes() {
        // Decision 0300: one host certificate holds at most its cap, whatever it does.
        let mut t = Table::new(&small());
        let first = t.establish(&host("ace"), None, at(1)).expect("first");
        t.establish(&host("ace"), None, at(2)).expect("second");
        let over = t.establish(&host("ace"), None, at(3)).expect_err("third");
        assert_eq!(over.cap, Cap::PerPrincipal);
        assert!(
            over.to_string().contains("host:ace already holds 2"),
            "{over}"
        );
        assert!(
            t.establish(&host("bee"), None, at(4)).is_ok(),
            "another host"
        );
        t.release(&first);
        assert!(
            t.establish(&host("ace"), None, at(3)).is_ok(),
            "after a close"
        );
    }

    #[test]
    fn a_source_address_past_its_cap_is_refused_whoever_it_names() {
        // Decision 0300: one socket holds at most connections_per_address_max.
        let mut t = Table::new(&small());
        t.establish(&host("ace"), None, at(1)).expect("ace");
        t.establish(&host("bee"), None, at(1)).expect("bee");
        let over = t.establish(&host("cat"), None, at(1)).expect_err("third");
        assert_eq!(over.cap, Cap::PerAddress);
        assert!(t.establish(&host("cat"), None, at(2)).is_ok(), "other port");
    }

    #[test]
    fn the_reserve_holds_for_replicas_and_admins_when_the_other_slots_are_full() {
        // Decision 0300: hosts and non-admin operators fill at most max - reserve.
        let mut t = Table::new(&small());
        for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
            t.establish(&host(name), None, at(i as u16))
                .expect("unreserved");
        }
        let over = t.establish(&host("e"), None, at(10)).expect_err("reserve");
        assert_eq!(over.cap, Cap::Reserve);
        let viewer = t.establish(&operator("eyes"), Some(Role::Viewer), at(11));
        assert_eq!(viewer.map_err(|o| o.cap), Err(Cap::Reserve));
        t.establish(&Principal::Replica(2), None, at(12))
            .expect("replica");
        t.establish(&operator("root"), Some(Role::Admin), at(13))
            .expect("admin");
        let full = t
            .establish(&operator("old"), None, at(14))
            .expect_err("full");
        assert_eq!(full.cap, Cap::Total);
    }

    #[test]
    fn past_the_threshold_unvalidated_handshakes_get_a_retry_and_take_no_slot() {
        // Decision 0300: a spoofed flood holds no handshake slot; a validated peer still starts.
        let mut t = Table::new(&small());
        assert_eq!(t.incoming(at(1), false), Incoming::Accept);
        assert_eq!(t.incoming(at(2), false), Incoming::Accept);
        assert_eq!(t.incoming(at(3), false), Incoming::Retry);
        assert_eq!(t.handshakes(), 2);
        assert_eq!(t.incoming(at(3), true), Incoming::Accept);
        assert_eq!(t.incoming(at(4), true), Incoming::Accept);
        let full = t.incoming(SocketAddr::from(([10, 0, 0, 2], 1)), true);
        assert!(matches!(
            full,
            Incoming::Refuse(OverCap {
                cap: Cap::Handshakes,
                ..
            })
        ));
        t.handshake_done(at(1), false);
        // Two validated from 10.0.0.1 already: its share is used up, another IP is not.
        let same_ip = t.incoming(at(5), true);
        assert!(matches!(
            same_ip,
            Incoming::Refuse(OverCap {
                cap: Cap::HandshakesPerIp,
                ..
            })
        ));
        let other = SocketAddr::from(([10, 0, 0, 2], 1));
        assert_eq!(t.incoming(other, true), Incoming::Accept);
        assert_eq!(t.open(), 0, "handshakes take no established slot");
    }

    #[test]
    fn refusals_are_warned_of_once_per_interval_with_how_many() {
        // Decision 0300: a flood of refusals logs one line per cap per interval, with a count.
        let mut t = Table::new(&small());
        let now = Instant::now();
        assert_eq!(t.refused(Cap::PerPrincipal, now), Some(1));
        assert_eq!(t.refused(Cap::PerPrincipal, now), None);
        assert_eq!(t.refused(Cap::PerAddress, now), Some(1), "each cap apart");
        assert_eq!(t.refused(Cap::PerPrincipal, now), None);
        let later = now + Duration::from_millis(1000);
        assert_eq!(t.refused(Cap::PerPrincipal, later), Some(3));
    }
}
