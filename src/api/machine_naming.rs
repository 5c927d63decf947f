//! `spec.machineNaming.template`: the name of a new control-plane Machine, as
//! KCP v1beta2 spells its template, with our kind's name:
//! `{{ .cluster.name }}`, `{{ .kthreesControlPlane.name }}` and `{{ .random }}`
//! (5 characters; required, so names do not collide). Pure.

use std::sync::LazyLock;

use regex::Regex;

/// The placeholder every template must hold.
pub const RANDOM: &str = "{{ .random }}";

/// Length of the random part.
pub const RANDOM_LEN: usize = 5;

/// A Machine name is a DNS label here: CAPI copies it to the Node's
/// provider objects, where 63 characters is the common limit.
pub const MAX_NAME_LEN: usize = 63;

static PLACEHOLDER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\{\{\s*([^}]*?)\s*\}\}").expect("placeholder pattern compiles"));

/// Why a template gives no usable name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamingError {
    #[error(
        "{template:?}: unknown placeholder {{{{ {placeholder} }}}} (known: .cluster.name, .kthreesControlPlane.name, .random)"
    )]
    UnknownPlaceholder {
        template: String,
        placeholder: String,
    },
    #[error("{template:?}: must contain {RANDOM}")]
    NoRandom { template: String },
    #[error(
        "{template:?} gives {name:?}, which is not a DNS label of at most {MAX_NAME_LEN} characters (lower-case letters, digits, '-', starting and ending with a letter or digit)"
    )]
    NotADnsLabel { template: String, name: String },
}

/// The name `template` gives (`None`: `<kcp>-<random>`).
pub fn render(
    template: Option<&str>,
    cluster: &str,
    kcp: &str,
    random: &str,
) -> Result<String, NamingError> {
    let Some(template) = template else {
        return Ok(format!("{kcp}-{random}"));
    };
    if !template.contains(RANDOM) {
        return Err(NamingError::NoRandom {
            template: template.into(),
        });
    }
    let mut unknown = None;
    let name = PLACEHOLDER.replace_all(template, |caps: &regex::Captures| match &caps[1] {
        ".cluster.name" => cluster.to_string(),
        ".kthreesControlPlane.name" => kcp.to_string(),
        ".random" => random.to_string(),
        other => {
            unknown.get_or_insert_with(|| other.to_string());
            String::new()
        }
    });
    if let Some(placeholder) = unknown {
        return Err(NamingError::UnknownPlaceholder {
            template: template.into(),
            placeholder,
        });
    }
    let name = name.into_owned();
    let label_ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !label_ok {
        return Err(NamingError::NotADnsLabel {
            template: template.into(),
            name,
        });
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_give_names_or_say_why_not() {
        let cases: [(&str, Option<&str>, Result<&str, &str>); 7] = [
            ("no template", None, Ok("cp-abcde")),
            (
                "every placeholder",
                Some("{{ .cluster.name }}-{{ .kthreesControlPlane.name }}-{{ .random }}"),
                Ok("c1-cp-abcde"),
            ),
            (
                "spacing as Go templates allow",
                Some("{{.cluster.name}}-x-{{ .random }}"),
                Ok("c1-x-abcde"),
            ),
            (
                "no random",
                Some("{{ .cluster.name }}-cp"),
                Err("must contain"),
            ),
            (
                "KCP's placeholder is not ours",
                Some("{{ .kubeadmControlPlane.name }}-{{ .random }}"),
                Err("unknown placeholder"),
            ),
            (
                "upper case",
                Some("CP-{{ .random }}"),
                Err("not a DNS label"),
            ),
            (
                "too long",
                Some(
                    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-{{ .random }}",
                ),
                Err("not a DNS label"),
            ),
        ];
        for (situation, template, want) in cases {
            let got = render(template, "c1", "cp", "abcde");
            match (got, want) {
                (Ok(name), Ok(want)) => assert_eq!(name, want, "{situation}"),
                (Err(e), Err(want)) => assert!(e.to_string().contains(want), "{situation}: {e}"),
                (got, want) => panic!("{situation}: got {got:?}, want {want:?}"),
            }
        }
    }
}
