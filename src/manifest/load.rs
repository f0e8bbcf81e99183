//! The file-system side of manifests: a cheap fingerprint of a directory, and reading it. Blocking
//! (`std::fs`): the task calls these on the blocking pool.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::dir::{Loaded, Parsed};
use super::parse::{self, CapabilityFiles};
use super::{ManifestError, AGENT_FILE, CAPABILITY_FILE, SCHEMA_FILE, SKILL_FILE};
use crate::defaults::{MAX_MANIFESTS_PER_DIR, MAX_MANIFEST_DIR_ENTRIES, MAX_MANIFEST_FILE_BYTES};

/// What identifies one file's version without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    path: PathBuf,
    len: u64,
    modified: Option<SystemTime>,
    /// A file replaced by rename (how many editors save) is a new inode even when its size and
    /// modification time come out the same.
    inode: u64,
}

/// Paths, sizes, modification times and inodes of every manifest file of a directory: when it is
/// equal to the last one, nothing needs reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    present: bool,
    files: Vec<Stamp>,
}

/// The directory's fingerprint: a listing of `dir` and a `stat` of each manifest file name in it and
/// in its subdirectories.
pub fn fingerprint(dir: &Path) -> Fingerprint {
    if !dir.is_dir() {
        return Fingerprint { present: false, files: Vec::new() };
    }
    let mut files = Vec::new();
    let mut stamp = |path: PathBuf| {
        if let Ok(meta) = fs::metadata(&path) {
            files.push(Stamp { len: meta.len(), modified: meta.modified().ok(), inode: inode(&meta), path });
        }
    };
    for name in [AGENT_FILE, CAPABILITY_FILE, SKILL_FILE, SCHEMA_FILE] {
        stamp(dir.join(name));
    }
    let (subdirs, _) = subdirs(dir);
    for sub in subdirs {
        for name in [CAPABILITY_FILE, SKILL_FILE, SCHEMA_FILE] {
            stamp(sub.join(name));
        }
    }
    Fingerprint { present: true, files }
}

#[cfg(unix)]
fn inode(meta: &fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::ino(meta)
}

#[cfg(not(unix))]
fn inode(_meta: &fs::Metadata) -> u64 {
    0
}

/// Immediate subdirectories of `dir` (symbolic links followed), in name order, and whether the
/// listing stopped at [`MAX_MANIFEST_DIR_ENTRIES`] or failed.
fn subdirs(dir: &Path) -> (Vec<PathBuf>, Option<String>) {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => return (Vec::new(), Some(format!("cannot list: {e}"))),
    };
    let mut found = Vec::new();
    let mut problem = None;
    for (i, entry) in entries.enumerate() {
        if i == MAX_MANIFEST_DIR_ENTRIES {
            problem = Some(format!("more than {MAX_MANIFEST_DIR_ENTRIES} entries; the rest are not read"));
            break;
        }
        let Ok(entry) = entry else { continue };
        let path = entry.path();
        if path.is_dir() {
            found.push(path);
        }
    }
    found.sort();
    (found, problem)
}

/// Reads a directory's manifests: the agent, then `dir` itself and each subdirectory that holds a
/// `CAPABILITY.yaml`, at most [`MAX_MANIFESTS_PER_DIR`] in path order.
pub fn load(dir: &Path, default_agent_id: &str, default_base_url: &str) -> Loaded {
    let shown = dir.display().to_string();
    if !dir.is_dir() {
        let agent = Err(ManifestError::new(&shown, None, "directory not found"));
        return Loaded {
            dir: dir.to_owned(),
            present: false,
            agent,
            capabilities: Vec::new(),
            errors: Vec::new(),
        };
    }
    let agent_path = dir.join(AGENT_FILE);
    let agent_shown = agent_path.display().to_string();
    let agent = read_text(&agent_path)
        .and_then(|yaml| parse::agent(&agent_shown, yaml.as_deref(), default_agent_id, default_base_url));
    let mut loaded =
        Loaded { dir: dir.to_owned(), present: true, agent, capabilities: Vec::new(), errors: Vec::new() };

    let (subdirs, problem) = subdirs(dir);
    if let Some(problem) = problem {
        loaded.errors.push(ManifestError::new(&shown, None, problem));
    }
    let mut manifests: Vec<PathBuf> = std::iter::once(dir.to_owned())
        .chain(subdirs)
        .filter(|d| d.join(CAPABILITY_FILE).is_file())
        .collect();
    if manifests.len() > MAX_MANIFESTS_PER_DIR {
        let message = format!(
            "{} capability manifests, over the limit of {MAX_MANIFESTS_PER_DIR}; the first in name order are read",
            manifests.len()
        );
        loaded.errors.push(ManifestError::new(&shown, None, message));
        manifests.truncate(MAX_MANIFESTS_PER_DIR);
    }
    loaded.capabilities = manifests
        .into_iter()
        .map(|d| {
            let parsed = capability(&d);
            (d, parsed)
        })
        .collect();
    loaded
}

/// One capability from the files of `dir`.
fn capability(dir: &Path) -> Parsed {
    let [yaml_path, skill_path, schema_path] =
        [CAPABILITY_FILE, SKILL_FILE, SCHEMA_FILE].map(|name| dir.join(name));
    let shown = [&yaml_path, &skill_path, &schema_path].map(|p| p.display().to_string());
    let yaml = read_text(&yaml_path)?
        .ok_or_else(|| ManifestError::new(&shown[0], None, "file disappeared while being read"))?;
    let skill = read_text(&skill_path)?;
    let schema = read_text(&schema_path)?;
    parse::capability(&CapabilityFiles {
        yaml_path: &shown[0],
        yaml: &yaml,
        skill_path: &shown[1],
        skill: skill.as_deref(),
        schema_path: &shown[2],
        schema: schema.as_deref(),
    })
}

/// A manifest file's text: `None` when it does not exist; an error when it cannot be read, is over
/// [`MAX_MANIFEST_FILE_BYTES`] or is not UTF-8.
pub fn read_text(path: &Path) -> Result<Option<String>, ManifestError> {
    let shown = || path.display().to_string();
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ManifestError::new(shown(), None, format!("cannot read: {e}"))),
    };
    let mut bytes = Vec::new();
    let limit = MAX_MANIFEST_FILE_BYTES as u64 + 1;
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| ManifestError::new(shown(), None, format!("cannot read: {e}")))?;
    if bytes.len() > MAX_MANIFEST_FILE_BYTES {
        let message = format!("over the {MAX_MANIFEST_FILE_BYTES} byte limit of a manifest file");
        return Err(ManifestError::new(shown(), None, message));
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|e| ManifestError::new(shown(), None, format!("not UTF-8 text: {e}")))
}

/// The agent id a directory gets without `AGENT.yaml`: its name made an id (the name of the
/// directory it resolves to for `.`).
pub fn default_agent_id(dir: &Path) -> String {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .or_else(|| dir.canonicalize().ok()?.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    parse::default_agent_id(&name)
}
