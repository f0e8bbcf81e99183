//! The command-line client of a running daemon (`discover`, `agents`, `peers`) and the offline card
//! tools (`card validate`, `card sign`). An edge of the program: errors are `anyhow`, for people.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context};
use serde_json::Value;

use crate::card::{a2a, AgentCard};
use crate::cli::{AgentsArgs, CardFormat, DiscoverArgs, OutputFormat};
use crate::identity::Identity;

/// GETs `path` from the daemon at `api`; a non-2xx answer is an error carrying the daemon's message.
async fn get(api: &str, path: &str) -> anyhow::Result<String> {
    let url = format!("{}{path}", api.trim_end_matches('/'));
    let response = reqwest::get(&url).await.with_context(|| format!("cannot reach the daemon at {api}"))?;
    let status = response.status();
    let text = response.text().await.with_context(|| format!("{url}: no body"))?;
    if !status.is_success() {
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or(text);
        bail!("{status}: {message}");
    }
    Ok(text)
}

fn get_json(text: &str) -> anyhow::Result<Value> {
    serde_json::from_str(text).context("the daemon's answer is not JSON")
}

/// The discovery query string for the flags.
pub fn discover_query(args: &DiscoverArgs) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    if !args.agents.is_empty() {
        q.append_pair("agent_ids", &args.agents.join(","));
    }
    for (name, value) in
        [("reasoner", &args.reasoner), ("skill", &args.skill), ("health_status", &args.health)]
    {
        if let Some(v) = value {
            q.append_pair(name, v);
        }
    }
    if !args.tags.is_empty() {
        q.append_pair("tags", &args.tags.join(","));
    }
    for (name, on) in [
        ("include_input_schema", args.input_schema),
        ("include_output_schema", args.output_schema),
        ("include_examples", args.examples),
    ] {
        if on {
            q.append_pair(name, "true");
        }
    }
    if args.no_descriptions {
        q.append_pair("include_descriptions", "false");
    }
    if let Some(limit) = args.limit {
        q.append_pair("limit", &limit.to_string());
    }
    if let Some(offset) = args.offset {
        q.append_pair("offset", &offset.to_string());
    }
    let format = match args.format {
        OutputFormat::Table | OutputFormat::Json => "json",
        OutputFormat::Xml => "xml",
        OutputFormat::Compact => "compact",
    };
    q.append_pair("format", format);
    q.finish()
}

/// `agentmesh discover`: prints the daemon's answer as it came (json, xml, compact) or as a table.
pub async fn discover(args: &DiscoverArgs) -> anyhow::Result<String> {
    let body = get(&args.api, &format!("/api/v1/discovery/capabilities?{}", discover_query(args))).await?;
    Ok(match args.format {
        OutputFormat::Table => discovery_table(&get_json(&body)?),
        OutputFormat::Json => pretty(&body)?,
        OutputFormat::Xml | OutputFormat::Compact => body,
    })
}

fn pretty(body: &str) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(&get_json(body)?)?)
}

fn text(v: &Value) -> String {
    v.as_str().map(str::to_owned).unwrap_or_else(|| if v.is_null() { "-".into() } else { v.to_string() })
}

fn tags(v: &Value) -> String {
    let list: Vec<String> = v.as_array().into_iter().flatten().map(text).collect();
    if list.is_empty() {
        "-".into()
    } else {
        list.join(",")
    }
}

/// Left-aligned columns, as wide as their widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// One row per reasoner and skill of a discovery JSON answer, and a summary line. Pure.
pub fn discovery_table(body: &Value) -> String {
    let mut rows = Vec::new();
    for agent in body["capabilities"].as_array().into_iter().flatten() {
        for (kind, list) in [("reasoner", &agent["reasoners"]), ("skill", &agent["skills"])] {
            for cap in list.as_array().into_iter().flatten() {
                rows.push(vec![
                    text(&agent["agent_id"]),
                    text(&agent["health_status"]),
                    kind.to_owned(),
                    text(&cap["id"]),
                    tags(&cap["tags"]),
                    text(&cap["invocation_target"]),
                ]);
            }
        }
    }
    let mut out = table(&["AGENT", "HEALTH", "KIND", "ID", "TAGS", "TARGET"], &rows);
    let page = &body["pagination"];
    let shown = body["capabilities"].as_array().map_or(0, Vec::len);
    let _ = writeln!(
        out,
        "\n{} agents ({} shown from offset {}{}), {} reasoners, {} skills",
        body["total_agents"],
        shown,
        page["offset"],
        if page["has_more"] == true { ", more with --offset" } else { "" },
        body["total_reasoners"],
        body["total_skills"],
    );
    out
}

