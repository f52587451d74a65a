//! The status page `meshd` serves at `/`, as a pure function of what `status` and `history`
//! answer and of the stored model: replicas (leader, term), machines (behind, held, module health,
//! last report age), the mesh graph drawn as SVG (modules by machine, provider → consumer edges),
//! and recent history. It shows names, states, digests and reasons only: never a setting's value,
//! an env value, a file's contents, a module's command line or a secret.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::api::{HistoryItem, MachineView, StatusView};
use crate::core::model::Mesh;
use crate::core::report::{Health, ModuleState};

/// History rows shown, newest first.
pub const history_rows_max: usize = 20;
/// How often the page refreshes itself, in ms (issue 25 item 5): in place with its script, by a
/// reload without scripts. The server draws it at most once per `page_fresh_ms_max` (1 s) however
/// many browsers ask.
pub const page_refresh_ms: u64 = 2_000;
/// Width of one machine's column in the graph, in SVG units.
const column_w: i64 = 210;
/// Height of one module's row in the graph.
const row_h: i64 = 46;
/// A module box.
const box_w: i64 = 150;
const box_h: i64 = 30;
/// Room above the first module row for the machine names.
const header_h: i64 = 40;

/// What the page is drawn from.
pub struct Page<'a> {
    /// The replica serving the page.
    pub replica: u64,
    /// Its current Raft term (the epoch).
    pub term: u64,
    /// The leader it knows of.
    pub leader: Option<u64>,
    pub status: &'a StatusView,
    pub mesh: &'a Mesh,
    /// Newest last, as `history` answers.
    pub history: &'a [HistoryItem],
    /// When it was drawn: the serving replica's wall clock, ms since the Unix epoch.
    pub made_ms: u64,
}

/// The whole HTML document.
pub fn render(page: &Page) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let leader = page
        .leader
        .map(|l| format!("replica {l}"))
        .unwrap_or_else(|| "none known".into());
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>mesh: replica {id}</title>\
<style>{style}</style>{refresh}</head><body>\n<h1>mesh</h1>\n<p class=\"summary\">served by replica {id} · \
leader: <b id=\"leader\">{leader}</b> · term {term} · model revision {rev} · epoch floor {floor}</p>\n{made}",
        id = page.replica,
        style = style,
        refresh = refresh_head(),
        made = made_line(page.made_ms),
        leader = esc(&leader),
        term = page.term,
        rev = page.status.revision,
        floor = page.status.epoch_floor,
    );
    if let Some(reset) = &page.status.store_reset {
        let _ = writeln!(out, "<p class=\"alarm\">{}</p>", esc(reset));
    }
    for c in &page.status.certs_expiring {
        let _ = writeln!(
            out,
            "<p class=\"alarm\">certificate {} serial {} expires at {}; renew it with <code>meshctl certs renew {}</code> and reload</p>",
            esc(&c.principal),
            esc(&c.serial),
            esc(&crate::timefmt::utc_seconds(c.not_after_ms.max(0) as u64)),
            esc(&c.principal)
        );
    }
    replicas(&mut out, page);
    machines(&mut out, page.status, page.leader == Some(page.replica));
    out.push_str("<h2>Mesh</h2>\n");
    out.push_str(&graph_svg(page.mesh, page.status));
    history(&mut out, page.history);
    out.push_str("</body></html>\n");
    out
}

/// The page's self-refresh (issue 25 item 5): without scripts a reload every
/// [`page_refresh_ms`] (`<noscript>`); with them, the page fetched again and its body swapped in
/// place (no flash, the scroll kept), the drawing's age counted each second from when the browser
/// got it (no clock of the browser compared with the server's), and a failed fetch shown in
/// `#stale` rather than a page silently old.
fn refresh_head() -> String {
    let seconds = page_refresh_ms.div_ceil(1000);
    format!(
        "<noscript><meta http-equiv=\"refresh\" content=\"{seconds}\"></noscript>\
<script>(function(){{var got=Date.now();\
function age(){{var a=document.getElementById('age');if(a)a.textContent=Math.round((Date.now()-got)/1000)+' s ago';}}\
function refresh(){{fetch(location.href,{{cache:'no-store'}}).then(function(r){{if(!r.ok)throw new Error('HTTP '+r.status);return r.text();}})\
.then(function(t){{var d=new DOMParser().parseFromString(t,'text/html');document.body.innerHTML=d.body.innerHTML;got=Date.now();age();}})\
.catch(function(e){{var s=document.getElementById('stale');if(s)s.textContent='not refreshed: '+e.message;}});}}\
setInterval(refresh,{page_refresh_ms});setInterval(age,1000);}})();</script>"
    )
}

