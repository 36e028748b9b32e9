//! `sluice monitor`'s filters: every given one must match.

use std::net::{IpAddr, SocketAddr};

use sluice_common::Stat;

use super::record::Record;

/// What `--reason`, `--frontend`, `--addr` and `--port` ask for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    reasons: Vec<String>,
    frontend: Option<Frontend>,
    addr: Option<IpAddr>,
    port: Option<u16>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Frontend {
    Addr(IpAddr),
    Socket(SocketAddr),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FilterError {
    #[error("unknown reason `{0}` (one of: {1})")]
    Reason(String, String),
    #[error("--frontend wants ADDR, ADDR:PORT or [ADDR6]:PORT, got `{0}`")]
    Frontend(String),
}

impl Filter {
    pub fn new(
        reasons: &[String],
        frontend: Option<&str>,
        addr: Option<IpAddr>,
        port: Option<u16>,
    ) -> Result<Self, FilterError> {
        for r in reasons {
            if !Stat::ALL.iter().any(|s| s.name() == r) {
                let all: Vec<&str> = Stat::ALL.iter().map(Stat::name).collect();
                return Err(FilterError::Reason(r.clone(), all.join(", ")));
            }
        }
        let frontend = match frontend {
            None => None,
            Some(f) => Some(if let Ok(s) = f.parse::<SocketAddr>() {
                Frontend::Socket(s)
            } else {
                Frontend::Addr(
                    f.parse::<IpAddr>()
                        .map_err(|_| FilterError::Frontend(f.to_owned()))?,
                )
            }),
        };
        Ok(Self {
            reasons: reasons.to_vec(),
            frontend,
            addr,
            port,
        })
    }

    pub fn matches(&self, r: &Record) -> bool {
        if !self.reasons.is_empty() && !self.reasons.contains(&r.reason) {
            return false;
        }
        let backend: Option<SocketAddr> = r.backend.as_deref().and_then(|b| b.parse().ok());
        match &self.frontend {
            None => {}
            Some(Frontend::Addr(a)) if r.frontend.is_some() && r.dst == Some(*a) => {}
            Some(Frontend::Socket(s))
                if r.frontend.is_some() && r.dst == Some(s.ip()) && r.dport == Some(s.port()) => {}
            Some(_) => return false,
        }
        if let Some(a) = self.addr {
            if r.src != Some(a) && r.dst != Some(a) && backend.map(|b| b.ip()) != Some(a) {
                return false;
            }
        }
        if let Some(p) = self.port {
            if r.sport != Some(p) && r.dport != Some(p) && backend.map(|b| b.port()) != Some(p) {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> Record {
        Record {
            time: String::new(),
            reason: "no_backend".into(),
            hook: "ingress",
            family: Some("ipv4"),
            proto: Some("tcp".into()),
            src: Some("10.0.0.2".parse().unwrap()),
            sport: Some(40000),
            dst: Some("10.96.0.10".parse().unwrap()),
            dport: Some(80),
            frontend: Some("10.96.0.10:80".into()),
            svc_id: Some(1),
            backend_id: Some(4),
            backend: Some("10.1.0.5:8080".into()),
            ifindex: Some(3),
        }
    }

    #[test]
    fn each_filter_selects() {
        let f = |reasons: &[&str], fe: Option<&str>, a: Option<&str>, p: Option<u16>| {
            let reasons: Vec<String> = reasons.iter().map(|s| s.to_string()).collect();
            Filter::new(&reasons, fe, a.map(|a| a.parse().unwrap()), p).unwrap()
        };
        let r = rec();
        assert!(f(&[], None, None, None).matches(&r));
        assert!(f(&["no_backend", "source_denied"], None, None, None).matches(&r));
        assert!(!f(&["source_denied"], None, None, None).matches(&r));
        assert!(f(&[], Some("10.96.0.10:80"), None, None).matches(&r));
        assert!(f(&[], Some("10.96.0.10"), None, None).matches(&r));
        assert!(!f(&[], Some("10.96.0.10:81"), None, None).matches(&r));
        assert!(f(&[], None, Some("10.1.0.5"), None).matches(&r));
        assert!(f(&[], None, Some("10.0.0.2"), None).matches(&r));
        assert!(!f(&[], None, Some("10.0.0.3"), None).matches(&r));
        assert!(f(&[], None, None, Some(8080)).matches(&r));
        assert!(f(&[], None, None, Some(40000)).matches(&r));
        assert!(!f(&[], None, None, Some(81)).matches(&r));
    }

    #[test]
    fn bad_filters_are_refused() {
        assert!(matches!(
            Filter::new(&["nope".into()], None, None, None),
            Err(FilterError::Reason(..))
        ));
        assert!(matches!(
            Filter::new(&[], Some("x:y"), None, None),
            Err(FilterError::Frontend(_))
        ));
    }
}
