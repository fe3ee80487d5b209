//! docs/openapi.json against a running slotgate: `GET /openapi.json` serves the repository's
//! document to the read-only token, and every answer the document describes as JSON, read from a
//! slotgate that has keys, a quota in use and a row in its ledger, has the members its schema
//! names: each required one, and none it does not name, each of the type the schema gives (down
//! through objects and arrays whose schema lists members). A member added to or dropped from an answer without the document fails
//! here. The route tables themselves are held to the document by `admin::openapi`'s unit tests.

use http::Method;
use serde_json::{json, Value};
use slotgate_tests::client::Client;
use slotgate_tests::fake_upstream::FakeUpstream;
use slotgate_tests::gate::Gate;
use slotgate_tests::request::CHAT;
use slotgate_tests::wait::unique_dir;
use slotgate_tests::wat;

const DOCUMENT: &str = include_str!("../../../docs/openapi.json");
const ADMIN: &str = "admin-token-for-openapi";
const READ: &str = "read-token-for-openapi-0123";
const QUOTA: &str = "{ period = \"day\", requests = 50, tokens = 100000 }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_is_the_repositorys_and_every_json_answer_has_its_members() {
    let doc: Value = serde_json::from_str(DOCUMENT).expect("docs/openapi.json is JSON");
    let dir = unique_dir("openapi");
    let read_file = dir.join("read.token");
    std::fs::write(&read_file, format!("{READ}\n")).unwrap();
    let up = FakeUpstream::instant().start().await;
    let gate = Gate::new()
        .opt("--client-auth", "keys")
        .opt("--state-dir", dir.join("state").display())
        .opt("--load-report", "always")
        .opt("--admin-read-token-file", read_file.display())
        .admin_token(ADMIN)
        .policies(&[(&wat::built("quota"), Some(QUOTA))])
        .upstream(&up)
        .start()
        .await;
    let admin = gate.admin();
    let reader = admin.clone().without_bearer().with_bearer(READ);

    let served = reader.get("/openapi.json").await;
    assert_eq!(served.status, 200, "{}", served.body);
    assert_eq!(
        served.headers["content-type"], "application/json",
        "its content type"
    );
    let served: Value = serde_json::from_str(&served.body).expect("the answer is JSON");
    assert_eq!(served, doc, "GET /openapi.json is not docs/openapi.json");

    // A key (its answer is a schema too), a request on it, and so a quota and a ledger row.
    let created = admin
        .post_json(
            "/keys",
            &json!({"tenant": "alice", "team": "research", "labels": {"laptop": "a"}}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let created: Value = serde_json::from_str(&created.body).unwrap();
    conforms(
        &doc,
        &response_schema(&doc, "/keys", "post", "201"),
        &created,
        "POST /keys",
    );
    let secret = created["secret"].as_str().unwrap().to_owned();
    let chat =
        json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let r = gate
        .client()
        .send_with(
            Method::POST,
            CHAT,
            &[("x-api-key", &secret)],
            chat.to_string(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    gate.wait_outcome("ok", 1).await;

    let keyed = gate.client().with_bearer(&secret);
    let mut checked = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let Some(op) = item.get("get") else { continue };
        let json_answer = op["responses"]["200"]["content"]["application/json"]["schema"].clone();
        // Path parameters need a value; a schema that names no member says nothing to check.
        if path.contains('{') || json_answer.is_null() || !names_members(&doc, &json_answer) {
            continue;
        }
        let client: &Client = match item.get("servers") {
            Some(_) => &keyed,
            None => admin,
        };
        let r = client.get(path).await;
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        let v: Value = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("GET {path}: {e}"));
        conforms(&doc, &json_answer, &v, &format!("GET {path}"));
        checked.push(path.clone());
    }
    for want in [
        "/status",
        "/live",
        "/usage",
        "/quotas",
        "/keys",
        "/v1/slotgate/me",
        "/v1/loads",
    ] {
        assert!(
            checked.iter().any(|p| p == want),
            "{want} was not checked: {checked:?}"
        );
    }
    let id = created["id"].as_str().unwrap();
    let one = admin.get(&format!("/keys/{id}")).await;
    let one: Value = serde_json::from_str(&one.body).unwrap();
    conforms(
        &doc,
        &response_schema(&doc, "/keys/{id}", "get", "200"),
        &one,
        "GET /keys/{id}",
    );
    // The members were not vacuous: the ledger row and the quota are there.
    let usage: Value = serde_json::from_str(&admin.get("/usage").await.body).unwrap();
    assert_eq!(usage["rows"].as_array().map(Vec::len), Some(1), "{usage}");
    let quotas: Value = serde_json::from_str(&admin.get("/quotas").await.body).unwrap();
    assert!(quotas["count"].as_u64() >= Some(1), "{quotas}");
}

fn response_schema(doc: &Value, path: &str, method: &str, status: &str) -> Value {
    doc["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"].clone()
}

/// `schema` with its `$ref` followed and an `allOf` merged: (properties, required).
fn members(doc: &Value, schema: &Value) -> (serde_json::Map<String, Value>, Vec<String>) {
    if let Some(r) = schema["$ref"].as_str() {
        let target = doc
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("{r}"));
        return members(doc, target);
    }
    let mut props = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut required: Vec<String> = (schema["required"].as_array().into_iter().flatten())
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect();
    for part in schema["allOf"].as_array().into_iter().flatten() {
        let (p, r) = members(doc, part);
        props.extend(p);
        required.extend(r);
    }
    (props, required)
}

fn names_members(doc: &Value, schema: &Value) -> bool {
    !members(doc, schema).0.is_empty()
}

/// Whether `value` is of the JSON Schema type `t`.
fn is(t: &str, value: &Value) -> bool {
    match t {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => panic!("unknown type {t}"),
    }
}

/// `value` is of the type `schema` says, has every member it requires and none it does not name,
/// and so on down.
fn conforms(doc: &Value, schema: &Value, value: &Value, at: &str) {
    if let Some(r) = schema["$ref"].as_str() {
        let target = doc.pointer(r.trim_start_matches('#')).unwrap();
        return conforms(doc, target, value, at);
    }
    if let Some(types) = schema.get("type") {
        let types: Vec<&str> = match types {
            Value::Array(all) => all.iter().filter_map(Value::as_str).collect(),
            t => t.as_str().into_iter().collect(),
        };
        assert!(
            types.iter().any(|t| is(t, value)),
            "{at}: {value} is not of type {types:?}"
        );
    }
    match value {
        Value::Object(m) => {
            let (props, required) = members(doc, schema);
            if props.is_empty() {
                return;
            }
            for r in &required {
                assert!(
                    m.contains_key(r),
                    "{at}: `{r}` is required and missing: {value}"
                );
            }
            for (k, v) in m {
                let sub = props
                    .get(k)
                    .unwrap_or_else(|| panic!("{at}: `{k}` is not in docs/openapi.json: {value}"));
                conforms(doc, sub, v, &format!("{at}.{k}"));
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for v in items {
                    conforms(doc, item, v, &format!("{at}[]"));
                }
            }
        }
        _ => {}
    }
}
