//! The transport's admission counts (decision 0300) as Prometheus metrics, for the replica's and
//! the host's `/metrics`: registered once under a prefix, set from the endpoint's `Counts` at
//! each scrape.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use mesh_transport::ConnCounts;

/// One label, fixed at compile time.
type Label = [(&'static str, &'static str); 1];

/// The caps a refusal is counted under, as the `cap` label says them.
pub const refusal_caps: [&str; 5] = [
    "handshakes",
    "per_principal",
    "per_address",
    "reserve",
    "full",
];

/// The metrics of one endpoint's admission.
pub struct ConnMetrics {
    handshakes: Gauge,
    open: Gauge,
    retries: Counter,
    refused: Family<Label, Counter>,
}

impl ConnMetrics {
    /// Registers the metrics in `registry`, named `<prefix>_connections_open` and so on.
    pub fn register(registry: &mut Registry, prefix: &str) -> ConnMetrics {
        let m = ConnMetrics {
            handshakes: Gauge::default(),
            open: Gauge::default(),
            retries: Counter::default(),
            refused: Family::default(),
        };
        // Every cap's series exists from the start at 0, so a rate over the first refusal is right.
        for cap in refusal_caps {
            let _ = m.refused.get_or_create(&[("cap", cap)]);
        }
        registry.register(
            format!("{prefix}_handshakes_in_progress"),
            "QUIC handshakes this endpoint is serving now (counted apart from connections, at most handshakes_max)",
            m.handshakes.clone(),
        );
        registry.register(
            format!("{prefix}_connections_open"),
            "Connections this endpoint serves now, past their handshake (at most connections_max)",
            m.open.clone(),
        );
        registry.register(
            format!("{prefix}_handshake_retries"),
            "QUIC Retry packets sent to addresses not yet validated while many handshakes were in progress",
            m.retries.clone(),
        );
        registry.register(
            format!("{prefix}_connections_refused"),
            "Connections refused by a cap, by cap: handshakes (too many in progress, in all or from one IP), per_principal, per_address (one socket), reserve (only the slots kept for replicas and admins were left), full",
            m.refused.clone(),
        );
        m
    }

    /// Sets every metric from `counts`, a snapshot of the endpoint's.
    pub fn set(&self, counts: &ConnCounts) {
        self.handshakes
            .set(gauge_value(counts.handshakes_in_progress));
        self.open.set(gauge_value(counts.connections_open));
        catch_up(&self.retries, counts.retries_sent);
        let by_cap = [
            counts.refused_handshakes,
            counts.refused_per_principal,
            counts.refused_per_address,
            counts.refused_reserve,
            counts.refused_full,
        ];
        for (cap, count) in refusal_caps.into_iter().zip(by_cap) {
            catch_up(&self.refused.get_or_create(&[("cap", cap)]), count);
        }
    }
}

/// Raises `counter` to `total`, the endpoint's own count (it only grows).
fn catch_up(counter: &Counter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
