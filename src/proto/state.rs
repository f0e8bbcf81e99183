//! One node's mesh protocol as a state machine: [`State::handle`] takes what happened (a connection, a
//! sync answer, what ingest made of a message, a timer) at time `now` and returns what to do (requests
//! to send, peers to redial, ban or declare down). It owns the sync questions in flight, the fetch
//! claims, the failure detector and the ban list; the view it reconciles is given to it as an
//! [`Index`] whenever the view changes.
//!
//! The daemon's mesh task (`net`) feeds it swarm events and carries out its actions; the simulator
//! (`simulations/sim.rs`) runs the very same state machine on a virtual network.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use libp2p::identity::PeerId;
use rand::rngs::StdRng;
use rand::seq::IteratorRandom;
use rand::SeedableRng;

use super::bans::BanList;
use super::fetch::Fetches;
use super::membership::{self, Membership, Reach};
use super::reconcile::{Index, RecordId};
use super::target::{self, Bounds, Target};
use crate::clock::Millis;
use crate::defaults::{
    FETCH_BATCH, HEARTBEATS_FROM_PEERS, MAX_LIST_FETCHES, MAX_PENDING_FETCHES, MAX_RECONCILING,
    MAX_SYNC_IN_FLIGHT,
};

/// How often the state is ticked while it is [`urgent`](State::urgent): a suspicion is checked for its
/// timeout (failure detection), the connection target dials or asks to part.
pub const DETECT_TICK: Duration = Duration::from_millis(100);
/// How often the state is ticked otherwise: what a tick then does (lapsed fetch claims and bans, the
/// shuffle, which [`State::next_tick`] keeps to its time) is due in seconds.
pub const IDLE_DETECT_TICK: Duration = Duration::from_secs(1);

/// A question to a peer over the sync protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// A reconciliation frame: answered with the next one.
    Reconcile(Vec<u8>),
    /// These records, by id (at most `FETCH_BATCH`).
    Fetch(Vec<RecordId>),
    /// This publisher's newest heartbeat and current agent list.
    List(PeerId),
    /// Whether the peer reaches this one (failure detection).
    Reach(PeerId),
    /// The newest heartbeat of every publisher the peer hears (a node that just joined asks its first
    /// peers: its agents' liveness at once, not one heartbeat interval or more later).
    Heartbeats,
    /// "May we part?" (the connection target): answered yes or no.
    Part,
}

impl Request {
    /// The question's kind, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Reconcile(_) => "reconcile",
            Request::Fetch(_) => "fetch",
            Request::List(_) => "list",
            Request::Reach(_) => "reach",
            Request::Heartbeats => "heartbeats",
            Request::Part => "part",
        }
    }
}

/// A question's number, unique per [`State`].
pub type RequestId = u64;

/// What happened.
#[derive(Debug, Clone)]
pub enum Event {
    /// The view changed: its reconciliation index as it is now.
    View(Arc<Index>),
    /// A first connection to `peer`.
    Connected(PeerId),
    /// The last connection to `peer` closed. `watched`: this node follows `peer`'s heartbeats, so its
    /// death matters here. `silent`: the node closed it because its pings failed, not the peer or its
    /// host (a process that dies closes its connections): the path went quiet (a partition, an address
    /// gone), which says nothing of the peer's life.
    Closed { peer: PeerId, watched: bool, silent: bool },
    /// A dial of `peer` failed.
    DialFailed(PeerId),
    /// A peer answered question `id`: with a reconciliation frame, or whether it reaches a peer (cards
    /// in an answer go to ingest, which reports them as `Settled`).
    Answered { id: RequestId, frame: Option<Vec<u8>>, reach: Option<Reach> },
    /// A peer answered question `id`, a request to part: whether it agreed.
    PartAnswered { id: RequestId, agreed: bool },
    /// Question `id` got no answer (the connection went, a timeout, an error).
    Failed { id: RequestId },
    /// A heartbeat relayed by `from` names records of `publisher` this node lacks.
    Missing { from: PeerId, publisher: PeerId, ids: Vec<RecordId> },
    /// A heartbeat relayed by `from` names an agent list of `publisher` this node does not hold.
    ListUnknown { from: PeerId, publisher: PeerId },
    /// These fetched records were applied or refused: no longer being fetched.
    Settled(Vec<RecordId>),
    /// `peer` sent `count` messages that verification refused.
    Refused { peer: PeerId, count: u32 },
    /// Time for an anti-entropy round with one random peer (every `SYNC_INTERVAL`).
    SyncTimer,
    /// Time to check suspicions and lapse old claims and bans, at [`State::next_tick`].
    Tick,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ask `peer` this; report the outcome as `Answered` or `Failed` with `id`.
    Send { peer: PeerId, id: RequestId, request: Request },
    /// Dial `peer` again (a suspect: a failed dial is evidence that it is gone).
    Redial(PeerId),
    /// `peer` is down: announce it, and apply it here.
    Declare(PeerId),
    /// `peer` sent too much that verification refused: disconnect it and refuse it until `Unban`.
    Ban(PeerId),
    /// `peer`'s ban ended.
    Unban(PeerId),
    /// `peer` is banned: close the connection it just made.
    Refuse(PeerId),
    /// `peer` agreed to part (the connection target): close the connections to it.
    Disconnect(PeerId),
    /// Dial `peer` for the connection target; a failure comes back as `DialFailed`.
    Dial(PeerId),
}

