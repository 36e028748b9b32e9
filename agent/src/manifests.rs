//! Parsing a manifest directory: the files' contents in, Services,
//! EndpointSlices, Nodes and ServiceCIDRs out. No I/O here: the caller lists and reads
//! the files (see `is_manifest_file`).
//!
//! YAML files may hold several documents (`---`); JSON files one value or
//! a stream of them. `kind: List` (and typed lists such as `ServiceList`)
//! are unpacked. Kinds other than v1 Service, v1 Node,
//! discovery.k8s.io/v1 EndpointSlice and networking.k8s.io/v1 ServiceCIDR
//! are ignored; a document that does not
//! parse is reported and the others are still used.

use std::path::Path;

use k8s_openapi::{
    api::{
        core::v1::Node, core::v1::Service, discovery::v1::EndpointSlice,
        networking::v1::ServiceCIDR,
    },
    serde::de::DeserializeOwned,
};
use serde::Deserialize;
use serde_json::Value;
use tracing::debug;

use crate::translate::{Problem, ProblemReason};

/// The objects of a manifest directory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Manifests {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub nodes: Vec<Node>,
    pub service_cidrs: Vec<ServiceCIDR>,
    /// Documents that could not be used.
    pub problems: Vec<Problem>,
}

/// Whether a directory entry is a manifest: a `.yaml`, `.yml` or `.json`
/// file whose name does not start with a dot (which also leaves out the
/// `..data` links of a mounted ConfigMap).
pub fn is_manifest_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    if name.starts_with('.') {
        return false;
    }
    format_of(path).is_some()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Yaml,
    Json,
}

fn format_of(path: &Path) -> Option<Format> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    match ext.as_str() {
        "yaml" | "yml" => Some(Format::Yaml),
        "json" => Some(Format::Json),
        _ => None,
    }
}

/// What one manifest file may cost before it is parsed: a bigger or more
/// deeply nested file is refused whole, so that no input can keep the
/// agent busy (YAML parsers are slow on pathological nesting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest file, in bytes.
    pub max_bytes: usize,
    /// Deepest nesting of flow collections (`[`, `{`) and of block
    /// indentation (in levels of at least one column).
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: 64 << 20,
            max_depth: 64,
        }
    }
}

