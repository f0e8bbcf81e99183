use super::*;
use crate::card::AgentCard;
use crate::registry::health::Reported;
use crate::registry::{Origin, RecordKey};
use libp2p::PeerId;

fn entry(id: &str, publisher: PeerId, seq: u64) -> Arc<Entry> {
    let card =
        AgentCard::from_json(format!(r#"{{"agent_id":"{id}","base_url":"http://h"}}"#).as_bytes()).unwrap();
    Arc::new(Entry::new(RecordKey { agent_id: id.into(), publisher }, seq, &card, Origin::Remote, 0))
}

fn kinds(changes: &[Change]) -> Vec<(Kind, String, Health)> {
    changes.iter().map(|c| (c.kind, c.entry.key.agent_id.clone(), c.health)).collect()
}

#[test]
fn diff_finds_additions_updates_removals_and_health_changes_by_age() {
    let t = Thresholds::default();
    let p = PeerId::random();
    let (a, b, c) = (entry("a", p, 1), entry("b", p, 1), entry("c", p, 1));
    for e in [&a, &b, &c] {
        e.beat(1_000, Reported::Ready);
    }
    let (changes, view) = diff(&Vec::new(), &[a.clone(), b.clone()], 1_000, &t);
    assert_eq!(
        kinds(&changes),
        [(Kind::Added, "a".into(), Health::Active), (Kind::Added, "b".into(), Health::Active)]
    );

    // Nothing changed: nothing to say.
    let (changes, view) = diff(&view, &[a.clone(), b.clone()], 1_001, &t);
    assert!(changes.is_empty());

    // b re-published at a higher seq, a removed, c added.
    let b2 = entry("b", p, 2);
    b2.beat(1_000, Reported::Ready);
    let (changes, view) = diff(&view, &[b2.clone(), c.clone()], 1_002, &t);
    assert_eq!(
        kinds(&changes),
        [
            (Kind::Removed, "a".into(), Health::Active),
            (Kind::Updated, "b".into(), Health::Active),
            (Kind::Added, "c".into(), Health::Active)
        ]
    );

    // Silence alone makes them degraded, then inactive: one event each, at the crossing.
    let degraded_at = 1_000 + t.degraded_after.as_millis() as u64;
    let (changes, view) = diff(&view, &[b2.clone(), c.clone()], degraded_at, &t);
    assert_eq!(changes.len(), 2);
    assert!(changes.iter().all(|c| c.kind == Kind::HealthChanged
        && c.health == Health::Degraded
        && c.previous == Some(Health::Active)));
    let (changes, _) = diff(&view, &[b2, c], degraded_at + 1, &t);
    assert!(changes.is_empty());
}

#[test]
fn the_same_agent_from_two_publishers_is_two_records() {
    let t = Thresholds::default();
    let (p, q) = (PeerId::random(), PeerId::random());
    let (first, second) = if p < q { (p, q) } else { (q, p) };
    let (changes, view) = diff(&Vec::new(), &[entry("a", first, 1)], 0, &t);
    assert_eq!(changes.len(), 1);
    let (changes, _) = diff(&view, &[entry("a", first, 1), entry("a", second, 1)], 0, &t);
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].entry.key.publisher, second);
}

