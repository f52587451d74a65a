//! The `build_info` series both `/metrics` carry (meshd's `mesh_build_info`, mesh-host's
//! `mesh_host_build_info`): a gauge at 1 labelled with the release, as Prometheus exporters do, so
//! a dashboard can tell which release every process runs and alert on a mixed fleet.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The release this build is, as `--version` prints it.
pub const version: &str = env!("CARGO_PKG_VERSION");

/// Registers `<prefix>_build_info{version="…"} 1` in `registry`.
pub fn register(registry: &mut Registry, prefix: &str) {
    let family = Family::<Vec<(String, String)>, Gauge>::default();
    family
        .get_or_create(&vec![("version".to_string(), version.to_string())])
        .set(1);
    registry.register(
        format!("{prefix}_build_info"),
        "Always 1, labelled with the release this process runs",
        family,
    );
}
