//! Label and field selectors, as the apiserver parses and applies them,
//! and the filter a list or watch request applies to objects.

use serde_json::Value;

use super::kinds::ResourceKind;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq)]
enum LabelReq {
    Exists(String),
    NotExists(String),
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector`: `key`, `!key`, `key=value`, `key==value`,
/// `key!=value`, `key in (a,b)`, `key notin (a,b)`, comma-joined (all
/// must hold). `!=` and `notin` also match objects without the label, as
/// in Kubernetes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

fn valid_token(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '=' | '!' | '(' | ')' | ',' | '<' | '>'))
}

fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

impl LabelSelector {
    /// Parses a selector; the empty string selects everything.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let mut reqs = Vec::new();
        for raw in split_top_level(s) {
            let part = raw.trim();
            let bad = || format!("unable to parse requirement: invalid label selector {part:?}");
            if part.is_empty() {
                return Err(format!("found empty requirement in label selector {s:?}"));
            }
            if let Some(key) = part.strip_prefix('!') {
                let key = key.trim();
                if !valid_token(key) {
                    return Err(bad());
                }
                reqs.push(LabelReq::NotExists(key.to_owned()));
            } else if let Some(open) = part.find('(') {
                let Some(inner) = part[open + 1..].strip_suffix(')') else {
                    return Err(bad());
                };
                let words: Vec<&str> = part[..open].split_whitespace().collect();
                let [key, op] = words[..] else {
                    return Err(bad());
                };
                if !valid_token(key) {
                    return Err(bad());
                }
                let values: Vec<String> = inner.split(',').map(|v| v.trim().to_owned()).collect();
                if values.iter().any(|v| v.chars().any(char::is_whitespace)) {
                    return Err(bad());
                }
                reqs.push(match op {
                    "in" => LabelReq::In(key.to_owned(), values),
                    "notin" => LabelReq::NotIn(key.to_owned(), values),
                    _ => return Err(bad()),
                });
            } else if let Some((k, v)) = part.split_once("!=") {
                let (k, v) = (k.trim(), v.trim());
                if !valid_token(k) || v.contains(char::is_whitespace) || v.contains('=') {
                    return Err(bad());
                }
                reqs.push(LabelReq::NotEq(k.to_owned(), v.to_owned()));
            } else if let Some((k, v)) = part.split_once('=') {
                let v = v.strip_prefix('=').unwrap_or(v);
                let (k, v) = (k.trim(), v.trim());
                if !valid_token(k) || v.contains(char::is_whitespace) || v.contains('=') {
                    return Err(bad());
                }
                reqs.push(LabelReq::Eq(k.to_owned(), v.to_owned()));
            } else if valid_token(part) {
                reqs.push(LabelReq::Exists(part.to_owned()));
            } else {
                return Err(bad());
            }
        }
        Ok(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object (its whole JSON) matches.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
        })
    }
}

/// A parsed `fieldSelector`: `path=value`, `path==value`, `path!=value`,
/// comma-joined. Every kind supports `metadata.name` and
/// `metadata.namespace`; Services also `spec.clusterIP` and `spec.type`,
/// Nodes `spec.unschedulable`. Other fields are refused (400) like the
/// real server does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

fn supported_fields(kind: ResourceKind) -> &'static [&'static str] {
    match kind {
        ResourceKind::Service => &[
            "metadata.name",
            "metadata.namespace",
            "spec.clusterIP",
            "spec.type",
        ],
        ResourceKind::EndpointSlice => &["metadata.name", "metadata.namespace"],
        ResourceKind::Node => &["metadata.name", "metadata.namespace", "spec.unschedulable"],
        ResourceKind::ServiceCidr => &["metadata.name"],
    }
}

impl FieldSelector {
    pub fn parse(s: &str, kind: ResourceKind) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let mut reqs = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (path, equal, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v.strip_prefix('=').unwrap_or(v))
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            let path = path.trim();
            if !supported_fields(kind).contains(&path) {
                return Err(format!(
                    "field label not supported: {path} for {}",
                    kind.plural()
                ));
            }
            reqs.push((path.to_owned(), equal, value.trim().to_owned()));
        }
        Ok(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, equal, value)| {
            let pointer = format!("/{}", path.replace('.', "/"));
            let actual = match obj.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                // Absent fields compare as their zero value.
                Some(Value::Null) | None => {
                    if path == "spec.unschedulable" {
                        "false".to_owned()
                    } else {
                        String::new()
                    }
                }
                Some(other) => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}

/// What a list or watch request selects: one kind, optionally one
/// namespace, and label and field selectors.
#[derive(Clone, Debug)]
pub struct Filter {
    pub kind: ResourceKind,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    /// Whether an object of `self.kind` matches (the caller checks the kind).
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns.as_str()) {
                return false;
            }
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn svc(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn kube_proxy_selector() {
        let sel = LabelSelector::parse(
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless",
        )
        .unwrap();
        assert!(sel.matches(&svc(json!({"app": "x"}))));
        assert!(sel.matches(&json!({"metadata": {"name": "a"}})));
        assert!(!sel.matches(&svc(json!({"service.kubernetes.io/headless": ""}))));
        assert!(!sel.matches(&svc(
            json!({"service.kubernetes.io/service-proxy-name": "x"})
        )));
    }

    #[test]
    fn equality_and_sets() {
        let o = svc(json!({"app": "web", "tier": "fe"}));
        for (s, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app = web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app", true),
            ("!app", false),
            ("app=web,tier=fe", true),
            ("app=web,tier=be", false),
            ("app in (web, db)", true),
            ("app notin (web,db)", false),
            ("missing notin (a)", true),
            ("missing in (a)", false),
            ("tier in (fe),app=web", true),
            ("", true),
        ] {
            assert_eq!(LabelSelector::parse(s).unwrap().matches(&o), want, "{s}");
        }
        for bad in ["app=web,", "a b", "app in web", "app in (a", "app=x y", "!"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fields() {
        let o = svc(json!({}));
        let k = ResourceKind::Service;
        assert!(FieldSelector::parse("metadata.name=a", k)
            .unwrap()
            .matches(&o));
        assert!(
            FieldSelector::parse("metadata.name==a,metadata.namespace=ns", k)
                .unwrap()
                .matches(&o)
        );
        assert!(!FieldSelector::parse("metadata.name!=a", k)
            .unwrap()
            .matches(&o));
        assert!(FieldSelector::parse("spec.foo=a", k).is_err());
        assert!(FieldSelector::parse("metadata.name", k).is_err());
    }
}
