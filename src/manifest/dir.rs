//! What one manifest directory serves, and when its files have settled. Pure: no file system, no clock
//! (the caller passes `now`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{Kind, ManifestError, CAPABILITY_FILE};
use crate::card::{AgentCard, Capability};

/// What one capability's files gave: the capability and its kind, or what is wrong.
pub type Parsed = Result<(Kind, Capability), ManifestError>;

/// One directory as read from disk: the input of [`DirState::apply`].
#[derive(Debug)]
pub struct Loaded {
    /// The directory as configured (for errors about it as a whole).
    pub dir: PathBuf,
    /// Whether the directory exists (and is a directory).
    pub present: bool,
    /// The agent from `AGENT.yaml` and the defaults (for a missing directory, the error saying so).
    pub agent: Result<AgentCard, ManifestError>,
    /// Each directory holding a `CAPABILITY.yaml`, in path order, with what its files gave.
    pub capabilities: Vec<(PathBuf, Parsed)>,
    /// Problems with the directory as a whole (too many manifests, an unreadable listing).
    pub errors: Vec<ManifestError>,
}

/// What the directory should serve after a load.
#[derive(Debug)]
pub enum Serve {
    /// Register this card (an unchanged card writes nothing).
    Card(Box<AgentCard>),
    /// Leave whatever is registered as it is: the agent's own manifest has never been good, or the
    /// card as a whole is refused (over the size limit).
    Keep,
    /// The directory is gone: deregister its agent.
    Gone,
}

/// The outcome of one load: what to serve, and every problem found.
#[derive(Debug)]
pub struct Outcome {
    pub serve: Serve,
    pub errors: Vec<ManifestError>,
}

/// The last good version of each manifest of one directory. A manifest that fails keeps its last
/// good version; one whose `CAPABILITY.yaml` is gone is dropped.
#[derive(Debug, Default)]
pub struct DirState {
    agent: Option<AgentCard>,
    good: BTreeMap<PathBuf, (Kind, Capability)>,
}

impl DirState {
    /// Takes a fresh load into the state and says what to serve.
    pub fn apply(&mut self, loaded: Loaded) -> Outcome {
        let mut errors = loaded.errors;
        if !loaded.present {
            *self = Self::default();
            errors.extend(loaded.agent.err());
            return Outcome { serve: Serve::Gone, errors };
        }
        match loaded.agent {
            Ok(agent) => self.agent = Some(agent),
            Err(e) => errors.push(e),
        }
        let listed: Vec<PathBuf> = loaded.capabilities.iter().map(|(path, _)| path.clone()).collect();
        self.good.retain(|path, _| listed.contains(path));
        for (path, parsed) in loaded.capabilities {
            match parsed {
                Ok(capability) => {
                    self.good.insert(path, capability);
                }
                Err(e) => errors.push(e),
            }
        }
        let Some(agent) = &self.agent else {
            return Outcome { serve: Serve::Keep, errors };
        };
        let mut card = agent.clone();
        // Ids are unique per kind in a card: the first manifest in path order keeps an id.
        let mut owners: HashMap<(Kind, &str), &PathBuf> = HashMap::new();
        for (path, (kind, capability)) in &self.good {
            if let Some(first) = owners.get(&(*kind, capability.id.as_str())) {
                let message = format!(
                    "{} id {:?} is also the id of {}",
                    kind.as_str(),
                    capability.id,
                    first.join(CAPABILITY_FILE).display()
                );
                errors.push(ManifestError::new(
                    path.join(CAPABILITY_FILE).display().to_string(),
                    Some("id"),
                    message,
                ));
                continue;
            }
            owners.insert((*kind, capability.id.as_str()), path);
            match kind {
                Kind::Skill => card.skills.push(capability.clone()),
                Kind::Reasoner => card.reasoners.push(capability.clone()),
            }
        }
        match card.normalized() {
            Ok(card) => Outcome { serve: Serve::Card(Box::new(card)), errors },
            Err(e) => {
                let message = format!("the agent's card is refused, the last one stays: {e}");
                errors.push(ManifestError::new(loaded.dir.display().to_string(), None, message));
                Outcome { serve: Serve::Keep, errors }
            }
        }
    }
}

/// Says when a directory's fingerprint has changed and then stayed the same for `quiet`: an editor's
/// burst of writes (temporary file, rename, attributes) becomes one reload.
#[derive(Debug)]
pub struct Debounce<F> {
    loaded: Option<F>,
    pending: Option<(F, Instant)>,
    quiet: Duration,
}

impl<F: PartialEq> Debounce<F> {
    /// Starts from the fingerprint of what was last loaded.
    pub fn new(loaded: F, quiet: Duration) -> Self {
        Self { loaded: Some(loaded), pending: None, quiet }
    }

    /// Takes the fingerprint seen at `now`: `true` when it is time to load it (the caller then loads
    /// the directory, and it counts as loaded).
    pub fn observe(&mut self, seen: F, now: Instant) -> bool {
        if self.loaded.as_ref() == Some(&seen) {
            self.pending = None;
            return false;
        }
        match &self.pending {
            Some((pending, since)) if *pending == seen => {
                if now.saturating_duration_since(*since) < self.quiet {
                    return false;
                }
                self.pending = None;
                self.loaded = Some(seen);
                true
            }
            _ => {
                self.pending = Some((seen, now));
                false
            }
        }
    }

    /// Forgets what was loaded, so the directory loads again once quiet (after a failed write).
    pub fn retry(&mut self) {
        self.loaded = None;
    }
}
