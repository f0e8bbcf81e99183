//! Text to search terms: words split on punctuation, `_`, `-`, camelCase and letter-digit boundaries,
//! lower-cased, stop words dropped, stemmed (Snowball English), so `getWeatherForecast`,
//! `get_weather_forecast` and "forecasts of the weather" share their terms.

use rust_stemmers::{Algorithm, Stemmer};

/// Longest word kept; longer runs (hashes, base64) carry no meaning for ranking.
const MAX_WORD: usize = 40;

/// English function words that carry nothing for ranking. Kept short on purpose: words such as
/// "send", "get", "list" or "new" say what a capability does and stay.
const STOP_WORDS: &[&str] = &[
    "a", "about", "after", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be", "been", "being",
    "but", "by", "can", "could", "did", "do", "does", "doing", "each", "for", "from", "had", "has", "have",
    "having", "he", "her", "here", "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself",
    "just", "me", "might", "more", "most", "must", "my", "no", "nor", "not", "of", "on", "once", "only",
    "or", "other", "our", "ours", "out", "own", "please", "same", "she", "should", "so", "some", "such",
    "than", "that", "the", "their", "them", "then", "there", "these", "they", "this", "those", "through",
    "to", "too", "us", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom",
    "why", "will", "with", "would", "you", "your", "yours",
];

/// Turns text into search terms. Holds the stemmer; cheap to share.
pub struct Analyzer {
    stemmer: Stemmer,
}

impl Default for Analyzer {
    fn default() -> Self {
        Self { stemmer: Stemmer::create(Algorithm::English) }
    }
}

impl std::fmt::Debug for Analyzer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Analyzer(english)")
    }
}

impl Analyzer {
    /// Calls `emit` with each term of `text`, in order (repeats included).
    pub fn terms(&self, text: &str, mut emit: impl FnMut(String)) {
        words(text, |word| {
            // One ASCII character (`s` of "it's", `v` of "v2", a digit) carries nothing.
            if word.len() > MAX_WORD || word.len() == 1 || is_stop_word(word) {
                return;
            }
            emit(self.stemmer.stem(word).into_owned());
        });
    }

    /// The terms of `text`, collected.
    pub fn collect(&self, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.terms(text, |t| out.push(t));
        out
    }
}

fn is_stop_word(word: &str) -> bool {
    STOP_WORDS.binary_search(&word).is_ok()
}

/// Splits `text` into lower-case words: on anything not alphanumeric, at lower-to-upper case changes
/// (`getWeather`), before the last capital of a capital run followed by a lower-case letter
/// (`PDFParser` -> `pdf`, `parser`), and between letters and digits (`pdf2text`).
pub fn words(text: &str, mut emit: impl FnMut(&str)) {
    let mut word = String::new();
    let mut prev: Option<char> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if !c.is_alphanumeric() {
            flush(&mut word, &mut emit);
            prev = None;
            continue;
        }
        if let Some(p) = prev {
            let next_lower = chars.peek().is_some_and(|n| n.is_lowercase());
            let boundary = (p.is_lowercase() && c.is_uppercase())
                || (p.is_uppercase() && c.is_uppercase() && next_lower)
                || (p.is_alphabetic() && c.is_numeric())
                || (p.is_numeric() && c.is_alphabetic());
            if boundary {
                flush(&mut word, &mut emit);
            }
        }
        word.extend(c.to_lowercase());
        prev = Some(c);
    }
    flush(&mut word, &mut emit);
}

fn flush(word: &mut String, emit: &mut impl FnMut(&str)) {
    if !word.is_empty() {
        emit(word);
        word.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        words(text, |w| out.push(w.to_owned()));
        out
    }

    #[test]
    fn identifiers_split_into_words() {
        assert_eq!(split("getWeatherForecast"), ["get", "weather", "forecast"]);
        assert_eq!(split("get_weather-forecast"), ["get", "weather", "forecast"]);
        assert_eq!(split("PDFParser v2"), ["pdf", "parser", "v", "2"]);
        assert_eq!(split("pdf2text"), ["pdf", "2", "text"]);
        assert_eq!(split("Crème brûlée, naïve"), ["crème", "brûlée", "naïve"]);
        assert!(split(" \t,;").is_empty());
    }

    #[test]
    fn stop_words_are_sorted_for_binary_search() {
        assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn terms_are_stemmed_without_stop_words() {
        let a = Analyzer::default();
        assert_eq!(a.collect("the weather's forecasts"), a.collect("weather forecast"));
        assert_eq!(a.collect("sending emails"), a.collect("send_email"));
        assert_eq!(a.collect("convert currency"), a.collect("converts currencies"));
        assert!(a.collect("the of and to 7").is_empty());
    }
}