/// `agentmesh agents`: every record in the daemon's view.
pub async fn agents(args: &AgentsArgs) -> anyhow::Result<String> {
    let path = format!("/api/v1/agents?limit={}&offset={}", args.limit, args.offset);
    let body = get(&args.api, &path).await?;
    if args.json {
        return pretty(&body);
    }
    let body = get_json(&body)?;
    let rows: Vec<Vec<String>> = body["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            vec![
                text(&a["agent_id"]),
                text(&a["health_status"]),
                if a["local"] == true { "local".into() } else { "remote".into() },
                text(&a["card"]["version"]),
                text(&a["last_heartbeat"]),
                text(&a["publisher"]),
            ]
        })
        .collect();
    let mut out = table(&["AGENT", "HEALTH", "ORIGIN", "VERSION", "LAST HEARTBEAT", "PUBLISHER"], &rows);
    let _ = writeln!(out, "\n{} agents in the view ({} shown)", body["total"], rows.len());
    Ok(out)
}

/// `agentmesh peers`: the daemon's mesh status and its connected peers.
pub async fn peers(api: &str) -> anyhow::Result<String> {
    let status = get_json(&get(api, "/api/v1/mesh/status").await?)?;
    let peers = get_json(&get(api, "/api/v1/mesh/peers").await?)?;
    let mut out = String::new();
    let _ = writeln!(out, "peer id        {}", text(&status["peer_id"]));
    for addr in status["listen_addrs"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "listening on   {}", text(addr));
    }
    let _ = writeln!(
        out,
        "peers          {} connected, {} in the routing table",
        status["connected_peers"], status["routing_table_size"]
    );
    let _ = writeln!(out, "gossip mesh    {}", status["mesh_peers"]);
    let _ = writeln!(out, "records        {}", status["records"]);
    let _ = writeln!(out, "last sync      {}", text(&status["last_sync"]));
    let _ = writeln!(out, "rejected       {}\n", status["rejected"]);
    let rows: Vec<Vec<String>> = peers["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let rtt = p["rtt_ms"].as_f64().map_or("-".to_owned(), |ms| format!("{ms:.2} ms"));
            let addrs: Vec<String> = p["addresses"].as_array().into_iter().flatten().map(text).collect();
            vec![text(&p["peer_id"]), rtt, addrs.join(" ")]
        })
        .collect();
    out.push_str(&table(&["PEER", "RTT", "ADDRESSES"], &rows));
    Ok(out)
}

fn read_card(path: &Path) -> anyhow::Result<(AgentCard, Value)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let card = AgentCard::from_json_any(&bytes)
        .with_context(|| format!("{} is not a valid card", path.display()))?;
    let raw = serde_json::from_slice(&bytes)?;
    Ok((card, raw))
}

/// `agentmesh card validate FILE`: parses an agentmesh or A2A card with every rule the daemon applies,
/// and checks the signature it carries when its key id is a PeerId.
pub fn validate(path: &Path) -> anyhow::Result<String> {
    let (card, raw) = read_card(path)?;
    let mut out = format!(
        "valid {} card: agent `{}`, {} reasoners, {} skills\n",
        if a2a::looks_like_a2a(&raw) { "A2A" } else { "agentmesh" },
        card.agent_id,
        card.reasoners.len(),
        card.skills.len()
    );
    match a2a::view(&card) {
        Some(_) => out.push_str("A2A view: complete (every required field)\n"),
        None => out.push_str("A2A view: none (an A2A card needs at least one reasoner or skill)\n"),
    }
    for line in signature_report(&card, &raw)? {
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

/// Checks the signatures a card file carries: an agentmesh card's `a2a_signature`, or an A2A card's
/// `signatures` whose `kid` is a PeerId. Any that fails is an error.
fn signature_report(card: &AgentCard, raw: &Value) -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::new();
    let sigs: Vec<a2a::JwsSignature> = if a2a::looks_like_a2a(raw) {
        serde_json::from_value(raw["signatures"].clone()).unwrap_or_default()
    } else {
        card.a2a_signature.iter().cloned().collect()
    };
    let view = match (a2a::looks_like_a2a(raw), a2a::view(card)) {
        // An A2A file is verified over what it says (less its signatures), as A2A verifiers do.
        (true, _) => a2a::signed_payload(raw),
        (false, view) => view,
    };
    for sig in sigs {
        let kid = sig.kid().unwrap_or_default();
        let Ok(publisher) = kid.parse::<libp2p::PeerId>() else {
            lines.push(format!("signature with kid `{kid}`: not a PeerId, not checked"));
            continue;
        };
        let view = view.as_ref().context("a signature on a card with no A2A view")?;
        a2a::verify(&publisher, view, &sig)
            .with_context(|| format!("signature of {publisher} does not verify"))?;
        lines.push(format!("signature of {publisher}: verifies"));
    }
    if lines.is_empty() {
        lines.push("not signed".into());
    }
    Ok(lines)
}

/// `agentmesh card sign FILE`: the card signed with this node's key (`DATA_DIR/identity.key`), as an
/// A2A card (what the daemon would serve) or as an agentmesh card carrying `a2a_signature`.
pub fn sign(path: &Path, data_dir: &Path, format: CardFormat) -> anyhow::Result<String> {
    let (card, _) = read_card(path)?;
    let identity = Identity::load_or_create(data_dir)?;
    let card = card.signed(identity.keypair());
    let value = match format {
        CardFormat::A2a => a2a::served(&card).context("an A2A card needs at least one reasoner or skill")?,
        CardFormat::Agentmesh => serde_json::from_slice(&card.to_json())?,
    };
    Ok(serde_json::to_string_pretty(&value)?)
}

/// Longest MCP message `agentmesh mcp` takes from stdin (the daemon's request body limit).
pub const MAX_MCP_LINE: usize = crate::defaults::MAX_BODY_BYTES;
/// How long one MCP call to the daemon may take.
const MCP_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// `agentmesh mcp`: the MCP stdio transport (one JSON-RPC message per line on stdin, one answer per
/// line on stdout), each message carried to the daemon's `POST /mcp`, which answers it. Ends at
/// the end of stdin. A daemon that cannot be reached is an error answer to each request, so the
/// client says what is wrong instead of hanging.
pub async fn mcp_stdio(api: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    let url = format!("{}/mcp", api.trim_end_matches('/'));
    let client = reqwest::Client::builder().timeout(MCP_CALL_TIMEOUT).build()?;
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut stdout = tokio::io::stdout();
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut stdin).take(MAX_MCP_LINE as u64 + 1).read_until(b'\n', &mut line).await?;
        if n == 0 {
            return Ok(());
        }
        let answer = if line.len() > MAX_MCP_LINE && line.last() != Some(&b'\n') {
            // Skip the rest of the oversized line, then refuse it.
            let mut rest = Vec::new();
            while !rest.ends_with(b"\n") {
                rest.clear();
                if (&mut stdin).take(64 * 1024).read_until(b'\n', &mut rest).await? == 0 {
                    break;
                }
            }
            Some(mcp_error(Value::Null, crate::api::mcp::INVALID_REQUEST, "message too large"))
        } else if line.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            mcp_forward(&client, &url, api, &line).await
        };
        if let Some(answer) = answer {
            let mut out = serde_json::to_vec(&answer)?;
            out.push(b'\n');
            stdout.write_all(&out).await?;
            stdout.flush().await?;
        }
    }
}

