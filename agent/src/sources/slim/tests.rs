//! The slim decoders against k8s-openapi's: the conversion of an object
//! decoded either way is the same, whatever the object holds besides.

use k8s_openapi::{
    api::{
        core::v1::{ObjectReference, Service},
        discovery::v1::{EndpointSlice, ForNode},
    },
    apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference},
};
use proptest::{collection::vec, option, prelude::*};

use super::{SlimService, SlimSlice};
use crate::translate::{
    fuzz, ServiceInfo, SliceInfo, ANNOTATION_LB_ALGORITHM, LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME,
};

/// What a cluster's objects carry that the translation never reads, and
/// the labels and annotations it does read.
#[derive(Clone, Debug)]
struct Extra {
    lb_algorithm: Option<String>,
    last_applied: bool,
    label: Option<&'static str>,
    owner: bool,
    managed: bool,
}

fn extra() -> impl Strategy<Value = Extra> {
    (
        option::of(prop_oneof![
            Just("maglev".to_owned()),
            Just("random".to_owned()),
            Just(String::new()),
            fuzz::word()
        ]),
        any::<bool>(),
        option::of(prop_oneof![
            Just(LABEL_HEADLESS),
            Just(LABEL_SERVICE_PROXY_NAME),
            Just("app")
        ]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(lb_algorithm, last_applied, label, owner, managed)| Extra {
                lb_algorithm,
                last_applied,
                label,
                owner,
                managed,
            },
        )
}

fn dress(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, x: &Extra) {
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    if let Some(v) = &x.lb_algorithm {
        annotations.insert(ANNOTATION_LB_ALGORITHM.into(), v.clone());
    }
    if x.last_applied {
        annotations.insert(
            "kubectl.kubernetes.io/last-applied-configuration".into(),
            r#"{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{"service.sluice.dev/lb-algorithm":"maglev"}}}"#.into(),
        );
    }
    if let Some(l) = x.label {
        meta.labels
            .get_or_insert_with(Default::default)
            .insert(l.into(), "x".into());
    }
    meta.uid = Some("0a1b2c3d-0000-4000-8000-000000000001".into());
    meta.generation = Some(3);
    if x.owner {
        meta.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Service".into(),
            name: "web".into(),
            uid: "0a1b2c3d-0000-4000-8000-000000000002".into(),
            controller: Some(true),
            ..Default::default()
        }]);
    }
    if x.managed {
        meta.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kube-controller-manager".into()),
            operation: Some("Update".into()),
            fields_type: Some("FieldsV1".into()),
            ..Default::default()
        }]);
    }
}

/// Decodes `obj`'s JSON the slim way.
fn slim<T: serde::de::DeserializeOwned>(obj: &impl serde::Serialize) -> T {
    let json = serde_json::to_vec(obj).expect("k8s-openapi objects serialize");
    serde_json::from_slice(&json).expect("the slim decoder takes what k8s-openapi writes")
}

proptest! {
    #[test]
    fn slim_decoding_converts_services_like_the_full_object(
        mut svc in fuzz::service(),
        x in extra(),
    ) {
        dress(&mut svc.metadata, &x);
        let full: Service = slim(&svc);
        let slim: SlimService = slim(&svc);
        prop_assert_eq!(
            ServiceInfo::from_service(&slim.0),
            ServiceInfo::from_service(&full)
        );
        prop_assert_eq!(slim.0.metadata.resource_version, full.metadata.resource_version);
        // Nothing of what is never read was kept.
        prop_assert!(slim.0.metadata.managed_fields.is_none());
        prop_assert!(slim.0.metadata.owner_references.is_none());
        prop_assert!(slim
            .0
            .metadata
            .annotations
            .iter()
            .flatten()
            .all(|(k, _)| k == ANNOTATION_LB_ALGORITHM));
    }

    #[test]
    fn slim_decoding_converts_slices_like_the_full_object(
        mut s in fuzz::slice(),
        x in extra(),
        nodes in vec(option::of(vec(fuzz::word(), 0..2)), 4),
        pods in any::<bool>(),
    ) {
        dress(&mut s.metadata, &x);
        for (e, hinted) in s.endpoints.iter_mut().zip(nodes) {
            if let Some(names) = hinted {
                e.hints.get_or_insert_with(Default::default).for_nodes =
                    Some(names.into_iter().map(|name| ForNode { name }).collect());
            }
            if pods {
                e.target_ref = Some(ObjectReference {
                    kind: Some("Pod".into()),
                    name: Some("web-1".into()),
                    namespace: Some("default".into()),
                    ..Default::default()
                });
                e.zone = Some("zone-a".into());
            }
        }
        let full: EndpointSlice = slim(&s);
        let slim: SlimSlice = slim(&s);
        prop_assert_eq!(SliceInfo::from_slice(&slim.0), SliceInfo::from_slice(&full));
        prop_assert!(slim.0.endpoints.iter().all(|e| e.target_ref.is_none() && e.zone.is_none()));
    }
}

/// What the API server sends for an object the conversion rejects must
/// still decode: a bad object is reported, never a failed list page.
#[test]
fn objects_with_missing_or_null_fields_decode_and_are_reported() {
    for json in [
        r#"{"metadata":{"name":"web-1","namespace":"default","resourceVersion":"7",
            "labels":{"kubernetes.io/service-name":"web"},"annotations":null},"endpoints":null}"#,
        r#"{"metadata":{"name":"web-1","namespace":"default","resourceVersion":"7",
            "labels":{"kubernetes.io/service-name":"web"}},"addressType":null,
            "ports":null,"endpoints":[{"addresses":null,"conditions":null}]}"#,
    ] {
        let slice: SlimSlice = serde_json::from_str(json).expect("decodes");
        assert_eq!(slice.0.metadata.resource_version.as_deref(), Some("7"));
        let problem = SliceInfo::from_slice(&slice.0).expect_err("reported");
        assert!(problem.detail.contains("addressType"), "{problem:?}");
    }
    // A null metadata decodes too, and the conversion reports the name.
    let svc: SlimService =
        serde_json::from_str(r#"{"metadata":null,"spec":null}"#).expect("decodes");
    let problem = ServiceInfo::from_service(&svc.0).expect_err("reported");
    assert!(problem.detail.contains("metadata.name"), "{problem:?}");
}

#[test]
fn only_the_labels_and_annotations_the_translation_reads_are_kept() {
    let json = r#"{"metadata":{"name":"web-1","namespace":"default",
        "labels":{"app":"web","endpointslice.kubernetes.io/managed-by":"endpointslice-controller.k8s.io",
                  "kubernetes.io/service-name":"web","service.kubernetes.io/headless":""},
        "annotations":{"endpoints.kubernetes.io/last-change-trigger-time":"2026-11-26T00:00:00Z",
                       "service.sluice.dev/lb-algorithm":"maglev"}},
        "addressType":"IPv4","endpoints":[]}"#;
    let slice: SlimSlice = serde_json::from_str(json).expect("decodes");
    let keys = |m: &Option<std::collections::BTreeMap<String, String>>| {
        m.iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        keys(&slice.0.metadata.labels),
        [
            "kubernetes.io/service-name",
            "service.kubernetes.io/headless"
        ]
    );
    assert_eq!(
        keys(&slice.0.metadata.annotations),
        [ANNOTATION_LB_ALGORITHM]
    );
    // None kept: none at all, as an object without any.
    let svc: SlimService =
        serde_json::from_str(r#"{"metadata":{"name":"web","labels":{"app":"web"}}}"#)
            .expect("decodes");
    assert_eq!(svc.0.metadata.labels, None);
}
