//! Fault injection (failing requests, outages) and the request log.

use super::kinds::ResourceKind;

/// What a request asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    /// GET on a collection without `watch`.
    List,
    /// GET on a collection with `watch=true` (or `1`).
    Watch,
    /// GET of one object by name.
    Get,
    /// Anything else: other methods, `/version`, unknown paths.
    Other,
}

/// How to fail one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this HTTP status and a `Status` body (reason derived
    /// from the code: 410 Expired, 500 InternalError, 503
    /// ServiceUnavailable, ...).
    Status(u16),
    /// For watches: answer 200 and a single `ERROR` event carrying a 410
    /// Expired `Status`, then end the stream. This is what a real
    /// apiserver sends when a watch starts from a compacted
    /// resourceVersion, and the only 410 form kube-rs's watcher treats as
    /// a desync (it then relists). For other verbs it acts as
    /// `Status(410)`.
    ExpiredWatch,
    /// Close the connection without answering.
    CloseConnection,
}

/// Whole-server failure mode.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Outage {
    /// Serve normally.
    #[default]
    Off,
    /// Answer every request with this HTTP status (e.g. 503).
    Status(u16),
    /// Accept and immediately close every new connection, and close every
    /// request on an already open connection without an answer (the
    /// listening socket stays bound, so the port cannot be taken).
    CloseConnections,
}

/// One request the server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// Order of arrival, from 1.
    pub seq: u64,
    pub method: String,
    pub path: String,
    /// The raw query string, as sent (still percent-encoded).
    pub query: String,
    /// Decoded query parameters, in order.
    pub params: Vec<(String, String)>,
    pub verb: Verb,
    pub resource: Option<ResourceKind>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The HTTP status answered; 0 while the request is being handled or
    /// when the connection was closed instead. The log entry is made
    /// before the request is served (a watch is logged before it opens).
    pub status: u16,
}

impl RequestRecord {
    /// A decoded query parameter (the first, if repeated).
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The `resourceVersion` parameter.
    pub fn resource_version(&self) -> Option<&str> {
        self.param("resourceVersion")
    }
}

#[derive(Debug)]
struct Rule {
    verb: Verb,
    resource: Option<ResourceKind>,
    remaining: usize,
    fault: Fault,
}

#[derive(Debug, Default)]
pub(crate) struct Faults {
    rules: Vec<Rule>,
    pub outage: Outage,
    pub log: Vec<RequestRecord>,
    pub next_seq: u64,
    pub refused_connections: u64,
    /// How long every list request waits before it is answered (a slow
    /// API server: lets a test see two lists in flight at once).
    pub list_delay: std::time::Duration,
}

impl Faults {
    pub fn add(&mut self, verb: Verb, resource: Option<ResourceKind>, n: usize, fault: Fault) {
        if n > 0 {
            self.rules.push(Rule {
                verb,
                resource,
                remaining: n,
                fault,
            });
        }
    }

    pub fn clear(&mut self) {
        self.rules.clear();
    }

    /// The fault for this request, if a rule matches (oldest rule first).
    pub fn take(&mut self, verb: Verb, resource: Option<ResourceKind>) -> Option<Fault> {
        let i = self
            .rules
            .iter()
            .position(|r| r.verb == verb && (r.resource.is_none() || r.resource == resource))?;
        let rule = &mut self.rules[i];
        rule.remaining -= 1;
        let fault = rule.fault.clone();
        if rule.remaining == 0 {
            self.rules.remove(i);
        }
        Some(fault)
    }

    pub fn pending(&self) -> usize {
        self.rules.iter().map(|r| r.remaining).sum()
    }
}
