//! The request id: the client's `X-Request-Id` when it is one slotgate can carry safely (1 to 128
//! characters of letters, digits and `-_.:/+=@`), otherwise one slotgate makes (32 hex digits). It is
//! set on the request forwarded to llama-server, returned on the response, and written on the access
//! line, so one id follows a request through the client's logs, slotgate's and llama-server's.

use http::{HeaderMap, HeaderName, HeaderValue};

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client id kept.
pub const MAX_LEN: usize = 128;

/// The request's id, set in `headers` (the client's kept, a bad or missing one replaced).
pub fn assign(headers: &mut HeaderMap) -> HeaderValue {
    if let Some(v) = headers
        .get(&REQUEST_ID)
        .filter(|v| acceptable(v.as_bytes()))
    {
        if headers.get_all(&REQUEST_ID).iter().count() == 1 {
            return v.clone();
        }
    }
    let made = make();
    headers.insert(REQUEST_ID, made.clone());
    made
}

fn acceptable(id: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=@".contains(b))
}

/// 32 random hex digits.
fn make() -> HeaderValue {
    let mut out = [0u8; 32];
    let n = fastrand::u128(..);
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = b"0123456789abcdef"[((n >> (4 * i)) & 0xf) as usize];
    }
    // Hex digits are always a valid header value.
    HeaderValue::from_bytes(&out).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_good_client_id_is_kept_and_anything_else_replaced() {
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_static("req-42:abc/def"));
        assert_eq!(assign(&mut h), "req-42:abc/def");
        assert_eq!(h[REQUEST_ID], "req-42:abc/def");

        for bad in [
            "",
            "has space",
            "semi;colon",
            "quote\"",
            &"x".repeat(MAX_LEN + 1),
        ] {
            let mut h = HeaderMap::new();
            h.insert(REQUEST_ID, HeaderValue::from_str(bad).unwrap());
            let id = assign(&mut h);
            assert_ne!(id, bad);
            assert_eq!(id.len(), 32, "{id:?}");
            assert_eq!(h[REQUEST_ID], id, "the forwarded header is the id");
        }
        // Two ids: which one would the upstream log? Neither: one of slotgate's.
        let mut h = HeaderMap::new();
        h.append(REQUEST_ID, HeaderValue::from_static("a"));
        h.append(REQUEST_ID, HeaderValue::from_static("b"));
        let id = assign(&mut h);
        assert_eq!(h.get_all(REQUEST_ID).iter().collect::<Vec<_>>(), [&id]);
    }

    #[test]
    fn made_ids_are_hex_and_differ() {
        let (a, b) = (assign(&mut HeaderMap::new()), assign(&mut HeaderMap::new()));
        assert_ne!(a, b);
        assert!(a.as_bytes().iter().all(u8::is_ascii_hexdigit));
    }
}
