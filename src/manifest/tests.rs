use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::dir::{Debounce, DirState, Loaded, Parsed, Serve};
use super::parse::{self, CapabilityFiles};
use super::{load, Kind, ManifestError};
use crate::card::{AgentCard, Capability};
use crate::defaults::{MAX_MANIFESTS_PER_DIR, MAX_MANIFEST_DESCRIPTION_BYTES, MAX_MANIFEST_FILE_BYTES};

const YAML: &str = "caps/weather/CAPABILITY.yaml";
const SKILL: &str = "caps/weather/SKILL.md";
const SCHEMA: &str = "caps/weather/schema.json";

fn files<'a>(yaml: &'a str, skill: Option<&'a str>, schema: Option<&'a str>) -> CapabilityFiles<'a> {
    CapabilityFiles { yaml_path: YAML, yaml, skill_path: SKILL, skill, schema_path: SCHEMA, schema }
}

fn capability(yaml: &str) -> Result<(Kind, Capability), ManifestError> {
    parse::capability(&files(yaml, None, None))
}

fn error(yaml: &str) -> ManifestError {
    capability(yaml).expect_err("refused")
}

const MINIMAL: &str = "name: get_forecast\nkind: skill\ndescription: Daily forecast for a city.\n";

#[test]
fn a_minimal_manifest_gets_its_defaults() {
    let (kind, cap) = capability(MINIMAL).unwrap();
    assert_eq!(kind, Kind::Skill);
    assert_eq!(cap.id, "get_forecast", "the id defaults to the name");
    assert_eq!(cap.name.as_deref(), Some("get_forecast"));
    assert_eq!(cap.description.as_deref(), Some("Daily forecast for a city."));
    assert!(cap.tags.is_empty() && cap.input_schema.is_none() && cap.examples.is_empty());
    assert!(!cap.has_side_effects);
}