/// What a question in flight was for.
#[derive(Debug, Clone)]
enum Asked {
    Reconcile,
    Fetch(Vec<RecordId>),
    List,
    Reach(PeerId),
    Heartbeats,
    Part,
}

/// Settings of the state machine.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// How often a publisher's list may be fetched (the heartbeat interval).
    pub list_refetch: Millis,
    /// How many connections the node keeps.
    pub peers: Bounds,
}

/// One node's mesh protocol state.
pub struct State {
    config: Config,
    index: Arc<Index>,
    connected: BTreeSet<PeerId>,
    /// Questions awaiting their answer, and what each asked (at most `MAX_SYNC_IN_FLIGHT`).
    asked: HashMap<RequestId, (PeerId, Asked)>,
    next_id: RequestId,
    /// Records being fetched, each of one peer at a time.
    fetches: Fetches,
    /// Fetches decided on while `MAX_SYNC_IN_FLIGHT` questions awaited their answers, oldest first,
    /// with the peer that holds them: sent as answers make room. A newcomer connecting to many peers
    /// fills the window with reconciliations and list questions, and the fetches its first
    /// reconciliation decides on would otherwise wait for a heartbeat or the next sync round to show
    /// the records missing again. Unclaimed while they wait (another answer may bring them); at most
    /// `MAX_PENDING_FETCHES` records in all.
    deferred: VecDeque<(PeerId, Vec<RecordId>)>,
    deferred_records: usize,
    /// Peers whose reconciliation waits its turn, oldest first (each once): at most `MAX_RECONCILING`
    /// run at once, and none starts while this node is catching up (`FETCH_BATCH` records or more
    /// being fetched). A newcomer meets dozens of peers within milliseconds; reconciling its near-empty
    /// view with all of them would have each session list most of the view, and every answer compete
    /// with the fetches for the window. Once what it fetches has landed, each takes one round trip.
    /// Bounded by the peers connected.
    sync_waiting: VecDeque<PeerId>,
    /// When each publisher's list may be fetched again (at most `MAX_LIST_FETCHES`).
    list_fetches: HashMap<PeerId, Millis>,
    /// List questions (whom to ask, whose list) that found the window full, oldest first, each
    /// publisher once: sent as answers make room, ahead of waiting fetches (a list is what makes the
    /// held cards of its publisher alive). A newcomer hears every publisher's heartbeat at once, by
    /// digest, and asks for every list; those beyond the window used to wait for the publisher's next
    /// heartbeat. At most `MAX_LIST_FETCHES` (about 1.5 MB).
    lists_waiting: VecDeque<(PeerId, PeerId)>,
    bans: BanList,
    membership: Membership,
    target: Target,
    /// Questions for every publisher's heartbeats that failed and were asked again of another peer.
    heartbeats_retries: u32,
    rng: StdRng,
}

/// A failed question for every publisher's heartbeats is asked again of another peer at most this
/// many times in a node's life (the next start asks anew).
const HEARTBEATS_RETRIES: u32 = 3;

