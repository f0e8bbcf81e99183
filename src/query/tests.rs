use super::*;
use crate::card::AgentCard;
use crate::registry::health::Reported;
use crate::registry::{Entry, Liveness, Origin, RecordKey};
use libp2p::identity::PeerId;

fn err(raw: &str) -> (String, String, Vec<&'static str>) {
    let e = Query::parse(raw).unwrap_err();
    (e.to_string(), e.provided, e.allowed.to_vec())
}

#[test]
fn defaults() {
    let q = Query::parse("").unwrap();
    assert_eq!(q, Query::default());
    assert_eq!(q.limit, 100);
    assert!(q.include_descriptions && !q.include_input_schema);
}

#[test]
fn ids_merge_from_every_alias() {
    let q = Query::parse("agent=a&node_id=b&agent_ids=c%2C%20d,,c&node_ids=e").unwrap();
    let ids: Vec<_> = q.ids.iter().map(String::as_str).collect();
    assert_eq!(ids, ["a", "c", "d", "e"], "agent wins over node_id; lists merged, trimmed, deduplicated");
    let q = Query::parse("node_id=b").unwrap();
    assert!(q.ids.contains("b"));
}

#[test]
fn booleans_accept_every_spelling() {
    for (v, want) in [
        ("true", true),
        ("TRUE", true),
        ("1", true),
        ("yes", true),
        ("Y", true),
        ("false", false),
        ("0", false),
        ("No", false),
        ("n", false),
    ] {
        let q = Query::parse(&format!("include_input_schema={v}")).unwrap();
        assert_eq!(q.include_input_schema, want, "{v}");
    }
    assert!(Query::parse("include_descriptions=").unwrap().include_descriptions, "empty means default");
}

#[test]
fn each_bad_value_names_its_parameter() {
    let cases = [
        (
            "include_input_schema=maybe",
            "invalid include_input_schema parameter",
            "maybe",
            vec!["true", "false"],
        ),
        ("include_output_schema=2", "invalid include_output_schema parameter", "2", vec!["true", "false"]),
        ("include_descriptions=on", "invalid include_descriptions parameter", "on", vec!["true", "false"]),
        ("include_examples=tru", "invalid include_examples parameter", "tru", vec!["true", "false"]),
        ("format=yaml", "invalid format parameter", "yaml", vec!["json", "xml", "compact"]),
        ("format=", "invalid format parameter", "", vec!["json", "xml", "compact"]),
        (
            "health_status=dead",
            "invalid health_status parameter",
            "dead",
            vec!["active", "inactive", "degraded", "unknown"],
        ),
        ("limit=-1", "invalid limit parameter", "-1", vec!["0-500"]),
        ("limit=501", "invalid limit parameter", "501", vec!["0-500"]),
        ("limit=10abc", "invalid limit parameter", "10abc", vec!["0-500"]),
        ("limit=1e3", "invalid limit parameter", "1e3", vec!["0-500"]),
        ("limit=0x10", "invalid limit parameter", "0x10", vec!["0-500"]),
        ("limit=", "invalid limit parameter", "", vec!["0-500"]),
        ("limit=%2B5", "invalid limit parameter", "+5", vec!["0-500"]),
        ("offset=1000001", "invalid offset parameter", "1000001", vec!["0-1000000"]),
        (
            "offset=99999999999999999999",
            "invalid offset parameter",
            "99999999999999999999",
            vec!["0-1000000"],
        ),
    ];
    for (raw, message, provided, allowed) in cases {
        assert_eq!(err(raw), (message.to_owned(), provided.to_owned(), allowed), "{raw}");
    }
}

#[test]
fn errors_come_in_table_order() {
    assert_eq!(err("limit=x&format=bad&include_examples=bad").0, "invalid include_examples parameter");
    assert_eq!(err("offset=x&limit=x").0, "invalid limit parameter");
    assert_eq!(err("limit=x&health_status=x").0, "invalid health_status parameter");
}

#[test]
fn format_and_health_are_case_insensitive() {
    let q = Query::parse("format=XML&health_status=Active&limit=500&offset=1000000").unwrap();
    assert_eq!(q.format, Format::Xml);
    assert_eq!(q.health, Some(Health::Active));
    assert_eq!((q.limit, q.offset), (500, 1_000_000));
}

#[test]
fn wildcards() {
    let m = |p: &str, s: &str| Pattern::new(p).matches(s);
    assert!(m("deep_*", "deep_research"));
    assert!(!m("deep_*", "a_deep_research"));
    assert!(m("*research", "deep_research"));
    assert!(!m("*research", "research_x"));
    assert!(m("*research*", "my_research_tool"));
    assert!(m("a*b", "ab") && m("a*b", "axxb") && !m("a*b", "axxbc"));
    assert!(m("a*b*c", "abc") && m("a*b*c", "a_b_c") && !m("a*b*c", "acb"));
    assert!(!m("ab*ba", "aba"), "prefix and suffix must not overlap");
    assert!(m("exact", "exact") && !m("exact", "Exact") && !m("exact", "exactly"));
    assert!(m("*", "anything") && m("", "anything"));
    assert!(Pattern::new("**").matches_all());
}

