//! Discovery query parsing on any query string: never panics, and two queries share a cache key
//! only when they are the same query (else one client's answer would be served to another).
#![no_main]

use agentmesh::query::Query;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // Two queries from one input, split at the first newline.
    let (a, b) = text.split_once('\n').unwrap_or((text, ""));
    let (Ok(qa), qb) = (Query::parse(a), Query::parse(b)) else { return };
    let key = qa.cache_key();
    assert_eq!(Query::parse(a).map(|q| q.cache_key()).ok(), Some(key.clone()), "cache key is stable");
    if let Ok(qb) = qb {
        if qb.cache_key() == key {
            assert_eq!(qa, qb, "different queries share the cache key {key:?}");
        }
    }
    // Every pattern matches without panicking on any text, including the input itself.
    for p in qa.reasoner.iter().chain(qa.skill.iter()).chain(qa.tags.iter()) {
        let _ = p.matches(a);
        let _ = p.matches(b);
    }
});