impl State {
    /// A node's protocol state; `seed` draws its probe helpers and sync partners.
    pub fn new(config: Config, seed: u64) -> Self {
        Self {
            config,
            index: Arc::new(Index::build(std::iter::empty())),
            connected: BTreeSet::new(),
            asked: HashMap::new(),
            next_id: 0,
            fetches: Fetches::default(),
            deferred: VecDeque::new(),
            deferred_records: 0,
            sync_waiting: VecDeque::new(),
            list_fetches: HashMap::new(),
            lists_waiting: VecDeque::new(),
            bans: BanList::default(),
            membership: Membership::default(),
            target: Target::new(config.peers),
            heartbeats_retries: 0,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The reconciliation index last given.
    pub fn index(&self) -> &Arc<Index> {
        &self.index
    }

    /// Whether `peer` is banned at `now`.
    pub fn is_banned(&self, peer: &PeerId, now: Millis) -> bool {
        self.bans.is_banned(peer, now)
    }

    /// Peers banned at `now`.
    pub fn banned(&self, now: Millis) -> usize {
        self.bans.banned(now)
    }

    /// The records question `id` fetches, if it is a fetch awaiting its answer.
    pub fn fetching(&self, id: RequestId) -> Option<&[RecordId]> {
        match self.asked.get(&id) {
            Some((_, Asked::Fetch(ids))) => Some(ids),
            _ => None,
        }
    }

    /// Questions awaiting their answer.
    pub fn in_flight(&self) -> usize {
        self.asked.len()
    }

    /// Whether a tick is due within `DETECT_TICK`: a suspicion is open (its timeout decides within a
    /// second), or the connection target has peers to dial or to ask to part.
    pub fn urgent(&self) -> bool {
        self.membership.suspecting() || self.target.unsettled()
    }

    /// When the next [`Event::Tick`] is due, asked after a tick at `now`: `DETECT_TICK` later while the
    /// state is [`urgent`](Self::urgent); otherwise `IDLE_DETECT_TICK` later, or at the connection
    /// target's shuffle if sooner (everything else a tick lapses, fetch claims and bans, may wait a
    /// second). A node at rest is not woken ten times a second for nothing. Asked again after any other
    /// event, the earlier of the two answers holds: a state that turns urgent is ticked `DETECT_TICK`
    /// later, and one that stays urgent is not put off by events.
    pub fn next_tick(&self, now: Millis) -> Millis {
        if self.urgent() {
            return now + DETECT_TICK.as_millis() as Millis;
        }
        (now + IDLE_DETECT_TICK.as_millis() as Millis).min(self.target.next_shuffle().max(now))
    }

    /// The connection target's view of this node's peers.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The peers asked to part last of all (bootstrap peers) and those asked only before them (gossip
    /// mesh peers).
    pub fn keep(&mut self, bootstrap: BTreeSet<PeerId>, mesh: BTreeSet<PeerId>) {
        self.target.keep(bootstrap, mesh);
    }

    /// This node heard of `peer` (mDNS, Kademlia): a candidate when it wants more connections.
    pub fn heard_of(&mut self, peer: PeerId, now: Millis) {
        self.target.heard_of(peer, now);
    }

    /// This node's network changed (a listen address came up): the connection target dials again at
    /// once.
    pub fn network_changed(&mut self) {
        self.target.network_changed();
    }

    /// A dial the connection target asked for could not start (no address known, say).
    pub fn dial_not_started(&mut self, peer: PeerId) {
        self.target.dial_failed(peer);
    }

    /// This node's answer to `peer` asking to part (the connection target).
    pub fn part_asked(&mut self, peer: PeerId, now: Millis) -> bool {
        let busy = self.asked.values().any(|(p, _)| *p == peer) || self.sync_waiting.contains(&peer);
        self.target.part_asked(peer, busy, now)
    }

    pub fn handle(&mut self, event: Event, now: Millis) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::View(index) => self.index = index,
            Event::Connected(peer) => {
                if self.bans.is_banned(&peer, now) {
                    out.push(Action::Refuse(peer));
                    return out;
                }
                self.connected.insert(peer);
                self.membership.connected(peer);
                self.target.connected(peer, now);
                self.start_sync(peer, &mut out);
                // Its newest heartbeat and list at once: its agents are alive as their cards land,
                // without waiting for its next heartbeat to reach this node by gossip.
                let _ = self.ask_list(peer, peer, &mut out);
                // A node with hardly any peer (just started, or back from isolation) hears nobody's
                // heartbeats yet: the first peers it meets tell it who is alive, one at a time.
                let asking = self.asked.values().any(|(_, asked)| matches!(asked, Asked::Heartbeats));
                if self.connected.len() <= HEARTBEATS_FROM_PEERS && !asking {
                    self.send(peer, Request::Heartbeats, Asked::Heartbeats, &mut out);
                }
            }
            Event::Closed { peer, watched, silent } => {
                self.connected.remove(&peer);
                self.sync_waiting.retain(|p| *p != peer);
                if self.target.closed(peer, now) {
                    // The two agreed to part: no sign of failure.
                    self.membership.parted(peer);
                } else if silent {
                    // Heartbeat age judges a peer behind a quiet path; a suspicion would be confirmed
                    // by helpers behind the same cut and declare live nodes down once it heals.
                    self.membership.went_quiet(peer);
                } else if !self.bans.is_banned(&peer, now) {
                    let actions = self.membership.closed(peer, watched, now, &mut self.rng);
                    self.detector(actions, &mut out);
                }
            }
            Event::DialFailed(peer) => {
                self.target.dial_failed(peer);
                let actions = self.membership.dial_failed(peer);
                self.detector(actions, &mut out);
            }
            Event::Answered { id, frame, reach } => self.answered(id, frame, reach, now, &mut out),
            Event::PartAnswered { id, agreed } => {
                if let Some((peer, Asked::Part)) = self.asked.remove(&id) {
                    let actions = self.target.answered(peer, Some(agreed), now);
                    self.connection_target(actions, now, &mut out);
                }
            }
            Event::Failed { id } => match self.asked.remove(&id) {
                Some((_, Asked::Fetch(ids))) => self.fetches.failed(&ids),
                Some((failed, Asked::Heartbeats)) if self.heartbeats_retries < HEARTBEATS_RETRIES => {
                    // Another peer is asked at once (a few times at most: peers of an older version
                    // never answer).
                    self.heartbeats_retries += 1;
                    let other = self.connected.iter().copied().filter(|p| *p != failed).choose(&mut self.rng);
                    if let Some(peer) = other {
                        self.send(peer, Request::Heartbeats, Asked::Heartbeats, &mut out);
                    }
                }
                Some((_, Asked::Reach(target))) => {
                    let actions = self.membership.probe_failed(target);
                    self.detector(actions, &mut out);
                }
                Some((peer, Asked::Part)) => {
                    self.target.answered(peer, None, now);
                }
                _ => {}
            },
            Event::Missing { from, publisher, ids } => {
                let peer = self.ask_for(publisher, from);
                self.fetch(peer, ids, now, &mut out);
            }
            Event::ListUnknown { from, publisher } => {
                let due = self.list_fetches.get(&publisher).is_none_or(|&at| now >= at);
                if due && self.list_fetches.len() < MAX_LIST_FETCHES {
                    // At most one fetch per publisher per heartbeat interval; the sender accepted the
                    // heartbeat, so it most likely holds the list.
                    let peer = self.ask_for(publisher, from);
                    if self.ask_list(peer, publisher, &mut out) {
                        self.list_fetches.insert(publisher, now + self.config.list_refetch);
                    }
                }
            }
            Event::Settled(ids) => self.fetches.failed(&ids),
            Event::Refused { peer, count } => {
                if self.bans.strike(peer, count, now) {
                    self.connected.remove(&peer);
                    out.push(Action::Ban(peer));
                }
            }
            Event::SyncTimer => {
                if let Some(peer) = self.connected.iter().copied().choose(&mut self.rng) {
                    self.start_sync(peer, &mut out);
                }
            }
            Event::Tick => {
                let actions = self.membership.tick(now);
                self.detector(actions, &mut out);
                self.fetches.expire(now);
                self.list_fetches.retain(|_, &mut at| at > now);
                out.extend(self.bans.expire(now).into_iter().map(Action::Unban));
                let busy: BTreeSet<PeerId> =
                    self.asked.values().map(|(p, _)| *p).chain(self.sync_waiting.iter().copied()).collect();
                let actions = self.target.tick(now, |p| busy.contains(p), &mut self.rng);
                self.connection_target(actions, now, &mut out);
            }
        }
        self.resume(now, &mut out);
        out
    }