/// When the page was drawn (UTC) and how long ago; the age counts on in the browser with scripts.
fn made_line(made_ms: u64) -> String {
    format!(
        "<p class=\"made\">drawn <span id=\"made\" data-ms=\"{made_ms}\">{} UTC</span> (<span id=\"age\">0 s ago</span>) · refreshes every {:.0} s <span id=\"stale\" class=\"bad\"></span></p>\n",
        esc(&utc(made_ms)),
        page_refresh_ms as f64 / 1000.0
    )
}

const style: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}\
th{background:#f2f2f2}.ok{color:#176f2c}.warn{color:#a35b00}.bad{color:#b00020}.alarm{background:#fdd;padding:.5em}\
.summary{font-size:1.1em}svg{border:1px solid #ccc;background:#fcfcfc}";

fn replicas(out: &mut String, page: &Page) {
    out.push_str("<h2>Replicas</h2>\n<table id=\"replicas\"><tr><th>replica</th><th>address</th><th>role</th><th>epoch</th><th>reachable</th></tr>\n");
    for r in &page.status.replicas {
        let role = if r.leader { "leader" } else { "follower" };
        let (reach, class) = if r.reachable {
            ("yes", "ok")
        } else {
            ("no", "bad")
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{role}</td><td>{}</td><td class=\"{class}\">{reach}</td></tr>",
            r.id,
            esc(&r.addr),
            r.epoch
        );
    }
    out.push_str("</table>\n");
}

/// The machines' table; `leading`: the serving replica leads, so it is the one that hears hosts.
fn machines(out: &mut String, status: &StatusView, leading: bool) {
    out.push_str("<h2>Machines</h2>\n<table id=\"machines\"><tr><th>machine</th><th>behind</th><th>held</th><th>health</th><th>modules</th><th>last report</th><th>refused reports</th></tr>\n");
    for m in &status.machines {
        let behind = behind_cell(m, leading);
        let held: Vec<String> = m
            .holds
            .iter()
            .map(|h| esc(&format!("{} mount {}", h.module, h.mount)))
            .collect();
        let (health, class) = health_word(m);
        let mut modules = String::new();
        for module in &m.modules {
            let _ = write!(
                modules,
                "{} <span class=\"{}\">{}</span>",
                esc(&module.name),
                state_class(&module.state),
                module.state.word()
            );
            if module.restarts > 0 {
                let _ = write!(modules, " ({} restarts)", module.restarts);
            }
            if !module.drift.is_empty() {
                // Decision 0305: what differs from its declaration on the host.
                let _ = write!(
                    modules,
                    " <span class=\"bad\">DRIFTED</span>: {}",
                    esc(&module.drift.join(", "))
                );
            }
            modules.push_str("<br>");
        }
        let age = m
            .report_age_ms
            .map(|ms| format!("{:.1} s ago", ms as f64 / 1000.0))
            .unwrap_or_else(|| "never".into());
        // Refused for size or rate (decision 0299) beside those refused as older (G5).
        let refused = match &m.report_refusal {
            Some(why) => format!(
                "{}<br><span class=\"bad\">{}</span>",
                m.refused_reports,
                esc(why)
            ),
            None => m.refused_reports.to_string(),
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{behind}</td><td>{}</td><td class=\"{class}\">{health}</td><td>{modules}</td><td>{age}</td><td>{refused}</td></tr>",
            esc(&m.name),
            if held.is_empty() {
                "-".into()
            } else {
                held.join("<br>")
            },
        );
    }
    out.push_str("</table>\n");
    if !leading {
        out.push_str("<p class=\"note\">This replica does not lead: it hears no host, so it cannot say which are up to date or SILENT (decision 0301); the leader's page does.</p>\n");
    }
}

/// The machine row's "behind" cell: `SILENT` (decision 0301) before anything else, and "up to
/// date" only for a host the leader heard within its threshold. A follower hears no host: it says
/// what the last report says (`applied`), and the table's note sends the reader to the leader.
fn behind_cell(m: &MachineView, leading: bool) -> String {
    let behind = if m.behind { " and behind" } else { "" };
    match (m.silent_for_ms, m.heard_ago_ms) {
        (Some(ms), _) => format!(
            "<span class=\"bad\">SILENT</span> for {:.1} s{behind}",
            ms as f64 / 1000.0
        ),
        _ if !m.drifted.is_empty() => format!(
            "<span class=\"bad\">DRIFTED</span> {}",
            esc(&m.drifted.join(", "))
        ),
        _ if m.behind => "<span class=\"warn\">behind</span>".to_string(),
        (None, None) if leading => "<span class=\"warn\">not heard yet</span>".to_string(),
        (None, None) => "applied".to_string(),
        (None, Some(_)) => "<span class=\"ok\">up to date</span>".to_string(),
    }
}

fn health_word(m: &MachineView) -> (&'static str, &'static str) {
    match &m.health {
        None => ("no report yet", "warn"),
        Some(Health::Ready) => ("ready", "ok"),
        Some(Health::Settling { .. }) => ("settling", "warn"),
        Some(Health::Failing { .. }) => ("failing", "bad"),
    }
}

fn state_class(state: &ModuleState) -> &'static str {
    match state {
        ModuleState::Ready | ModuleState::Running => "ok",
        ModuleState::Starting | ModuleState::Waiting { .. } => "warn",
        ModuleState::Failed { .. } | ModuleState::Stopped => "bad",
    }
}

/// The mesh as SVG: one column per machine, one box per module (coloured by its last reported
/// state), and an arrow from each provider to each module that consumes from it, labelled with
/// the kind.
pub fn graph_svg(mesh: &Mesh, status: &StatusView) -> String {
    let mut states: BTreeMap<(&str, &str), &ModuleState> = BTreeMap::new();
    for m in &status.machines {
        for module in &m.modules {
            states.insert((m.name.as_str(), module.name.as_str()), &module.state);
        }
    }
    let mut at: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    let mut rows_max = 1;
    for (column, machine) in (0_i64..).zip(mesh.machines.keys()) {
        let mut row = 0;
        for module in mesh.modules.values().filter(|m| &m.machine == machine) {
            at.insert(
                module.name.as_str(),
                (20 + column * column_w, header_h + row * row_h),
            );
            row += 1;
        }
        rows_max = rows_max.max(row);
    }
    let width = 40 + column_w * i64::try_from(mesh.machines.len().max(1)).unwrap_or(1);
    let height = header_h + rows_max * row_h + 10;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg id=\"graph\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"13\">\
<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#555\"/></marker></defs>"
    );
    for (column, machine) in (0_i64..).zip(mesh.machines.keys()) {
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"22\" font-weight=\"bold\">{}</text>",
            20 + column * column_w,
            esc(machine)
        );
    }
    for module in mesh.modules.values() {
        let Some(&(x, y)) = at.get(module.name.as_str()) else {
            continue;
        };
        for need in &module.consumes {
            let Some(&(px, py)) = at.get(need.from.as_str()) else {
                continue;
            };
            let Edge {
                x1,
                y1,
                c1x,
                c2x,
                x2,
                y2,
            } = edge((px, py), (x, y));
            let _ = writeln!(
                out,
                "<path class=\"edge\" data-from=\"{}\" data-to=\"{}\" d=\"M{x1},{y1} C{c1x},{y1} {c2x},{y2} {x2},{y2}\" fill=\"none\" stroke=\"#555\" marker-end=\"url(#arrow)\"/>\
<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#555\">{}</text>",
                esc(&need.from),
                esc(&module.name),
                (x1 + x2) / 2,
                (y1 + y2) / 2 - 4,
                esc(&need.kind)
            );
        }
    }
    for module in mesh.modules.values() {
        let Some(&(x, y)) = at.get(module.name.as_str()) else {
            continue;
        };
        let state = states.get(&(module.machine.as_str(), module.name.as_str()));
        let (fill, word) = match state {
            Some(s) => (
                match state_class(s) {
                    "ok" => "#d7f0dc",
                    "warn" => "#fbeccc",
                    _ => "#f8d0d6",
                },
                s.word(),
            ),
            None => ("#eeeeee", "not reported"),
        };
        let _ = writeln!(
            out,
            "<g class=\"module\" data-module=\"{name}\"><rect x=\"{x}\" y=\"{y}\" width=\"{box_w}\" height=\"{box_h}\" rx=\"5\" fill=\"{fill}\" stroke=\"#777\"/>\
<text x=\"{}\" y=\"{}\">{name}</text><text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"#555\">{word}</text></g>",
            x + 8,
            y + 19,
            x + box_w - 8 - 7 * i64::try_from(word.len()).unwrap_or(0),
            y + 19,
            name = esc(&module.name),
        );
    }
    out.push_str("</svg>\n");
    out
}