/// Why `contents` is refused under `limits`, if it is. One pass over the
/// bytes, no allocation: the check costs far less than any parse.
///
/// Flow nesting (`[`, `{`) is what makes the YAML parser slow (quadratic
/// in unclosed flow collections), so it is counted outside quoted scalars
/// (a JSON document in an annotation is a quoted string) and, separately,
/// inside each quoted span, so that a quote this scan takes for the start
/// of a string where the parser does not still cannot hide openers.
pub fn over_limits(contents: &str, limits: Limits) -> Option<String> {
    if let Some(why) = too_large(contents.len() as u64, limits) {
        return Some(why);
    }
    let deep = || Some(format!("nested deeper than {} levels", limits.max_depth));
    let mut depth = 0usize;
    // Openers minus closers inside the current quoted span.
    let mut quoted_depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut escaped = false;
    let mut comment = false;
    // The previous byte that is not a space: a quote starts a scalar only
    // after one of these (or at the start of a line).
    let mut prev: u8 = b'\n';
    let mut indent: Option<usize> = Some(0);
    // A single quote just closed a span: `''` is an escaped quote inside
    // it, so the span goes on if the next byte is another `'`.
    let mut single_closed = false;
    for &b in contents.as_bytes() {
        if std::mem::take(&mut single_closed) && b == b'\'' {
            quote = Some(b'\'');
            continue;
        }
        if b == b'\n' {
            comment = false;
            indent = Some(0);
            prev = b'\n';
            continue;
        }
        if let Some(n) = indent.as_mut() {
            if b == b' ' {
                *n += 1;
                if *n > limits.max_depth * 8 {
                    return Some(format!(
                        "indentation deeper than {} columns",
                        limits.max_depth * 8
                    ));
                }
                continue;
            }
            indent = None;
        }
        if comment {
            continue;
        }
        if let Some(q) = quote {
            match b {
                b'\\' if q == b'"' && !escaped => {
                    escaped = true;
                    continue;
                }
                c if c == q && !escaped => {
                    quote = None;
                    quoted_depth = 0;
                    single_closed = q == b'\'';
                }
                b'[' | b'{' => {
                    quoted_depth += 1;
                    if depth + quoted_depth > limits.max_depth {
                        return deep();
                    }
                }
                b']' | b'}' => quoted_depth = quoted_depth.saturating_sub(1),
                _ => {}
            }
            escaped = false;
            prev = b;
            continue;
        }
        match b {
            b'"' | b'\''
                if matches!(prev, b'\n' | b':' | b'-' | b'[' | b'{' | b',' | b'?' | b' ') =>
            {
                quote = Some(b)
            }
            b'#' if matches!(prev, b'\n' | b' ' | b'\t') => comment = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limits.max_depth {
                    return deep();
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if b != b' ' {
            prev = b;
        } else if prev != b'\n' {
            prev = b' ';
        }
    }
    None
}

/// Parses one file under `limits`: a file over them yields one problem
/// and no object.
pub fn parse_file(path: &Path, contents: &str, limits: Limits) -> Manifests {
    if let Some(why) = over_limits(contents, limits) {
        return unusable(path, &format!("{why}: refused unread"));
    }
    parse_manifests(&[(path, contents.to_owned())])
}

/// Why a file of `len` bytes is too large to be read, if it is.
pub fn too_large(len: u64, limits: Limits) -> Option<String> {
    (len > limits.max_bytes as u64).then(|| {
        format!(
            "file of {len} bytes is larger than the limit of {} bytes",
            limits.max_bytes
        )
    })
}

/// A file none of whose objects can be used, and why.
pub fn unusable(path: &Path, why: &str) -> Manifests {
    Manifests {
        problems: vec![Problem::new(
            path.display().to_string(),
            ProblemReason::Unparseable,
            why,
        )],
        ..Manifests::default()
    }
}

/// Parses the given files (name, contents), in the given order. Files
/// named other than `.json` are read as YAML.
pub fn parse_manifests<P: AsRef<Path>>(files: &[(P, String)]) -> Manifests {
    let mut out = Manifests::default();
    for (path, contents) in files {
        let path = path.as_ref();
        let file = path.display().to_string();
        let contents = contents.strip_prefix('\u{feff}').unwrap_or(contents);
        match format_of(path) {
            Some(Format::Json) => parse_json(&file, contents, &mut out),
            _ => parse_yaml(&file, contents, &mut out),
        }
    }
    out
}

fn parse_json(file: &str, contents: &str, out: &mut Manifests) {
    let stream = serde_json::Deserializer::from_str(contents).into_iter::<Value>();
    for (i, doc) in stream.enumerate() {
        let origin = format!("{file} document {}", i + 1);
        match doc {
            Ok(value) => add_value(value, &origin, out),
            Err(e) => {
                out.problems.push(Problem::new(
                    origin,
                    ProblemReason::Unparseable,
                    format!("invalid JSON: {e}"),
                ));
                // A JSON stream cannot resynchronise after an error.
                break;
            }
        }
    }
}

fn parse_yaml(file: &str, contents: &str, out: &mut Manifests) {
    let mut index = 0usize;
    for (line, chunk) in split_documents(contents) {
        // A chunk is normally one document; the YAML parser still gets to
        // split what the line scan did not.
        for doc in serde_yaml::Deserializer::from_str(chunk) {
            index += 1;
            let origin = format!("{file} document {index} (line {line})");
            match serde_yaml::Value::deserialize(doc) {
                Ok(serde_yaml::Value::Null) => {}
                Ok(value) => match serde_json::to_value(&value) {
                    Ok(value) => add_value(value, &origin, out),
                    Err(e) => out.problems.push(Problem::new(
                        origin,
                        ProblemReason::Unparseable,
                        format!("not a Kubernetes object: {e}"),
                    )),
                },
                Err(e) => {
                    out.problems.push(Problem::new(
                        origin,
                        ProblemReason::Unparseable,
                        format!("invalid YAML: {e}"),
                    ));
                    // The rest of this chunk is lost; the next chunk
                    // starts afresh.
                    break;
                }
            }
        }
    }
}

/// Splits a YAML stream at `---` lines, so that a broken document cannot
/// take the following ones with it. Yields the 1-based line each chunk
/// starts at.
fn split_documents(contents: &str) -> Vec<(usize, &str)> {
    let mut chunks = Vec::new();
    let mut start = 0usize;
    let mut start_line = 1usize;
    let mut offset = 0usize;
    for (i, line) in contents.split_inclusive('\n').enumerate() {
        let is_marker = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace));
        if is_marker && offset > start {
            chunks.push((start_line, &contents[start..offset]));
            start = offset;
            start_line = i + 1;
        }
        offset += line.len();
    }
    if start < contents.len() {
        chunks.push((start_line, &contents[start..]));
    }
    chunks
}

