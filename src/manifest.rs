//! Capability manifests: a directory of YAML files that describes one local agent.
//!
//! ```text
//! DIR/
//!   AGENT.yaml            optional: agent_id, name, description, version, base_url, tags, category
//!   CAPABILITY.yaml       optional: DIR itself may be a capability too
//!   weather/
//!     CAPABILITY.yaml     name, kind (skill | reasoner), description; optional id, tags, category,
//!                         requires, required_secrets, has_side_effects, input_schema, output_schema,
//!                         examples
//!     SKILL.md            optional: appended to the description (see below)
//!     schema.json         optional: the input schema (not together with `input_schema`)
//! ```
//!
//! Each `--capabilities-dir` becomes one agent card, registered like a card file (the node vouches for
//! it) and rebuilt when the files change. The pieces:
//!
//! - [`parse`]: pure, text in and a [`Capability`] or agent fields out, every problem a
//!   [`ManifestError`] naming the file and the field (YAML syntax errors with line and column).
//! - [`dir`]: pure, what one directory serves: the newest good version of each manifest
//!   ([`dir::DirState`]) and when a change has settled ([`dir::Debounce`]).
//! - [`load`]: the blocking file-system side: a cheap fingerprint of a directory, and reading it.
//! - [`reload`]: the polling task, and the state `GET /api/v1/manifests` serves.
//!
//! Choices:
//!
//! - **The capability id** defaults to `name`, not `kind:name`: ids appear in invocation targets
//!   (`agent:skill:id`) and so may not hold `:` ([`crate::card::check_id`]). A name that is not a valid
//!   id (`Weather forecast`) needs an explicit `id`; the error says so.
//! - **SKILL.md** has no field of its own in a card, so it extends the description: `description`, a
//!   blank line, then the file, at most [`MAX_MANIFEST_DESCRIPTION_BYTES`] in all (cut at a line
//!   boundary). Search indexes the description and the A2A view carries it, so both see the
//!   instructions; the first sentence, which the context tiers show, stays the YAML `description`.
//! - **`base_url`** defaults to this node's HTTP address: an agent described only by files is served
//!   by nothing else, and a probe of it then asks the daemon that vouches for it. Set it when a process
//!   serves the capabilities.
//! - **A broken manifest keeps its last good version** (held in memory; a restart with a broken file
//!   serves without it): the typical cause is a half-saved edit or a typo, and dropping the capability
//!   would withdraw it from every node of the mesh and announce it again a moment later. The error is
//!   visible in the warn log and `GET /api/v1/manifests` until fixed. A manifest that is deleted (its
//!   `CAPABILITY.yaml` gone) is dropped.
//! - **A directory left with no capabilities** keeps its agent, with none: the directory still
//!   describes it (`AGENT.yaml`). A directory that disappears deregisters its agent until it is back.

pub mod dir;
pub mod load;
pub mod parse;
pub mod reload;
#[cfg(test)]
mod tests;

use std::fmt;

use serde::Serialize;

#[cfg(doc)]
use crate::card::Capability;
#[cfg(doc)]
use crate::defaults::MAX_MANIFEST_DESCRIPTION_BYTES;

/// A capability's manifest.
pub const CAPABILITY_FILE: &str = "CAPABILITY.yaml";
/// The agent's manifest, in the directory itself.
pub const AGENT_FILE: &str = "AGENT.yaml";
/// Long-form instructions beside a capability's manifest.
pub const SKILL_FILE: &str = "SKILL.md";
/// A capability's input schema beside its manifest.
pub const SCHEMA_FILE: &str = "schema.json";

/// One problem with one manifest file: `caps/weather/CAPABILITY.yaml: kind: expected skill or
/// reasoner, got "tool"`. Serialised as `GET /api/v1/manifests` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct ManifestError {
    /// The file (or directory) at fault.
    pub path: String,
    /// The field at fault (`kind`, `tags[2]`); `None` for the whole file (syntax, size, encoding).
    pub field: Option<String>,
    pub message: String,
}

impl ManifestError {
    pub fn new(path: impl Into<String>, field: Option<&str>, message: impl Into<String>) -> Self {
        Self { path: path.into(), field: field.map(str::to_owned), message: message.into() }
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{}: {field}: {}", self.path, self.message),
            None => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

/// Whether a capability is a skill or a reasoner: which list of the card it goes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Skill,
    Reasoner,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Skill => "skill",
            Kind::Reasoner => "reasoner",
        }
    }
}

/// What `GET /api/v1/manifests` reports of one directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DirReport {
    /// The directory as configured.
    pub dir: String,
    /// The agent the directory registered; `None` while it has none (no good `AGENT.yaml` yet, or the
    /// directory is gone).
    pub agent_id: Option<String>,
    /// Ids of the capabilities served: reasoners, then skills, each in path order.
    pub capabilities: Vec<String>,
    /// What is wrong now; empty when every file is good.
    pub errors: Vec<ManifestError>,
}
