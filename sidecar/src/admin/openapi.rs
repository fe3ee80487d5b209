//! `GET /openapi.json`: the OpenAPI 3.1 document of slotgate's own APIs (docs/openapi.json, written
//! by hand, embedded), served as it is in the repository. Its tests hold it equal to the route
//! tables: the admin listener's (`routes::ROUTES`, and llama-server's routes it forwards) and the
//! client listener's own (`pipeline::routes::OWN`), with each route's need as its security.

use http::Response;

use crate::respond::{self, Body};

/// The document, as the repository has it.
pub const DOCUMENT: &str = include_str!("../../../docs/openapi.json");

pub fn answer() -> Response<Body> {
    respond::json_bytes(200, DOCUMENT)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use http::Method;
    use serde_json::Value;

    use super::super::auth::{self, Need};
    use super::super::routes::ROUTES;
    use super::DOCUMENT;
    use crate::pipeline::routes as client;

    const METHODS: &[&str] = &[
        "get", "put", "post", "delete", "options", "head", "patch", "trace",
    ];

    /// `(METHOD, path)` pairs.
    type Operations = BTreeSet<(String, String)>;

    fn document() -> Value {
        serde_json::from_str(DOCUMENT).expect("docs/openapi.json is JSON")
    }

    /// `(METHOD, path)` of every operation, split by listener: a path item with a `servers` of
    /// its own is on the client listener, the others on the admin listener (the document's).
    fn operations(doc: &Value) -> (Operations, Operations) {
        let (mut admin, mut clients) = (BTreeSet::new(), BTreeSet::new());
        for (path, item) in doc["paths"].as_object().expect("paths") {
            let on = match item.get("servers") {
                Some(_) => &mut clients,
                None => &mut admin,
            };
            for m in METHODS.iter().filter(|m| item.get(**m).is_some()) {
                on.insert((m.to_uppercase(), path.clone()));
            }
        }
        (admin, clients)
    }

    /// llama-server's `:name` segments as OpenAPI's `{name}`.
    fn templated(path: &str) -> String {
        path.split('/')
            .map(|s| match s.strip_prefix(':') {
                Some(name) => format!("{{{name}}}"),
                None => s.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    /// What the admin listener answers: its own table, and llama-server's admin routes that are
    /// not its own (`/metrics` is slotgate's), with what each needs.
    fn admin_routes() -> Vec<(String, String, Need)> {
        let own: Vec<_> = ROUTES
            .iter()
            .map(|r| (r.method.to_owned(), r.path.to_owned(), r.need))
            .collect();
        let forwarded = client::ROUTES
            .iter()
            .filter(|r| matches!(r.handling, client::Handling::Admin))
            .filter(|r| !ROUTES.iter().any(|o| o.path == r.path))
            .map(|r| {
                let sample = r.path.replace(":id_slot", "0");
                let need = auth::need(&Method::from_bytes(r.method.as_bytes()).unwrap(), &sample);
                (r.method.to_owned(), templated(r.path), need)
            });
        own.into_iter().chain(forwarded).collect()
    }

    #[test]
    fn the_document_names_exactly_the_routes_of_both_tables() {
        let doc = document();
        assert!(
            doc["openapi"]
                .as_str()
                .is_some_and(|v| v.starts_with("3.1.")),
            "OpenAPI 3.1"
        );
        let (admin, clients) = operations(&doc);
        let table: BTreeSet<(String, String)> =
            admin_routes().into_iter().map(|(m, p, _)| (m, p)).collect();
        let missing: Vec<_> = table.difference(&admin).collect();
        let extra: Vec<_> = admin.difference(&table).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "admin listener: in the tables, not in docs/openapi.json: {missing:?}; \
             in docs/openapi.json, not in the tables: {extra:?}"
        );
        let own: Operations = client::OWN
            .iter()
            .map(|r| (r.method.to_owned(), r.path.to_owned()))
            .collect();
        assert_eq!(
            clients, own,
            "client listener: docs/openapi.json and pipeline::routes::OWN differ"
        );
    }

    #[test]
    fn each_operations_security_is_what_its_route_needs() {
        let doc = document();
        let scheme = |names: &[&str]| -> Value {
            names
                .iter()
                .map(|n| serde_json::json!({ *n: [] }))
                .collect()
        };
        for (method, path, need) in admin_routes() {
            let op = &doc["paths"][&path][method.to_lowercase()];
            let want = match need {
                Need::Open => scheme(&[]),
                Need::Read => scheme(&["adminToken", "readToken"]),
                Need::Change => scheme(&["adminToken"]),
            };
            assert_eq!(op["security"], want, "{method} {path} needs {need:?}");
        }
        for r in client::OWN {
            let op = &doc["paths"][r.path][r.method.to_lowercase()];
            assert!(
                op["security"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| s.get("clientKey").is_some())),
                "{} {} takes the client's key",
                r.method,
                r.path
            );
        }
    }

    #[test]
    fn every_operation_answers_and_every_reference_resolves() {
        let doc = document();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for m in METHODS.iter().filter(|m| item.get(**m).is_some()) {
                let responses = item[*m]["responses"].as_object().unwrap();
                assert!(
                    responses.keys().any(|s| s.starts_with('2')),
                    "{m} {path} has no success answer"
                );
                assert!(item[*m]["operationId"].is_string(), "{m} {path}");
            }
        }
        fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(r)) = m.get("$ref") {
                        out.push(r);
                    }
                    m.values().for_each(|v| refs(v, out));
                }
                Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        refs(&doc, &mut all);
        assert!(!all.is_empty());
        for r in all {
            let pointer = r.strip_prefix('#').expect("a local reference");
            assert!(doc.pointer(pointer).is_some(), "{r} resolves to nothing");
        }
    }
}
