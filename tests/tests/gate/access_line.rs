//! The text access line (the default log format) holds whatever a client's headers say: a value is
//! quoted and escaped, so it can neither write a line of its own nor add a field (issue 46's two
//! forged lines: a newline in Codex's `parent_thread_id`, spaces in `X-Session-Id`).

use std::time::Duration;

use slotgate_tests::*;

/// A whole access line, claiming a served request of the `admin` tenant.
const FAKE_LINE: &str = "2026-01-01T00:00:00.000000Z  INFO slotgate::access: request outcome=ok \
    status=200 method=POST path=/v1/chat/completions request_id=forged priority=0 tenant=admin \
    total_ms=1";
const SPACED: &str = "s outcome=ok status=200 tenant=x";

/// The fields of a text access line, each value unquoted: a bare value runs to the next space, a
/// quoted one is a JSON string. `None` when the line is not that.
fn fields(line: &str) -> Option<Vec<(String, String)>> {
    let (_, mut rest) = line.split_once("slotgate::access: request")?;
    let mut out = Vec::new();
    while let Some(field) = rest.strip_prefix(' ') {
        let (name, value) = field.split_once('=')?;
        let (value, after) = match value.strip_prefix('"') {
            Some(quoted) => {
                let mut escaped = false;
                let end = quoted.char_indices().find_map(|(i, c)| {
                    let closes = c == '"' && !escaped;
                    escaped = c == '\\' && !escaped;
                    closes.then_some(i)
                })?;
                let json = &value[..end + 2];
                (serde_json::from_str(json).ok()?, &quoted[end + 1..])
            }
            None => {
                let end = value.find(' ').unwrap_or(value.len());
                (value[..end].to_owned(), &value[end..])
            }
        };
        out.push((name.to_owned(), value));
        rest = after;
    }
    rest.is_empty().then_some(out)
}

/// The one access line whose `request_id` is `id`, as its fields; each name at most once.
fn line_of(lines: &[Vec<(String, String)>], id: &str) -> Vec<(String, String)> {
    let mine: Vec<_> = lines
        .iter()
        .filter(|f| f.iter().any(|(k, v)| k == "request_id" && v == id))
        .collect();
    assert_eq!(mine.len(), 1, "access lines of {id}: {mine:?}");
    let line = mine[0].clone();
    let mut names: Vec<&str> = line.iter().map(|(k, _)| k.as_str()).collect();
    names.sort_unstable();
    let all = names.len();
    names.dedup();
    assert_eq!(names.len(), all, "a field twice: {line:?}");
    line
}

fn get<'a>(line: &'a [(String, String)], name: &str) -> Option<&'a str> {
    line.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_header_cannot_write_an_access_line_or_add_a_field() {
    let (up, gate) = Gate::one_slot(4)
        .policies(&[(
            &wat::built("request-guard"),
            Some("{ max_prompt_chars = 50 }"),
        )])
        .start_instant()
        .await;
    // Codex names a subagent's parent inside JSON, where `\n` is a newline once read.
    let meta = serde_json::json!({ "parent_thread_id": format!("x\n{FAKE_LINE}") }).to_string();
    let codex = gate
        .client()
        .post_chat(
            &Req::chat("codex")
                .header("x-request-id", "forge-codex")
                .header("session-id", "cx")
                .header("thread-id", "cx-worker")
                .header("x-codex-turn-metadata", &meta),
        )
        .await;
    assert_eq!(codex.status, 200, "{}", codex.body);
    // Refused by the policy (its prompt is too long), and claiming in its session id to be served.
    let spaced = gate
        .client()
        .post_chat(
            &Req::chat("spaced")
                .set(
                    "messages",
                    serde_json::json!([{"role": "user", "content": "p".repeat(200)}]),
                )
                .header("x-request-id", "forge-session")
                .header("X-Session-Id", SPACED),
        )
        .await;
    assert_eq!(spaced.status, 403, "{}", spaced.body);

    let log = eventually(Duration::from_secs(3), "both access lines", || async {
        let text = gate.stderr_text();
        (text.matches("request_id=forge-").count() >= 2).then_some(text)
    })
    .await;
    let access: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("slotgate::access"))
        .collect();
    assert_eq!(access.len(), 2, "one line per request:\n{log}");
    let lines: Vec<Vec<(String, String)>> = access
        .iter()
        .map(|l| fields(l).unwrap_or_else(|| panic!("not an access line: {l:?}")))
        .collect();
    assert!(
        !lines
            .iter()
            .any(|f| f.iter().any(|(k, v)| k == "request_id" && v == "forged")),
        "{log}"
    );

    let codex = line_of(&lines, "forge-codex");
    assert_eq!(get(&codex, "outcome"), Some("ok"), "{codex:?}");
    assert_eq!(get(&codex, "status"), Some("200"), "{codex:?}");
    assert_eq!(get(&codex, "agent"), Some("cx-worker"), "{codex:?}");
    let parent = format!("x\n{FAKE_LINE}");
    assert_eq!(get(&codex, "parent_agent"), Some(parent.as_str()));
    assert!(
        get(&codex, "tenant").is_some_and(|t| t.starts_with("uid:")),
        "{codex:?}"
    );

    let denied = line_of(&lines, "forge-session");
    assert_eq!(get(&denied, "outcome"), Some("policy_denied"), "{denied:?}");
    assert_eq!(get(&denied, "status"), Some("403"), "{denied:?}");
    assert_eq!(get(&denied, "session"), Some(SPACED), "{denied:?}");
    assert_eq!(get(&denied, "policy"), Some("request-guard"), "{denied:?}");
    // The caller, as for the served request: not the `x` the header named.
    assert_eq!(get(&denied, "tenant"), get(&codex, "tenant"), "{denied:?}");
    gate.assert_settled(&up, 1).await;
}