#[test]
fn subscribers_resume_from_their_last_event_or_get_the_view() {
    let t = Thresholds::default();
    let p = PeerId::random();
    let watch = Watch::new(&[entry("a", p, 1)], 0, &t, 1_000);
    assert_eq!(watch.advance(&[entry("a", p, 1), entry("b", p, 1)], 0, &t), 1);
    assert_eq!(watch.advance(&[entry("b", p, 1)], 0, &t), 1);

    let fresh = watch.subscribe(None);
    assert_eq!(fresh.head, 1_002);
    assert!(matches!(fresh.start, Start::View { ref view, reset: false } if view.len() == 1));

    let resumed = watch.subscribe(Some(1_001));
    let Start::Resume(events) = resumed.start else { panic!("resumable") };
    assert_eq!(events.iter().map(|e| (e.id, e.kind)).collect::<Vec<_>>(), [(1_002, Kind::Removed)]);
    assert!(matches!(watch.subscribe(Some(1_000)).start, Start::Resume(ref e) if e.len() == 2));
    assert!(matches!(watch.subscribe(Some(1_002)).start, Start::Resume(ref e) if e.is_empty()));

    // From before this node started, or from the future: the view, flagged as a reset.
    for id in [5, 999, 2_000] {
        assert!(matches!(watch.subscribe(Some(id)).start, Start::View { reset: true, .. }), "{id}");
    }

    // Past the buffer, the oldest events are gone and cannot be resumed from.
    for i in 0..WATCH_BUFFER as u64 {
        watch.advance(&[entry("b", p, i + 2)], 0, &t);
    }
    assert!(matches!(watch.subscribe(Some(1_001)).start, Start::View { reset: true, .. }));
    let mut live = watch.subscribe(None).live;
    watch.advance(&[], 0, &t);
    assert_eq!(live.try_recv().unwrap().kind, Kind::Removed);
}

/// `refresh` compares only when the registry's tag moved or a health is due to change by age: a change
/// the tag does not show is not seen until it does, and ageing is seen at its crossing.
#[test]
fn refresh_compares_when_the_tag_moves_or_a_health_is_due() {
    let t = Thresholds::default();
    let p = PeerId::random();
    let a = entry("a", p, 1);
    a.beat(1_000, Reported::Ready);
    let watch = Watch::new(&[], 0, &t, 0);
    assert_eq!(watch.refresh(std::slice::from_ref(&a), (1, 0), 1_000, &t), 1, "added");
    a.beat(1_100, Reported::Offline);
    assert_eq!(
        watch.refresh(std::slice::from_ref(&a), (1, 0), 1_200, &t),
        0,
        "same tag, nothing due: skipped"
    );
    assert_eq!(watch.refresh(std::slice::from_ref(&a), (1, 1), 1_200, &t), 1, "the epoch moved");

    let b = entry("b", p, 1);
    b.beat(1_000, Reported::Ready);
    let watch = Watch::new(&[], 0, &t, 0);
    let degraded_at = 1_000 + t.degraded_after.as_millis() as u64;
    assert_eq!(watch.refresh(std::slice::from_ref(&b), (1, 0), 1_000, &t), 1);
    assert_eq!(watch.refresh(std::slice::from_ref(&b), (1, 0), degraded_at - 1, &t), 0);
    assert_eq!(watch.refresh(std::slice::from_ref(&b), (1, 0), degraded_at, &t), 1, "degraded by age");
}

/// Asleep, the watch compares nothing and holds nothing; woken, it takes the view as it is without
/// events, then reports changes as before.
#[test]
fn an_asleep_watch_holds_no_view_and_starts_from_the_view_when_woken() {
    let t = Thresholds::default();
    let p = PeerId::random();
    let (a, b) = (entry("a", p, 1), entry("b", p, 1));
    let watch = Watch::asleep(1_000);
    assert_eq!(watch.refresh(std::slice::from_ref(&a), (1, 0), 1_000, &t), 0);
    assert_eq!(Arc::strong_count(&a), 1, "an asleep watch keeps no entry alive");

    assert_eq!(watch.wake(std::slice::from_ref(&a), (2, 0), 1_100, &t), 0, "what came before is the view");
    assert_eq!(watch.refresh(&[a.clone(), b.clone()], (3, 0), 1_200, &t), 1, "b added");
    let sub = watch.subscribe(None);
    assert!(matches!(sub.start, Start::View { ref view, reset: false } if view.len() == 2));
    assert_eq!(sub.head, 1_001);
    assert!(matches!(watch.subscribe(Some(1_000)).start, Start::Resume(ref e) if e.len() == 1));
}