    /// This node's answer to a reconciliation frame of a peer's.
    pub fn respond(&self, frame: &[u8]) -> Option<Vec<u8>> {
        match self.index.respond(frame) {
            Ok(reply) => Some(reply),
            Err(error) => {
                tracing::debug!(%error, "reconciliation frame refused");
                None
            }
        }
    }

    /// This node's answer to a peer asking whether it reaches `target`.
    pub fn reach(&self, target: &PeerId, now: Millis) -> Reach {
        self.membership.reach(target, now)
    }

    fn answered(
        &mut self,
        id: RequestId,
        frame: Option<Vec<u8>>,
        reach: Option<Reach>,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let Some((peer, asked)) = self.asked.remove(&id) else { return };
        match asked {
            Asked::Fetch(ids) => self.fetches.answered(&ids, now),
            Asked::Reach(target) => {
                let actions = self.membership.answer(target, reach.unwrap_or(Reach::Unknown));
                self.detector(actions, out);
            }
            Asked::Reconcile => {
                let Some(frame) = frame else { return };
                match self.index.step(&frame) {
                    Ok(step) => {
                        if let Some(next) = step.next {
                            self.send(peer, Request::Reconcile(next), Asked::Reconcile, out);
                        }
                        if !step.need.is_empty() {
                            tracing::debug!(%peer, need = step.need.len(), have = step.have, "reconciled");
                            self.fetch(peer, step.need, now, out);
                        }
                    }
                    Err(error) => tracing::debug!(%peer, %error, "reconciliation frame refused"),
                }
            }
            Asked::List | Asked::Heartbeats => {}
            // Answered as `PartAnswered`; any other answer is no agreement.
            Asked::Part => {
                self.target.answered(peer, None, now);
            }
        }
    }

    /// Starts an anti-entropy round with `peer` (reconciliation first, then fetches of what it shows),
    /// or queues it for its turn.
    fn start_sync(&mut self, peer: PeerId, out: &mut Vec<Action>) {
        if self.may_reconcile() {
            self.reconcile(peer, out);
        } else if !self.sync_waiting.contains(&peer) {
            self.sync_waiting.push_back(peer);
        }
    }

    fn reconcile(&mut self, peer: PeerId, out: &mut Vec<Action>) {
        match self.index.initiate() {
            Ok(frame) => {
                self.send(peer, Request::Reconcile(frame), Asked::Reconcile, out);
            }
            Err(error) => tracing::warn!(%error, "cannot start a reconciliation"),
        }
    }

    /// Asks `peer` for the records `ids` names that nobody is fetching yet, in pipelined requests; what
    /// the window has no room for waits its turn.
    fn fetch(&mut self, peer: PeerId, ids: Vec<RecordId>, now: Millis, out: &mut Vec<Action>) {
        for batch in self.fetches.claim(ids, now) {
            if !self.send(peer, Request::Fetch(batch.clone()), Asked::Fetch(batch.clone()), out) {
                // Not sent: the claims are freed, and the batch waits for room.
                self.fetches.failed(&batch);
                if self.deferred_records + batch.len() <= MAX_PENDING_FETCHES {
                    self.deferred_records += batch.len();
                    self.deferred.push_back((peer, batch));
                }
            }
        }
    }

    /// Sends waiting fetches while the window has room: to peers still connected, each record unless
    /// the view holds it by now or another fetch claimed it meanwhile.
    fn resume(&mut self, now: Millis, out: &mut Vec<Action>) {
        while self.asked.len() < MAX_SYNC_IN_FLIGHT {
            let Some((peer, publisher)) = self.lists_waiting.pop_front() else { break };
            if self.connected.contains(&peer) {
                self.send(peer, Request::List(publisher), Asked::List, out);
            } else {
                // Whoever relays the publisher's next heartbeat may be asked at once.
                self.list_fetches.remove(&publisher);
            }
        }
        while self.asked.len() < MAX_SYNC_IN_FLIGHT {
            let Some((peer, mut batch)) = self.deferred.pop_front() else { break };
            self.deferred_records -= batch.len();
            batch.retain(|id| self.index.position(id).is_none());
            if self.connected.contains(&peer) && !batch.is_empty() {
                self.fetch(peer, batch, now, out);
            }
        }
        while self.may_reconcile() {
            let Some(peer) = self.sync_waiting.pop_front() else { break };
            if self.connected.contains(&peer) && !self.bans.is_banned(&peer, now) {
                self.reconcile(peer, out);
            }
        }
    }

