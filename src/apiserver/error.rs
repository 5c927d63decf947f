//! API errors rendered as Kubernetes `Status` objects with the real server's codes, reasons and messages.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

use super::resource::ResourceDef;

/// Who an error is about: used for the message and `details`.
#[derive(Clone, Debug, Default)]
pub struct Subject {
    pub group: String,
    /// `details.kind`: the plural for NotFound/AlreadyExists/Conflict, the Kind for Invalid.
    pub kind: String,
    /// `plural.group` (NotFound etc.) or `Kind.group` (Invalid) as printed in messages.
    pub qualified: String,
    pub name: String,
}

impl Subject {
    pub fn resource(def: &ResourceDef, name: &str) -> Self {
        Self {
            group: def.group.clone(),
            kind: def.plural.clone(),
            qualified: def.qualified_plural(),
            name: name.to_string(),
        }
    }

    pub fn kind(def: &ResourceDef, name: &str) -> Self {
        Self {
            group: def.group.clone(),
            kind: def.kind.clone(),
            qualified: def.qualified_kind(),
            name: name.to_string(),
        }
    }
}

/// Everything a request can fail with; each maps to one HTTP code and `reason`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{} \"{}\" not found", .0.qualified, .0.name)]
    NotFound(Subject),
    #[error("the server could not find the requested resource")]
    NoRoute,
    #[error("{} \"{}\" already exists", .0.qualified, .0.name)]
    AlreadyExists(Subject),
    #[error("Operation cannot be fulfilled on {} \"{}\": {}", .0.qualified, .0.name, .1)]
    Conflict(Subject, String),
    #[error("{} \"{}\" is invalid: {}: {}", .subject.qualified, .subject.name, .field, .detail)]
    Invalid {
        subject: Box<Subject>,
        field: String,
        detail: String,
    },
    #[error("{} \"{}\" is forbidden: {}", .0.qualified, .0.name, .1)]
    Forbidden(Subject, String),
    /// An RBAC denial (`NewForbidden` of the request's group/resource and name; no
    /// subject for a non-resource request).
    #[error("{}", denied_message(.0.as_deref(), .1))]
    Denied(Option<Box<Subject>>, String),
    /// Credentials that name no user.
    #[error("Unauthorized")]
    Unauthorized,
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Gone(String),
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    /// The real server answers some client mistakes with a bare 500 (no reason).
    #[error("{0}")]
    Internal(String),
    /// A server-side failure (`NewInternalError`): 500 with reason InternalError.
    #[error("Internal error occurred: {0}")]
    InternalError(String),
    #[error("the body of the request was in an unknown format - accepted media types include: {0}")]
    UnsupportedMediaType(String),
}

impl ApiError {
    pub fn code(&self) -> u16 {
        match self {
            Self::NotFound(_) | Self::NoRoute => 404,
            Self::AlreadyExists(_) | Self::Conflict(..) => 409,
            Self::Invalid { .. } => 422,
            Self::BadRequest(_) => 400,
            Self::Forbidden(..) | Self::Denied(..) => 403,
            Self::Unauthorized => 401,
            Self::Gone(_) => 410,
            Self::MethodNotAllowed => 405,
            Self::UnsupportedMediaType(_) => 415,
            Self::Internal(_) | Self::InternalError(_) => 500,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound(_) | Self::NoRoute => "NotFound",
            Self::AlreadyExists(_) => "AlreadyExists",
            Self::Conflict(..) => "Conflict",
            Self::Invalid { .. } => "Invalid",
            Self::BadRequest(_) => "BadRequest",
            Self::Forbidden(..) | Self::Denied(..) => "Forbidden",
            Self::Unauthorized => "Unauthorized",
            Self::Gone(_) => "Expired",
            Self::MethodNotAllowed => "MethodNotAllowed",
            Self::UnsupportedMediaType(_) => "UnsupportedMediaType",
            Self::InternalError(_) => "InternalError",
            Self::Internal(_) => "",
        }
    }

