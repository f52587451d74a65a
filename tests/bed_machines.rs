//! Beds for G11 "genesis equals compose" through real meshd and mesh-host processes (issue 9 part
//! 9): a machine added to a running mesh starts from the envelope the leader composed, minted and
//! recorded for it, with its provider's grant sent in the same push, and no push of it anywhere.

use mesh_beds::{Bed, binaries, wait_ms_default};

const pair: &str = include_str!("../beds/meshes/pair.toml");

/// pair.toml plus machine zed running tool, which consumes sql from db on ace.
fn with_zed() -> String {
    format!(
        "{pair}\n[machines.zed]\naddress = \"127.0.0.1\"\n\n[modules.tool]\nmachine = \"zed\"\ncommand = \"sleep\"\nargs = [\"600\"]\nconsumes = [{{ kind = \"sql\", from = \"db\" }}]\n"
    )
}

fn free_udp_port() -> anyhow::Result<u16> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
    Ok(socket.local_addr()?.port())
}

#[test]
fn g11_a_machine_added_to_a_running_mesh_starts_from_its_genesis_with_provisions_minted()
-> anyhow::Result<()> {
    // G11: `machines add zed` gets the leader's genesis (tool's provision minted, the send
    // recorded, ace's grant sent in the same push); zed's mesh-host applies it at first start and
    // reports exactly the recorded digest, with the endpoint in its provisions file.
    let mut bed = Bed::start(binaries!(), 3, pair)?;
    bed.leader_other_than(None)?;
    bed.apply(pair, "first model")?;
    bed.meshctl_ok(&["push", "--all", "--why", "first send"])?;
    bed.apply(&with_zed(), "zed joins with tool")?;
    let address = format!("127.0.0.1:{}", free_udp_port()?);
    let unknown = bed.meshctl(&[
        "machines",
        "add",
        "nosuch",
        "--address",
        &address,
        "--why",
        "x",
    ])?;
    assert_eq!(
        unknown.code,
        Some(2),
        "{}{}",
        unknown.stdout,
        unknown.stderr
    );
    assert!(
        unknown.stderr.contains("there is no machine nosuch"),
        "{}",
        unknown.stderr
    );
    assert!(
        !bed.dir.join("host-nosuch.toml").exists(),
        "a refused add writes nothing"
    );
    let added = bed.meshctl(&[
        "machines",
        "add",
        "zed",
        "--address",
        &address,
        "--why",
        "zed joins",
    ])?;
    assert_eq!(added.code, Some(0), "{}{}", added.stdout, added.stderr);
    assert!(
        added.stdout.contains("machine zed: genesis at epoch"),
        "{}",
        added.stdout
    );
    let ace = added
        .stdout
        .lines()
        .find(|l| l.starts_with("ace "))
        .unwrap_or_default();
    assert!(
        ace.contains("applied") && ace.contains("cascaded from zed"),
        "{}",
        added.stdout
    );
    let grants = bed.grants_file("ace", "db");
    assert!(
        bed.read(&grants).contains("tool@zed"),
        "{}",
        bed.read(&grants)
    );
    let again = bed.meshctl(&[
        "machines",
        "add",
        "zed",
        "--address",
        &address,
        "--why",
        "x",
    ])?;
    assert_eq!(again.code, Some(2), "{}{}", again.stdout, again.stderr);
    bed.start_host("zed")?;
    bed.wait_for(
        "zed applied its genesis and reported it",
        wait_ms_default,
        || {
            let status = bed.status()?;
            let Some(zed) = Bed::machine(&status, "zed") else {
                return Ok(None);
            };
            let sent = zed["last_send"].clone();
            let reported = zed["last_report"].clone();
            Ok((zed["behind"] == false && !sent.is_null() && !reported.is_null()).then_some(()))
        },
    )?;
    let provisions = bed.host_root("zed").join("modules/tool/provisions.toml");
    let text = bed.read(&provisions);
    assert!(
        text.contains("127.0.0.1:5432") && text.contains("db@ace"),
        "{text}"
    );
    let history = bed.meshctl_ok(&["history"])?;
    let sends: Vec<&str> = history
        .stdout
        .lines()
        .filter(|l| l.contains("send zed"))
        .collect();
    assert_eq!(
        sends.len(),
        1,
        "one recorded send, the genesis: {}",
        history.stdout
    );
    Ok(())
}
