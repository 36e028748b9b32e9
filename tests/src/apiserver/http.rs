//! HTTP/1.1 serving: the accept loop, routing, list/get handlers, and
//! `Status` error objects.

use std::{convert::Infallible, io, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::{
    body::Incoming, header, server::conn::http1, service::service_fn, Method, Request, Response,
    StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::{
    faults::{Fault, Outage, RequestRecord, Verb},
    kinds::ResourceKind,
    selector::{FieldSelector, Filter, LabelSelector},
    store::{Key, SnapshotError},
    watch::{self, Start, WatchRequest},
    Shared,
};

pub(crate) type Body = UnsyncBoxBody<Bytes, io::Error>;

/// The watch timeout when a request sets none (the apiserver picks one
/// between 30 and 60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

pub(crate) fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    }
}

/// A `Status` object describing a failure.
pub(crate) fn status_value(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn json_response(code: u16, value: &Value) -> Response<Body> {
    bytes_response(code, serde_json::to_vec(value).unwrap_or_default())
}

/// A response whose body is `body`, already JSON.
fn bytes_response(code: u16, body: Vec<u8>) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never: Infallible| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn status_response(code: u16, message: &str) -> Response<Body> {
    status_with(code, reason_for(code), message, None)
}

fn status_with(code: u16, reason: &str, message: &str, details: Option<Value>) -> Response<Body> {
    let mut status = status_value(code, reason, message);
    if let Some(details) = details {
        status["details"] = details;
    }
    json_response(code, &status)
}

fn not_found() -> Response<Body> {
    status_with(
        404,
        "NotFound",
        "the server could not find the requested resource",
        Some(json!({})),
    )
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let escaped = (b[i] == b'%')
            .then(|| b.get(i + 1..i + 3))
            .flatten()
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (escaped, b[i]) {
            (Some(v), _) => {
                out.push(v);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, c) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Decodes an `application/x-www-form-urlencoded` query string.
pub(crate) fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

struct Params(Vec<(String, String)>);

impl Params {
    /// A parameter; empty values count as unset.
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// A boolean parameter, parsed like Go's `strconv.ParseBool`.
    fn flag(&self, key: &str) -> Result<Option<bool>, String> {
        match self.get(key) {
            None => Ok(None),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(Some(true)),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(Some(false)),
            Some(v) => Err(format!("invalid value for {key}: {v:?}")),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Route {
    Collection {
        kind: ResourceKind,
        namespace: Option<String>,
    },
    Object {
        kind: ResourceKind,
        namespace: Option<String>,
        name: String,
    },
    Version,
    Health,
    NotFound,
}

fn route(path: &str) -> Route {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        ["version"] => return Route::Version,
        ["healthz" | "readyz" | "livez"] => return Route::Health,
        _ => return Route::NotFound,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() && !ns.is_empty() => {
            (Some((*ns).to_owned()), rest)
        }
        _ => (None, rest),
    };
    let (plural, name) = match rest {
        [plural] => (*plural, None),
        [plural, name] if !name.is_empty() => (*plural, Some(*name)),
        _ => return Route::NotFound,
    };
    let Some(kind) = ResourceKind::from_path(group, version, plural) else {
        return Route::NotFound;
    };
    if namespace.is_some() && !kind.namespaced() {
        return Route::NotFound;
    }
    match name {
        None => Route::Collection { kind, namespace },
        // Namespaced objects are only addressable inside their namespace.
        Some(_) if kind.namespaced() && namespace.is_none() => Route::NotFound,
        Some(name) => Route::Object {
            kind,
            namespace,
            name: name.to_owned(),
        },
    }
}

/// Accepts connections until the task is dropped.
pub(crate) async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if shared.faults().outage == Outage::CloseConnections {
            shared.faults().refused_connections += 1;
            shared.notify();
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(shared.clone(), req));
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Handles one request. An `Err` makes hyper close the connection without
/// an answer.
async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, io::Error> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let params = Params(parse_query(&query));
    let route = route(&path);
    let watch_flag = params.flag("watch");
    let (verb, resource, namespace, name) = match &route {
        Route::Collection { kind, namespace } if method == Method::GET => {
            let verb = if watch_flag == Ok(Some(true)) {
                Verb::Watch
            } else {
                Verb::List
            };
            (verb, Some(*kind), namespace.clone(), None)
        }
        Route::Object {
            kind,
            namespace,
            name,
        } if method == Method::GET => (
            Verb::Get,
            Some(*kind),
            namespace.clone(),
            Some(name.clone()),
        ),
        Route::Collection { kind, namespace } => {
            (Verb::Other, Some(*kind), namespace.clone(), None)
        }
        Route::Object {
            kind,
            namespace,
            name,
        } => (
            Verb::Other,
            Some(*kind),
            namespace.clone(),
            Some(name.clone()),
        ),
        _ => (Verb::Other, None, None, None),
    };
    let seq = shared.begin(RequestRecord {
        seq: 0,
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        params: params.0.clone(),
        verb,
        resource,
        namespace: namespace.clone(),
        name: name.clone(),
        status: 0,
    });
    let finish = |resp: Response<Body>| -> Result<Response<Body>, io::Error> {
        shared.finish(seq, resp.status().as_u16());
        Ok(resp)
    };
    let close = || -> Result<Response<Body>, io::Error> {
        Err(io::Error::other("connection closed by fault injection"))
    };

    let outage = shared.faults().outage.clone();
    match outage {
        Outage::Off => {}
        Outage::Status(code) => {
            return finish(status_response(code, "the test apiserver is in an outage"))
        }
        Outage::CloseConnections => return close(),
    }
    if verb == Verb::List {
        let delay = shared.faults().list_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
    if resource.is_some() {
        let fault = shared.faults().take(verb, resource);
        match fault {
            None => {}
            Some(Fault::CloseConnection) => return close(),
            Some(Fault::ExpiredWatch) if verb == Verb::Watch => {
                let rv = params
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let compacted = shared.store().rv();
                let mut resp = Response::new(watch::expired_body(rv, compacted));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static("application/json"),
                );
                return finish(resp);
            }
            Some(Fault::ExpiredWatch) => {
                return finish(status_response(410, "injected fault: expired"));
            }
            Some(Fault::Status(code)) => {
                return finish(status_response(
                    code,
                    &format!("injected fault: HTTP {code}"),
                ))
            }
        }
    }

    let resp = match route {
        Route::Version => json_response(
            200,
            &json!({
                "major": "1",
                "minor": "33",
                "gitVersion": "v1.33.0-sluice-test",
                "gitCommit": "0000000000000000000000000000000000000000",
                "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z",
                "goVersion": "go1.24",
                "compiler": "gc",
                "platform": "linux/amd64",
            }),
        ),
        Route::Health => {
            let mut resp = Response::new(
                Full::new(Bytes::from_static(b"ok"))
                    .map_err(|never: Infallible| match never {})
                    .boxed_unsync(),
            );
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain"),
            );
            resp
        }
        Route::NotFound => not_found(),
        _ if method != Method::GET => status_response(
            405,
            &format!("the test apiserver does not support {method} (it is read-only over HTTP)"),
        ),
        Route::Object {
            kind,
            namespace,
            name,
        } => get(&shared, kind, namespace.as_deref(), &name),
        Route::Collection { kind, namespace } => {
            if let Err(e) = watch_flag {
                status_response(400, &e)
            } else if verb == Verb::Watch {
                watch(&shared, kind, namespace, &params)
            } else {
                list(&shared, kind, namespace, &params)
            }
        }
    };
    finish(resp)
}

fn get(shared: &Shared, kind: ResourceKind, namespace: Option<&str>, name: &str) -> Response<Body> {
    let store = shared.store();
    match store.get(kind, namespace.unwrap_or_default(), name) {
        Some(obj) => json_response(200, obj),
        None => status_with(
            404,
            "NotFound",
            &format!("{} \"{name}\" not found", kind.plural()),
            Some(json!({"name": name, "group": kind.group(), "kind": kind.plural()})),
        ),
    }
}

fn filter(
    kind: ResourceKind,
    namespace: Option<String>,
    params: &Params,
) -> Result<Filter, String> {
    Ok(Filter {
        kind,
        namespace,
        labels: LabelSelector::parse(params.get("labelSelector").unwrap_or_default())?,
        fields: FieldSelector::parse(params.get("fieldSelector").unwrap_or_default(), kind)?,
    })
}

fn encode_continue(rv: u64, key: &Key) -> String {
    format!("{rv}:{}/{}", key.1, key.2)
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str, kind: ResourceKind) -> Option<(u64, Key)> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let (rv, key) = text.split_once(':')?;
    let (ns, name) = key.split_once('/')?;
    Some((rv.parse().ok()?, (kind, ns.to_owned(), name.to_owned())))
}

fn parse_rv(v: &str) -> Result<u64, Box<Response<Body>>> {
    v.parse()
        .map_err(|_| status_response(400, &format!("invalid resource version: {v:?}")).into())
}

fn list(
    shared: &Shared,
    kind: ResourceKind,
    namespace: Option<String>,
    params: &Params,
) -> Response<Body> {
    match list_inner(shared, kind, namespace, params) {
        Ok(resp) => resp,
        Err(resp) => *resp,
    }
}

fn list_inner(
    shared: &Shared,
    kind: ResourceKind,
    namespace: Option<String>,
    params: &Params,
) -> Result<Response<Body>, Box<Response<Body>>> {
    let filter = filter(kind, namespace, params).map_err(|e| status_response(400, &e))?;
    let limit = match params.get("limit") {
        None => None,
        Some(l) => match l.parse::<usize>() {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => return Err(status_response(400, &format!("invalid limit: {l:?}")).into()),
        },
    };
    let rv_param = params.get("resourceVersion");
    let rv_match = params.get("resourceVersionMatch");
    let store = shared.store();
    let (at, start_after, from_continue) = if let Some(token) = params.get("continue") {
        if rv_param.is_some() {
            return Err(status_response(
                400,
                "specifying resource version is not allowed when using continue",
            )
            .into());
        }
        let (rv, key) = decode_continue(token, kind)
            .ok_or_else(|| status_response(400, "continue key is not valid"))?;
        (rv, Some(key), true)
    } else {
        let at = match (rv_param, rv_match) {
            (None, Some(_)) => {
                return Err(status_response(
                    400,
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
                .into())
            }
            (None, None) => store.rv(),
            (Some("0"), Some("Exact")) => {
                return Err(status_response(
                    400,
                    "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
                )
                .into())
            }
            (Some("0"), _) => store.rv(),
            (Some(v), m) => {
                let rv = parse_rv(v)?;
                let exact = match m {
                    Some("Exact") => true,
                    Some("NotOlderThan") => false,
                    // Legacy semantics: exact when paginating.
                    None => limit.is_some(),
                    Some(other) => {
                        return Err(status_response(
                            400,
                            &format!("unsupported resourceVersionMatch {other:?}"),
                        )
                        .into())
                    }
                };
                if exact || rv > store.rv() {
                    rv
                } else {
                    store.rv()
                }
            }
        };
        (at, None, false)
    };
    // Without selectors every object of the kind (and namespace) counts:
    // the rest of the list is counted without looking into the objects.
    let unfiltered = filter.labels.is_empty() && filter.fields.is_empty();
    let counted = unfiltered && filter.namespace.is_none();
    let page = store.page(kind, at, start_after.as_ref(), limit, unfiltered, |obj| {
        counted || filter.matches(obj)
    });
    let (page, remaining) = match page {
        Ok(p) => p,
        Err(SnapshotError::Expired { compacted }) => {
            let message = if from_continue {
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".to_owned()
            } else {
                format!("too old resource version: {at} ({compacted})")
            };
            return Err(status_response(410, &message).into());
        }
        Err(SnapshotError::TooLarge { current }) => {
            return Err(status_with(
                504,
                "Timeout",
                &format!("Too large resource version: {at}, current: {current}"),
                Some(json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1})),
            ).into())
        }
    };
    drop(store);
    let mut metadata = json!({"resourceVersion": at.to_string()});
    if let (true, Some((last, _))) = (remaining > 0, page.last()) {
        metadata["continue"] = Value::String(encode_continue(at, last));
        if unfiltered {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    // The envelope, then the items' stored JSON, copied as they are.
    let head = json!({
        "kind": kind.list_kind(),
        "apiVersion": kind.api_version(),
        "metadata": metadata,
    });
    let mut body = serde_json::to_vec(&head).unwrap_or_default();
    body.pop(); // the closing brace
    body.extend_from_slice(b",\"items\":[");
    let size: usize = page.iter().map(|(_, item)| item.len() + 1).sum();
    body.reserve(size + 2);
    for (i, (_, item)) in page.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(item);
    }
    body.extend_from_slice(b"]}");
    Ok(bytes_response(200, body))
}

fn watch(
    shared: &Arc<Shared>,
    kind: ResourceKind,
    namespace: Option<String>,
    params: &Params,
) -> Response<Body> {
    match watch_inner(shared, kind, namespace, params) {
        Ok(resp) => resp,
        Err(resp) => *resp,
    }
}

fn watch_inner(
    shared: &Arc<Shared>,
    kind: ResourceKind,
    namespace: Option<String>,
    params: &Params,
) -> Result<Response<Body>, Box<Response<Body>>> {
    let bad = |e: String| status_response(400, &e);
    let filter = filter(kind, namespace, params).map_err(bad)?;
    let bookmarks = params
        .flag("allowWatchBookmarks")
        .map_err(bad)?
        .unwrap_or(false);
    let start = match params.get("resourceVersion") {
        None | Some("0") => Start::Current,
        Some(v) => Start::After(parse_rv(v)?),
    };
    let send_initial = params.flag("sendInitialEvents").map_err(bad)?;
    if send_initial == Some(true) {
        if !bookmarks {
            return Err(status_response(
                422,
                "sendInitialEvents requires allowWatchBookmarks=true",
            )
            .into());
        }
        if params.get("resourceVersionMatch") != Some("NotOlderThan") {
            return Err(status_response(
                422,
                "sendInitialEvents requires resourceVersionMatch=NotOlderThan",
            )
            .into());
        }
    }
    let timeout = match params.get("timeoutSeconds") {
        None => DEFAULT_WATCH_TIMEOUT,
        Some(t) => match t.parse::<u64>() {
            Ok(0) => DEFAULT_WATCH_TIMEOUT,
            Ok(s) => Duration::from_secs(s),
            Err(_) => return Err(bad(format!("invalid timeoutSeconds: {t:?}")).into()),
        },
    };
    let body = watch::open(
        shared,
        WatchRequest {
            filter,
            start,
            // Without sendInitialEvents, "0" and unset start with the
            // current state as ADDED events ("get state and start").
            send_initial: send_initial.unwrap_or(start == Start::Current),
            initial_end_bookmark: send_initial == Some(true),
            bookmarks,
            timeout,
        },
    );
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        use ResourceKind::*;
        let coll = |kind, ns: Option<&str>| Route::Collection {
            kind,
            namespace: ns.map(str::to_owned),
        };
        assert_eq!(route("/api/v1/services"), coll(Service, None));
        assert_eq!(
            route("/api/v1/namespaces/x/services"),
            coll(Service, Some("x"))
        );
        assert_eq!(
            route("/apis/discovery.k8s.io/v1/endpointslices"),
            coll(EndpointSlice, None)
        );
        assert_eq!(
            route("/apis/discovery.k8s.io/v1/namespaces/x/endpointslices"),
            coll(EndpointSlice, Some("x"))
        );
        assert_eq!(route("/api/v1/nodes"), coll(Node, None));
        assert_eq!(
            route("/api/v1/nodes/n1"),
            Route::Object {
                kind: Node,
                namespace: None,
                name: "n1".into()
            }
        );
        assert_eq!(
            route("/api/v1/namespaces/x/services/web"),
            Route::Object {
                kind: Service,
                namespace: Some("x".into()),
                name: "web".into()
            }
        );
        for nf in [
            "/",
            "/api/v1/pods",
            "/api/v1/namespaces/x/nodes",
            "/api/v1/services/web",
            "/apis/discovery.k8s.io/v1beta1/endpointslices",
            "/api/v2/services",
            "/apis/discovery.k8s.io/v1/services",
        ] {
            assert_eq!(route(nf), Route::NotFound, "{nf}");
        }
    }

    #[test]
    fn query_decoding() {
        assert_eq!(
            parse_query("labelSelector=%21a%2Cb%3Dc&watch=true&x=a+b&e"),
            [
                ("labelSelector".into(), "!a,b=c".into()),
                ("watch".into(), "true".into()),
                ("x".into(), "a b".into()),
                ("e".into(), String::new()),
            ]
        );
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%4"), "%4");
    }

    #[test]
    fn continue_tokens() {
        let key = (ResourceKind::Service, "ns".to_owned(), "web".to_owned());
        let t = encode_continue(7, &key);
        assert_eq!(decode_continue(&t, ResourceKind::Service), Some((7, key)));
        assert_eq!(decode_continue("zz", ResourceKind::Service), None);
    }
}