    /// The `Status` object the real server sends for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        let details = match self {
            Self::NotFound(s)
            | Self::AlreadyExists(s)
            | Self::Conflict(s, _)
            | Self::Forbidden(s, _) => Some(details(s, None)),
            Self::Invalid {
                subject,
                field,
                detail,
            } => Some(details(
                subject,
                Some(json!([{"reason": cause_reason(detail), "message": detail, "field": field}])),
            )),
            Self::InternalError(cause) => Some(json!({"causes": [{"message": cause}]})),
            // omitempty, as upstream: `{}` for a non-resource request.
            Self::Denied(s, _) => Some(json!(
                s.as_deref()
                    .map(
                        |s| [("name", &s.name), ("group", &s.group), ("kind", &s.kind)]
                            .into_iter()
                            .filter(|(_, v)| !v.is_empty())
                            .map(|(k, v)| (k.to_string(), json!(v)))
                            .collect::<serde_json::Map<_, _>>()
                    )
                    .unwrap_or_default()
            )),
            _ => None,
        };
        if self.reason().is_empty() {
            status
                .as_object_mut()
                .expect("built as an object")
                .remove("reason");
        }
        if let Some(d) = details {
            status["details"] = d;
        }
        status
    }
}

/// `NewForbidden`'s message: `forbidden: ...` without a resource, `<resource> is
/// forbidden: ...` without a name.
fn denied_message(subject: Option<&Subject>, message: &str) -> String {
    match subject {
        None => format!("forbidden: {message}"),
        Some(s) if s.name.is_empty() => format!("{} is forbidden: {message}", s.qualified),
        Some(s) => format!("{} {:?} is forbidden: {message}", s.qualified, s.name),
    }
}

/// The `StatusCause` reason of a field error, from its detail's type prefix
/// (`field.Error.Type`: "Required value", "Forbidden", ...), as upstream.
fn cause_reason(detail: &str) -> &'static str {
    const TYPES: &[(&str, &str)] = &[
        ("Required value", "FieldValueRequired"),
        ("Forbidden", "FieldValueForbidden"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Too long", "FieldValueTooLong"),
        ("Too many", "FieldValueTooMany"),
        ("Not found", "FieldValueNotFound"),
        ("Internal error", "InternalError"),
    ];
    TYPES
        .iter()
        .find(|(prefix, _)| detail.starts_with(prefix))
        .map_or("FieldValueInvalid", |(_, reason)| reason)
}

fn details(s: &Subject, causes: Option<Value>) -> Value {
    let mut d = json!({"name": s.name, "group": s.group, "kind": s.kind});
    if let Some(c) = causes {
        d["causes"] = c;
    }
    d
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, axum::Json(self.to_status())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kcp() -> ResourceDef {
        ResourceDef::new(
            kube::core::ApiResource {
                group: "controlplane.cluster.x-k8s.io".into(),
                version: "v1beta2".into(),
                api_version: "controlplane.cluster.x-k8s.io/v1beta2".into(),
                kind: "KThreesControlPlane".into(),
                plural: "kthreescontrolplanes".into(),
            },
            super::super::resource::Scope::Namespaced,
        )
    }

    #[test]
    fn not_found_reads_like_the_real_server() {
        let err = ApiError::NotFound(Subject::resource(&kcp(), "kcp-1"));
        let status = err.to_status();
        assert_eq!(
            status["message"],
            "kthreescontrolplanes.controlplane.cluster.x-k8s.io \"kcp-1\" not found"
        );
        assert_eq!(status["code"], 404);
        assert_eq!(status["details"]["kind"], "kthreescontrolplanes");
    }

    #[test]
    fn invalid_names_kind_and_field() {
        let err = ApiError::Invalid {
            subject: Box::new(Subject::kind(&kcp(), "kcp-1")),
            field: "metadata.finalizers".into(),
            detail: "Forbidden: no new finalizers can be added if the object is being deleted"
                .into(),
        };
        assert_eq!(err.code(), 422);
        assert!(err.to_string().starts_with("KThreesControlPlane.controlplane.cluster.x-k8s.io \"kcp-1\" is invalid: metadata.finalizers"));
        // A cause carries the field error's body (no field) and its type.
        let cause = &err.to_status()["details"]["causes"][0];
        assert_eq!(cause["field"], "metadata.finalizers");
        assert_eq!(cause["reason"], "FieldValueForbidden");
        assert!(
            cause["message"]
                .as_str()
                .unwrap()
                .starts_with("Forbidden: ")
        );
    }
}