fn entry(id: &str, reasoners: &[(&str, &[&str])], skills: &[(&str, &[&str])]) -> Entry {
    let caps = |list: &[(&str, &[&str])]| {
        list.iter().map(|(id, tags)| serde_json::json!({"id": id, "tags": tags})).collect::<Vec<_>>()
    };
    let json = serde_json::json!({
        "agent_id": id, "base_url": "http://127.0.0.1:1",
        "reasoners": caps(reasoners), "skills": caps(skills),
    });
    let card = AgentCard::from_json(json.to_string().as_bytes()).unwrap();
    let key = RecordKey { agent_id: id.to_owned(), publisher: PeerId::random() };
    Entry::new(key, 1, &card, Origin::Local(Liveness::Agent), 0)
}

fn fixture() -> Vec<Entry> {
    vec![
        entry(
            "alpha",
            &[("deep_research", &["research", "ml"]), ("summarize", &["nlp"])],
            &[("web_search", &["web"])],
        ),
        entry("beta", &[("quick_research", &["research"])], &[]),
        entry("gamma", &[], &[("translate", &["nlp", "i18n"])]),
        entry("empty", &[], &[]),
    ]
}

const T: Thresholds = Thresholds {
    degraded_after: std::time::Duration::from_secs(7),
    inactive_after: std::time::Duration::from_secs(20),
};

fn ids(sel: &Selection<'_>) -> Vec<String> {
    sel.page.iter().map(|h| h.entry.key.agent_id.clone()).collect()
}

#[test]
fn reasoner_filter_keeps_skills() {
    let es = fixture();
    let q = Query::parse("reasoner=*research*").unwrap();
    let sel = select(&es, &q, 0, &T);
    assert_eq!(ids(&sel), ["alpha", "beta", "gamma"]);
    assert_eq!((sel.total_reasoners, sel.total_skills), (2, 2));
    assert_eq!(sel.page[0].reasoners, vec![0]);
    assert_eq!(sel.page[0].skills, vec![0], "reasoner= does not filter skills");
}

#[test]
fn tags_apply_per_capability_with_or() {
    let es = fixture();
    let sel = select(&es, &Query::parse("tags=nlp,web").unwrap(), 0, &T);
    assert_eq!(ids(&sel), ["alpha", "gamma"]);
    assert_eq!(sel.page[0].reasoners, vec![1]);
    assert_eq!(sel.page[0].skills, vec![0]);
    let sel = select(&es, &Query::parse("tags=i18*").unwrap(), 0, &T);
    assert_eq!(ids(&sel), ["gamma"]);
}

#[test]
fn agent_without_capabilities_is_never_returned() {
    let es = fixture();
    let sel = select(&es, &Query::default(), 0, &T);
    assert_eq!(sel.total_agents, 3);
    assert!(!ids(&sel).contains(&"empty".to_owned()));
}

#[test]
fn pagination_edges() {
    let es = fixture();
    let page = |raw: &str| {
        let sel = select(&es, &Query::parse(raw).unwrap(), 0, &T);
        (ids(&sel), sel.total_agents, sel.has_more)
    };
    assert_eq!(page("limit=2"), (vec!["alpha".into(), "beta".into()], 3, true));
    assert_eq!(page("limit=2&offset=2"), (vec!["gamma".into()], 3, false));
    assert_eq!(page("limit=1&offset=2"), (vec!["gamma".into()], 3, false));
    assert_eq!(page("limit=0"), (vec![], 3, true));
    assert_eq!(page("offset=3"), (vec![], 3, false));
    assert_eq!(page("offset=1000000"), (vec![], 3, false));
    assert_eq!(page("agent=nobody&limit=0"), (vec![], 0, false));
}

#[test]
fn health_filter_and_cache_validity() {
    let es = fixture();
    es[0].beat(1_000, Reported::Ready);
    es[1].beat(1_000, Reported::Degraded);
    let sel = select(&es, &Query::parse("health_status=active").unwrap(), 2_000, &T);
    assert_eq!(ids(&sel), ["alpha"]);
    assert_eq!(sel.valid_until, Some(8_000), "alpha and beta turn degraded at 8s");
    let sel = select(&es, &Query::parse("health_status=unknown").unwrap(), 2_000, &T);
    assert_eq!(ids(&sel), ["gamma"]);
    let sel = select(&es, &Query::parse("health_status=degraded").unwrap(), 9_000, &T);
    assert_eq!(ids(&sel), ["alpha", "beta"]);
    assert_eq!(sel.valid_until, Some(21_000));
}

#[test]
fn cache_key_is_canonical() {
    let key = |raw: &str| Query::parse(raw).unwrap().cache_key();
    assert_eq!(key("agent=a&format=JSON&colour=red"), key("node_id=a&format=json"));
    assert_eq!(key("agent_ids=b,a"), key("node_ids=a&agent=b"));
    assert_eq!(key("include_examples=yes"), key("include_examples=true"));
    assert_ne!(key("reasoner=a*"), key("skill=a*"));
    assert_ne!(key("limit=10"), key("offset=10"));
    assert_ne!(key("tags=a,b"), key("tags=a%2Cb&reasoner=b"));
    // A separator inside a value must not move it into the next field.
    assert_ne!(key("agent_ids=a&reasoner=b%7C"), key("agent_ids=a%7Cb"));
    assert_ne!(key("skill=x%7C&tags=y"), key("skill=x&tags=%7Cy"));
}