/// One provider → consumer edge of the graph: a cubic curve from `(x1, y1)` to `(x2, y2)` whose
/// control points share those rows (`c1x` beside the start, `c2x` beside the end), so it leaves
/// the provider's box and enters the consumer's box horizontally, and its arrow (`orient="auto"`,
/// along the curve's last tangent, from `c2x` to `x2`) points into the consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    pub x1: i64,
    pub y1: i64,
    pub c1x: i64,
    pub c2x: i64,
    pub x2: i64,
    pub y2: i64,
}

/// Least horizontal reach of an edge's control points, so a short edge still curves.
const bend_min: i64 = 40;

/// The edge from the provider's box at `p` to the consumer's box at `c` (top-left corners). It
/// never crosses either box the wrong way (issue 25 item 5): a consumer to the right is entered
/// on its left side from the provider's right side; a consumer to the left on its right side from
/// the provider's left side (drawn from the right side, the edge ran back through both boxes and
/// its arrow read consumer → provider); a consumer in the same column on its right side, the curve
/// bulging right of the column.
pub fn edge(p: (i64, i64), c: (i64, i64)) -> Edge {
    let (y1, y2) = (p.1 + box_h / 2, c.1 + box_h / 2);
    if c.0 >= p.0 + box_w {
        let (x1, x2) = (p.0 + box_w, c.0);
        let bend = ((x2 - x1) / 2).max(bend_min);
        Edge {
            x1,
            y1,
            c1x: x1 + bend,
            c2x: x2 - bend,
            x2,
            y2,
        }
    } else if c.0 + box_w <= p.0 {
        let (x1, x2) = (p.0, c.0 + box_w);
        let bend = ((x1 - x2) / 2).max(bend_min);
        Edge {
            x1,
            y1,
            c1x: x1 - bend,
            c2x: x2 + bend,
            x2,
            y2,
        }
    } else {
        let (x1, x2) = (p.0 + box_w, c.0 + box_w);
        Edge {
            x1,
            y1,
            c1x: x1 + bend_min,
            c2x: x2 + bend_min,
            x2,
            y2,
        }
    }
}