fn str_field<'a>(value: &'a Value, field: &str) -> Option<&'a str> {
    value.get(field).and_then(Value::as_str)
}

/// How a document names its object, for problems.
fn describe(value: &Value, kind: &str) -> String {
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| str_field(m, "name"))
        .unwrap_or("<unnamed>");
    match meta.and_then(|m| str_field(m, "namespace")) {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

fn add_value(value: Value, origin: &str, out: &mut Manifests) {
    if !value.is_object() {
        out.problems.push(Problem::new(
            origin,
            ProblemReason::Unparseable,
            "not a Kubernetes object (expected a mapping)",
        ));
        return;
    }
    let Some(kind) = str_field(&value, "kind").map(str::to_owned) else {
        out.problems.push(Problem::new(
            origin,
            ProblemReason::MissingField,
            "kind is missing",
        ));
        return;
    };
    let api_version = str_field(&value, "apiVersion").unwrap_or("").to_owned();

    if kind.ends_with("List") {
        add_list(value, &kind, &api_version, origin, out);
        return;
    }
    let wanted = match kind.as_str() {
        "Service" | "Node" => "v1",
        "EndpointSlice" => "discovery.k8s.io/v1",
        "ServiceCIDR" => "networking.k8s.io/v1",
        _ => {
            debug!(
                origin,
                kind, api_version, "ignoring manifest of unhandled kind"
            );
            return;
        }
    };
    if api_version != wanted {
        out.problems.push(Problem::new(
            format!("{origin}: {}", describe(&value, &kind)),
            ProblemReason::InvalidValue,
            format!("apiVersion {api_version:?} of {kind} is not supported, {wanted} is"),
        ));
        return;
    }
    let label = format!("{origin}: {}", describe(&value, &kind));
    match kind.as_str() {
        "Service" => push_typed(value, &label, &mut out.services, &mut out.problems),
        "Node" => push_typed(value, &label, &mut out.nodes, &mut out.problems),
        "ServiceCIDR" => push_typed(value, &label, &mut out.service_cidrs, &mut out.problems),
        _ => push_typed(value, &label, &mut out.slices, &mut out.problems),
    }
}

fn push_typed<T: DeserializeOwned>(
    value: Value,
    label: &str,
    list: &mut Vec<T>,
    problems: &mut Vec<Problem>,
) {
    match serde_json::from_value::<T>(value) {
        Ok(obj) => list.push(obj),
        Err(e) => problems.push(Problem::new(
            label,
            ProblemReason::Unparseable,
            format!("does not fit the schema: {e}"),
        )),
    }
}

/// `kind: List` holds complete objects; a typed list (`ServiceList`, as
/// the API returns it) may leave kind and apiVersion out of its items.
fn add_list(value: Value, kind: &str, api_version: &str, origin: &str, out: &mut Manifests) {
    let items = match value {
        Value::Object(mut map) => map.remove("items"),
        _ => None,
    };
    let items = match items {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items,
        Some(_) => {
            out.problems.push(Problem::new(
                origin,
                ProblemReason::Unparseable,
                format!("{kind}: items is not a list"),
            ));
            return;
        }
    };
    let item_kind = kind.strip_suffix("List").unwrap_or_default();
    for (i, mut item) in items.into_iter().enumerate() {
        if !item_kind.is_empty() {
            if let Value::Object(map) = &mut item {
                map.entry("kind")
                    .or_insert_with(|| Value::String(item_kind.to_owned()));
                map.entry("apiVersion")
                    .or_insert_with(|| Value::String(api_version.to_owned()));
            }
        }
        add_value(item, &format!("{origin} item {}", i + 1), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn one(name: &str, contents: &str) -> Manifests {
        parse_manifests(&[(name, contents.to_owned())])
    }

    const SERVICE_YAML: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  clusterIP: 10.96.0.10
  ports:
  - name: http
    port: 80
    targetPort: web
"#;

    const SLICE_YAML: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: 8080
  protocol: TCP
endpoints:
- addresses: ["10.0.0.1"]
  conditions: {ready: true}
  nodeName: n1
"#;

    #[test]
    fn multi_document_yaml() {
        let text = format!(
            "# leading comment\n---{SERVICE_YAML}---\n{SLICE_YAML}\n---\n# only a comment\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n---\n\
             apiVersion: v1\nkind: Node\nmetadata: {{name: n1}}\n"
        );
        let m = one("all.yaml", &text);
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        assert_eq!(m.services.len(), 1);
        assert_eq!(m.services[0].metadata.name.as_deref(), Some("web"));
        assert_eq!(m.slices.len(), 1);
        assert_eq!(m.slices[0].endpoints[0].addresses, vec!["10.0.0.1"]);
        assert_eq!(m.nodes.len(), 1);
    }

    #[test]
    fn json_and_json_stream() {
        let svc = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},
                     "spec":{"clusterIP":"10.96.0.1","ports":[{"port":80}]}}"#;
        let m = one("a.json", svc);
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        assert_eq!(m.services.len(), 1);

        let m = one("two.json", &format!("{svc}\n{svc}"));
        assert_eq!(m.services.len(), 2);
    }

    #[test]
    fn list_kinds() {
        let list = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: a}
  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: d}
- apiVersion: v1
  kind: List
  items:
  - apiVersion: v1
    kind: Node
    metadata: {name: n1}
"#;
        let m = one("list.yml", list);
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        assert_eq!(m.services.len(), 1);
        assert_eq!(m.nodes.len(), 1);

        // A typed list as the API returns it: items without kind.
        let typed = r#"{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSliceList",
            "items":[{"metadata":{"name":"s1","labels":{"kubernetes.io/service-name":"a"}},
                      "addressType":"IPv4","endpoints":[]}]}"#;
        let m = one("slices.json", typed);
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        assert_eq!(m.slices.len(), 1);
    }

    #[test]
    fn unparseable_document_among_good_ones() {
        let text = format!(
            "{SERVICE_YAML}---\nkind: Service\n  bad: [indent\n---\n{SLICE_YAML}---\n\
             apiVersion: v1\nkind: Service\nmetadata: {{name: typed}}\nspec: {{ports: [{{port: \"eighty\"}}]}}\n---\n\
             - just\n- a list\n---\nmetadata: {{name: kindless}}\n"
        );
        let m = one("mixed.yaml", &text);
        assert_eq!(m.services.len(), 1);
        assert_eq!(m.slices.len(), 1);
        let reasons: Vec<_> = m.problems.iter().map(|p| p.reason).collect();
        assert_eq!(
            reasons,
            vec![
                ProblemReason::Unparseable,
                ProblemReason::Unparseable,
                ProblemReason::Unparseable,
                ProblemReason::MissingField
            ]
        );
        assert!(
            m.problems[0].object.starts_with("mixed.yaml document 2"),
            "{}",
            m.problems[0]
        );
        assert!(
            m.problems[1].object.contains("Service typed"),
            "{}",
            m.problems[1]
        );
    }

    #[test]
    fn broken_json_file_does_not_stop_other_files() {
        let files = vec![
            (PathBuf::from("bad.json"), "{\"kind\": ".to_owned()),
            (PathBuf::from("good.yaml"), SERVICE_YAML.to_owned()),
        ];
        let m = parse_manifests(&files);
        assert_eq!(m.services.len(), 1);
        assert_eq!(m.problems.len(), 1);
        assert_eq!(m.problems[0].object, "bad.json document 1");
    }

    #[test]
    fn wrong_api_version_is_reported() {
        let m = one(
            "old.yaml",
            "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: s}\naddressType: IPv4\nendpoints: []\n",
        );
        assert!(m.slices.is_empty());
        assert_eq!(m.problems.len(), 1);
        assert_eq!(m.problems[0].reason, ProblemReason::InvalidValue);
    }

    #[test]
    fn manifest_file_predicate() {
        for ok in ["a.yaml", "dir/b.yml", "c.json", "D.YAML"] {
            assert!(is_manifest_file(Path::new(ok)), "{ok}");
        }
        for no in [
            "a.txt",
            "README",
            ".hidden.yaml",
            "..data",
            "yaml",
            "x.yaml.bak",
        ] {
            assert!(!is_manifest_file(Path::new(no)), "{no}");
        }
    }

    #[test]
    fn document_split() {
        let text = "a: 1\n---\nb: 2\n--- \nc: 3\n---x: 4\n";
        let chunks = split_documents(text);
        assert_eq!(
            chunks,
            vec![
                (1, "a: 1\n"),
                (2, "---\nb: 2\n"),
                (4, "--- \nc: 3\n---x: 4\n")
            ]
        );
        assert!(split_documents("").is_empty());
    }

    #[test]
    fn end_to_end_with_translation() {
        use crate::translate::{translate, Stores, TranslateConfig};
        let text = format!("{SERVICE_YAML}---\n{SLICE_YAML}");
        let m = one("web.yaml", &text);
        let stores = Stores::from_objects(&m.services, &m.slices, &m.nodes, "n1");
        assert!(stores.problems.is_empty());
        let t = translate(
            &stores.services,
            &stores.slices,
            stores.node.as_ref(),
            &TranslateConfig {
                node_name: "n1".into(),
                ..Default::default()
            },
        );
        assert!(t.problems.is_empty(), "{:?}", t.problems);
        let (name, svc) = t.desired.services.iter().next().unwrap();
        assert_eq!(name.to_string(), "default/web:http/TCP");
        assert_eq!(
            svc.frontends[0].backends[0].endpoint.to_string(),
            "10.0.0.1:8080"
        );
    }
}
#[cfg(test)]
mod limit_tests {
    use super::*;