#[test]
fn every_field_is_read() {
    let yaml = r#"
name: Send email
id: send-email
kind: reasoner
description: Sends an email.
tags: [mail, "notify"]
category: messaging
requires: [smtp, "mailer:skill:send"]
required_secrets: [SMTP_PASSWORD]
has_side_effects: true
input_schema:
  type: object
  properties:
    to: {type: string}
  required: [to]
output_schema: {type: object}
examples:
  - {to: a@example.org}
"#;
    let (kind, cap) = capability(yaml).unwrap();
    assert_eq!(kind, Kind::Reasoner);
    assert_eq!((cap.id.as_str(), cap.name.as_deref()), ("send-email", Some("Send email")));
    assert_eq!(cap.tags, ["mail", "notify"]);
    assert_eq!(cap.category.as_deref(), Some("messaging"));
    assert_eq!(cap.requires, ["smtp", "mailer:skill:send"]);
    assert_eq!(cap.required_secrets, ["SMTP_PASSWORD"]);
    assert!(cap.has_side_effects);
    assert_eq!(
        cap.input_schema.unwrap().get(),
        r#"{"type":"object","properties":{"to":{"type":"string"}},"required":["to"]}"#,
        "minified, key order kept"
    );
    assert_eq!(cap.output_schema.unwrap().get(), r#"{"type":"object"}"#);
    assert_eq!(cap.examples[0].get(), r#"{"to":"a@example.org"}"#);
}

#[test]
fn each_required_field_is_named_when_missing() {
    for field in ["name", "kind", "description"] {
        let yaml: String =
            MINIMAL.lines().filter(|l| !l.starts_with(field)).map(|l| format!("{l}\n")).collect();
        let e = error(&yaml);
        assert_eq!(e.path, YAML);
        assert_eq!(e.field.as_deref(), Some(field), "{e}");
        assert!(e.message.contains("missing"), "{e}");
    }
    let e = error("name: x\nkind: skill\ndescription: '  '\n");
    assert_eq!(e.field.as_deref(), Some("description"));
}

#[test]
fn an_unknown_field_is_named() {
    let e = error(&format!("{MINIMAL}has_side_efects: true\n"));
    assert_eq!(e.field.as_deref(), Some("has_side_efects"), "{e}");
    assert!(e.message.contains("unknown field"), "{e}");
}

#[test]
fn a_bad_kind_says_what_is_expected() {
    let e = error("name: x\nkind: tool\ndescription: d\n");
    assert_eq!(
        e.to_string(),
        r#"caps/weather/CAPABILITY.yaml: kind: expected skill or reasoner, got "tool""#
    );
}

#[test]
fn type_errors_name_the_field_and_position() {
    let e = error(&format!("{MINIMAL}tags: 5\n"));
    assert_eq!(e.field.as_deref(), Some("tags"), "{e}");
    assert!(e.message.starts_with("line 4 column 7: "), "{e}");
    let e = error(&format!("{MINIMAL}tags: [a, [b]]\n"));
    assert_eq!(e.field.as_deref(), Some("tags[1]"), "{e}");
}

#[test]
fn a_yaml_syntax_error_has_line_and_column() {
    let e = error("name: x\nkind: skill\ndescription: \"unclosed\ntags: [a]\n");
    assert_eq!(e.field, None, "{e}");
    assert!(e.message.starts_with("line ") && e.message.contains(" column "), "{e}");
    let e = error("name: x\nkind: skill\ndescription: d\ntags: [a, b\n");
    assert_eq!(e.field, None, "a syntax error inside a field is still about the text: {e}");
    let e = error("name: x\n  kind: skill\n");
    assert!(e.message.starts_with("line 2 column 7: "), "{e}");
    assert_eq!(e.field, None, "{e}");
}

#[test]
fn card_rules_apply_and_name_the_field() {
    let e = error(&format!("{MINIMAL}category: Weather Data\n"));
    assert_eq!(e.field.as_deref(), Some("category"), "{e}");
    let e = error(&format!("{MINIMAL}tags: [ok, 'a,b']\n"));
    assert_eq!(e.field.as_deref(), Some("tags[1]"), "{e}");
    let e = error("name: x\nid: 'a:b'\nkind: skill\ndescription: d\n");
    assert_eq!(e.field.as_deref(), Some("id"), "{e}");
    let e = error(&format!("{MINIMAL}input_schema: [1, 2]\n"));
    assert_eq!(e.field.as_deref(), Some("input_schema"), "{e}");
}

#[test]
fn a_name_that_is_no_id_needs_an_id() {
    let e = error("name: Weather forecast\nkind: skill\ndescription: d\n");
    assert_eq!(e.field.as_deref(), Some("id"), "{e}");
    assert!(e.message.contains("add an id"), "{e}");
    let (_, cap) = capability("name: Weather forecast\nid: forecast\nkind: skill\ndescription: d\n").unwrap();
    assert_eq!((cap.id.as_str(), cap.name.as_deref()), ("forecast", Some("Weather forecast")));
}

#[test]
fn schema_json_is_the_input_schema_but_not_beside_an_inline_one() {
    let schema = r#"{ "type": "object", "properties": { "city": { "type": "string" } } }"#;
    let (_, cap) = parse::capability(&files(MINIMAL, None, Some(schema))).unwrap();
    assert_eq!(
        cap.input_schema.unwrap().get(),
        r#"{"type":"object","properties":{"city":{"type":"string"}}}"#
    );

    let inline = format!("{MINIMAL}input_schema: {{type: object}}\n");
    let e = parse::capability(&files(&inline, None, Some(schema))).unwrap_err();
    assert_eq!((e.path.as_str(), e.field.as_deref()), (YAML, Some("input_schema")));
    assert!(e.message.contains(SCHEMA), "names both: {e}");

    let e = parse::capability(&files(MINIMAL, None, Some("[1]"))).unwrap_err();
    assert_eq!(e.path, SCHEMA);
    let e = parse::capability(&files(MINIMAL, None, Some("{\n  \"type\": \n"))).unwrap_err();
    assert_eq!(e.path, SCHEMA);
    assert!(e.message.contains("line"), "{e}");
}

#[test]
fn skill_md_extends_the_description_after_a_blank_line() {
    let skill = "---\nname: get_forecast\ndescription: repeated\n---\n\n# Forecast\n\nCall it with a city.\n";
    let (_, cap) = parse::capability(&files(MINIMAL, Some(skill), None)).unwrap();
    assert_eq!(
        cap.description.as_deref(),
        Some("Daily forecast for a city.\n\n# Forecast\n\nCall it with a city."),
        "front matter left out"
    );
    let (_, cap) = parse::capability(&files(MINIMAL, Some(" \n"), None)).unwrap();
    assert_eq!(
        cap.description.as_deref(),
        Some("Daily forecast for a city."),
        "an empty SKILL.md adds nothing"
    );
}

#[test]
fn a_long_skill_md_is_cut_at_a_line_within_the_limit() {
    let line = "Use it for weather questions about one city and one day.\n";
    let skill = line.repeat(MAX_MANIFEST_DESCRIPTION_BYTES / line.len() + 10);
    let description = parse::describe(YAML, "Forecast.", Some(&skill)).unwrap();
    assert!(description.len() <= MAX_MANIFEST_DESCRIPTION_BYTES, "{}", description.len());
    assert!(description.len() > MAX_MANIFEST_DESCRIPTION_BYTES - line.len() - 1, "fills the room");
    assert!(description.ends_with("one day."), "whole lines only");
    let e = parse::describe(YAML, &"x".repeat(MAX_MANIFEST_DESCRIPTION_BYTES + 1), None).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("description"));
    // A multi-byte character across the cut and no newline at all.
    let one_line = "é".repeat(MAX_MANIFEST_DESCRIPTION_BYTES);
    let description = parse::describe(YAML, "d", Some(&one_line)).unwrap();
    assert!(description.len() <= MAX_MANIFEST_DESCRIPTION_BYTES);
}

#[test]
fn the_agent_defaults_to_the_directory_and_the_node() {
    let agent = parse::agent("caps/AGENT.yaml", None, "caps", "http://127.0.0.1:8080").unwrap();
    assert_eq!((agent.agent_id.as_str(), agent.name.as_str()), ("caps", "caps"));
    assert_eq!((agent.base_url.as_str(), agent.version.as_str()), ("http://127.0.0.1:8080", "0.0.0"));
    let yaml = "agent_id: weather\nname: Weather\ndescription: Forecasts\nversion: 1.2.0\nbase_url: http://127.0.0.1:9000\ntags: [weather]\ncategory: weather\n";
    let agent = parse::agent("caps/AGENT.yaml", Some(yaml), "caps", "http://127.0.0.1:8080").unwrap();
    assert_eq!((agent.agent_id.as_str(), agent.base_url.as_str()), ("weather", "http://127.0.0.1:9000"));
    assert_eq!((agent.version.as_str(), agent.category.as_deref()), ("1.2.0", Some("weather")));

    let e = parse::agent("caps/AGENT.yaml", Some("base_url: ftp://x\n"), "caps", "http://h").unwrap_err();
    assert_eq!((e.path.as_str(), e.field.as_deref()), ("caps/AGENT.yaml", Some("base_url")));
    let e = parse::agent("caps/AGENT.yaml", Some("agent-id: x\n"), "caps", "http://h").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("agent-id"), "{e}");
}

