//! `apiextensions.k8s.io/v1` `ConversionReview`: the API server's request to
//! convert objects, and our answer. Pure: the API versions a down-conversion
//! may need ([`needed_versions`]) are looked up by the server first.

use serde_json::{Value, json};

use crate::api::conversion::{ApiVersions, convert, versions_needed};

/// The (group, kind) pairs whose API version answering `review` may need.
pub fn needed_versions(review: &Value) -> Vec<(String, String)> {
    let request = &review["request"];
    let (Some(desired), Some(objects)) = (
        request["desiredAPIVersion"].as_str(),
        request["objects"].as_array(),
    ) else {
        return Vec::new();
    };
    versions_needed(objects, desired)
}

/// Answer one review: every object converted to `request.desiredAPIVersion`,
/// or a `Failure` naming the first object and field that could not be.
/// Returns `Err` only when the review itself is malformed (no `request.uid`),
/// which the server answers with HTTP 400.
pub fn answer(review: &Value, versions: &dyn ApiVersions) -> Result<Value, String> {
    let request = review
        .get("request")
        .filter(|r| r.is_object())
        .ok_or("ConversionReview: request: missing")?;
    let uid = request
        .get("uid")
        .and_then(Value::as_str)
        .ok_or("ConversionReview: request.uid: missing")?;
    let response = match converted(request, versions) {
        Ok(objects) => json!({
            "uid": uid,
            "convertedObjects": objects,
            "result": {"status": "Success"},
        }),
        Err(message) => json!({
            "uid": uid,
            "result": {"status": "Failure", "message": message},
        }),
    };
    Ok(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "response": response,
    }))
}

fn converted(request: &Value, versions: &dyn ApiVersions) -> Result<Vec<Value>, String> {
    let desired = request
        .get("desiredAPIVersion")
        .and_then(Value::as_str)
        .ok_or("ConversionReview: request.desiredAPIVersion: missing")?;
    let objects = request
        .get("objects")
        .and_then(Value::as_array)
        .ok_or("ConversionReview: request.objects: missing")?;
    objects
        .iter()
        .map(|o| convert(o, desired, versions).map_err(|e| e.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conversion::{KnownApiVersions, V1BETA1, V1BETA2};

    fn answer(review: &Value) -> Result<Value, String> {
        super::answer(review, &KnownApiVersions::new())
    }

    fn object(version: &str) -> Value {
        json!({"apiVersion": version, "kind": "KThreesControlPlane",
               "metadata": {"name": "cp", "namespace": "ns"},
               "spec": {"version": "v1.30.2+k3s2"}})
    }

    #[test]
    fn a_review_converts_every_object_and_echoes_the_uid() {
        let review = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "u-1", "desiredAPIVersion": V1BETA2,
                        "objects": [object(V1BETA1), object(V1BETA2)]}});
        let answer = answer(&review).unwrap();
        assert_eq!(answer["kind"], "ConversionReview");
        assert_eq!(answer["response"]["uid"], "u-1");
        assert_eq!(answer["response"]["result"]["status"], "Success");
        let objects = answer["response"]["convertedObjects"].as_array().unwrap();
        assert_eq!(objects.len(), 2);
        assert!(objects.iter().all(|o| o["apiVersion"] == V1BETA2));
    }

    #[test]
    fn an_object_that_cannot_be_converted_fails_the_review_naming_it() {
        let mut bad = object(V1BETA1);
        bad["spec"]["rolloutStrategy"] = json!({});
        let review =
            json!({"request": {"uid": "u-2", "desiredAPIVersion": V1BETA2, "objects": [bad]}});
        let answer = answer(&review).unwrap();
        assert_eq!(answer["response"]["result"]["status"], "Failure");
        let message = answer["response"]["result"]["message"].as_str().unwrap();
        assert!(
            message.contains("ns/cp") && message.contains("spec.rolloutStrategy"),
            "{message}"
        );
    }

    #[test]
    fn a_malformed_review_is_refused() {
        assert!(answer(&json!({})).unwrap_err().contains("request"));
        assert!(
            answer(&json!({"request": {}}))
                .unwrap_err()
                .contains("request.uid")
        );
    }
}
