//! `wire::open` on any bytes: never panics, and a message sealed with a valid signature is only ever
//! refused for what its body holds, never for its signature.
#![no_main]

use agentmesh::wire::{self, Kind, WireError};
use libfuzzer_sys::fuzz_target;
use libp2p_identity::Keypair;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 5 {
        // Raw bytes as a peer would send them.
        0 => {
            let _ = wire::open(rest);
        }
        // A correctly signed envelope around an arbitrary body: reaches the body decoders.
        m => {
            let key = Keypair::ed25519_from_bytes([7u8; 32]).expect("fixed key");
            let kind = Kind::from_u8(m).expect("kinds 1..=4");
            let sealed = wire::seal(&key, kind, rest.to_vec());
            match wire::open(&sealed) {
                Ok(v) => assert_eq!(v.publisher, key.public().to_peer_id()),
                Err(WireError::BadSignature | WireError::BadPublisher | WireError::UnknownVersion(_)) => {
                    panic!("a validly signed envelope was refused for its signature or publisher")
                }
                Err(_) => {}
            }
        }
    }
});
