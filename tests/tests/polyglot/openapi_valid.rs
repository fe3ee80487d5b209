//! docs/openapi.json is a valid OpenAPI 3.1 document, as openapi-spec-validator (pinned in
//! tests/python/requirements.txt, run under `$SLOTGATE_PYTHON`) reads it. What it describes is held
//! to the route tables by `admin::openapi`'s unit tests and to the answers by `gate::openapi`.

use serde_json::Value;
use slotgate_tests::python;

#[tokio::test]
async fn the_openapi_document_is_valid_openapi_3_1() {
    let path = slotgate_tests::workspace().join("docs/openapi.json");
    let out: Value = python::driver("validate_openapi.py", &[path.display().to_string()]).await;
    assert_eq!(out["openapi"], "3.1.0", "{out}");
    assert_eq!(
        out["errors"],
        serde_json::json!([]),
        "docs/openapi.json: {out}"
    );
}
