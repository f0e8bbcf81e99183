//! What a card costs a node that takes it from the mesh, in process and on one thread: the steps a sync
//! answer goes through on its way into the view, timed apart.
//!
//! `cargo bench --bench ingest` prints a Markdown table for BENCHMARKS.md; `-- --agents N` for N cards
//! instead of 10,000, `-- --publishers P` for P publishers instead of 50, `-- --batch B` for answers of B
//! cards instead of 256.
//!
//! Every card is signed by its publisher (envelope and A2A signature) and sealed as the mesh carries it.
//! Then, per answer of `batch` cards: `parse` (envelope read, the publisher's key looked up), `verify`
//! (the envelopes' signatures in one batch), `decode` (the card's JSON parse and canonical check, its A2A
//! signing input, the A2A signatures in one batch), `apply` (one registry batch: view and store). The
//! store is a real sled tree in a fresh temporary directory for each run. The daemon's allocator
//! (mimalloc, counted by `heap::Counting`) is used; `MIMALLOC_PURGE_DELAY=0` in the environment gives
//! the daemon's purge setting.

use std::time::{Duration, Instant};

use agentmesh::defaults::STORE_DIR;
use agentmesh::registry::health::Thresholds;
use agentmesh::registry::{Limits, Origin, Registry, Update};
use agentmesh::wire::{self, CardBody, Message};
use libp2p::identity::Keypair;

#[path = "common/cards.rs"]
mod cards;

/// The daemon's allocator, counted as the daemon counts it, so that allocation costs what it costs in
/// the daemon (`src/main.rs`; run with `MIMALLOC_PURGE_DELAY=0` for the daemon's purge setting too).
#[global_allocator]
static ALLOCATOR: agentmesh::heap::Counting<mimalloc::MiMalloc> =
    agentmesh::heap::Counting(mimalloc::MiMalloc);

/// The default number of cards: the view size of the mesh targets in BENCHMARKS.md.
const AGENTS: usize = 10_000;
/// The default number of publishers, as in the 50-node mesh runs.
const PUBLISHERS: usize = 50;
/// Cards per answer: about what one sync answer frame carries.
const BATCH: usize = 256;
/// Timed runs; the table shows the fastest, then the slowest.
const RUNS: usize = 5;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).map_or(default, |at| {
        args.get(at + 1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{name} N"))
    })
}

/// CPU time of this process (every thread: sled's flusher included), from `/proc/self/stat`.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat.rsplit_once(')').expect("stat line").1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // Linux reports these in USER_HZ, 100 per second on every platform it runs on.
    Duration::from_millis(ticks * 10)
}

#[derive(Default, Clone, Copy)]
struct Phases {
    parse: Duration,
    verify: Duration,
    decode: Duration,
    apply: Duration,
    wall: Duration,
    cpu: Duration,
}

impl Phases {
    fn total(&self) -> Duration {
        self.parse + self.verify + self.decode + self.apply
    }
}

/// Takes every sealed card into a fresh registry, answer by answer, timing each step.
async fn run(sealed: &[Vec<u8>], batch: usize, agents: usize) -> Phases {
    let dir = tempfile::tempdir().expect("temp dir");
    let me = Keypair::generate_ed25519();
    let limits = Limits { per_publisher: agents, remote_records: agents };
    let (registry, _) =
        Registry::open_checked(&dir.path().join(STORE_DIR), me, Thresholds::default(), limits, false)
            .expect("store opens");
    let mut phases = Phases::default();
    let (cpu0, wall0) = (process_cpu(), Instant::now());
    for answer in sealed.chunks(batch) {
        let t = Instant::now();
        let parsed: Vec<wire::Sealed> = answer.iter().map(|m| wire::parse(m).expect("parses")).collect();
        phases.parse += t.elapsed();
        let t = Instant::now();
        let checked: Vec<wire::Checked> =
            wire::verify_all(parsed).into_iter().map(|c| c.expect("signature holds")).collect();
        phases.verify += t.elapsed();
        let t = Instant::now();
        let updates: Vec<Update> = wire::decode_all(checked)
            .into_iter()
            .map(|v| {
                let v = v.expect("decodes");
                let Message::Card { body, card } = v.message else { panic!("a card") };
                Update::Upsert {
                    publisher: v.publisher,
                    seq: body.seq,
                    card: *card,
                    text: body.card,
                    origin: Origin::Remote,
                    sig: v.sig,
                }
            })
            .collect();
        phases.decode += t.elapsed();
        let t = Instant::now();
        let applied = registry.apply_many(updates, 1).await;
        phases.apply += t.elapsed();
        assert!(applied.iter().all(|a| a.is_ok()), "every card applies");
    }
    phases.wall = wall0.elapsed();
    phases.cpu = process_cpu() - cpu0;
    assert_eq!(registry.snapshot().entries.len(), sealed.len(), "the view holds every card");
    phases
}

fn main() {
    let agents = arg("--agents", AGENTS);
    let publishers = arg("--publishers", PUBLISHERS);
    let batch = arg("--batch", BATCH);
    let keys: Vec<Keypair> = (0..publishers).map(|_| Keypair::generate_ed25519()).collect();
    let sealed: Vec<Vec<u8>> = (0..agents)
        .map(|i| {
            let key = &keys[i % publishers];
            let card = cards::card(i).signed(key);
            let body = CardBody {
                agent_id: card.agent_id.clone(),
                seq: 1,
                card: String::from_utf8(card.to_json()).expect("card JSON is UTF-8"),
            };
            wire::seal_card(key, &body)
        })
        .collect();
    let bytes: usize = sealed.iter().map(Vec::len).sum();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut runs: Vec<Phases> = (0..RUNS).map(|_| rt.block_on(run(&sealed, batch, agents))).collect();
    runs.sort_by_key(Phases::total);
    let per_card = |d: Duration| d.as_secs_f64() * 1e6 / agents as f64;
    println!(
        "{agents} cards ({:.0} B each on the wire) from {publishers} publishers, answers of {batch}, \
         one thread, {RUNS} runs: µs per card, fastest run / slowest run\n",
        bytes as f64 / agents as f64
    );
    println!("| step | µs per card |");
    println!("|---|---|");
    let (best, worst) = (runs[0], runs[RUNS - 1]);
    for (name, pick) in [
        ("parse (envelope, publisher key)", (|p: &Phases| p.parse) as fn(&Phases) -> Duration),
        ("verify (envelope signatures, one batch per answer)", |p| p.verify),
        ("decode (JSON parse, canonical check, A2A signing input and signatures)", |p| p.decode),
        ("apply (one registry batch per answer: view and store)", |p| p.apply),
        ("all four steps", Phases::total),
        ("process CPU over the run (sled's threads included)", |p| p.cpu),
    ] {
        println!("| {name} | {:.1} / {:.1} |", per_card(pick(&best)), per_card(pick(&worst)));
    }
    println!(
        "\n{:.0} cards per second on one thread (fastest run: {:.2} s wall)",
        agents as f64 / best.wall.as_secs_f64(),
        best.wall.as_secs_f64()
    );
}