fn history(out: &mut String, items: &[HistoryItem]) {
    out.push_str("<h2>Recent history</h2>\n<table id=\"history\"><tr><th>time (UTC)</th><th>epoch</th><th>what</th><th>by</th><th>why</th></tr>\n");
    for item in items.iter().rev().take(history_rows_max) {
        let (time_ms, epoch, what, actor, why) = match item {
            HistoryItem::Send(s) => (
                s.time_ms,
                s.epoch,
                format!("send {} #{} {}", s.machine, s.sequence, s.digest.short()),
                &s.actor,
                &s.why,
            ),
            HistoryItem::Settings(c) => {
                let change = match (&c.before, &c.after) {
                    (None, _) => "created",
                    (Some(_), None) => "cleared",
                    (Some(_), Some(_)) => "changed",
                };
                // Key names only: a value may be a secret.
                let keys: Vec<&str> = c
                    .after
                    .iter()
                    .chain(c.before.iter())
                    .flat_map(|l| l.keys().map(String::as_str))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                (
                    c.time_ms,
                    c.epoch,
                    format!("settings {} {change} (keys: {})", c.scope, keys.join(", ")),
                    &c.actor,
                    &c.why,
                )
            }
            HistoryItem::Model(m) => (
                m.time_ms,
                m.epoch,
                format!(
                    "model revision {} (machines changed: {})",
                    m.revision,
                    if m.changes.is_empty() {
                        "none".to_string()
                    } else {
                        m.changes.join(", ")
                    }
                ),
                &m.actor,
                &m.why,
            ),
            HistoryItem::Revocation(r) => (
                r.time_ms,
                r.epoch,
                match crate::store::revoked::retired_replica(&r.target) {
                    Some(id) => format!("replica {id} retired"),
                    None => format!("{} revoked", r.target),
                },
                &r.actor,
                &r.why,
            ),
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{epoch}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            utc(time_ms),
            esc(&what),
            esc(actor),
            esc(why)
        );
    }
    out.push_str("</table>\n");
}

