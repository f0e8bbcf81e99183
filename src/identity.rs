//! The node's identity: an Ed25519 keypair created on first start in the data directory (mode 0600) and
//! reused after. The PeerId embeds the public key, so anyone can verify what this node signs.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use libp2p::identity::{Keypair, PeerId};

use crate::defaults::IDENTITY_FILE;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot create data directory {path}: {source}")]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("cannot read identity key {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write identity key {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error(
        "identity key {path} is not a valid key file: {reason} (move it aside to create a new identity)"
    )]
    Corrupt { path: PathBuf, reason: String },
}

/// The keypair and its PeerId. `Debug` never prints the secret key.
#[derive(Clone)]
pub struct Identity {
    keypair: Keypair,
    peer_id: PeerId,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity").field("peer_id", &self.peer_id).field("keypair", &"<redacted>").finish()
    }
}

impl Identity {
    /// Loads `<data_dir>/identity.key`, or creates it (and the directory) on first start.
    pub fn load_or_create(data_dir: &Path) -> Result<Self, IdentityError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|source| IdentityError::CreateDir { path: data_dir.to_owned(), source })?;
        let path = data_dir.join(IDENTITY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let keypair = Keypair::from_protobuf_encoding(&bytes)
                    .map_err(|e| IdentityError::Corrupt { path: path.clone(), reason: e.to_string() })?;
                if keypair.clone().try_into_ed25519().is_err() {
                    return Err(IdentityError::Corrupt { path, reason: "not an Ed25519 key".into() });
                }
                warn_if_readable_by_others(&path);
                Ok(Self::from_keypair(keypair))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let keypair = Keypair::generate_ed25519();
                write_private(&path, &keypair)?;
                tracing::info!(peer_id = %keypair.public().to_peer_id(), path = %path.display(), "created node identity");
                Ok(Self::from_keypair(keypair))
            }
            Err(source) => Err(IdentityError::Read { path, source }),
        }
    }

    /// A fresh identity that lives only in memory.
    pub fn ephemeral() -> Self {
        Self::from_keypair(Keypair::generate_ed25519())
    }

    fn from_keypair(keypair: Keypair) -> Self {
        let peer_id = keypair.public().to_peer_id();
        Self { keypair, peer_id }
    }

    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    pub fn keypair(&self) -> &Keypair {
        &self.keypair
    }
}

/// Writes the key to a temporary file created with mode 0600, syncs it, then renames it into place,
/// so a crash never leaves a half-written key and the secret is never readable by others.
fn write_private(path: &Path, keypair: &Keypair) -> Result<(), IdentityError> {
    let err = |source| IdentityError::Write { path: path.to_owned(), source };
    let bytes = keypair.to_protobuf_encoding().map_err(|e| err(std::io::Error::other(e.to_string())))?;
    let tmp = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&tmp).map_err(err)?;
    file.write_all(&bytes).map_err(err)?;
    file.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)?;
    Ok(())
}

fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "identity key is readable by other users; chmod 600 it");
            }
        }
    }
}

/// Facts about publishers worked out from their PeerId: at most `bound` publishers, the table emptied
/// when a new one finds it full. For checks repeated on every message of a publisher (its key
/// decompressed, its A2A header read), where a mesh has few publishers that each send many; its users
/// keep one per thread (`wire::KEY_CACHE`, `card::a2a::HEADER_CACHE`), so it needs no lock.
pub struct PerPublisher<V> {
    bound: usize,
    held: std::collections::HashMap<PeerId, V>,
}

impl<V> PerPublisher<V> {
    pub fn new(bound: usize) -> Self {
        Self { bound, held: std::collections::HashMap::new() }
    }

    pub fn get(&self, publisher: &PeerId) -> Option<&V> {
        self.held.get(publisher)
    }

    pub fn insert(&mut self, publisher: PeerId, value: V) {
        if self.held.len() >= self.bound && !self.held.contains_key(&publisher) {
            self.held.clear();
        }
        self.held.insert(publisher, value);
    }
}

/// The Ed25519 public key an Ed25519 PeerId embeds (identity multihash of the protobuf key).
pub fn public_key(peer: &libp2p::PeerId) -> Option<libp2p::identity::PublicKey> {
    let mh: &libp2p::multihash::Multihash<64> = peer.as_ref();
    if mh.code() != 0 {
        return None;
    }
    let key = libp2p::identity::PublicKey::try_decode_protobuf(mh.digest()).ok()?;
    key.clone().try_into_ed25519().ok()?;
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_per_publisher_table_is_emptied_for_a_new_publisher_only() {
        let peers: Vec<PeerId> = (0..3).map(|_| Keypair::generate_ed25519().public().to_peer_id()).collect();
        let mut table = PerPublisher::new(2);
        table.insert(peers[0], 1);
        table.insert(peers[1], 2);
        // Full, but a publisher it holds is updated in place.
        table.insert(peers[1], 3);
        assert_eq!((table.get(&peers[0]), table.get(&peers[1])), (Some(&1), Some(&3)));
        // A third publisher empties it first: never more than the bound.
        table.insert(peers[2], 4);
        assert_eq!(
            (table.get(&peers[0]), table.get(&peers[1]), table.get(&peers[2])),
            (None, None, Some(&4))
        );
    }

    #[test]
    fn created_once_then_reused_with_private_mode() {
        let dir = tempfile::tempdir().unwrap();
        let first = Identity::load_or_create(dir.path()).unwrap();
        let second = Identity::load_or_create(dir.path()).unwrap();
        assert_eq!(first.peer_id(), second.peer_id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(IDENTITY_FILE)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(!format!("{first:?}").contains("Keypair {"));
    }

    #[test]
    fn corrupt_key_is_a_clear_error_and_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(IDENTITY_FILE);
        std::fs::write(&path, b"garbage").unwrap();
        let err = Identity::load_or_create(dir.path()).unwrap_err();
        assert!(matches!(err, IdentityError::Corrupt { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"garbage");
    }
}