fn mcp_error(id: Value, code: i64, message: &str) -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Carries one message to the daemon: its answer, or `None` when there is none to give.
async fn mcp_forward(client: &reqwest::Client, url: &str, api: &str, line: &[u8]) -> Option<Value> {
    let message: Value = match serde_json::from_slice(line) {
        Ok(m) => m,
        Err(e) => {
            return Some(mcp_error(Value::Null, crate::api::mcp::PARSE_ERROR, &format!("parse error: {e}")))
        }
    };
    // The id to answer with if the daemon cannot: only requests (a method and an id) get answers.
    let request_id = message.get("method").and(message.get("id")).cloned();
    let sent = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(serde_json::to_vec(&message).unwrap_or_default())
        .send()
        .await;
    let failed =
        |reason: String| request_id.clone().map(|id| mcp_error(id, crate::api::mcp::INTERNAL_ERROR, &reason));
    let response = match sent {
        Ok(r) => r,
        Err(e) => return failed(format!("cannot reach the agentmesh daemon at {api}: {e}")),
    };
    let status = response.status();
    if status == reqwest::StatusCode::ACCEPTED {
        return None;
    }
    match response.json::<Value>().await {
        Ok(answer) if answer.get("jsonrpc").is_some() => Some(answer),
        Ok(_) | Err(_) => {
            failed(format!("the agentmesh daemon at {api} answered {status} without a JSON-RPC message"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn discover_args(args: &[&str]) -> DiscoverArgs {
        let cli = crate::cli::Cli::try_parse_from(["agentmesh", "discover"].iter().chain(args)).unwrap();
        match cli.command {
            Some(crate::cli::Command::Discover(a)) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn flags_become_the_discovery_query() {
        let q = discover_args(&[
            "--agent",
            "a",
            "--agent",
            "b",
            "--reasoner",
            "*research*",
            "--tag",
            "ml",
            "--tag",
            "nlp",
            "--health",
            "active",
            "--input-schema",
            "--limit",
            "5",
            "--format",
            "xml",
        ]);
        assert_eq!(
            discover_query(&q),
            "agent_ids=a%2Cb&reasoner=*research*&health_status=active&tags=ml%2Cnlp&include_input_schema=true&limit=5&format=xml"
        );
        assert_eq!(discover_query(&discover_args(&[])), "format=json");
    }

    #[test]
    fn the_table_has_a_row_per_capability_and_a_summary() {
        let body = serde_json::json!({"total_agents": 2, "total_reasoners": 1, "total_skills": 1,
            "pagination": {"limit": 1, "offset": 0, "has_more": true},
            "capabilities": [{"agent_id": "alpha", "health_status": "active",
                "reasoners": [{"id": "deep", "tags": ["ml", "x"], "invocation_target": "alpha:deep"}],
                "skills": [{"id": "web", "tags": [], "invocation_target": "alpha:skill:web"}]}]});
        let out = discovery_table(&body);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "AGENT  HEALTH  KIND      ID    TAGS  TARGET");
        assert_eq!(lines[1], "alpha  active  reasoner  deep  ml,x  alpha:deep");
        assert_eq!(lines[2], "alpha  active  skill     web   -     alpha:skill:web");
        assert!(lines[4].starts_with("2 agents (1 shown from offset 0, more with --offset)"), "{out}");
    }
}
