//! What went wrong with an input object: reported, never fatal.

use std::fmt;

/// Why (part of) an object was not used. `label()` is stable: metrics and
/// alerts key on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProblemReason {
    /// An IP address or CIDR that does not parse, or of the wrong family.
    InvalidAddress,
    /// A port number outside 1..=65535.
    InvalidPort,
    /// A protocol other than TCP, UDP and SCTP (an unknown spelling).
    UnsupportedProtocol,
    /// A field the object cannot be used without.
    MissingField,
    /// A field with a value outside what the API allows.
    InvalidValue,
    /// Two entries that must be unique are not (e.g. two service ports with
    /// the same name and protocol).
    Duplicate,
    /// IPv6 frontends and endpoints are not balanced (IPv6 is off), or an
    /// IPv6 frontend needs a feature the IPv6 datapath lacks.
    Ipv6Unsupported,
    /// A manifest document that is not valid YAML or JSON, or does not fit
    /// its kind's schema.
    Unparseable,
    /// An address that is never a service's or a backend's (unspecified,
    /// loopback, multicast, broadcast, link-local, also v4-mapped): a
    /// frontend on it would capture traffic that is not service traffic.
    ForbiddenAddress,
}

impl ProblemReason {
    /// The snake_case label used in metrics.
    pub const fn label(self) -> &'static str {
        match self {
            Self::InvalidAddress => "invalid_address",
            Self::InvalidPort => "invalid_port",
            Self::UnsupportedProtocol => "unsupported_protocol",
            Self::MissingField => "missing_field",
            Self::InvalidValue => "invalid_value",
            Self::Duplicate => "duplicate",
            Self::Ipv6Unsupported => "ipv6_unsupported",
            Self::Unparseable => "unparseable",
            Self::ForbiddenAddress => "forbidden_address",
        }
    }

    /// Every reason, e.g. to initialise a metric family.
    pub const ALL: [ProblemReason; 9] = [
        Self::InvalidAddress,
        Self::InvalidPort,
        Self::UnsupportedProtocol,
        Self::MissingField,
        Self::InvalidValue,
        Self::Duplicate,
        Self::Ipv6Unsupported,
        Self::Unparseable,
        Self::ForbiddenAddress,
    ];
}

impl fmt::Display for ProblemReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// One problem with one object (or one part of it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Problem {
    /// The object, as operators name it: `Service default/web`,
    /// `EndpointSlice default/web-abc12`, `Node worker-1`, or a manifest
    /// file and document.
    pub object: String,
    pub reason: ProblemReason,
    pub detail: String,
}

impl Problem {
    pub fn new(
        object: impl Into<String>,
        reason: ProblemReason,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            object: object.into(),
            reason,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.object, self.detail, self.reason)
    }
}

impl std::error::Error for Problem {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_snake_case_and_unique() {
        let labels: std::collections::BTreeSet<&str> =
            ProblemReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), ProblemReason::ALL.len());
        for l in labels {
            assert!(
                l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{l}"
            );
        }
    }

    #[test]
    fn display_names_object_detail_and_reason() {
        let p = Problem::new(
            "Service default/web",
            ProblemReason::InvalidPort,
            "port 70000 is outside 1..=65535",
        );
        assert_eq!(
            p.to_string(),
            "Service default/web: port 70000 is outside 1..=65535 (invalid_port)"
        );
    }
}
