//! Edits fields of a JSON object in its own bytes. Everything slotgate does not change keeps the
//! bytes the client sent (key order, spacing, number spelling): a chat template prints tool schemas
//! in key order, so a re-serialised body (serde_json sorts keys) would change the prompt, and the
//! model's answer with it.
//!
//! The input is a body that already parsed as one JSON object; anything this scanner cannot follow
//! gives `None`, and the caller falls back on re-serialising.

use std::ops::Range;

/// One `"key": value` of an object, as byte ranges of the source.
#[derive(Debug, Clone)]
struct Member {
    key: String,
    /// From the key's opening quote to the end of its value.
    whole: Range<usize>,
    value: Range<usize>,
}

/// The members of an object of `src`.
#[derive(Debug)]
struct Object {
    /// Just after `{`.
    open: usize,
    members: Vec<Member>,
}

/// The top-level members of `body` in the order sent, each as its key and the bytes of its value.
pub fn members(body: &[u8]) -> Option<Vec<(String, &[u8])>> {
    let obj = object(body, 0..body.len())?;
    Some(
        obj.members
            .into_iter()
            .map(|m| (m.key, &body[m.value]))
            .collect(),
    )
}

/// Sets `key` to `value` (JSON text) at the top level of `body`: every member of that name gets the
/// new value (a duplicate key must not keep an old one), or one member is added at the end.
pub fn set(body: &[u8], key: &str, value: &str) -> Option<Vec<u8>> {
    let obj = object(body, 0..body.len())?;
    Some(set_in_object(body, &obj, key, value))
}

/// Removes every member named `key` from the top level of `body`.
pub fn remove(body: &[u8], key: &str) -> Option<Vec<u8>> {
    let obj = object(body, 0..body.len())?;
    if !obj.members.iter().any(|m| m.key == key) {
        return Some(body.to_vec());
    }
    // What precedes each member: spacing for the first, a comma and spacing for the others.
    let lead = |i: usize| match i {
        0 => obj.open..obj.members[0].whole.start,
        _ => obj.members[i - 1].whole.end..obj.members[i].whole.start,
    };
    let last_end = obj.members.last().map_or(obj.open, |m| m.whole.end);
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(&body[..obj.open]);
    let mut first = true;
    for (i, m) in obj.members.iter().enumerate() {
        if m.key == key {
            continue;
        }
        // The first member kept takes the first member's spacing, without a comma.
        out.extend_from_slice(&body[if first { lead(0) } else { lead(i) }]);
        out.extend_from_slice(&body[m.whole.clone()]);
        first = false;
    }
    if first {
        out.extend_from_slice(&body[lead(0)]);
    }
    out.extend_from_slice(&body[last_end..]);
    Some(out)
}

/// Sets `inner` to `value` inside the object at top-level `outer`. When `outer` is absent, or not an
/// object, it becomes `{"inner": value}`.
pub fn set_nested(body: &[u8], outer: &str, inner: &str, value: &str) -> Option<Vec<u8>> {
    let obj = object(body, 0..body.len())?;
    let last = obj.members.iter().rev().find(|m| m.key == outer);
    match last {
        Some(m) if body.get(skip_ws(body, m.value.start)) == Some(&b'{') => {
            // Every member of that name is edited alike, so whichever llama-server reads agrees.
            let mut out = body.to_vec();
            let targets: Vec<Range<usize>> = obj
                .members
                .iter()
                .filter(|m| m.key == outer)
                .map(|m| m.value.clone())
                .collect();
            for span in targets.into_iter().rev() {
                let sub = &body[span.clone()];
                let replacement = match object(sub, 0..sub.len()) {
                    Some(inner_obj) => set_in_object(sub, &inner_obj, inner, value),
                    None => format!("{{{}:{value}}}", quote(inner)).into_bytes(),
                };
                out.splice(span, replacement);
            }
            Some(out)
        }
        _ => set(body, outer, &format!("{{{}:{value}}}", quote(inner))),
    }
}

fn set_in_object(body: &[u8], obj: &Object, key: &str, value: &str) -> Vec<u8> {
    let mut out = body.to_vec();
    let spans: Vec<Range<usize>> = obj
        .members
        .iter()
        .filter(|m| m.key == key)
        .map(|m| m.value.clone())
        .collect();
    if spans.is_empty() {
        let member = format!("{}:{value}", quote(key));
        match obj.members.last() {
            Some(last) => {
                out.splice(
                    last.whole.end..last.whole.end,
                    format!(",{member}").into_bytes(),
                );
            }
            None => {
                out.splice(obj.open..obj.open, member.into_bytes());
            }
        }
        return out;
    }
    // From the end, so earlier spans stay where they were.
    for span in spans.into_iter().rev() {
        out.splice(span, value.bytes());
    }
    out
}

