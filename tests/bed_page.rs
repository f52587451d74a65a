//! The status page in a real browser (issue 13 part 4): a 3-replica bed running the example mesh
//! `meshctl dev` runs (4 machines, real mesh-host processes), each replica serving its page; headless
//! Chromium loads a follower's page, and the DOM it rendered must name the leader and every
//! machine; then it takes a screenshot into the test's temp dir (`MESH_PAGE_SCREENSHOT=<file>`
//! copies it there too: that is how `docs/status-page.png` is made). Chromium is required, not
//! optional: `.ci/run` installs the Debian package when it is missing, and without it this test
//! fails naming `apt-get install chromium`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mesh::cli::dev::example_for_run;
use mesh::cli::procs::Guarded;
use mesh_beds::{Bed, binaries, wait_ms_default};

/// How long one Chromium run may take (a cold start on a busy 2-core machine is a few seconds).
const chromium_wait_ms: u64 = 60_000;
/// Pause between two looks at a running Chromium.
const chromium_poll_ms: u64 = 50;
/// The window the screenshot is taken in: wide enough for the graph's four machine columns.
const window_size: &str = "1280,1150";
/// How long the mesh gets to come up: apply, push and every module ready.
const push_wait: &str = "--wait=90s";

/// The Chromium binary: `MESH_CHROMIUM` if set, else `chromium` (Debian's name) or
/// `chromium-browser` on the PATH.
fn chromium() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("MESH_CHROMIUM") {
        return Ok(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    anyhow::bail!(
        "headless Chromium is needed to test the status page and none is on the PATH; install it with `apt-get install chromium` (.ci/run does this in CI) or set MESH_CHROMIUM to its path"
    )
}

/// Runs Chromium headless with `args` then `url`, in its own process group (killed on drop, even
/// when the test panics), with a profile of its own under `dir`; returns what it printed.
fn run_chromium(dir: &Path, name: &str, args: &[&str], url: &str) -> anyhow::Result<String> {
    let profile = dir.join(format!("{name}.profile"));
    let out = dir.join(format!("{name}.out"));
    let profile_arg = format!("--user-data-dir={}", profile.display());
    let mut all = vec![
        "--headless=new",
        // The sandbox needs user namespaces, which containers and root (as in CI) do not give.
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-dev-shm-usage",
        &profile_arg,
    ];
    all.extend_from_slice(args);
    all.push(url);
    let mut child = Guarded::spawn(name, &chromium()?, &all, &out, Duration::ZERO)?;
    let deadline = Instant::now() + Duration::from_millis(chromium_wait_ms);
    let status = loop {
        if let Some(status) = child.exited() {
            break status;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "chromium {args:?} {url} did not finish within {chromium_wait_ms} ms; its output:\n{}",
            std::fs::read_to_string(&out).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(chromium_poll_ms));
    };
    let printed = std::fs::read_to_string(&out)?;
    anyhow::ensure!(
        status.success(),
        "chromium {args:?} {url} exited {status}:\n{printed}"
    );
    Ok(printed)
}

/// The DOM Chromium rendered for `url`.
fn dump_dom(dir: &Path, url: &str) -> anyhow::Result<String> {
    run_chromium(dir, "chromium-dom", &["--dump-dom"], url)
}

#[test]
fn the_status_page_in_chromium_names_the_leader_and_every_machine() -> anyhow::Result<()> {
    // Issue 13 part 4: what a person sees in a browser, not only the HTML meshd sends: the
    // leader, the four machines with their modules, none behind (a follower's page leaves whether
    // a host is heard to the leader's, decision 0301); and a screenshot of it.
    // Before anything starts: without a browser this test cannot check what it is for.
    chromium()?;
    let (mesh_text, _moved) = example_for_run()?;
    let bed = Bed::start_with_pages(binaries!(), 3, &mesh_text)?;
    bed.leader_other_than(None)?;
    bed.apply(&mesh_text, "the example mesh")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send", push_wait])?;
    let machines = ["ace", "g14", "novox", "shanks"];
    let work = bed.dir.join("browser");
    std::fs::create_dir_all(&work)?;
    let dom = bed.wait_for(
        "a page in Chromium naming the leader and every machine up to date",
        wait_ms_default,
        || {
            let leader = bed.leader_other_than(None)?;
            let follower = (1..=3).find(|id| *id != leader).unwrap_or(1);
            let page: SocketAddr = bed
                .page(follower)
                .ok_or_else(|| anyhow::anyhow!("replica {follower} serves no page"))?;
            let dom = dump_dom(&work, &format!("http://{page}/"))?;
            let names_leader = dom.contains(&format!("<b id=\"leader\">replica {leader}</b>"));
            let every_machine = machines
                .iter()
                .all(|m| dom.contains(&format!("<tr><td>{m}</td>")));
            let settled = !dom.contains("behind</span>") && !dom.contains("never</td>");
            if names_leader && every_machine && settled {
                return Ok(Some((follower, dom)));
            }
            anyhow::bail!(
                "replica {follower}'s page (leader {leader}, names it: {names_leader}, every machine: {every_machine}, settled: {settled}):\n{dom}"
            )
        },
    );
    let (follower, dom) = dom?;
    // The rendered DOM, not just the bytes sent: Chromium parsed the table and the SVG graph.
    assert!(dom.contains("<table id=\"machines\">"), "{dom}");
    assert!(dom.contains("<svg id=\"graph\""), "{dom}");
    for module in ["db", "broker", "web", "backup"] {
        assert!(
            dom.contains(module),
            "the page does not show module {module}:\n{dom}"
        );
    }
    assert!(
        dom.contains(&format!("served by replica {follower}")),
        "{dom}"
    );

    let shot = work.join("status-page.png");
    let shot_arg = format!("--screenshot={}", shot.display());
    let size_arg = format!("--window-size={window_size}");
    let page = bed
        .page(follower)
        .ok_or_else(|| anyhow::anyhow!("replica {follower} serves no page"))?;
    run_chromium(
        &work,
        "chromium-shot",
        &[&shot_arg, &size_arg, "--hide-scrollbars"],
        &format!("http://{page}/"),
    )?;
    let png = std::fs::read(&shot)?;
    assert!(
        png.len() > 10_000 && png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a screenshot ({} bytes)",
        shot.display(),
        png.len()
    );
    if let Some(keep) = std::env::var_os("MESH_PAGE_SCREENSHOT") {
        std::fs::copy(&shot, &keep)?;
    }
    Ok(())
}