    /// Reconciliations under way (each has one frame in flight at a time).
    fn reconciling(&self) -> usize {
        self.asked.values().filter(|(_, asked)| matches!(asked, Asked::Reconcile)).count()
    }

    /// Whether another reconciliation may start now: fewer than `MAX_RECONCILING` under way, and this
    /// node not catching up (fewer than `FETCH_BATCH` records being fetched or waiting to be).
    fn may_reconcile(&self) -> bool {
        self.reconciling() < MAX_RECONCILING && self.fetches.claimed() + self.deferred_records < FETCH_BATCH
    }

    /// Peers whose reconciliation waits its turn.
    pub fn sync_waiting(&self) -> usize {
        self.sync_waiting.len()
    }

    /// Asks `peer` for `publisher`'s list, or queues the question while the window is full; false if
    /// neither (the queue is full).
    fn ask_list(&mut self, peer: PeerId, publisher: PeerId, out: &mut Vec<Action>) -> bool {
        if self.send(peer, Request::List(publisher), Asked::List, out) {
            return true;
        }
        if self.lists_waiting.len() >= MAX_LIST_FETCHES {
            return false;
        }
        // A publisher is queued once: its rate-limit entry keeps it from being asked again meanwhile,
        // but a connection's own question has none.
        if !self.list_fetches.contains_key(&publisher)
            && self.lists_waiting.iter().any(|(_, p)| *p == publisher)
        {
            return true;
        }
        self.lists_waiting.push_back((peer, publisher));
        true
    }

    /// List questions waiting for room in the window.
    pub fn lists_waiting(&self) -> usize {
        self.lists_waiting.len()
    }

    /// Records whose fetch waits for room in the window.
    pub fn deferred(&self) -> usize {
        self.deferred_records
    }

    /// Sends a question unless `MAX_SYNC_IN_FLIGHT` are already awaiting answers (the work is then
    /// picked up again by the next heartbeat or sync round); false if not sent.
    fn send(&mut self, peer: PeerId, request: Request, asked: Asked, out: &mut Vec<Action>) -> bool {
        if self.asked.len() >= MAX_SYNC_IN_FLIGHT {
            tracing::debug!(%peer, "sync request not sent: too many in flight");
            return false;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.asked.insert(id, (peer, asked));
        out.push(Action::Send { peer, id, request });
        true
    }

    /// Whom to ask for a publisher's records: the publisher itself when connected (it surely holds its
    /// newest), else the peer that relayed what named them.
    fn ask_for(&self, publisher: PeerId, relay: PeerId) -> PeerId {
        if self.connected.contains(&publisher) {
            publisher
        } else {
            relay
        }
    }

    /// Carries the connection target's decisions into actions: a request to part becomes a `Part`
    /// question.
    fn connection_target(&mut self, actions: Vec<target::Action>, now: Millis, out: &mut Vec<Action>) {
        for action in actions {
            match action {
                target::Action::AskToPart(peer) => {
                    if !self.send(peer, Request::Part, Asked::Part, out) {
                        // The window is full: asked again at a later tick.
                        self.target.answered(peer, None, now);
                    }
                }
                target::Action::Disconnect(peer) => out.push(Action::Disconnect(peer)),
                target::Action::Dial(peer) => out.push(Action::Dial(peer)),
            }
        }
    }

    /// Carries the failure detector's decisions into actions: probes become `Reach` questions.
    fn detector(&mut self, actions: Vec<membership::Action>, out: &mut Vec<Action>) {
        for action in actions {
            match action {
                membership::Action::Probe { helper, target } => {
                    if !self.send(helper, Request::Reach(target), Asked::Reach(target), out) {
                        let more = self.membership.probe_failed(target);
                        self.detector(more, out);
                    }
                }
                membership::Action::Redial(peer) => out.push(Action::Redial(peer)),
                membership::Action::Declare(peer) => out.push(Action::Declare(peer)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults::FETCH_BATCH;
    use crate::proto::reconcile::record_id;

    const CONFIG: Config = Config {
        list_refetch: 2_000,
        peers: Bounds { low: crate::defaults::PEER_LOW, high: crate::defaults::PEER_HIGH },
    };

    fn index(records: &[(PeerId, &str, u64)]) -> Arc<Index> {
        Arc::new(Index::build(records.iter().map(|(p, a, s)| (p, *a, *s))))
    }

    fn sends(actions: &[Action]) -> Vec<(PeerId, RequestId, Request)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send { peer, id, request } => Some((*peer, *id, request.clone())),
                _ => None,
            })
            .collect()
    }

    /// A node with few peers asks them, one at a time, for every publisher's newest heartbeat; a failed
    /// question goes to another peer; a node with enough peers does not ask.
    #[test]
    fn a_node_with_few_peers_asks_who_is_alive_one_peer_at_a_time() {
        let mut s = State::new(CONFIG, 1);
        let asks = |actions: &[Action]| -> Vec<(PeerId, RequestId)> {
            sends(actions)
                .into_iter()
                .filter(|(_, _, r)| *r == Request::Heartbeats)
                .map(|(p, id, _)| (p, id))
                .collect()
        };
        let (a, b, c, d) = (PeerId::random(), PeerId::random(), PeerId::random(), PeerId::random());
        let first = asks(&s.handle(Event::Connected(a), 0));
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].0, a);
        assert!(asks(&s.handle(Event::Connected(b), 0)).is_empty(), "one question at a time");
        let again = asks(&s.handle(Event::Failed { id: first[0].1 }, 10));
        assert_eq!(again.iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![b], "asked of the other peer");
        s.handle(Event::Answered { id: again[0].1, frame: None, reach: None }, 20);
        assert!(asks(&s.handle(Event::Connected(c), 30)).is_empty(), "three peers: enough");
        // Isolated, then back: it asks again.
        for peer in [a, b, c] {
            s.handle(Event::Closed { peer, watched: false, silent: false }, 40);
        }
        assert_eq!(asks(&s.handle(Event::Connected(d), 50)).len(), 1);
    }