#[test]
fn a_directory_name_becomes_a_valid_id() {
    assert_eq!(parse::default_agent_id("weather-tools"), "weather-tools");
    assert_eq!(parse::default_agent_id("My Skills!"), "My-Skills");
    assert_eq!(parse::default_agent_id("..."), "agent");
    assert_eq!(parse::default_agent_id(""), "agent");
    assert_eq!(parse::default_agent_id(&"x".repeat(500)).len(), crate::defaults::MAX_ID_LEN);
}

fn agent_card() -> AgentCard {
    parse::agent("d/AGENT.yaml", None, "d", "http://127.0.0.1:1").unwrap()
}

fn loaded(caps: Vec<(&str, Parsed)>) -> Loaded {
    Loaded {
        dir: PathBuf::from("d"),
        present: true,
        agent: Ok(agent_card()),
        capabilities: caps.into_iter().map(|(p, c)| (PathBuf::from(p), c)).collect(),
        errors: Vec::new(),
    }
}

fn skill(id: &str) -> Parsed {
    capability(&format!("name: {id}\nkind: skill\ndescription: does {id}\n"))
}

fn served(serve: &Serve) -> Vec<String> {
    match serve {
        Serve::Card(card) => card.reasoners.iter().chain(&card.skills).map(|c| c.id.clone()).collect(),
        other => panic!("expected a card, got {other:?}"),
    }
}

#[test]
fn a_broken_manifest_keeps_its_last_good_version_and_a_deleted_one_goes() {
    let mut state = DirState::default();
    let out = state.apply(loaded(vec![("d/a", skill("a")), ("d/b", skill("b"))]));
    assert_eq!(served(&out.serve), ["a", "b"]);
    assert!(out.errors.is_empty());

    let broken = ManifestError::new("d/b/CAPABILITY.yaml", Some("kind"), "bad");
    let out = state.apply(loaded(vec![("d/a", skill("a")), ("d/b", Err(broken.clone()))]));
    assert_eq!(served(&out.serve), ["a", "b"], "b's last good version stays");
    assert_eq!(out.errors, std::slice::from_ref(&broken));

    let out = state.apply(loaded(vec![("d/b", Err(broken.clone())), ("d/c", Err(broken.clone()))]));
    assert_eq!(served(&out.serve), ["b"], "a deleted; c never was good");
    let out = state.apply(loaded(vec![]));
    assert_eq!(served(&out.serve), Vec::<String>::new(), "an empty directory keeps its agent");
}

#[test]
fn duplicate_ids_keep_the_first_in_path_order() {
    let mut state = DirState::default();
    let out = state.apply(loaded(vec![("d/a", skill("x")), ("d/b", skill("x")), ("d/c", skill("y"))]));
    assert_eq!(served(&out.serve), ["x", "y"]);
    assert_eq!(out.errors.len(), 1);
    assert_eq!(
        (out.errors[0].path.as_str(), out.errors[0].field.as_deref()),
        ("d/b/CAPABILITY.yaml", Some("id"))
    );
}

