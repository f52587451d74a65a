//! A network of Linux network namespaces for beds that must not share `127.0.0.1`: one namespace
//! per process with its own address on a bridge, the bridge in a namespace of its own (so nothing
//! touches the machine's own network), all made with iproute2 and removed when the [`Fabric`] drops,
//! even after a panic. A partition is a link taken down on the bridge; a cut between two nodes
//! ([`Fabric::cut_between`]) is a blackhole route to each other's addresses in both namespaces,
//! so each still reaches every other node.
//!
//! Names are `meshbed-<pid>-<n>-<node>`: unique per test process and per fabric, so parallel tests
//! and test binaries never collide; namespaces left by a process that was SIGKILLed (no drop ran)
//! are swept by the next fabric, whose process sees the old pid gone.

use anyhow::{Context as _, anyhow, bail};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Prefix of every namespace a fabric makes.
pub const name_prefix: &str = "meshbed-";
/// Most nodes on one fabric (a /24 and the interface names leave room for more; a bed needs ~8).
pub const nodes_max: usize = 64;
/// The environment variable that turns "namespaces unavailable" from a skip into a failure
/// (`.ci/run` sets it to `1`: there the bed must really run).
pub const require_env: &str = "MESH_BED_NETNS_REQUIRED";

static fabrics_made: AtomicU64 = AtomicU64::new(0);

/// One process's place: its namespace and addresses on the bridge.
#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub netns: String,
    /// The bridge-side end of its link (in the bridge's namespace).
    link: String,
    pub addresses: Vec<IpAddr>,
}

/// Namespaces on one bridge, removed on drop.
#[derive(Debug)]
pub struct Fabric {
    bridge_ns: String,
    nodes: Vec<Node>,
    made: Vec<String>,
    /// The node pairs cut by [`Fabric::cut_between`] and not healed yet, each as `(a, b)` with
    /// `a < b`: their routes are removed on heal and on drop.
    cuts: Mutex<BTreeSet<(String, String)>>,
}

