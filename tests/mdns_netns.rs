//! Two daemons in two network namespaces joined by a veth pair: with no bootstrap address they find
//! each other by mDNS and share their cards; a node cut off and back at a new address is reached again,
//! and dials again as soon as its address is back. Needs root (it creates the namespaces; CI runs as
//! root) and iproute2's `ip`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_agentmesh");
const DEADLINE: Duration = Duration::from_secs(20);
/// Each daemon's API, on its own namespace's loopback.
const API: &str = "127.0.0.1:18080";

/// Two namespaces `a` and `b`, veth-linked on a private /24 that exists only between them.
struct Namespaces {
    a: String,
    b: String,
    /// a's end of the veth pair.
    va: String,
    /// b's end.
    vb: String,
}

/// Tests of one process run in parallel: each pair of namespaces needs its own names.
static PAIRS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("iproute2 `ip` is installed");
    assert!(
        out.status.success(),
        "ip {}: {} (this test needs root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Namespaces {
    fn create() -> Self {
        let tag =
            format!("{}x{}", std::process::id(), PAIRS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let (a, b) = (format!("amtest-a-{tag}"), format!("amtest-b-{tag}"));
        let (va, vb) = (format!("amva{tag}"), format!("amvb{tag}"));
        ip(&["netns", "add", &a]);
        let ns = Namespaces { a: a.clone(), b: b.clone(), va: va.clone(), vb: vb.clone() };
        ip(&["netns", "add", &b]);
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        ip(&["link", "set", &va, "netns", &a]);
        ip(&["link", "set", &vb, "netns", &b]);
        ip(&["-n", &a, "addr", "add", "10.231.7.1/24", "dev", &va]);
        ip(&["-n", &b, "addr", "add", "10.231.7.2/24", "dev", &vb]);
        for (n, v) in [(&a, &va), (&b, &vb)] {
            ip(&["-n", n, "link", "set", v, "up"]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        ns
    }

    fn run(&self, ns: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, BIN]).args(args);
        cmd
    }

    /// The PeerId of the node whose data dir is `data` (created now if new, so a daemon started on it
    /// later uses this one).
    fn peer_id(&self, ns: &str, data: &Path) -> String {
        let out = self.run(ns, &["id", "--data-dir", data.to_str().unwrap()]).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// A daemon in `ns` on `data`, its API on the namespace's loopback, the mesh on every interface.
    fn start(&self, ns: &str, data: &Path, extra: &[&str]) -> Daemon {
        let mut args = vec![
            "run",
            "--data-dir",
            data.to_str().unwrap(),
            "--http",
            API,
            "--listen",
            "/ip4/0.0.0.0/tcp/4001",
        ];
        args.extend_from_slice(extra);
        Daemon(self.run(ns, &args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap())
    }

    /// Polls `agentmesh peers` of the daemon in `ns` until `seen` holds of its output, for `patience`.
    fn wait_for_peers(&self, ns: &str, what: &str, patience: Duration, seen: impl Fn(&str) -> bool) {
        let begun = Instant::now();
        loop {
            let out = self.run(ns, &["peers", "--api", &format!("http://{API}")]).output().unwrap();
            let shown = String::from_utf8_lossy(&out.stdout);
            if out.status.success() && seen(&shown) {
                return;
            }
            assert!(begun.elapsed() < patience, "timed out waiting for {what}:\n{shown}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and with it the other end.
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn two_namespaces_find_each_other_by_mdns_alone() {
    let ns = Namespaces::create();
    let dir = tempfile::tempdir().unwrap();
    let card = dir.path().join("card.json");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/config/cards/research-agent.json"), &card).unwrap();
    let (a_data, b_data) = (dir.path().join("a"), dir.path().join("b"));
    let a_id = ns.peer_id(&ns.a, &a_data);

    // b first, and serving, before a exists: b's first mDNS query finds nobody, and when a's PeerId is
    // the higher one a does not dial, so the pair meets only when b asks again.
    let _b = ns.start(&ns.b, &b_data, &[]);
    ns.wait_for_peers(&ns.b, "b to serve", DEADLINE, |_| true);
    let _a = ns.start(&ns.a, &a_data, &["--card", card.to_str().unwrap()]);
    // Connected to a, over the veth, and holding a's agent.
    ns.wait_for_peers(&ns.b, "b to find a by mDNS", DEADLINE, |shown| {
        shown.contains(&a_id) && shown.contains("/ip4/10.231.7.1/tcp/4001") && shown.contains("\"active\":1")
    });
}

/// A peer whose network vanishes without a goodbye (no FIN: its address is gone) and comes back at a
/// new address is reached again: the dead connection fails its pings and is closed, so mDNS redials.
#[test]
fn a_peer_cut_off_and_back_at_a_new_address_is_reconnected() {
    let ns = Namespaces::create();
    let dir = tempfile::tempdir().unwrap();
    let (a_data, b_data) = (dir.path().join("a"), dir.path().join("b"));
    let a_id = ns.peer_id(&ns.a, &a_data);
    let _a = ns.start(&ns.a, &a_data, &[]);
    let _b = ns.start(&ns.b, &b_data, &[]);
    let b_sees_a_at = |addr: &str, patience| {
        ns.wait_for_peers(&ns.b, &format!("b connected to a at {addr}"), patience, |shown| {
            shown.lines().any(|l| l.contains(&a_id) && l.contains(addr))
        })
    };
    b_sees_a_at("/ip4/10.231.7.1/", DEADLINE);

    // a's address disappears under its open connections, and a returns at another one.
    ip(&["-n", &ns.a, "addr", "del", "10.231.7.1/24", "dev", &ns.va]);
    ip(&["-n", &ns.a, "addr", "add", "10.231.7.3/24", "dev", &ns.va]);
    // Ping period + timeout (20 s), then an mDNS query (5 s) and a dial.
    b_sees_a_at("/ip4/10.231.7.3/", Duration::from_secs(60));
}

/// A node whose network goes away long enough for its connection to die and its redials to back off
/// dials again as soon as an address comes back, rather than when the backoff the outage grew ends.
/// `b` joins `a` by bootstrap address (no mDNS) and comes back at a new address, so only `b` can
/// dial: `a` knows only the old one.
#[test]
fn a_node_whose_network_comes_back_redials_at_once() {
    let ns = Namespaces::create();
    let dir = tempfile::tempdir().unwrap();
    let (a_data, b_data) = (dir.path().join("a"), dir.path().join("b"));
    let a_id = ns.peer_id(&ns.a, &a_data);
    let _a = ns.start(&ns.a, &a_data, &["--no-mdns"]);
    let bootstrap = format!("/ip4/10.231.7.1/tcp/4001/p2p/{a_id}");
    let _b = ns.start(&ns.b, &b_data, &["--no-mdns", "--bootstrap", &bootstrap]);
    let connected = |shown: &str| shown.lines().any(|l| l.contains(&a_id) && l.contains("/ip4/10.231.7.1/"));
    ns.wait_for_peers(&ns.b, "b connected to a", DEADLINE, connected);

    // b's address goes: with no address off loopback left it closes its connections to other hosts
    // (else their failed pings would, 10-20 s later), then its dials fail and back off.
    ip(&["-n", &ns.b, "addr", "del", "10.231.7.2/24", "dev", &ns.vb]);
    ns.wait_for_peers(&ns.b, "b's dead connection closed", DEADLINE, |s| !connected(s));
    // The outage lasts: long enough for the bootstrap backoff to reach 8 s and the connection
    // target to have tried a within its 10 s retry time.
    std::thread::sleep(Duration::from_secs(12));
    ip(&["-n", &ns.b, "addr", "add", "10.231.7.4/24", "dev", &ns.vb]);
    ns.wait_for_peers(
        &ns.b,
        "b to redial a as soon as its address is back",
        Duration::from_secs(3),
        connected,
    );
}
