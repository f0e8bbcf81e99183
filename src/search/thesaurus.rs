//! Related words for query expansion. People ask in everyday words ("nudge me at five", "paid back");
//! capabilities are documented in technical ones ("set a reminder", "expense reimbursement"). The
//! built-in thesaurus (`synonyms.txt`, compiled in) groups words that name the same thing a tool
//! does; a query term then also matches its group's words, for a fixed share of the credit of an exact
//! match (see `index::RELATED_WEIGHT`).

use std::collections::HashMap;
use std::sync::OnceLock;

use super::text::Analyzer;

/// The built-in groups, one per line.
const BUILTIN: &str = include_str!("synonyms.txt");
/// Most related terms one query term expands to (a word in many groups stops at this many, in the
/// order the groups are written).
pub const MAX_RELATED: usize = 24;
/// Most words read from one group.
const MAX_GROUP: usize = 16;

/// Stemmed term -> the stemmed terms related to it.
#[derive(Debug, Default)]
pub struct Thesaurus {
    related: HashMap<Box<str>, Box<[Box<str>]>>,
}

impl Thesaurus {
    /// Reads groups of related words: one group per line, words separated by white space, `#`
    /// starting a comment line. Words are analysed as indexed text is (stemmed, stop words dropped).
    pub fn parse(source: &str, analyzer: &Analyzer) -> Self {
        let mut related: HashMap<String, Vec<String>> = HashMap::new();
        for line in source.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut group: Vec<String> = Vec::new();
            for word in line.split_whitespace().take(MAX_GROUP) {
                analyzer.terms(word, |term| {
                    if !group.contains(&term) {
                        group.push(term);
                    }
                });
            }
            for term in &group {
                let list = related.entry(term.clone()).or_default();
                for other in &group {
                    if other != term && !list.contains(other) && list.len() < MAX_RELATED {
                        list.push(other.clone());
                    }
                }
            }
        }

        let related = related
            .into_iter()
            .filter(|(_, list)| !list.is_empty())
            .map(|(term, list)| {
                (term.into_boxed_str(), list.into_iter().map(String::into_boxed_str).collect())
            })
            .collect();
        Self { related }
    }

    /// The compiled-in thesaurus, parsed once.
    pub fn builtin() -> &'static Thesaurus {
        static BUILT: OnceLock<Thesaurus> = OnceLock::new();
        BUILT.get_or_init(|| Thesaurus::parse(BUILTIN, &Analyzer::default()))
    }

    /// Terms related to `term` (a stemmed term), without `term` itself.
    pub fn related(&self, term: &str) -> &[Box<str>] {
        self.related.get(term).map_or(&[], |list| list)
    }

    /// Terms with related terms.
    pub fn len(&self) -> usize {
        self.related.len()
    }

    pub fn is_empty(&self) -> bool {
        self.related.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_relate_their_words_both_ways_after_stemming() {
        let a = Analyzer::default();
        let t = Thesaurus::parse("# comment\nremind reminder nudge\n\ninvoice bill\nbill charge\n", &a);
        let stem = |w: &str| a.collect(w).remove(0);
        assert_eq!(t.related(&stem("nudge")), [Box::from(stem("remind"))]);
        assert_eq!(t.related(&stem("reminders")), [Box::from(stem("nudge"))]);
        let bill: Vec<&str> = t.related(&stem("bills")).iter().map(|b| &**b).collect();
        assert_eq!(bill, [stem("invoice"), stem("charge")]);
        assert!(t.related("comment").is_empty());
    }

    #[test]
    fn the_builtin_thesaurus_loads() {
        let t = Thesaurus::builtin();
        assert!(t.len() > 500, "{} terms", t.len());
        assert!(t.related(&Analyzer::default().collect("delete").remove(0)).len() >= 2);
    }
}
