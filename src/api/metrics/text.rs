//! The Prometheus text format (version 0.0.4) of an OpenMetrics exposition, for scrapers that do not
//! ask for OpenMetrics (`curl`, older agents, clients written against the text format).
//!
//! prometheus-client encodes OpenMetrics only. For what it writes, the two formats differ in the family
//! line of a counter (OpenMetrics names the family `x` and its sample `x_total`; 0.0.4 names both
//! `x_total`), in `unknown` (0.0.4: `untyped`) and `info` (0.0.4: an `x_info` gauge), in `# UNIT` and
//! `# EOF` (not in 0.0.4), in `_created` samples and exemplars (neither in 0.0.4) and in timestamps
//! (seconds in OpenMetrics, milliseconds in 0.0.4). Samples, label sets and values are otherwise
//! written the same way in both, so the rest passes through unchanged.

use std::fmt::Write as _;

/// Rewrites `openmetrics` (a whole exposition) in the Prometheus text format. `counters` names the
/// families that OpenMetrics types `unknown` but that are counters (by their full sample name).
pub fn to_prometheus_text(openmetrics: &str, counters: &[&str]) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // OpenMetrics writes HELP before TYPE; the 0.0.4 family name depends on the type.
    let mut help: Option<(&str, &str)> = None;
    // The current family: its OpenMetrics name and type.
    let mut family: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, help.take());
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (renamed, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                "unknown" if counters.contains(&name) => (name.to_owned(), "counter"),
                _ => (name.to_owned(), "untyped"),
            };
            match help.take() {
                Some((help_name, text)) if help_name == name => {
                    let _ = writeln!(out, "# HELP {renamed} {text}");
                }
                other => flush_help(&mut out, other),
            }
            let _ = writeln!(out, "# TYPE {renamed} {kind}");
            family = Some((name, kind));
        } else if line.starts_with('#') {
            // `# UNIT`, `# EOF`.
        } else if !line.is_empty() {
            flush_help(&mut out, help.take());
            write_sample(&mut out, line, family);
        }
    }
    flush_help(&mut out, help);
    out
}

/// A HELP line whose TYPE never came: the family is untyped and keeps its name.
fn flush_help(out: &mut String, help: Option<(&str, &str)>) {
    if let Some((name, text)) = help {
        let _ = writeln!(out, "# HELP {name} {text}");
    }
}

fn write_sample(out: &mut String, line: &str, family: Option<(&str, &str)>) {
    let series_end = series_end(line);
    let (series, rest) = line.split_at(series_end);
    let name = series.split('{').next().unwrap_or(series);
    if let Some((family, "counter" | "histogram" | "summary")) = family {
        if name.strip_prefix(family) == Some("_created") {
            return;
        }
    }
    // What follows the series: the value, then an optional timestamp, then an optional exemplar.
    let mut fields = rest.split_whitespace().take_while(|f| *f != "#");
    let Some(value) = fields.next() else { return };
    let _ = write!(out, "{series} {value}");
    if let Some(ms) = fields.next().and_then(|t| t.parse::<f64>().ok()) {
        let _ = write!(out, " {}", (ms * 1000.0).round() as i64);
    }
    out.push('\n');
}

/// Where a sample's name and label set end: label values are quoted and may hold `}`, `#` or spaces.
fn series_end(line: &str) -> usize {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    if !line[name_end..].starts_with('{') {
        return name_end;
    }
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in line.char_indices().skip_while(|(i, _)| *i <= name_end) {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return i + 1,
            _ => {}
        }
    }
    line.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_take_their_sample_name_and_the_rest_passes_through() {
        let om = "\
# HELP a_requests Requests.
# TYPE a_requests counter
a_requests_total{format=\"json\",status=\"200\"} 2
# HELP a_latency_seconds Latency.
# TYPE a_latency_seconds histogram
# UNIT a_latency_seconds seconds
a_latency_seconds_sum 0.5
a_latency_seconds_count 3
a_latency_seconds_bucket{le=\"0.1\"} 1
a_latency_seconds_bucket{le=\"+Inf\"} 3
# HELP a_agents Agents.
# TYPE a_agents gauge
a_agents 4
# EOF
";
        let text = "\
# HELP a_requests_total Requests.
# TYPE a_requests_total counter
a_requests_total{format=\"json\",status=\"200\"} 2
# HELP a_latency_seconds Latency.
# TYPE a_latency_seconds histogram
a_latency_seconds_sum 0.5
a_latency_seconds_count 3
a_latency_seconds_bucket{le=\"0.1\"} 1
a_latency_seconds_bucket{le=\"+Inf\"} 3
# HELP a_agents Agents.
# TYPE a_agents gauge
a_agents 4
";
        assert_eq!(to_prometheus_text(om, &[]), text);
    }

    #[test]
    fn unknown_is_untyped_unless_named_a_counter_and_info_is_a_gauge() {
        let om = "\
# HELP x_banned_total Banned.
# TYPE x_banned_total unknown
x_banned_total 1
# HELP x_other Other.
# TYPE x_other unknown
x_other 2
# HELP x_build Build.
# TYPE x_build info
x_build_info{version=\"1\"} 1
# EOF
";
        let text = to_prometheus_text(om, &["x_banned_total"]);
        assert!(text.contains("# TYPE x_banned_total counter\nx_banned_total 1\n"), "{text}");
        assert!(text.contains("# TYPE x_other untyped\nx_other 2\n"), "{text}");
        assert!(text.contains("# HELP x_build_info Build.\n# TYPE x_build_info gauge\n"), "{text}");
    }

    #[test]
    fn created_samples_exemplars_and_timestamps_are_made_0_0_4() {
        let om = "\
# HELP c Things.
# TYPE c counter
c_total{path=\"/a } # {b\"} 7 1520879607.789 # {trace_id=\"x\"} 1
c_created{path=\"/a } # {b\"} 1520879600
c_total{path=\"q\\\"}\"} 8 # {trace_id=\"y\"} 1
# EOF
";
        let text = to_prometheus_text(om, &[]);
        assert_eq!(
            text,
            "# HELP c_total Things.\n# TYPE c_total counter\n\
             c_total{path=\"/a } # {b\"} 7 1520879607789\n\
             c_total{path=\"q\\\"}\"} 8\n"
        );
    }

    #[test]
    fn a_help_without_type_keeps_its_name() {
        let text = to_prometheus_text("# HELP lone Alone.\nlone 1\n# EOF\n", &[]);
        assert_eq!(text, "# HELP lone Alone.\nlone 1\n");
    }
}
