use std::cell::Cell;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;

use agentmesh::cli::{CardCommand, Cli, Command};
use agentmesh::config::LogFormat;
use agentmesh::identity::Identity;
use agentmesh::node::Node;

/// mimalloc keeps each size class on pages of its own and gives back pages it no longer uses. glibc's
/// heap, after the start-up load had interleaved short-lived row texts with long-lived view entries,
/// kept a quarter of the process's memory as holes it could not return (BENCHMARKS.md, "Memory").
/// Counted (`heap::live_bytes`, served as `agentmesh_heap_live_bytes`), so that what the program holds
/// can be told apart from what the allocator keeps around it.
#[global_allocator]
static ALLOCATOR: agentmesh::heap::Counting<mimalloc::MiMalloc> =
    agentmesh::heap::Counting(mimalloc::MiMalloc);

/// mimalloc's `mi_option_arena_max_object_size` (`mimalloc.h` of the version the lock file pins; the
/// sys crate does not name it).
const MI_OPTION_ARENA_MAX_OBJECT_SIZE: libmimalloc_sys::mi_option_t = 45;

/// How long freed pages are kept during a burst of allocation (a catch-up's sync answers), in ms: the
/// answers of a catch-up come tens of ms apart; 1 s kept more at the peak and joined no sooner.
const BURST_PURGE_DELAY: i64 = 200;

/// A sidecar's memory is taken from its agent's machine, so the allocator gives back what it does not
/// use (BENCHMARKS.md, "Memory"); a `MIMALLOC_*` variable of the same name in the environment, read by
/// mimalloc itself, wins:
/// - freed pages go back at once (mimalloc's default keeps them 10 ms, then batches: a node after
///   start-up held 10 MB more at 10,000 agents), except during a burst of allocation
///   (`heap::burst`, a catch-up's sync answers), when they are kept [`BURST_PURGE_DELAY`]: each batch
///   would otherwise fault in again the pages the one before gave back; once the burst ends every thread
///   hands back what it kept (`heap::bursting`, checked by `collect_when_idle`);
/// - an allocation over 1 MiB is mapped from the system and unmapped when freed, as glibc does: reused
///   from mimalloc's arena, a zeroed one (sled's 4 MiB page table, at each of its two opens) had to be
///   cleared and so became resident, 5 MB on one start in two.
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        agentmesh::heap::manage_purge_delay(0, BURST_PURGE_DELAY);
    }
    if std::env::var_os("MIMALLOC_ARENA_MAX_OBJECT_SIZE").is_none() {
        // SAFETY: sets one of mimalloc's process-wide options, which it reads atomically.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_MAX_OBJECT_SIZE, 1024) };
    }
}

fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// How often at most a runtime thread going idle hands back what it freed ([`collect_when_idle`]).
const COLLECT_INTERVAL: Duration = Duration::from_secs(1);

/// Collects when a runtime worker goes idle, at most once per [`COLLECT_INTERVAL`]: a busy worker
/// reuses what it frees anyway, an idle one would keep it indefinitely (`heap::collect_thread`: a node
/// that had just caught up with a mesh of 10,000 agents held 7 MB that way, most of it on the two
/// runtime workers, until each thread collected; BENCHMARKS.md, "Memory"). What sled deferred on the thread
/// is freed first (`store::release_deferred`), and so are response buffers no answer asked for a while
/// (`api::render::buffers::trim`), so the same collect hands them back. Not during a burst
/// of allocation (`heap::bursting`): the first collect after it hands back what it kept.
fn collect_when_idle() {
    thread_local! {
        static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    LAST.with(|last| {
        let now = Instant::now();
        if last.get().is_none_or(|at| now.duration_since(at) >= COLLECT_INTERVAL) {
            last.set(Some(now));
            agentmesh::api::render::buffers::trim();
            agentmesh::registry::store::release_deferred();
            if !agentmesh::heap::bursting() {
                agentmesh::heap::collect_thread();
            }
        }
    });
}

fn main() -> ExitCode {
    tune_allocator();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(collect_when_idle)
        // A blocking-pool thread ends after a while idle: what it still holds goes with its heap.
        .on_thread_stop(agentmesh::heap::collect_thread)
        .build();
    let outcome = match runtime {
        Ok(runtime) => runtime.block_on(run(Cli::parse())),
        Err(error) => Err(anyhow::Error::new(error).context("cannot start the async runtime")),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", report(&error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, like `{:#}`, but a cause whose text the line already ends
/// with is not repeated: many errors name their source in their own message and also return it as
/// `source()`, which `{:#}` would print twice.
fn report(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = format!(": {cause}");
        if !line.ends_with(&text) {
            line.push_str(&text);
        }
    }
    line.strip_prefix(": ").unwrap_or(&line).to_owned()
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command.unwrap_or_else(|| Command::Run(Box::default())) {
        Command::Id { data_dir } => {
            let identity = Identity::load_or_create(&data_dir)?;
            println!("{}", identity.peer_id());
            Ok(())
        }
        Command::Peers { api } => print(agentmesh::client::peers(&api).await),
        // Logs go to stderr; stdout carries only MCP messages.
        Command::Mcp { api } => agentmesh::client::mcp_stdio(&api).await,
        Command::Discover(args) => print(agentmesh::client::discover(&args).await),
        Command::Agents(args) => print(agentmesh::client::agents(&args).await),
        Command::Card(CardCommand::Validate { file }) => print(agentmesh::client::validate(&file)),
        Command::Card(CardCommand::Sign { file, data_dir, format }) => {
            print(agentmesh::client::sign(&file, &data_dir, format))
        }
        Command::NetworkKey => {
            let mut key = [0u8; 32];
            rand::fill(&mut key);
            print!("{}", libp2p::pnet::PreSharedKey::new(key).to_key_file());
            Ok(())
        }
        Command::Run(args) => {
            let config = args.resolve()?;
            init_tracing(config.log_format);
            agentmesh::api::server::raise_fd_limit();
            tracing::debug!(?config, "configuration");
            let mut node = Node::start(config).await.context("node failed to start")?;
            tokio::select! {
                _ = shutdown_signal() => tracing::info!("shutting down"),
                error = node.failed() => return Err(error).context("node failed"),
            }
            node.shutdown().await?;
            Ok(())
        }
    }
}

fn print(output: anyhow::Result<String>) -> anyhow::Result<()> {
    let text = output?;
    print!("{text}");
    if !text.ends_with('\n') {
        println!();
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
