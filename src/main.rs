use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;

use agentmesh::cli::{Cli, Command};
use agentmesh::config::LogFormat;
use agentmesh::identity::Identity;
use agentmesh::node::Node;

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

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command.unwrap_or_else(|| Command::Run(Box::default())) {
        Command::Id { data_dir } => {
            let identity = Identity::load_or_create(&data_dir)?;
            println!("{}", identity.peer_id());
            Ok(())
        }
        Command::Peers { api } => peers(&api).await,
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

/// `agentmesh peers`: the daemon's mesh status and its connected peers, readable.
async fn peers(api: &str) -> anyhow::Result<()> {
    let api = api.trim_end_matches('/');
    let get = |path: &str| {
        let url = format!("{api}{path}");
        async move {
            let response =
                reqwest::get(&url).await.with_context(|| format!("cannot reach the daemon at {url}"))?;
            let status = response.status();
            let body: serde_json::Value =
                response.json().await.with_context(|| format!("{url}: not JSON"))?;
            anyhow::ensure!(status.is_success(), "{url}: {status}: {body}");
            anyhow::Ok(body)
        }
    };
    let status = get("/api/v1/mesh/status").await?;
    let peers = get("/api/v1/mesh/peers").await?;
    let text = |v: &serde_json::Value| v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
    println!("peer id        {}", text(&status["peer_id"]));
    for addr in status["listen_addrs"].as_array().into_iter().flatten() {
        println!("listening on   {}", text(addr));
    }
    println!(
        "peers          {} connected, {} in the routing table",
        status["connected_peers"], status["routing_table_size"]
    );
    println!("gossip mesh    {}", status["mesh_peers"]);
    println!("records        {}", status["records"]);
    println!("last sync      {}", text(&status["last_sync"]));
    println!("rejected       {}", status["rejected"]);
    println!();
    println!("{:<54} {:>9}  ADDRESSES", "PEER", "RTT");
    for peer in peers["peers"].as_array().into_iter().flatten() {
        let rtt = peer["rtt_ms"].as_f64().map_or("-".to_owned(), |ms| format!("{ms:.2} ms"));
        let addrs: Vec<String> = peer["addresses"].as_array().into_iter().flatten().map(text).collect();
        println!("{:<54} {:>9}  {}", text(&peer["peer_id"]), rtt, addrs.join(" "));
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