    fn refused(s: &str) -> bool {
        over_limits(s, Limits::default()).is_some()
    }

    #[test]
    fn pathological_nesting_is_refused_at_once() {
        let started = std::time::Instant::now();
        for s in [
            "[".repeat(100_000),
            "{a: ".repeat(50_000),
            // Closers inside strings do not hide openers.
            "[ \"]\", ".repeat(1000),
            "[ !t \"]\" ".repeat(1000),
            "[ 'x]''y]', ".repeat(1000),
            "[a#[".repeat(1000),
            // An apostrophe taken for a quote still counts what follows.
            format!("a: it's\n{}", "[".repeat(1000)),
            format!("a: b \"c\n{}", "{x: ".repeat(1000)),
            (0..2000)
                .map(|i| format!("{}a:\n", " ".repeat(i)))
                .collect(),
        ] {
            assert!(refused(&s), "{:?}", &s[..s.len().min(60)]);
            let m = parse_file(Path::new("x.yaml"), &s, Limits::default());
            assert!(m.services.is_empty() && m.problems.len() == 1);
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn ordinary_manifests_pass() {
        let last_applied = r#"{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"name":"web","namespace":"default"},"spec":{"ports":[{"port":80,"targetPort":8080}],"selector":{"app":"web"}}}"#;
        let doc = format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: default\n  annotations:\n    kubectl.kubernetes.io/last-applied-configuration: '{last_applied}'\n    note: \"it's [fine\"\n    other: it's {{fine}} # comment's [\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{{port: 80, targetPort: 8080, name: \"http\"}}]\n"
        );
        let many: String = std::iter::repeat_n(format!("{doc}---\n"), 200).collect();
        assert_eq!(over_limits(&many, Limits::default()), None);
        let m = parse_file(Path::new("x.yaml"), &many, Limits::default());
        assert_eq!(m.services.len(), 200, "{:?}", m.problems);
        // JSON, deeply but reasonably nested.
        let json = serde_json::to_string(&serde_json::json!({"kind": "List", "apiVersion": "v1", "items": [{"a": {"b": {"c": [[["d"]]]}}}]})).unwrap();
        assert_eq!(over_limits(&json, Limits::default()), None);
    }

    #[test]
    fn a_file_over_the_size_limit_is_refused_unread() {
        let limits = Limits {
            max_bytes: 100,
            ..Limits::default()
        };
        let m = parse_file(Path::new("big.yaml"), &"a: b\n".repeat(30), limits);
        assert_eq!(m.problems.len(), 1);
        assert!(m.problems[0].to_string().contains("larger than the limit"));
    }
}
