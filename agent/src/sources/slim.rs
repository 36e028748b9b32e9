//! Services and EndpointSlices decoded with only what the translation
//! reads (`ServiceInfo::from_service`, `SliceInfo::from_slice`), as
//! Cilium's slim types do. A cluster's objects carry much more: managed
//! fields, owner references, kubectl's last-applied copy of the whole
//! object, and per endpoint the pod reference, node and zone. Decoding
//! all of it into k8s-openapi types allocated a string for every field of
//! every object of a 100,000-service list, only for the conversion to
//! drop it a moment later. Here what is not read is skipped by the
//! decoder (`IgnoredAny`): scanned, never allocated.
//!
//! The decoded value is the k8s-openapi object with only those fields
//! set, so the conversion is the very same function for the API, the
//! manifest directory and the tests. What is kept: the metadata's name,
//! namespace, resourceVersion, the labels the translation reads
//! (`KEPT_LABELS`) and sluice's own annotations; a Service's whole spec
//! and status (k8s-openapi's decoder); a slice's addressType, ports, and
//! per endpoint its addresses, conditions, nodeName and hints. The
//! `slim_decoding_converts_*_like_the_full_object` properties hold the
//! conversion of both forms equal on generated objects.
//!
//! Missing or null fields (a slice without `addressType`, a null
//! `metadata`) decode as empty, as with k8s-openapi's decoders, and the
//! conversion reports what it needs and does not find: one bad object
//! never fails the list page it came in.

use std::{borrow::Cow, collections::BTreeMap, fmt, marker::PhantomData};

use k8s_openapi::{
    api::{
        core::v1::{Service, ServiceSpec, ServiceStatus},
        discovery::v1::{Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    NamespaceResourceScope,
};
use serde::{
    de::{IgnoredAny, MapAccess, Visitor},
    Deserialize, Deserializer,
};

use crate::translate::{
    ANNOTATION_LB_ALGORITHM, LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME,
};

/// Annotations the translation reads; every other one is skipped.
const KEPT_ANNOTATIONS: &[&str] = &[ANNOTATION_LB_ALGORITHM];
/// Labels the translation reads of a Service or a slice; every other one
/// (an app's own, copied from its Service to each slice) is skipped.
const KEPT_LABELS: &[&str] = &[LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS];

/// A Service with only what the translation reads.
#[derive(Clone, Debug, Default)]
pub struct SlimService(pub Service);

/// An EndpointSlice with only what the translation reads.
#[derive(Clone, Debug, Default)]
pub struct SlimSlice(pub EndpointSlice);

/// `kube::Resource` as the full type's: same kind, group, version and
/// plural, so `Api` builds the same URLs.
macro_rules! resource_like {
    ($slim:ty, $full:ty) => {
        impl kube::Resource for $slim {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::kind(dt)
            }
            fn group(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::group(dt)
            }
            fn version(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::version(dt)
            }
            fn api_version(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::api_version(dt)
            }
            fn plural(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::plural(dt)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.0.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.0.metadata
            }
        }
    };
}

resource_like!(SlimService, Service);
resource_like!(SlimSlice, EndpointSlice);

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    labels: Option<Kept<Labels>>,
    annotations: Option<Kept<Annotations>>,
}

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> Self {
        ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            resource_version: m.resource_version,
            labels: m.labels.map(|k| k.0).filter(|l| !l.is_empty()),
            annotations: m.annotations.map(|k| k.0).filter(|a| !a.is_empty()),
            ..ObjectMeta::default()
        }
    }
}

/// Which keys of a map of strings are kept.
trait KeptNames {
    const NAMES: &'static [&'static str];
}

/// `KEPT_ANNOTATIONS`.
struct Annotations;
impl KeptNames for Annotations {
    const NAMES: &'static [&'static str] = KEPT_ANNOTATIONS;
}

/// `KEPT_LABELS`.
struct Labels;
impl KeptNames for Labels {
    const NAMES: &'static [&'static str] = KEPT_LABELS;
}

/// The entries of a map of strings (annotations, labels) whose keys `N`
/// names; the values of the others (a last-applied copy of the object,
/// say) are skipped unread, and their keys never allocated.
struct Kept<N>(BTreeMap<String, String>, PhantomData<N>);

impl<N> Default for Kept<N> {
    fn default() -> Self {
        Kept(BTreeMap::new(), PhantomData)
    }
}

impl<'de, N: KeptNames> Deserialize<'de> for Kept<N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<N>(PhantomData<N>);
        impl<'de, N: KeptNames> Visitor<'de> for V<N> {
            type Value = Kept<N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kept<N>, A::Error> {
                let mut kept = BTreeMap::new();
                while let Some(key) = map.next_key::<KeptKey<N>>()? {
                    match key.0 {
                        Some(name) => {
                            kept.insert(name.to_owned(), map.next_value::<String>()?);
                        }
                        None => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Kept(kept, PhantomData))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// A map's key: which of the names `N` keeps it is, if any (read without
/// allocating).
struct KeptKey<N>(Option<&'static str>, PhantomData<N>);

impl<'de, N: KeptNames> Deserialize<'de> for KeptKey<N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<N>(PhantomData<N>);
        impl<N: KeptNames> Visitor<'_> for V<N> {
            type Value = KeptKey<N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<KeptKey<N>, E> {
                Ok(KeptKey(
                    N::NAMES.iter().copied().find(|k| *k == key),
                    PhantomData,
                ))
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireService {
    metadata: Option<Meta>,
    spec: Option<ServiceSpec>,
    status: Option<ServiceStatus>,
}

impl<'de> Deserialize<'de> for SlimService {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = WireService::deserialize(d)?;
        Ok(SlimService(Service {
            metadata: w.metadata.unwrap_or_default().into(),
            spec: w.spec,
            status: w.status,
        }))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSlice {
    metadata: Option<Meta>,
    address_type: Option<String>,
    ports: Option<Vec<EndpointPort>>,
    endpoints: Option<Vec<WireEndpoint>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireEndpoint {
    addresses: Option<Vec<String>>,
    conditions: Option<EndpointConditions>,
    node_name: Option<String>,
    hints: Option<EndpointHints>,
}

impl<'de> Deserialize<'de> for SlimSlice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = WireSlice::deserialize(d)?;
        let endpoints = w
            .endpoints
            .unwrap_or_default()
            .into_iter()
            .map(|e| Endpoint {
                addresses: e.addresses.unwrap_or_default(),
                conditions: e.conditions,
                node_name: e.node_name,
                hints: e.hints,
                ..Endpoint::default()
            })
            .collect();
        Ok(SlimSlice(EndpointSlice {
            metadata: w.metadata.unwrap_or_default().into(),
            address_type: w.address_type.unwrap_or_default(),
            ports: w.ports,
            endpoints,
        }))
    }
}

#[cfg(test)]
mod tests;
