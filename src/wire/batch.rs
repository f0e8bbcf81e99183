//! Ed25519 batch verification with one term per public key.
//!
//! The batch equation checks `n` signatures `(R_i, s_i)` by their keys `A_i` over messages `M_i` at once:
//! with random 128-bit weights `z_i` and `h_i = SHA-512(R_i || A_i || M_i)`,
//!
//! ```text
//! -(sum z_i s_i) B + sum z_i R_i + sum z_i h_i A_i = 0
//! ```
//!
//! which is the equation `ed25519_dalek::verify_batch` checks (cofactorless, `s` canonical). A mesh
//! batch is mostly signed by few publishers (a sync answer holds one publisher's cards, or a few), and
//! the terms of one key add up: `sum_{i: A_i = A} (z_i h_i) A` is one point times one scalar. So the
//! multiscalar multiplication takes `n + k + 1` points for `k` distinct keys instead of `2n + 1`, the
//! larger part of a batch's cost. The equation is dalek's, its terms grouped; only the weights differ
//! (dalek derives them from a transcript of the batch, these come from the thread's CSPRNG), so a batch
//! of good signatures passes both and a bad signature fails both but with negligible probability
//! (tested against it below).

use std::collections::HashMap;

use curve25519_dalek::constants::ED25519_BASEPOINT_POINT;
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::{IsIdentity, VartimeMultiscalarMul};
use ed25519_dalek::{Signature, VerifyingKey};
use rand::RngCore as _;
use sha2::{Digest as _, Sha512};

/// One signature to check: the message signed, the signature, the key it claims.
pub type Item<'a> = (&'a [u8], Signature, VerifyingKey);