/// `2026-11-30 10:05:22` from ms since the Unix epoch.
fn utc(ms: u64) -> String {
    crate::timefmt::utc_seconds(ms)
}

/// Text made safe for HTML and SVG (element content and quoted attributes).
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(heard_ago_ms: Option<u64>, silent_for_ms: Option<u64>) -> MachineView {
        MachineView {
            name: "g14".into(),
            health: Some(Health::Ready),
            report_filed_ms: Some(1),
            report_age_ms: Some(50_000),
            heard_ago_ms,
            silent_for_ms,
            ..MachineView::default()
        }
    }

    /// The example mesh with `worker` moved from shanks to g14: web (novox) → worker is then an
    /// edge from right to left (issue 25 item 5).
    fn worker_on_g14() -> Mesh {
        let text = crate::cli::dev::example_mesh.replace(
            "[modules.worker]\nmachine = \"shanks\"",
            "[modules.worker]\nmachine = \"g14\"",
        );
        assert_ne!(
            text,
            crate::cli::dev::example_mesh,
            "the example moved worker"
        );
        crate::core::meshfile::parse_mesh("mesh.toml", &text).expect("the example parses")
    }

    /// The numbers of the `d` of the edge `from` → `to` in `svg`: `M x1,y1 C c1x,y1 c2x,y2 x2,y2`.
    fn edge_in(svg: &str, from: &str, to: &str) -> Edge {
        let tag = format!("data-from=\"{from}\" data-to=\"{to}\" d=\"");
        let at = svg
            .find(&tag)
            .unwrap_or_else(|| panic!("no edge {from} -> {to}:\n{svg}"));
        let d = &svg[at + tag.len()..];
        let d = &d[..d.find('"').expect("end of d")];
        let n: Vec<i64> = d
            .split(|c: char| !(c.is_ascii_digit() || c == '-'))
            .filter(|t| !t.is_empty())
            .map(|t| t.parse().expect("a number"))
            .collect();
        assert_eq!(n.len(), 8, "{d}");
        Edge {
            x1: n[0],
            y1: n[1],
            c1x: n[2],
            c2x: n[4],
            x2: n[6],
            y2: n[7],
        }
    }

    /// The top-left corner of module `name`'s box in `svg`.
    fn box_at(svg: &str, name: &str) -> (i64, i64) {
        let tag = format!("data-module=\"{name}\"><rect x=\"");
        let at = svg.find(&tag).expect("the module's box");
        let rest = &svg[at + tag.len()..];
        let x: i64 = rest[..rest.find('"').expect("x")].parse().expect("x");
        let rest = &rest[rest.find("y=\"").expect("y") + 3..];
        let y: i64 = rest[..rest.find('"').expect("y")].parse().expect("y");
        (x, y)
    }

    #[test]
    fn an_edge_leaves_its_provider_and_enters_its_consumer_on_the_facing_sides_in_both_directions()
    {
        // Issue 25 item 5: graph edges never cross boxes the wrong way. With worker moved to g14,
        // web (novox, right) → worker (g14, left) was drawn from web's right side to worker's left
        // side, through both boxes, its arrow reading worker → web.
        let mesh = worker_on_g14();
        let svg = graph_svg(
            &mesh,
            &StatusView {
                replicas: vec![],
                machines: vec![],
                revision: 1,
                epoch_floor: 1,
                store_reset: None,
                certs_expiring: vec![],
            },
        );
        let (web, worker) = (box_at(&svg, "web"), box_at(&svg, "worker"));
        assert!(
            worker.0 + box_w <= web.0,
            "worker left of web: {worker:?} {web:?}"
        );
        let e = edge_in(&svg, "web", "worker");
        // Out of web's left side, into worker's right side, the arrow's last tangent pointing left.
        assert_eq!((e.x1, e.x2), (web.0, worker.0 + box_w), "{e:?}");
        assert!(e.c1x < e.x1 && e.c2x > e.x2, "{e:?}");
        // Left to right as before: broker (g14) → web (novox).
        let (broker, web) = (box_at(&svg, "broker"), box_at(&svg, "web"));
        let e = edge_in(&svg, "broker", "web");
        assert_eq!((e.x1, e.x2), (broker.0 + box_w, web.0), "{e:?}");
        assert!(e.c1x > e.x1 && e.c2x < e.x2, "{e:?}");
        // Same column: broker → worker, both on g14: right side to right side, bulging right.
        let e = edge_in(&svg, "broker", "worker");
        assert_eq!((e.x1, e.x2), (broker.0 + box_w, worker.0 + box_w), "{e:?}");
        assert!(e.c1x > e.x1 && e.c2x > e.x2, "{e:?}");
    }

    #[test]
    fn the_page_refreshes_itself_and_says_when_it_was_drawn() {
        // Issue 25 item 5: the page refreshes itself (in place with a script, by a reload without)
        // and shows when it was drawn (UTC) and its age.
        let mesh = worker_on_g14();
        let status = StatusView {
            replicas: vec![],
            machines: vec![],
            revision: 1,
            epoch_floor: 1,
            store_reset: None,
            certs_expiring: vec![],
        };
        let html = render(&Page {
            replica: 2,
            term: 3,
            leader: Some(1),
            status: &status,
            mesh: &mesh,
            history: &[],
            made_ms: 1_764_770_000_000,
        });
        let seconds = page_refresh_ms / 1000;
        assert!(
            html.contains(&format!(
                "<noscript><meta http-equiv=\"refresh\" content=\"{seconds}\"></noscript>"
            )),
            "{html}"
        );
        assert!(
            html.contains(&format!("setInterval(refresh,{page_refresh_ms})")),
            "{html}"
        );
        assert!(
            html.contains(
                "drawn <span id=\"made\" data-ms=\"1764770000000\">2025-12-03 13:53:20 UTC</span>"
            ),
            "{html}"
        );
        assert!(html.contains("<span id=\"age\">"), "{html}");
    }

    #[test]
    fn a_silent_host_reads_silent_in_its_machine_row_and_never_up_to_date() {
        // Decision 0301: the page says SILENT where it said "up to date" in green.
        let cell = behind_cell(&view(Some(50_000), Some(50_000)), true);
        assert!(
            cell.contains("SILENT") && !cell.contains("up to date"),
            "{cell}"
        );
        let heard = behind_cell(&view(Some(800), None), true);
        assert!(heard.contains("up to date"), "{heard}");
        let new_leader = behind_cell(&view(None, None), true);
        assert!(!new_leader.contains("up to date"), "{new_leader}");
        let follower = behind_cell(&view(None, None), false);
        assert!(!follower.contains("up to date"), "{follower}");
    }

    #[test]
    fn a_drifted_host_reads_drifted_with_what_differs_and_never_up_to_date() {
        // Decision 0305: the page names the drift where it would say "up to date".
        let mut m = view(Some(800), None);
        m.behind = true;
        m.drifted = vec!["broker: conf/broker.conf changed".into()];
        let cell = behind_cell(&m, true);
        assert!(
            cell.contains("DRIFTED") && cell.contains("broker: conf/broker.conf changed"),
            "{cell}"
        );
        assert!(!cell.contains("up to date"), "{cell}");
    }
}