    /// Two state machines reconcile through their actions alone, and the one missing records fetches
    /// exactly those, of one peer.
    #[test]
    fn a_connection_reconciles_and_fetches_what_is_missing() {
        let (b, p) = (PeerId::random(), PeerId::random());
        let mut sa = State::new(CONFIG, 1);
        let mut sb = State::new(CONFIG, 2);
        let all: Vec<(PeerId, &str, u64)> = vec![(p, "x", 1), (p, "y", 2), (p, "z", 3)];
        sa.handle(Event::View(index(&all[..1])), 0);
        sb.handle(Event::View(index(&all)), 0);
        let first = sends(&sa.handle(Event::Connected(b), 0));
        assert!(matches!(first[0].2, Request::Reconcile(_)));
        assert_eq!(first[1].2, Request::List(b));
        let mut pending = vec![first[0].clone()];
        let mut fetched = Vec::new();
        while let Some((peer, id, request)) = pending.pop() {
            assert_eq!(peer, b);
            match request {
                Request::Reconcile(frame) => {
                    let reply = sb.respond(&frame).unwrap();
                    let actions = sa.handle(Event::Answered { id, frame: Some(reply), reach: None }, 10);
                    pending.extend(sends(&actions));
                }
                Request::Fetch(ids) => fetched.extend(ids),
                other => panic!("unexpected {other:?}"),
            }
        }
        let mut want = vec![record_id(&p, "y", 2), record_id(&p, "z", 3)];
        want.sort();
        fetched.sort();
        assert_eq!(fetched, want);
        // The same records shown missing by a heartbeat are not fetched twice.
        let again = sa.handle(Event::Missing { from: b, publisher: p, ids: want.clone() }, 20);
        assert!(sends(&again).is_empty());
    }

    #[test]
    fn a_closed_peer_is_declared_only_with_evidence() {
        let (h1, dead) = (PeerId::random(), PeerId::random());
        let mut s = State::new(CONFIG, 3);
        s.handle(Event::Connected(h1), 0);
        s.handle(Event::Connected(dead), 0);
        let actions = s.handle(Event::Closed { peer: dead, watched: true, silent: false }, 100);
        let probe = sends(&actions).into_iter().find(|(_, _, r)| *r == Request::Reach(dead)).unwrap();
        assert_eq!(probe.0, h1);
        assert!(actions.contains(&Action::Redial(dead)));
        // The helper lost it too, and the redial failed: declared.
        let actions = s.handle(Event::Answered { id: probe.1, frame: None, reach: Some(Reach::Lost) }, 150);
        let actions = [actions, s.handle(Event::DialFailed(dead), 160)].concat();
        assert!(actions.contains(&Action::Declare(dead)));
        // A peer whose helper still reaches it is not.
        let other = PeerId::random();
        s.handle(Event::Connected(other), 200);
        let actions = s.handle(Event::Closed { peer: other, watched: true, silent: false }, 300);
        let probe = sends(&actions).into_iter().find(|(_, _, r)| *r == Request::Reach(other)).unwrap();
        let actions =
            s.handle(Event::Answered { id: probe.1, frame: None, reach: Some(Reach::Reached) }, 310);
        let later = s.handle(Event::Tick, 5_000);
        assert!(!actions.contains(&Action::Declare(other)) && !later.contains(&Action::Declare(other)));
        // A connection closed because its pings failed (a partition, say): no probe, no redial, and
        // nothing declared however long nothing is heard; heartbeat age judges the peer.
        let quiet = PeerId::random();
        s.handle(Event::Connected(quiet), 6_000);
        let actions = s.handle(Event::Closed { peer: quiet, watched: true, silent: true }, 7_000);
        assert!(sends(&actions).is_empty() && !actions.contains(&Action::Redial(quiet)), "{actions:?}");
        let later = s.handle(Event::Tick, 60_000);
        assert!(!later.contains(&Action::Declare(quiet)));
    }