/// Why a fabric cannot be made on this machine at all (not root, no iproute2): the bed skips with
/// this reason unless [`require_env`] is set.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl Fabric {
    /// Whether the namespace bed `what` runs here: `Ok(true)` when namespaces can be made;
    /// `Ok(false)` after saying on stderr why `what` is skipped; an error when they cannot be made
    /// and [`require_env`] is `1` (CI), so a skip never passes there.
    pub fn runs_here(what: &str) -> anyhow::Result<bool> {
        let Err(why) = Fabric::available() else {
            return Ok(true);
        };
        if std::env::var(require_env).as_deref() == Ok("1") {
            anyhow::bail!(
                "{require_env}=1 but network namespaces cannot be made: {}",
                why.0
            );
        }
        eprintln!(
            "SKIPPED {what}: network namespaces cannot be made here: {}; run as root with iproute2 (set {require_env}=1 to make this a failure)",
            why.0
        );
        Ok(false)
    }

    /// Whether namespaces can be made here: `Err` says why not.
    pub fn available() -> Result<(), Unavailable> {
        use std::os::unix::fs::MetadataExt;
        // /proc/self belongs to this process's effective user.
        let uid = std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .unwrap_or(u32::MAX);
        if uid != 0 {
            return Err(Unavailable(
                "not running as root (network namespaces and veth links need CAP_NET_ADMIN)".into(),
            ));
        }
        match Command::new("ip").arg("-V").output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(Unavailable(format!(
                "`ip -V` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
            Err(e) => Err(Unavailable(format!(
                "cannot run `ip` ({e}); install iproute2 (`apt-get install iproute2`)"
            ))),
        }
    }

    /// Makes a bridge namespace and one namespace per `(name, addresses)`, each linked to the
    /// bridge with a veth pair, `eth0` inside carrying its addresses (`/24` for IPv4, `/64` for
    /// IPv6, no duplicate-address wait), loopback up.
    pub fn create(nodes: &[(&str, Vec<IpAddr>)]) -> anyhow::Result<Fabric> {
        if nodes.len() > nodes_max {
            bail!("{} nodes, at most {nodes_max}", nodes.len());
        }
        sweep_stale();
        let n = fabrics_made.fetch_add(1, Ordering::Relaxed);
        let base = format!("{name_prefix}{}-{n}", std::process::id());
        let mut fabric = Fabric {
            bridge_ns: format!("{base}-br"),
            nodes: Vec::new(),
            made: Vec::new(),
            cuts: Mutex::new(BTreeSet::new()),
        };
        let br = fabric.bridge_ns.clone();
        fabric.add_netns(&br)?;
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        for (i, (name, addresses)) in nodes.iter().enumerate() {
            let netns = format!("{base}-{i}");
            fabric.add_netns(&netns)?;
            let link = format!("v{i}");
            ip(&[
                "-n", &br, "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns",
                &netns,
            ])?;
            ip(&["-n", &br, "link", "set", &link, "master", "br0", "up"])?;
            for address in addresses {
                let cidr = match address {
                    IpAddr::V4(_) => format!("{address}/24"),
                    IpAddr::V6(_) => format!("{address}/64"),
                };
                let mut args = vec!["-n", &netns, "addr", "add", &cidr, "dev", "eth0"];
                if address.is_ipv6() {
                    args.push("nodad");
                }
                ip(&args)?;
            }
            ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &netns, "link", "set", "lo", "up"])?;
            fabric.nodes.push(Node {
                name: name.to_string(),
                netns,
                link,
                addresses: addresses.clone(),
            });
        }
        Ok(fabric)
    }

    fn add_netns(&mut self, name: &str) -> anyhow::Result<()> {
        ip(&["netns", "add", name])?;
        self.made.push(name.to_string());
        Ok(())
    }

    pub fn node(&self, name: &str) -> anyhow::Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| anyhow!("no node {name} on this fabric"))
    }

    /// The command prefix that runs a program inside `name`'s namespace.
    pub fn exec_prefix(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let node = self.node(name)?;
        Ok(vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            node.netns.clone(),
        ])
    }

    /// Takes `name`'s link to the bridge down: it hears nothing and nobody hears it.
    pub fn cut(&self, name: &str) -> anyhow::Result<()> {
        let node = self.node(name)?;
        ip(&["-n", &self.bridge_ns, "link", "set", &node.link, "down"])
    }

    /// Brings `name`'s link back up.
    pub fn heal(&self, name: &str) -> anyhow::Result<()> {
        let node = self.node(name)?;
        ip(&["-n", &self.bridge_ns, "link", "set", &node.link, "up"])
    }

    /// Cuts the path between nodes `a` and `b` only, both ways: in each one's namespace a
    /// blackhole route to every address of the other (`/32`, `/128`), so what either sends the
    /// other is dropped at its own sender while both reach every other node. Cutting a pair
    /// already cut changes nothing.
    pub fn cut_between(&self, a: &str, b: &str) -> anyhow::Result<()> {
        let pair = self.pair(a, b)?;
        let mut cuts = self.lock_cuts();
        if cuts.contains(&pair) {
            return Ok(());
        }
        // Recorded before the routes, so a half-made cut is still removed on heal or drop.
        cuts.insert(pair.clone());
        self.routes("add", &pair.0, &pair.1)?;
        self.routes("add", &pair.1, &pair.0)
    }

    /// Removes the cut between `a` and `b` (both directions); a pair not cut changes nothing.
    pub fn heal_between(&self, a: &str, b: &str) -> anyhow::Result<()> {
        let pair = self.pair(a, b)?;
        let mut cuts = self.lock_cuts();
        if !cuts.remove(&pair) {
            return Ok(());
        }
        self.routes_del(&pair.0, &pair.1)
    }

    /// The pairs cut now, each `(a, b)` with `a < b`.
    pub fn cut_pairs(&self) -> Vec<(String, String)> {
        self.lock_cuts().iter().cloned().collect()
    }

    fn lock_cuts(&self) -> std::sync::MutexGuard<'_, BTreeSet<(String, String)>> {
        // A panic while holding the set leaves it as it was: still the truth about the routes.
        self.cuts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn pair(&self, a: &str, b: &str) -> anyhow::Result<(String, String)> {
        self.node(a)?;
        self.node(b)?;
        if a == b {
            bail!("cannot cut node {a} from itself: name two different nodes");
        }
        Ok(if a < b {
            (a.to_string(), b.to_string())
        } else {
            (b.to_string(), a.to_string())
        })
    }

    /// `ip route add blackhole <addr>` in `from`'s namespace for every address of `to`.
    fn routes(&self, verb: &str, from: &str, to: &str) -> anyhow::Result<()> {
        let mut first_error = None;
        for args in self.route_args(verb, from, to)? {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            if let Err(e) = ip(&args) {
                // Adding stops at the first failure; deleting tries every route.
                if verb == "add" {
                    return Err(e);
                }
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn route_args(&self, verb: &str, from: &str, to: &str) -> anyhow::Result<Vec<Vec<String>>> {
        let from = self.node(from)?;
        let to = self.node(to)?;
        Ok(to
            .addresses
            .iter()
            .map(|address| {
                let (family, prefix) = match address {
                    IpAddr::V4(_) => ("-4", format!("{address}/32")),
                    IpAddr::V6(_) => ("-6", format!("{address}/128")),
                };
                [
                    family,
                    "-n",
                    &from.netns,
                    "route",
                    verb,
                    "blackhole",
                    &prefix,
                ]
                .map(str::to_string)
                .to_vec()
            })
            .collect())
    }

    /// Deletes both directions' routes of a cut, trying every one even when one fails.
    fn routes_del(&self, a: &str, b: &str) -> anyhow::Result<()> {
        let first = self.routes("del", a, b);
        let second = self.routes("del", b, a);
        first.and(second)
    }

    /// The namespaces this fabric made (for a test's checks on cleanup).
    pub fn namespaces(&self) -> &[String] {
        &self.made
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // The cuts' routes first (they would go with their namespaces too, but a namespace that
        // cannot be deleted must not keep a cut).
        for (a, b) in self.cut_pairs() {
            if let Err(e) = self.routes_del(&a, &b) {
                eprintln!("bed netns: cannot remove the cut between {a} and {b}: {e:#}");
            }
        }
        self.lock_cuts().clear();
        // Deleting a namespace deletes its end of every veth pair, so the links go too.
        for name in self.made.iter().rev() {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("bed netns: cannot remove namespace {name}: {e:#}");
            }
        }
    }
}

/// Every namespace `ip netns list` shows.
pub fn list() -> anyhow::Result<Vec<String>> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .context("run ip netns list")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Removes `meshbed-<pid>-…` namespaces whose process is gone (it was killed before its drop ran).
fn sweep_stale() {
    let Ok(names) = list() else { return };
    for name in names {
        let Some(rest) = name.strip_prefix(name_prefix) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("run ip {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