/// `s` as a JSON string.
fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// The object whose `{` is the first non-space byte of `span`.
fn object(src: &[u8], span: Range<usize>) -> Option<Object> {
    let mut i = skip_ws(src, span.start);
    if src.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    let open = i;
    let mut members = Vec::new();
    loop {
        i = skip_ws(src, i);
        match src.get(i)? {
            b'}' => return (i < span.end).then_some(Object { open, members }),
            b',' if !members.is_empty() => {
                i = skip_ws(src, i + 1);
            }
            _ if members.is_empty() => {}
            _ => return None,
        }
        let key_start = i;
        let key_end = skip_string(src, i)?;
        let raw = &src[key_start..key_end];
        let key = if raw.contains(&b'\\') {
            serde_json::from_slice::<String>(raw).ok()?
        } else {
            std::str::from_utf8(&raw[1..raw.len() - 1]).ok()?.to_owned()
        };
        i = skip_ws(src, key_end);
        if src.get(i) != Some(&b':') {
            return None;
        }
        let value_start = skip_ws(src, i + 1);
        let value_end = skip_value(src, value_start)?;
        members.push(Member {
            key,
            whole: key_start..value_end,
            value: value_start..value_end,
        });
        i = value_end;
    }
}

fn skip_ws(src: &[u8], mut i: usize) -> usize {
    while matches!(src.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The end (one past the closing quote) of the string that opens at `i`.
fn skip_string(src: &[u8], i: usize) -> Option<usize> {
    if src.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    loop {
        match src.get(j)? {
            b'"' => return Some(j + 1),
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
}

/// The end of the value that starts at `i`.
fn skip_value(src: &[u8], i: usize) -> Option<usize> {
    match src.get(i)? {
        b'"' => skip_string(src, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match src.get(j)? {
                    b'"' => {
                        j = skip_string(src, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while let Some(b) = src.get(j) {
                if matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    break;
                }
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn s(b: Option<Vec<u8>>) -> String {
        String::from_utf8(b.expect("editable")).unwrap()
    }

    #[test]
    fn set_keeps_every_other_byte() {
        let body = br#"{ "z": 1.0, "tools": [{"b": {"y": 1, "a": 2}}], "max_tokens" :  5 }"#;
        assert_eq!(
            s(set(body, "max_tokens", "3")),
            r#"{ "z": 1.0, "tools": [{"b": {"y": 1, "a": 2}}], "max_tokens" :  3 }"#
        );
        assert_eq!(
            s(set(body, "n_predict", "7")),
            r#"{ "z": 1.0, "tools": [{"b": {"y": 1, "a": 2}}], "max_tokens" :  5,"n_predict":7 }"#
        );
        assert_eq!(s(set(b"{}", "a", "true")), r#"{"a":true}"#);
        assert_eq!(s(set(b" { \n } ", "a", "1")), " {\"a\":1 \n } ");
    }

    #[test]
    fn duplicate_keys_all_change_and_escaped_keys_are_found() {
        let body = br#"{"n":1,"x":"}\"{","n":2,"m\u0061x":4}"#;
        let out = s(set(body, "n", "9"));
        assert_eq!(out, r#"{"n":9,"x":"}\"{","n":9,"m\u0061x":4}"#);
        assert_eq!(
            s(set(body, "max", "0")),
            r#"{"n":1,"x":"}\"{","n":2,"m\u0061x":0}"#
        );
    }

    #[test]
    fn remove_takes_the_member_and_one_comma() {
        let cases = [
            (r#"{"a":1,"id_slot":2,"b":3}"#, r#"{"a":1,"b":3}"#),
            (r#"{"id_slot":2, "b":3}"#, r#"{"b":3}"#),
            (r#"{"a":1, "id_slot":2}"#, r#"{"a":1}"#),
            (r#"{ "id_slot" : 2 }"#, r#"{  }"#),
            (r#"{"id_slot":1,"id_slot":2,"a":0}"#, r#"{"a":0}"#),
            (r#"{"a":0,"id_slot":1,"id_slot":2}"#, r#"{"a":0}"#),
            (r#"{"a":0}"#, r#"{"a":0}"#),
        ];
        for (body, want) in cases {
            let got = s(remove(body.as_bytes(), "id_slot"));
            assert_eq!(got, want, "{body}");
            serde_json::from_str::<Value>(&got).unwrap();
        }
    }

    #[test]
    fn nested_fields_are_set_inside_their_object() {
        let body = br#"{"stream":true,"stream_options":{ "x": 1 },"z":0}"#;
        assert_eq!(
            s(set_nested(body, "stream_options", "include_usage", "true")),
            r#"{"stream":true,"stream_options":{ "x": 1,"include_usage":true },"z":0}"#
        );
        let body = br#"{"stream_options":{"include_usage":false}}"#;
        assert_eq!(
            s(set_nested(body, "stream_options", "include_usage", "true")),
            r#"{"stream_options":{"include_usage":true}}"#
        );
        for body in [&br#"{"stream":true}"#[..], br#"{"stream_options":null}"#] {
            let out = s(set_nested(body, "stream_options", "include_usage", "true"));
            let v: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["stream_options"], json!({"include_usage": true}), "{out}");
        }
    }

    #[test]
    fn what_is_not_an_object_is_not_edited() {
        for body in [
            &b"[1]"[..],
            b"",
            b"{\"a\"",
            b"{\"a\":}",
            b"{\"a\":1 \"b\":2}",
        ] {
            assert!(
                set(body, "k", "1").is_none(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
