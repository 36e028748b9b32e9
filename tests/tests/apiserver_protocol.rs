//! The test API server against the real kube-rs client and watcher: list
//! and watch semantics, and the failure modes sluice's agent must survive.

use std::{collections::BTreeMap, time::Duration};

use anyhow::{bail, Context, Result};
use futures::{stream::BoxStream, StreamExt};
use k8s_openapi::{
    api::{
        core::v1::{Node, Pod, Service, ServicePort, ServiceSpec},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    api::{ListParams, ObjectList, PostParams, VersionMatch, WatchEvent, WatchParams},
    runtime::{
        watcher::{self, Event},
        WatchStreamExt,
    },
    Api, ResourceExt,
};
use serde_json::json;
use sluice_tests::apiserver::{ApiHandle, ApiServer, Fault, Outage, ResourceKind, Verb};

const STEP: Duration = Duration::from_secs(5);
const SVC: ResourceKind = ResourceKind::Service;

fn svc(ns: &str, name: &str, labels: &[(&str, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: (!labels.is_empty()).then(|| {
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>()
            }),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("10.96.0.10".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn api_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn names<K: ResourceExt + Clone>(list: &ObjectList<K>) -> Vec<String> {
    list.items
        .iter()
        .map(|o| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
        .collect()
}

type Watcher = BoxStream<'static, watcher::Result<Event<Service>>>;

/// A watcher event as a short string: `Init`, `InitApply(a)`, `InitDone`,
/// `Apply(a@3)`, `Delete(a@4)`, or the error variant (`WatchError(410)`,
/// `WatchStartFailed(503)`, ...).
fn describe(ev: &watcher::Result<Event<Service>>) -> String {
    let at = |s: &Service| {
        format!(
            "{}@{}",
            s.name_any(),
            s.resource_version().unwrap_or_default()
        )
    };
    let code = |e: &kube::Error| api_code(e).map_or_else(|| "io".to_owned(), |c| c.to_string());
    match ev {
        Ok(Event::Init) => "Init".into(),
        Ok(Event::InitApply(s)) => format!("InitApply({})", s.name_any()),
        Ok(Event::InitDone) => "InitDone".into(),
        Ok(Event::Apply(s)) => format!("Apply({})", at(s)),
        Ok(Event::Delete(s)) => format!("Delete({})", at(s)),
        Err(watcher::Error::WatchError(s)) => format!("WatchError({})", s.code),
        Err(watcher::Error::InitialListFailed(e)) => format!("InitialListFailed({})", code(e)),
        Err(watcher::Error::WatchStartFailed(e)) => format!("WatchStartFailed({})", code(e)),
        Err(watcher::Error::WatchFailed(e)) => format!("WatchFailed({})", code(e)),
        Err(watcher::Error::NoResourceVersion) => "NoResourceVersion".into(),
    }
}

async fn next(w: &mut Watcher) -> Result<String> {
    match tokio::time::timeout(STEP, w.next()).await {
        Ok(Some(ev)) => Ok(describe(&ev)),
        Ok(None) => bail!("the watcher ended"),
        Err(_) => bail!("no watcher event within {STEP:?}"),
    }
}

/// The next `n` watcher events.
async fn take(w: &mut Watcher, n: usize) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(next(w).await?);
    }
    Ok(out)
}

/// Watcher events up to and including the first one `last` accepts.
async fn until(w: &mut Watcher, last: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let mut out = Vec::new();
    loop {
        let ev = next(w).await.with_context(|| format!("after {out:?}"))?;
        let done = last(&ev);
        out.push(ev);
        if done {
            return Ok(out);
        }
    }
}

fn watch_rvs(server: &ApiServer) -> Vec<String> {
    server
        .watch_resource_versions(SVC)
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect()
}

/// Keeps polling the watcher (it only sends requests while polled) until
/// `condition` holds on the server; any watcher event meanwhile is an
/// error.
async fn poll_until(
    server: &ApiServer,
    w: &mut Watcher,
    what: &str,
    condition: impl FnMut(&ApiHandle) -> bool,
) -> Result<()> {
    tokio::select! {
        ev = w.next() => bail!("unexpected watcher event {:?} while waiting for {what}", ev.as_ref().map(describe)),
        done = server.wait_for(STEP, what, condition) => done,
    }
}

/// [`poll_until`] the watcher has its watch open.
async fn watching(server: &ApiServer, w: &mut Watcher) -> Result<()> {
    poll_until(server, w, "an open Service watch", |s| {
        s.open_watches(Some(SVC)) == 1
    })
    .await
}

#[tokio::test]
async fn list_honours_selectors_namespaces_pages_and_versions() -> Result<()> {
    let server = ApiServer::start()?;
    for (ns, name, labels) in [
        ("a", "web", &[("app", "web")][..]),
        ("a", "db", &[("app", "db"), ("tier", "data")][..]),
        ("b", "web", &[("app", "web")][..]),
        (
            "b",
            "other-proxy",
            &[("service.kubernetes.io/service-proxy-name", "other")][..],
        ),
        (
            "b",
            "headless",
            &[("service.kubernetes.io/headless", "")][..],
        ),
    ] {
        server.apply(&svc(ns, name, labels))?;
    }
    let client = server.client()?;
    let all: Api<Service> = Api::all(client.clone());

    let list = all.list(&ListParams::default()).await?;
    assert_eq!(list.metadata.resource_version.as_deref(), Some("5"));
    assert_eq!(
        names(&list),
        ["a/db", "a/web", "b/headless", "b/other-proxy", "b/web"]
    );
    assert!(list
        .items
        .iter()
        .all(|s| s.metadata.uid.is_some() && s.metadata.creation_timestamp.is_some()));

    for (selector, want) in [
        (
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless",
            &["a/db", "a/web", "b/web"][..],
        ),
        ("app=web", &["a/web", "b/web"]),
        ("app==web", &["a/web", "b/web"]),
        ("app!=web", &["a/db", "b/headless", "b/other-proxy"]),
        ("app", &["a/db", "a/web", "b/web"]),
        ("app,!tier", &["a/web", "b/web"]),
        ("app=web,tier", &[]),
        ("app in (db,web),tier=data", &["a/db"]),
    ] {
        let got = all.list(&ListParams::default().labels(selector)).await?;
        assert_eq!(names(&got), want, "labelSelector {selector}");
    }
    for (selector, want) in [
        ("metadata.name=web", &["a/web", "b/web"][..]),
        ("metadata.namespace=a", &["a/db", "a/web"]),
        (
            "metadata.namespace==b,metadata.name!=web",
            &["b/headless", "b/other-proxy"],
        ),
    ] {
        let got = all.list(&ListParams::default().fields(selector)).await?;
        assert_eq!(names(&got), want, "fieldSelector {selector}");
    }
    let in_b: Api<Service> = Api::namespaced(client.clone(), "b");
    assert_eq!(
        names(&in_b.list(&ListParams::default().labels("app")).await?),
        ["b/web"]
    );
    let err = all
        .list(&ListParams::default().labels("app in web"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(400), "{err}");
    let err = all
        .list(&ListParams::default().fields("spec.nope=1"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(400), "{err}");

    // Pages come from the snapshot of the first one, even when objects
    // change in between.
    let first = all.list(&ListParams::default().limit(2)).await?;
    assert_eq!(names(&first), ["a/db", "a/web"]);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    server.apply(&svc("a", "late", &[]))?;
    server.delete::<Service>("b", "web")?;
    let mut seen = names(&first);
    let mut token = first.metadata.continue_.clone();
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = all
            .list(&ListParams::default().limit(2).continue_token(&t))
            .await?;
        assert_eq!(page.metadata.resource_version.as_deref(), Some("5"));
        seen.extend(names(&page));
        token = page.metadata.continue_;
    }
    assert_eq!(
        seen,
        ["a/db", "a/web", "b/headless", "b/other-proxy", "b/web"]
    );

    // Exact reads of older versions, until compacted away.
    let at2 = all
        .list(&ListParams::default().at("2").matching(VersionMatch::Exact))
        .await?;
    assert_eq!(names(&at2), ["a/db", "a/web"]);
    assert_eq!(at2.metadata.resource_version.as_deref(), Some("2"));
    let not_older = all
        .list(
            &ListParams::default()
                .at("2")
                .matching(VersionMatch::NotOlderThan),
        )
        .await?;
    assert_eq!(not_older.metadata.resource_version.as_deref(), Some("7"));
    server.compact();
    let err = all
        .list(&ListParams::default().at("2").matching(VersionMatch::Exact))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(410), "{err}");
    let err = all
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(first.metadata.continue_.as_deref().unwrap_or_default()),
        )
        .await
        .unwrap_err();
    assert_eq!(
        api_code(&err),
        Some(410),
        "an expired continue token: {err}"
    );

    // EndpointSlices, from YAML.
    server.apply_yaml(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  namespace: a
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
endpoints:
- addresses: [10.0.0.1]
ports:
- port: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: db-abc
  namespace: a
  labels:
    kubernetes.io/service-name: db
addressType: IPv4
endpoints: []
",
    )?;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "a");
    let web = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await?;
    assert_eq!(names(&web), ["a/web-abc"]);
    assert_eq!(web.items[0].endpoints[0].addresses, ["10.0.0.1"]);
    let all_slices: Api<EndpointSlice> = Api::all(client);
    assert_eq!(
        all_slices.list(&ListParams::default()).await?.items.len(),
        2
    );

    let lists = server.requests();
    let first_list = &lists[0];
    assert_eq!(first_list.path, "/api/v1/services");
    assert_eq!(first_list.verb, Verb::List);
    Ok(())
}

#[tokio::test]
async fn watch_streams_added_modified_deleted_in_order() -> Result<()> {
    let server = ApiServer::builder().bookmark_interval(None).start()?;
    server.apply(&svc("default", "old", &[]))?;
    let api: Api<Service> = Api::namespaced(server.client()?, "default");
    let list = api.list(&ListParams::default()).await?;
    let rv = list.metadata.resource_version.unwrap_or_default();
    assert_eq!(rv, "1");

    let mut events = api.watch(&WatchParams::default(), &rv).await?.boxed();
    server.apply(&svc("default", "web", &[("app", "web")]))?;
    server.apply(&svc("default", "web", &[("app", "web"), ("v", "2")]))?;
    // Objects in other namespaces are not this watch's business.
    server.apply(&svc("other", "web", &[]))?;
    let gone = server
        .delete::<Service>("default", "web")?
        .context("web existed")?;
    assert_eq!(gone.resource_version().as_deref(), Some("5"));

    let mut seen = Vec::new();
    while seen.len() < 3 {
        let ev = tokio::time::timeout(STEP, events.next())
            .await?
            .context("watch ended")??;
        seen.push(match ev {
            WatchEvent::Added(s) => format!(
                "ADDED {}@{}",
                s.name_any(),
                s.resource_version().unwrap_or_default()
            ),
            WatchEvent::Modified(s) => format!(
                "MODIFIED {}@{}",
                s.name_any(),
                s.resource_version().unwrap_or_default()
            ),
            WatchEvent::Deleted(s) => format!(
                "DELETED {}@{}",
                s.name_any(),
                s.resource_version().unwrap_or_default()
            ),
            WatchEvent::Bookmark(b) => format!("BOOKMARK {}", b.metadata.resource_version),
            WatchEvent::Error(e) => format!("ERROR {}", e.code),
        });
    }
    assert_eq!(seen, ["ADDED web@2", "MODIFIED web@3", "DELETED web@5"]);
    let watch = server
        .last_request(Verb::Watch, Some(SVC))
        .context("a watch")?;
    assert_eq!(watch.path, "/api/v1/namespaces/default/services");
    assert_eq!(watch.param("watch"), Some("true"));
    assert_eq!(watch.resource_version(), Some("1"));
    assert_eq!(watch.param("allowWatchBookmarks"), Some("true"));
    assert_eq!(watch.param("timeoutSeconds"), Some("290"));

    // Selectors filter events; an object that stops matching is DELETED
    // (with the change's resourceVersion), one that starts matching ADDED.
    let mut web_only = api
        .watch(&WatchParams::default().labels("app=web"), "5")
        .await?
        .boxed();
    server.apply(&svc("default", "x", &[("app", "web")]))?; // 6
    server.apply(&svc("default", "x", &[("app", "db")]))?; // 7
    server.apply(&svc("default", "y", &[("app", "db")]))?; // 8
    server.apply(&svc("default", "x", &[("app", "web")]))?; // 9
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let ev = tokio::time::timeout(STEP, web_only.next())
            .await?
            .context("watch ended")??;
        seen.push(match ev {
            WatchEvent::Added(s) => format!(
                "ADDED {}@{}",
                s.name_any(),
                s.resource_version().unwrap_or_default()
            ),
            WatchEvent::Deleted(s) => format!(
                "DELETED {}@{} app={}",
                s.name_any(),
                s.resource_version().unwrap_or_default(),
                s.labels().get("app").cloned().unwrap_or_default()
            ),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(seen, ["ADDED x@6", "DELETED x@7 app=web", "ADDED x@9"]);
    Ok(())
}

#[tokio::test]
async fn watch_from_a_compacted_version_gets_an_expired_error_event() -> Result<()> {
    let server = ApiServer::builder().bookmark_interval(None).start()?;
    server.apply(&svc("default", "a", &[]))?;
    server.apply(&svc("default", "b", &[]))?;
    assert_eq!(server.compact(), 2);
    let api: Api<Service> = Api::all(server.client()?);
    let mut events = api.watch(&WatchParams::default(), "1").await?.boxed();
    match tokio::time::timeout(STEP, events.next())
        .await?
        .context("no event")??
    {
        WatchEvent::Error(status) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => bail!("expected an ERROR event, got {other:?}"),
    }
    assert!(
        tokio::time::timeout(STEP, events.next()).await?.is_none(),
        "the stream ends after the error"
    );
    // From the compaction point itself, watching works.
    let mut events = api.watch(&WatchParams::default(), "2").await?.boxed();
    server.apply(&svc("default", "c", &[]))?;
    match tokio::time::timeout(STEP, events.next())
        .await?
        .context("no event")??
    {
        WatchEvent::Added(s) => assert_eq!(s.name_any(), "c"),
        other => bail!("expected ADDED c, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn bookmarks_arrive_and_timeouts_end_watches_cleanly() -> Result<()> {
    let server = ApiServer::builder()
        .bookmark_interval(Some(Duration::from_millis(100)))
        .start()?;
    server.apply(&svc("default", "a", &[]))?;
    let client = server.client()?;
    let api: Api<Service> = Api::all(client.clone());
    let mut events = api.watch(&WatchParams::default(), "1").await?.boxed();
    let mut bookmark = async || -> Result<String> {
        loop {
            match tokio::time::timeout(STEP, events.next())
                .await?
                .context("ended")??
            {
                WatchEvent::Bookmark(b) => {
                    assert_eq!(b.types.kind, "Service");
                    assert_eq!(b.types.api_version, "v1");
                    return Ok(b.metadata.resource_version);
                }
                WatchEvent::Added(_) | WatchEvent::Modified(_) => {}
                other => bail!("unexpected {other:?}"),
            }
        }
    };
    assert_eq!(bookmark().await?, "1");
    // Changes to other kinds advance bookmarks too: they carry the
    // resourceVersion up to which this watch has seen everything.
    server.apply(&node("n1"))?;
    let mut rv = bookmark().await?;
    while rv == "1" {
        rv = bookmark().await?;
    }
    assert_eq!(rv, "2");

    // timeoutSeconds ends the stream cleanly.
    let nodes: Api<Node> = Api::all(client);
    let started = std::time::Instant::now();
    let mut short = nodes
        .watch(&WatchParams::default().timeout(1).disable_bookmarks(), "2")
        .await?
        .boxed();
    assert!(tokio::time::timeout(STEP, short.next()).await?.is_none());
    assert!(started.elapsed() >= Duration::from_millis(900));
    Ok(())
}

#[tokio::test]
async fn watcher_sends_what_kube_rs_sends() -> Result<()> {
    let server = ApiServer::builder().bookmark_interval(None).start()?;
    server.apply(&svc("default", "a", &[("app", "web")]))?;
    server.apply(&svc("default", "b", &[("app", "db")]))?;
    let client = server.client()?;
    let api: Api<Service> = Api::all(client);

    // Default config: a paginated list, then a watch from its version.
    let mut w: Watcher = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    assert_eq!(
        take(&mut w, 4).await?,
        ["Init", "InitApply(a)", "InitApply(b)", "InitDone"]
    );
    watching(&server, &mut w).await?;
    let list = server
        .last_request(Verb::List, Some(SVC))
        .context("a list")?;
    // kube-rs's query strings start with "&" (form_urlencoded appends to
    // "path?"); servers ignore the empty pair.
    assert_eq!(list.query, "&limit=500");
    let watch = server
        .last_request(Verb::Watch, Some(SVC))
        .context("a watch")?;
    assert_eq!(
        watch.query,
        "&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=2"
    );
    drop(w);

    // Selectors and any_semantic (whose resourceVersion=0 kube-rs drops
    // because it pages).
    let config = watcher::Config::default()
        .labels("app=web")
        .fields("metadata.namespace=default")
        .any_semantic();
    let mut w: Watcher = watcher::watcher(api.clone(), config).boxed();
    assert_eq!(take(&mut w, 3).await?, ["Init", "InitApply(a)", "InitDone"]);
    poll_until(&server, &mut w, "a second watch", |s| {
        s.request_count(Verb::Watch) == 2
    })
    .await?;
    let list = server
        .last_request(Verb::List, Some(SVC))
        .context("a list")?;
    assert_eq!(list.param("labelSelector"), Some("app=web"));
    assert_eq!(
        list.param("fieldSelector"),
        Some("metadata.namespace=default")
    );
    assert_eq!(list.param("limit"), Some("500"));
    assert_eq!(list.resource_version(), None);
    let watch = server
        .last_request(Verb::Watch, Some(SVC))
        .context("a watch")?;
    assert_eq!(watch.param("labelSelector"), Some("app=web"));
    assert_eq!(watch.resource_version(), Some("2"));
    server.apply(&svc("default", "b", &[("app", "web")]))?;
    assert_eq!(next(&mut w).await?, "Apply(b@3)");
    drop(w);

    // Streaming lists: one watch from "0" that sends the state first.
    let mut w: Watcher =
        watcher::watcher(api, watcher::Config::default().streaming_lists()).boxed();
    assert_eq!(
        take(&mut w, 4).await?,
        ["Init", "InitApply(a)", "InitApply(b)", "InitDone"]
    );
    let watch = server
        .last_request(Verb::Watch, Some(SVC))
        .context("a watch")?;
    assert_eq!(watch.param("sendInitialEvents"), Some("true"));
    assert_eq!(watch.param("resourceVersionMatch"), Some("NotOlderThan"));
    assert_eq!(watch.resource_version(), Some("0"));
    server.apply(&svc("default", "c", &[]))?;
    assert_eq!(next(&mut w).await?, "Apply(c@4)");
    Ok(())
}

#[tokio::test]
async fn watcher_resumes_after_dropped_connections_without_relisting() -> Result<()> {
    let server = ApiServer::builder().bookmark_interval(None).start()?;
    server.apply(&svc("default", "a", &[]))?;
    let mut w: Watcher = watcher::watcher(
        Api::<Service>::all(server.client()?),
        watcher::Config::default(),
    )
    .boxed();
    assert_eq!(take(&mut w, 3).await?, ["Init", "InitApply(a)", "InitDone"]);
    watching(&server, &mut w).await?;
    server.apply(&svc("default", "b", &[]))?;
    assert_eq!(next(&mut w).await?, "Apply(b@2)");

    // A clean end of the response (like a watch timeout).
    assert_eq!(server.close_watches(), 1);
    server.apply(&svc("default", "c", &[]))?;
    assert_eq!(next(&mut w).await?, "Apply(c@3)");
    assert_eq!(watch_rvs(&server), ["1", "2"]);

    // A connection broken off mid-stream.
    watching(&server, &mut w).await?;
    assert_eq!(server.abort_watches(), 1);
    server.apply(&svc("default", "d", &[]))?;
    let seen = until(&mut w, |e| e.starts_with("Apply(")).await?;
    assert_eq!(
        seen.last().map(String::as_str),
        Some("Apply(d@4)"),
        "{seen:?}"
    );
    assert_eq!(watch_rvs(&server), ["1", "2", "3"]);
    assert_eq!(server.request_count(Verb::List), 1, "never relisted");
    Ok(())
}

#[tokio::test]
async fn watcher_relists_after_compaction() -> Result<()> {
    let server = ApiServer::builder().bookmark_interval(None).start()?;
    server.apply(&svc("default", "a", &[]))?;
    let mut w: Watcher = watcher::watcher(
        Api::<Service>::all(server.client()?),
        watcher::Config::default(),
    )
    .boxed();
    assert_eq!(take(&mut w, 3).await?, ["Init", "InitApply(a)", "InitDone"]);
    watching(&server, &mut w).await?;
    server.apply(&svc("default", "b", &[]))?;
    assert_eq!(next(&mut w).await?, "Apply(b@2)");

    // While the watcher is disconnected, history moves on and is compacted.
    server.close_watches();
    server.apply(&svc("default", "c", &[]))?;
    server.delete::<Service>("default", "a")?;
    assert_eq!(server.compact(), 4);
    assert_eq!(
        take(&mut w, 5).await?,
        [
            "WatchError(410)",
            "Init",
            "InitApply(b)",
            "InitApply(c)",
            "InitDone"
        ]
    );
    poll_until(&server, &mut w, "the watch after the relist", |s| {
        s.watch_resource_versions(SVC).len() == 3
    })
    .await?;
    assert_eq!(watch_rvs(&server), ["1", "2", "4"]);
    assert_eq!(server.request_count(Verb::List), 2);
    Ok(())
}

#[tokio::test]
async fn watcher_relists_after_injected_410s_in_the_stream_but_not_after_http_410() -> Result<()> {
    let server = ApiServer::builder().bookmark_interval(None).start()?;
    server.apply(&svc("default", "a", &[]))?;
    let mut w: Watcher = watcher::watcher(
        Api::<Service>::all(server.client()?),
        watcher::Config::default(),
    )
    .boxed();
    assert_eq!(take(&mut w, 3).await?, ["Init", "InitApply(a)", "InitDone"]);
    watching(&server, &mut w).await?;

    // The next watch is answered with an ERROR 410 event: relist.
    server.inject_fault(Verb::Watch, Some(SVC), 1, Fault::ExpiredWatch);
    server.close_watches();
    assert_eq!(
        take(&mut w, 4).await?,
        ["WatchError(410)", "Init", "InitApply(a)", "InitDone"]
    );
    assert_eq!(server.request_count(Verb::List), 2);

    // An ERROR 410 event injected into the open stream: relist.
    watching(&server, &mut w).await?;
    let expired = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "too old resource version", "reason": "Expired", "code": 410});
    assert_eq!(server.inject_event(SVC, "ERROR", expired), 1);
    assert_eq!(
        take(&mut w, 4).await?,
        ["WatchError(410)", "Init", "InitApply(a)", "InitDone"]
    );
    assert_eq!(server.request_count(Verb::List), 3);

    // A failed list (HTTP 410 or 500): the watcher lists again.
    watching(&server, &mut w).await?;
    server.fail_next(Verb::List, 1, 410);
    server.fail_next(Verb::List, 1, 500);
    server.inject_event(
        SVC,
        "ERROR",
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410}),
    );
    assert_eq!(
        take(&mut w, 7).await?,
        [
            "WatchError(410)",
            "Init",
            "InitialListFailed(410)",
            "Init",
            "InitialListFailed(500)",
            "Init",
            "InitApply(a)"
        ]
    );
    assert_eq!(next(&mut w).await?, "InitDone");
    assert_eq!(server.request_count(Verb::List), 6);

    // An HTTP 410 answer to a watch request is not a desync for kube-rs:
    // it retries the watch from the same resourceVersion, without listing.
    watching(&server, &mut w).await?;
    let watches = server.request_count(Verb::Watch);
    server.fail_next(Verb::Watch, 2, 410);
    server.close_watches();
    assert_eq!(
        take(&mut w, 2).await?,
        ["WatchStartFailed(410)", "WatchStartFailed(410)"]
    );
    server.apply(&svc("default", "b", &[]))?;
    assert_eq!(next(&mut w).await?, "Apply(b@2)");
    assert_eq!(server.request_count(Verb::Watch), watches + 3);
    assert_eq!(watch_rvs(&server)[watches..], ["1", "1", "1"]);
    assert_eq!(server.request_count(Verb::List), 6);
    Ok(())
}

#[tokio::test]
async fn watcher_recovers_from_an_outage_with_its_default_backoff() -> Result<()> {
    let server = ApiServer::builder().bookmark_interval(None).start()?;
    server.apply(&svc("default", "a", &[]))?;
    let mut w: Watcher = watcher::watcher(
        Api::<Service>::all(server.client()?),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed();
    assert_eq!(take(&mut w, 3).await?, ["Init", "InitApply(a)", "InitDone"]);
    watching(&server, &mut w).await?;

    // The server goes away: the watch breaks and reconnecting fails.
    server.set_outage(Outage::CloseConnections);
    until(&mut w, |e| e.starts_with("WatchStartFailed")).await?;
    server.apply(&svc("default", "b", &[]))?;
    server.set_outage(Outage::Off);

    // The backoff (0.8 s, doubling, jittered) lets it retry soon enough,
    // and it resumes where it was.
    let seen = until(&mut w, |e| e.starts_with("Apply(")).await?;
    assert_eq!(
        seen.last().map(String::as_str),
        Some("Apply(b@2)"),
        "{seen:?}"
    );
    assert_eq!(watch_rvs(&server).last().map(String::as_str), Some("1"));
    assert_eq!(server.request_count(Verb::List), 1);
    Ok(())
}

#[tokio::test]
async fn client_retries_hide_a_short_503_outage() -> Result<()> {
    let server = ApiServer::start()?;
    server.apply(&node("n1"))?;
    let nodes: Api<Node> = Api::all(server.client()?);
    server.set_outage(Outage::Status(503));
    let list = tokio::spawn(async move { nodes.list(&ListParams::default()).await });
    server
        .wait_for(STEP, "retried lists", |s| s.request_count(Verb::List) >= 3)
        .await?;
    server.set_outage(Outage::Off);
    let list = tokio::time::timeout(STEP, list).await???;
    assert_eq!(names(&list), ["/n1"]);
    let statuses: Vec<u16> = server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses.last(), Some(&200));
    assert!(statuses[..statuses.len() - 1].iter().all(|s| *s == 503));
    Ok(())
}

/// client-go's reflector once resumed watches from the resourceVersion of
/// the last event it received; an event for an old object carried an
/// older one, so after a reconnect the watch resumed from the past,
/// history was replayed and live services appeared deleted. kube-rs 5.0's
/// watcher does the same; sluice's agent must guard against it.
#[tokio::test]
async fn stale_event_makes_kube_rs_resume_from_the_past() -> Result<()> {
    let server = ApiServer::builder().bookmark_interval(None).start()?;
    server.apply(&svc("default", "a", &[]))?; // 1
    server.apply(&svc("default", "b", &[]))?; // 2
    server.delete::<Service>("default", "b")?; // 3
    server.apply(&svc("default", "b", &[]))?; // 4: b is live again
    let mut w: Watcher = watcher::watcher(
        Api::<Service>::all(server.client()?),
        watcher::Config::default(),
    )
    .boxed();
    assert_eq!(
        take(&mut w, 4).await?,
        ["Init", "InitApply(a)", "InitApply(b)", "InitDone"]
    );
    watching(&server, &mut w).await?;
    server.apply(&svc("default", "c", &[]))?; // 5
    assert_eq!(next(&mut w).await?, "Apply(c@5)");

    // An event for an old object, carrying an old resourceVersion...
    let mut stale = server.get_kind(SVC, "default", "a").context("a")?;
    stale["metadata"]["resourceVersion"] = json!("2");
    assert_eq!(server.inject_event(SVC, "MODIFIED", stale), 1);
    assert_eq!(next(&mut w).await?, "Apply(a@2)");
    // ...then the connection drops.
    server.close_watches();

    // kube-rs resumes from the stale resourceVersion: the server replays
    // history from there, and the live Service b is reported deleted.
    assert_eq!(
        take(&mut w, 3).await?,
        ["Delete(b@3)", "Apply(b@4)", "Apply(c@5)"]
    );
    assert_eq!(watch_rvs(&server), ["4", "2"]);
    let resumed = server
        .last_request(Verb::Watch, Some(SVC))
        .context("a watch")?;
    assert!(
        resumed.query.contains("resourceVersion=2"),
        "{}",
        resumed.query
    );
    assert_eq!(server.request_count(Verb::List), 1);
    Ok(())
}

#[tokio::test]
async fn nodes_are_read_by_name_and_unknown_things_are_404() -> Result<()> {
    let server = ApiServer::start()?;
    server.apply(&node("node-1"))?;
    server.apply(&node("node-2"))?;
    let client = server.client()?;
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get("node-1").await?;
    assert_eq!(n.name_any(), "node-1");
    assert_eq!(n.resource_version().as_deref(), Some("1"));
    assert_eq!(n.metadata.namespace, None);
    let get = server.last_request(Verb::Get, None).context("a get")?;
    assert_eq!(get.path, "/api/v1/nodes/node-1");
    assert_eq!(get.resource, Some(ResourceKind::Node));

    let err = nodes.get("node-3").await.unwrap_err();
    let kube::Error::Api(status) = &err else {
        bail!("expected a Status, got {err}");
    };
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert_eq!(nodes.get_opt("node-3").await?, None);

    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    server.apply(&svc("default", "web", &[]))?;
    assert_eq!(
        svcs.get("web").await?.resource_version().as_deref(),
        Some("3")
    );

    let pods: Api<Pod> = Api::all(client.clone());
    let err = pods.list(&ListParams::default()).await.unwrap_err();
    let kube::Error::Api(status) = &err else {
        bail!("expected a Status, got {err}");
    };
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));

    let err = svcs
        .create(&PostParams::default(), &svc("default", "new", &[]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(405));

    let version = client.apiserver_version().await?;
    assert_eq!(version.minor, "33");
    Ok(())
}

#[tokio::test]
async fn kubeconfig_points_kube_at_the_server() -> Result<()> {
    let server = ApiServer::start()?;
    server.apply(&node("n1"))?;
    let dir = std::env::temp_dir().join(format!("sluice-apiserver-{}", std::process::id()));
    let path = dir.join("kubeconfig");
    server.write_kubeconfig(&path)?;
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(config.cluster_url.to_string(), format!("{}/", server.url()));
    assert_eq!(config.default_namespace, "default");
    let client = kube::Client::try_from(config)?;
    let nodes: Api<Node> = Api::all(client);
    assert_eq!(names(&nodes.list(&ListParams::default()).await?), ["/n1"]);
    Ok(())
}

#[test]
fn serves_inside_a_network_namespace_and_stops_on_drop() -> Result<()> {
    if sluice_tests::require_root().is_err() {
        eprintln!("skipped: needs root for a network namespace");
        return Ok(());
    }
    let ns = sluice_tests::Netns::create("api")?;
    let server = ApiServer::start_in(&ns)?;
    server.apply(&node("n1"))?;
    let handle = server.handle();
    let listed = ns.run(|| -> Result<Vec<String>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let nodes: Api<Node> = Api::all(handle.client()?);
            Ok(names(&nodes.list(&ListParams::default()).await?))
        })
    })??;
    assert_eq!(listed, ["/n1"]);
    let port = server.port();
    drop(server);
    let refused = ns.run(move || std::net::TcpStream::connect(("127.0.0.1", port)).is_err())?;
    assert!(refused, "the port is closed after drop");
    Ok(())
}