#[test]
fn without_a_good_agent_nothing_is_served_and_a_missing_directory_is_gone() {
    let mut state = DirState::default();
    let mut first = loaded(vec![("d/a", skill("a"))]);
    first.agent = Err(ManifestError::new("d/AGENT.yaml", None, "syntax"));
    let out = state.apply(first);
    assert!(matches!(out.serve, Serve::Keep), "{:?}", out.serve);
    assert_eq!(out.errors.len(), 1);

    state.apply(loaded(vec![("d/a", skill("a"))]));
    let mut broken_agent = loaded(vec![("d/a", skill("a"))]);
    broken_agent.agent = Err(ManifestError::new("d/AGENT.yaml", None, "syntax"));
    assert_eq!(served(&state.apply(broken_agent).serve), ["a"], "the last good agent stays");

    let gone = Loaded {
        present: false,
        agent: Err(ManifestError::new("d", None, "directory not found")),
        ..loaded(vec![])
    };
    let out = state.apply(gone);
    assert!(matches!(out.serve, Serve::Gone));
    assert_eq!(out.errors[0].message, "directory not found");
}

#[test]
fn a_card_over_the_size_limit_keeps_the_last_card() {
    let mut state = DirState::default();
    assert_eq!(served(&state.apply(loaded(vec![("d/a", skill("a"))])).serve), ["a"]);
    let big = "word ".repeat(MAX_MANIFEST_DESCRIPTION_BYTES / 5 - 1);
    let many: Vec<(String, Parsed)> = (0..20)
        .map(|i| {
            (format!("d/s{i:02}"), capability(&format!("name: s{i}\nkind: skill\ndescription: {big}\n")))
        })
        .collect();
    let out = state.apply(loaded(many.iter().map(|(p, c)| (p.as_str(), c.clone())).collect()));
    assert!(matches!(out.serve, Serve::Keep), "{:?}", out.serve);
    assert!(out.errors[0].message.contains("byte limit"), "{:?}", out.errors);
}

#[test]
fn a_burst_of_changes_is_one_reload_once_quiet() {
    let quiet = Duration::from_millis(500);
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut d = Debounce::new(1, quiet);
    assert!(!d.observe(1, at(0)), "unchanged");
    assert!(!d.observe(2, at(250)));
    assert!(!d.observe(3, at(500)), "still changing");
    assert!(!d.observe(3, at(750)), "quiet for 250 ms only");
    assert!(d.observe(3, at(1000)), "quiet for 500 ms");
    assert!(!d.observe(3, at(1250)), "loaded");
    assert!(!d.observe(4, at(1500)));
    assert!(!d.observe(3, at(1750)), "changed back to what is loaded");
    assert!(!d.observe(3, at(2500)));
    d.retry();
    assert!(!d.observe(3, at(2750)));
    assert!(d.observe(3, at(3250)), "loads again after a retry");
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn files_over_the_limit_are_refused_and_the_manifest_count_is_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("caps");
    write(&dir.join("big/CAPABILITY.yaml"), MINIMAL);
    write(&dir.join("big/SKILL.md"), &"x".repeat(MAX_MANIFEST_FILE_BYTES + 1));
    write(&dir.join("CAPABILITY.yaml"), "name: top\nkind: reasoner\ndescription: the directory itself\n");
    let out = load::load(&dir, "caps", "http://127.0.0.1:1");
    assert_eq!(out.capabilities.len(), 2);
    let (kind, top) = out.capabilities[0].1.as_ref().unwrap();
    assert_eq!((*kind, top.id.as_str()), (Kind::Reasoner, "top"), "the directory's own manifest comes first");
    let e = out.capabilities[1].1.as_ref().unwrap_err();
    assert!(e.path.ends_with("big/SKILL.md") && e.message.contains("limit"), "{e}");

    for i in 0..MAX_MANIFESTS_PER_DIR {
        write(
            &dir.join(format!("s{i:03}/CAPABILITY.yaml")),
            &format!("name: s{i}\nkind: skill\ndescription: d\n"),
        );
    }
    let out = load::load(&dir, "caps", "http://127.0.0.1:1");
    assert_eq!(out.capabilities.len(), MAX_MANIFESTS_PER_DIR);
    assert!(out.errors[0].message.contains("over the limit"), "{:?}", out.errors);
}

#[test]
fn the_fingerprint_sees_edits_and_new_capabilities() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(&dir.join("a/CAPABILITY.yaml"), MINIMAL);
    let first = load::fingerprint(dir);
    assert_eq!(first, load::fingerprint(dir));
    write(&dir.join("a/CAPABILITY.yaml"), &format!("{MINIMAL}tags: [x]\n"));
    let second = load::fingerprint(dir);
    assert_ne!(first, second);
    write(&dir.join("b/SKILL.md"), "text");
    assert_ne!(second, load::fingerprint(dir));
    assert_ne!(load::fingerprint(&dir.join("missing")), load::fingerprint(dir));
}
