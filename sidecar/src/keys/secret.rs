//! A key's secret: how it is written, made and checked.
//!
//! `sgk_<id>_<secret>`: the prefix marks it as slotgate's (secret scanners and people both read
//! it); `<id>` (12 lower-case hex digits, 48 random bits) finds the key without its secret and is
//! what lists and logs show; `<secret>` is 48 lower-case hex digits, 192 random bits from the
//! operating system. Only the SHA-256 of the whole string is kept. A secret this long needs no slow
//! hash: there is nothing to guess from the digest.

use sha2::{Digest, Sha256};

/// What every key slotgate issues begins with.
pub const PREFIX: &str = "sgk_";
const ID_HEX: usize = 12;
const SECRET_HEX: usize = 48;

/// A new key: its id and its whole secret string (shown once, never kept).
pub struct Minted {
    pub id: String,
    pub secret: String,
}

/// A fresh id and secret from the operating system's random source.
pub fn mint() -> Result<Minted, String> {
    let id = hex(&random::<{ ID_HEX / 2 }>()?);
    let secret = secret_for(&id)?;
    Ok(Minted { id, secret })
}

/// A fresh secret for the key `id` (a rotation keeps the id).
pub fn secret_for(id: &str) -> Result<String, String> {
    Ok(format!(
        "{PREFIX}{id}_{}",
        hex(&random::<{ SECRET_HEX / 2 }>()?)
    ))
}

fn random<const N: usize>() -> Result<[u8; N], String> {
    let mut raw = [0u8; N];
    getrandom::fill(&mut raw).map_err(|e| format!("no random bytes from the system: {e}"))?;
    Ok(raw)
}

/// The id of a presented key, when it has the shape of one slotgate issues.
pub fn id_of(presented: &[u8]) -> Option<&str> {
    let rest = presented.strip_prefix(PREFIX.as_bytes())?;
    if rest.len() != ID_HEX + 1 + SECRET_HEX || rest[ID_HEX] != b'_' {
        return None;
    }
    let lower_hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    if !rest[..ID_HEX].iter().all(lower_hex) || !rest[ID_HEX + 1..].iter().all(lower_hex) {
        return None;
    }
    std::str::from_utf8(&rest[..ID_HEX]).ok()
}

/// Whether `s` is a key id's shape.
pub fn is_id(s: &str) -> bool {
    s.len() == ID_HEX
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The digest kept of a secret.
pub fn digest(presented: &[u8]) -> [u8; 32] {
    Sha256::digest(presented).into()
}

/// Equal, in a time that does not depend on where they differ.
pub fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// A digest written by [`hex`].
pub fn unhex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.as_bytes().chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_key_is_found_by_its_id_and_matches_its_digest() {
        let m = mint().unwrap();
        assert!(m.secret.starts_with("sgk_"));
        assert_eq!(id_of(m.secret.as_bytes()), Some(m.id.as_str()));
        assert!(is_id(&m.id));
        let d = digest(m.secret.as_bytes());
        assert!(same(&d, &unhex(&hex(&d)).unwrap()));
        let other = mint().unwrap();
        assert_ne!(other.secret, m.secret);
        assert!(!same(&d, &digest(other.secret.as_bytes())));
    }

    #[test]
    fn other_shapes_have_no_id() {
        let m = mint().unwrap();
        let s = m.secret.as_bytes();
        assert_eq!(id_of(&s[..s.len() - 1]), None);
        assert_eq!(id_of(m.secret.to_uppercase().as_bytes()), None);
        assert_eq!(id_of(b"sk-anything"), None);
        assert_eq!(id_of(b""), None);
        let mut swapped = m.secret.clone().into_bytes();
        swapped[4 + 12] = b'-';
        assert_eq!(id_of(&swapped), None);
    }
}