    #[test]
    fn it_is_ticked_every_100_ms_only_while_a_decision_is_due_within_a_second() {
        // No low bound: the connection target has nothing to dial, so suspicions alone decide.
        let mut s = State::new(Config { peers: Bounds { low: 0, high: 16 }, ..CONFIG }, 5);
        assert_eq!(s.next_tick(0), 0, "the first shuffle is due at once");
        s.handle(Event::Tick, 0);
        assert_eq!(s.next_tick(0), 1_000, "at rest: a second");
        let shuffle = crate::defaults::SHUFFLE_INTERVAL.as_millis() as Millis;
        assert_eq!(s.next_tick(shuffle - 300), shuffle, "the shuffle keeps its time");
        let (helper, peer) = (PeerId::random(), PeerId::random());
        s.handle(Event::Connected(helper), 10);
        s.handle(Event::Connected(peer), 10);
        assert_eq!(s.next_tick(20), 1_020);
        s.handle(Event::Closed { peer, watched: true, silent: false }, 30);
        assert_eq!(s.next_tick(30), 130, "a suspicion's timeout is a second away");
        // Declared at the timeout (the redial never connected), and at rest again.
        let timeout = 30 + crate::defaults::SUSPECT_TIMEOUT.as_millis() as Millis;
        assert!(s.handle(Event::Tick, timeout).contains(&Action::Declare(peer)));
        assert_eq!(s.next_tick(timeout), timeout + 1_000);
    }

    #[test]
    fn strikes_ban_and_bans_end() {
        let bad = PeerId::random();
        let mut s = State::new(CONFIG, 4);
        s.handle(Event::Connected(bad), 0);
        let actions = s.handle(Event::Refused { peer: bad, count: 1_000 }, 10);
        assert_eq!(actions, vec![Action::Ban(bad)]);
        assert_eq!(s.handle(Event::Connected(bad), 20), vec![Action::Refuse(bad)]);
        let end = 10 + crate::defaults::BAN_FOR.as_millis() as Millis + 1;
        assert!(s.handle(Event::Tick, end).contains(&Action::Unban(bad)));
    }

    /// A newcomer meeting many peers at once reconciles with a few; the rest wait while it fetches
    /// what the first answers showed, and go once those records have landed.
    #[test]
    fn a_catching_up_node_reconciles_with_a_few_peers_at_a_time() {
        let mut s = State::new(CONFIG, 3);
        let peers: Vec<PeerId> = (0..10).map(|_| PeerId::random()).collect();
        let reconciles = |actions: &[Action]| -> Vec<(PeerId, RequestId)> {
            sends(actions)
                .into_iter()
                .filter(|(_, _, r)| matches!(r, Request::Reconcile(_)))
                .map(|(p, id, _)| (p, id))
                .collect()
        };
        let mut started = Vec::new();
        for peer in &peers {
            started.extend(reconciles(&s.handle(Event::Connected(*peer), 0)));
        }
        assert_eq!(started.len(), MAX_RECONCILING);
        assert_eq!(s.sync_waiting(), peers.len() - MAX_RECONCILING);
        // The first peer's records, as the answer to this node's (empty) first frame shows them.
        let first = started[0].0;
        let records: Vec<(PeerId, String, u64)> = (0..1_000).map(|i| (first, format!("a{i}"), 1)).collect();
        let theirs = Index::build(records.iter().map(|(p, a, s)| (p, a.as_str(), *s)));
        let mut frame = theirs.respond(&s.index().initiate().unwrap()).unwrap();
        let mut id = started[0].1;
        let mut fetches: Vec<(RequestId, Vec<RecordId>)> = Vec::new();
        for round in 0.. {
            assert!(round < 16, "1,000 records reconcile in a few rounds");
            let actions = s.handle(Event::Answered { id, frame: Some(frame.clone()), reach: None }, 1);
            fetches.extend(sends(&actions).into_iter().filter_map(|(_, id, r)| match r {
                Request::Fetch(ids) => Some((id, ids)),
                _ => None,
            }));
            let more = reconciles(&actions);
            assert!(more.iter().all(|(p, _)| *p == first), "no reconciliation starts while catching up");
            let Some(&(_, next)) = more.first() else { break };
            let Some(Request::Reconcile(ours)) =
                sends(&actions).into_iter().find(|(_, i, _)| *i == next).map(|(_, _, r)| r)
            else {
                unreachable!()
            };
            (id, frame) = (next, theirs.respond(&ours).unwrap());
        }
        assert_eq!(fetches.iter().map(|(_, ids)| ids.len()).sum::<usize>(), 1_000, "all it holds is fetched");
        // The other sessions end (their peers hold what this node holds): still none while fetching.
        for (_, id) in &started[1..] {
            let actions = s.handle(Event::Failed { id: *id }, 2);
            assert!(reconciles(&actions).is_empty());
        }
        assert_eq!(s.sync_waiting(), peers.len() - MAX_RECONCILING);
        // The records land: the waiting peers go, a few at a time.
        s.handle(Event::View(Arc::new(theirs)), 3);
        let mut next = Vec::new();
        for (id, ids) in fetches {
            s.handle(Event::Answered { id, frame: None, reach: None }, 4);
            next.extend(reconciles(&s.handle(Event::Settled(ids), 4)));
        }
        assert_eq!(next.len(), MAX_RECONCILING);
        assert!(next.iter().all(|(p, _)| !started.iter().any(|(q, _)| q == p)), "each peer once");
        // A peer that went while waiting is skipped.
        let gone = peers[peers.len() - 1];
        s.handle(Event::Closed { peer: gone, watched: false, silent: false }, 5);
        let mut rest = Vec::new();
        for (_, id) in next {
            rest.extend(reconciles(&s.handle(Event::Failed { id }, 6)));
        }
        assert_eq!(rest.len(), peers.len() - 2 * MAX_RECONCILING - 1);
        assert!(rest.iter().all(|(p, _)| *p != gone));
        assert_eq!(s.sync_waiting(), 0);
    }

