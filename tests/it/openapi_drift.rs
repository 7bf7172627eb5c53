//! The committed OpenAPI document is the code's document, and the broker serves it.

use crate::support::TestBroker;

#[test]
fn committed_openapi_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = loopx::openapi::document_json();
    assert!(
        committed == generated,
        "openapi/openapi.json differs from the code; regenerate it with:\n    cargo run -- openapi > openapi/openapi.json"
    );
}

#[tokio::test]
async fn the_broker_serves_the_committed_document_without_a_token() {
    let broker = TestBroker::start().await;
    let reply = broker
        .client_with_token(None)
        .send(
            reqwest::Method::GET,
            "/openapi.json",
            loopx::client::NO_BODY,
            None,
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.text, loopx::openapi::document_json());
    let doc = reply.json();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/v1/sessions/{session_id}/claims"]["post"]["operationId"] == "claimTurn");
}

/// Every schema's example has the schema's required properties and no other
/// (a field added to a type must not leave its example behind; redocly's
/// `no-invalid-schema-examples` checks the rest in CI).
#[test]
fn every_schema_example_has_exactly_its_schemas_properties() {
    let doc: serde_json::Value = serde_json::from_str(&loopx::openapi::document_json()).unwrap();
    let mut checked = 0;
    for (name, schema) in doc["components"]["schemas"].as_object().unwrap() {
        let (Some(example), Some(properties)) = (
            schema["example"].as_object(),
            schema["properties"].as_object(),
        ) else {
            continue;
        };
        for required in schema["required"].as_array().into_iter().flatten() {
            let key = required.as_str().unwrap();
            assert!(example.contains_key(key), "{name}'s example lacks `{key}`");
        }
        // One level down: an object property given by reference (a session's
        // `agent`), its example value against that schema's required ones.
        for (key, value) in example {
            let (Some(inner), Some(reference)) =
                (value.as_object(), properties[key]["$ref"].as_str())
            else {
                continue;
            };
            let target = reference.trim_start_matches("#/components/schemas/");
            let nested = &doc["components"]["schemas"][target];
            for required in nested["required"].as_array().into_iter().flatten() {
                let field = required.as_str().unwrap();
                assert!(
                    inner.contains_key(field),
                    "{name}'s example: `{key}` lacks `{field}`"
                );
            }
        }
        for key in example.keys() {
            assert!(
                properties.contains_key(key),
                "{name}'s example has `{key}`, not in the schema"
            );
        }
        checked += 1;
    }
    assert!(checked > 5, "only {checked} examples found");
}