/// Whether every signature of `items` verifies, by one batch equation; an empty batch does. False
/// means at least one does not (or one is malformed: `s` not canonical, `R` not a point); the caller
/// then checks each alone to find which.
pub fn verify(items: &[Item<'_>]) -> bool {
    // Where each distinct key's scalar sums, by the key's bytes.
    let mut keys: HashMap<[u8; 32], usize> = HashMap::new();
    let mut key_points: Vec<EdwardsPoint> = Vec::new();
    let mut key_scalars: Vec<Scalar> = Vec::new();
    let mut r_points: Vec<CompressedEdwardsY> = Vec::with_capacity(items.len());
    let mut r_scalars: Vec<Scalar> = Vec::with_capacity(items.len());
    let mut b_scalar = Scalar::ZERO;
    let mut rng = rand::rng();
    for (message, sig, key) in items {
        let Some(s) = Option::<Scalar>::from(Scalar::from_canonical_bytes(*sig.s_bytes())) else {
            return false;
        };
        let mut hasher = Sha512::new();
        hasher.update(sig.r_bytes());
        hasher.update(key.as_bytes());
        hasher.update(message);
        let mut wide = [0u8; 64];
        wide.copy_from_slice(&hasher.finalize());
        let h = Scalar::from_bytes_mod_order_wide(&wide);
        let mut weight = [0u8; 16];
        rng.fill_bytes(&mut weight);
        let z = Scalar::from(u128::from_le_bytes(weight));
        b_scalar += z * s;
        r_points.push(CompressedEdwardsY(*sig.r_bytes()));
        r_scalars.push(z);
        let slot = *keys.entry(*key.as_bytes()).or_insert_with(|| {
            key_points.push(key.to_edwards());
            key_scalars.push(Scalar::ZERO);
            key_points.len() - 1
        });
        key_scalars[slot] += z * h;
    }
    let scalars = std::iter::once(-b_scalar).chain(r_scalars).chain(key_scalars);
    let points = std::iter::once(Some(ED25519_BASEPOINT_POINT))
        .chain(r_points.iter().map(CompressedEdwardsY::decompress))
        .chain(key_points.into_iter().map(Some));
    EdwardsPoint::optional_multiscalar_mul(scalars, points).is_some_and(|sum| sum.is_identity())
}

#[cfg(test)]
mod tests {
    use ed25519_dalek::{Signer as _, SigningKey};

    use super::*;

    fn keys(n: u8) -> Vec<SigningKey> {
        (1..=n).map(|i| SigningKey::from_bytes(&[i; 32])).collect()
    }

    /// Signed items: `per_key` messages by each of the keys, interleaved.
    fn signed(keys: &[SigningKey], per_key: usize) -> Vec<(Vec<u8>, Signature, VerifyingKey)> {
        (0..per_key)
            .flat_map(|m| {
                keys.iter().map(move |k| {
                    let message = format!("card {m} of {:?}", k.verifying_key().as_bytes()).into_bytes();
                    let sig = k.sign(&message);
                    (message, sig, k.verifying_key())
                })
            })
            .collect()
    }

    fn ours(items: &[(Vec<u8>, Signature, VerifyingKey)]) -> bool {
        let items: Vec<Item<'_>> = items.iter().map(|(m, s, k)| (m.as_slice(), *s, *k)).collect();
        verify(&items)
    }

    fn dalek(items: &[(Vec<u8>, Signature, VerifyingKey)]) -> bool {
        let messages: Vec<&[u8]> = items.iter().map(|(m, _, _)| m.as_slice()).collect();
        let sigs: Vec<Signature> = items.iter().map(|(_, s, _)| *s).collect();
        let keys: Vec<VerifyingKey> = items.iter().map(|(_, _, k)| *k).collect();
        ed25519_dalek::verify_batch(&messages, &sigs, &keys).is_ok()
    }

    #[test]
    fn a_batch_of_good_signatures_verifies_whatever_its_keys() {
        for (n_keys, per_key) in [(1, 1), (1, 64), (3, 20), (50, 5), (64, 1)] {
            let items = signed(&keys(n_keys), per_key);
            assert!(ours(&items), "{n_keys} keys x {per_key}");
            assert!(dalek(&items));
        }
        assert!(verify(&[]));
    }

    /// Every way one signature of a batch can be wrong fails the batch, as it fails dalek's.
    #[test]
    fn one_bad_signature_fails_the_batch() {
        let good = signed(&keys(3), 10);
        let other = SigningKey::from_bytes(&[9; 32]);
        type Spoil = fn(&mut (Vec<u8>, Signature, VerifyingKey), &SigningKey);
        let spoils: [(&str, Spoil); 6] = [
            ("message changed", |item, _| item.0.push(b'!')),
            ("signed by another key", |item, other| item.1 = other.sign(&item.0)),
            ("claims another key", |item, other| item.2 = other.verifying_key()),
            ("s changed", |item, _| {
                let mut bytes = item.1.to_bytes();
                bytes[40] ^= 1;
                item.1 = Signature::from_bytes(&bytes);
            }),
            ("R changed", |item, _| {
                let mut bytes = item.1.to_bytes();
                bytes[3] ^= 1;
                item.1 = Signature::from_bytes(&bytes);
            }),
            ("s not canonical (s + l)", |item, _| {
                // l, the group order, little-endian: s + l is the same scalar, not in canonical form.
                const L: [u8; 32] = [
                    0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde,
                    0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
                ];
                let mut bytes = item.1.to_bytes();
                let mut carry = 0u16;
                for (b, l) in bytes[32..].iter_mut().zip(L) {
                    let sum = u16::from(*b) + u16::from(l) + carry;
                    *b = sum as u8;
                    carry = sum >> 8;
                }
                item.1 = Signature::from_bytes(&bytes);
            }),
        ];
        for (what, spoil) in spoils {
            for at in [0, 7, good.len() - 1] {
                let mut items = good.clone();
                spoil(&mut items[at], &other);
                assert!(!ours(&items), "{what} at {at}");
                assert_eq!(ours(&items), dalek(&items), "{what} at {at}");
            }
        }
    }

    /// Two bad signatures by one key whose errors cancel in the sum of that key's terms still fail: each
    /// signature carries its own random weight.
    #[test]
    fn errors_of_one_key_do_not_cancel_out() {
        let key = SigningKey::from_bytes(&[5; 32]);
        let mut items = signed(std::slice::from_ref(&key), 4);
        // Swap the messages of two signatures: each is a good signature, over the other's message.
        let (a, b) = (items[0].0.clone(), items[1].0.clone());
        items[0].0 = b;
        items[1].0 = a;
        for _ in 0..32 {
            assert!(!ours(&items));
        }
    }
}