    /// Lists asked for while the window is full wait their turn, each publisher once, ahead of
    /// waiting fetches; those of a peer gone are dropped.
    #[test]
    fn list_questions_wait_for_room_in_the_window() {
        let mut s = State::new(CONFIG, 7);
        let (relay, other) = (PeerId::random(), PeerId::random());
        let mut in_flight: Vec<RequestId> = sends(&s.handle(Event::Connected(relay), 0))
            .into_iter()
            .chain(sends(&s.handle(Event::Connected(other), 0)))
            .map(|(_, id, _)| id)
            .collect();
        // The window fills with fetches.
        let ids: Vec<RecordId> = (0..100_000u64).map(|i| record_id(&relay, "a", i)).collect();
        in_flight.extend(
            sends(&s.handle(Event::Missing { from: relay, publisher: relay, ids }, 0))
                .iter()
                .map(|(_, id, _)| *id),
        );
        assert_eq!(s.in_flight(), MAX_SYNC_IN_FLIGHT);
        assert_eq!(in_flight.len(), MAX_SYNC_IN_FLIGHT);
        let publishers: Vec<PeerId> = (0..100).map(|_| PeerId::random()).collect();
        for publisher in &publishers {
            assert!(sends(&s.handle(Event::ListUnknown { from: relay, publisher: *publisher }, 1)).is_empty());
            // Heard again at once: still one question.
            s.handle(Event::ListUnknown { from: relay, publisher: *publisher }, 1);
        }
        assert_eq!(s.lists_waiting(), publishers.len());
        // Each answer makes room for the oldest waiting list first: every question in flight answered
        // once (the oldest first), and each list question as it goes out.
        let mut asked = Vec::new();
        let mut in_flight: VecDeque<RequestId> = in_flight.into();
        while asked.len() < publishers.len() {
            let id = in_flight.pop_front().expect("an answer makes room for the next waiting list");
            for (peer, id, request) in sends(&s.handle(Event::Answered { id, frame: None, reach: None }, 2)) {
                if let Request::List(publisher) = request {
                    assert_eq!(peer, relay);
                    asked.push(publisher);
                    in_flight.push_back(id);
                } else {
                    panic!("a fetch went before a waiting list: {request:?}");
                }
            }
        }
        assert_eq!(asked, publishers, "each once, oldest first");
        assert_eq!(s.lists_waiting(), 0);
        // A list waiting on a peer that went is dropped; its publisher may be asked again.
        let late = PeerId::random();
        s.handle(Event::ListUnknown { from: other, publisher: late }, 3);
        assert_eq!(s.lists_waiting(), 1);
        s.handle(Event::Closed { peer: other, watched: false, silent: false }, 4);
        s.handle(Event::Answered { id: in_flight[0], frame: None, reach: None }, 5);
        assert_eq!(s.lists_waiting(), 0);
        let again = sends(&s.handle(Event::ListUnknown { from: relay, publisher: late }, 6));
        // The window is full again (waiting fetches took the room): asked anew, so it waits.
        assert!(again.is_empty());
        assert_eq!(s.lists_waiting(), 1, "its rate limit went with the dropped question");
    }

    #[test]
    fn questions_in_flight_are_bounded() {
        let peer = PeerId::random();
        let mut s = State::new(CONFIG, 5);
        s.handle(Event::Connected(peer), 0);
        let ids: Vec<RecordId> = (0..100_000u64).map(|i| record_id(&peer, "a", i)).collect();
        let actions = s.handle(Event::Missing { from: peer, publisher: peer, ids }, 0);
        assert_eq!(s.in_flight(), MAX_SYNC_IN_FLIGHT);
        // The connection asked three questions: a reconciliation, the peer's list, who is alive.
        let sent = sends(&actions);
        assert_eq!(sent.len(), MAX_SYNC_IN_FLIGHT - 3);
        // The rest waits its turn, bounded (those sent hold their claims).
        let waiting = 100_000 - (MAX_SYNC_IN_FLIGHT - 3) * FETCH_BATCH;
        assert_eq!(s.deferred(), waiting.min(MAX_PENDING_FETCHES));
        // An answer makes room: the next batch goes at once, to the same peer, none asked twice.
        let (_, id, _) = sent[0].clone();
        let next = sends(&s.handle(Event::Answered { id, frame: None, reach: None }, 1));
        assert_eq!(next.len(), 1);
        assert_eq!(s.in_flight(), MAX_SYNC_IN_FLIGHT);
        let asked = |r: &Request| match r {
            Request::Fetch(ids) => ids.clone(),
            _ => Vec::new(),
        };
        let before: std::collections::HashSet<RecordId> =
            sent.iter().flat_map(|(_, _, r)| asked(r)).collect();
        assert_eq!(next[0].0, peer);
        assert_eq!(asked(&next[0].2).len(), FETCH_BATCH);
        assert!(asked(&next[0].2).iter().all(|id| !before.contains(id)));
        // A failure makes room too; a peer gone takes its waiting fetches with it.
        let (_, id, _) = sent[1].clone();
        assert_eq!(sends(&s.handle(Event::Failed { id }, 2)).len(), 1);
        s.handle(Event::Closed { peer, watched: false, silent: false }, 3);
        let (_, id, _) = sent[2].clone();
        assert!(sends(&s.handle(Event::Failed { id }, 4)).is_empty());
        assert_eq!(s.deferred(), 0);
    }
}
