//! Where Services, EndpointSlices and the Node come from: the Kubernetes
//! API (`kube`) or a directory of manifests (`dir`). Both convert objects
//! to their trimmed form at once and send [`Update`]s to the sync task,
//! which owns the stores: the stores never hold full API objects.

pub mod dir;
pub mod guard;
pub mod kube;
pub mod slim;

use std::fmt;

use crate::translate::{NodeInfo, ObjectKey, Problem, ServiceCidrInfo, ServiceInfo, SliceInfo};

/// The kinds of objects sluice reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    /// `networking.k8s.io/v1` ServiceCIDR: the service address space.
    ServiceCidr,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Node,
        Kind::ServiceCidr,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::ServiceCidr => "ServiceCIDR",
        }
    }
}

/// Health and metrics know kinds by name only.
impl From<Kind> for &'static str {
    fn from(k: Kind) -> Self {
        k.as_str()
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One object after conversion: usable (`Ok(Some)`), deliberately ignored
/// (`Ok(None)`, e.g. an ExternalName service) or unusable (`Err`, reported).
#[derive(Clone, Debug)]
pub struct Converted<T> {
    pub key: ObjectKey,
    pub value: Result<Option<T>, Problem>,
}

/// A change to one kind's store.
#[derive(Clone, Debug)]
pub enum Change<T> {
    Apply(Converted<T>),
    Delete(ObjectKey),
    /// The complete current set (a directory read, or an absent resource):
    /// replaces the store, so deletes missed while disconnected are not
    /// lost.
    Reset(Vec<Converted<T>>),
    /// A list (or relist) begins: the objects of the `ListPage`s that
    /// follow, up to `ListEnd`, are the complete set.
    ListStart,
    /// Objects of the list in progress: applied at once, like `Apply`s
    /// (a relist never holds a second copy of every object).
    ListPage(Vec<Converted<T>>),
    /// The list is complete: whatever its pages did not hold is gone.
    ListEnd,
}

/// An update and when its source handed it over.
pub type Envelope = (std::time::Instant, Update);

/// What sources send to the sync task.
#[derive(Clone, Debug)]
pub enum Update {
    Services(Change<ServiceInfo>),
    Slices(Change<SliceInfo>),
    Node(Change<NodeInfo>),
    ServiceCidrs(Change<ServiceCidrInfo>),
}

impl Update {
    pub fn kind(&self) -> Kind {
        match self {
            Update::Services(_) => Kind::Service,
            Update::Slices(_) => Kind::EndpointSlice,
            Update::Node(_) => Kind::Node,
            Update::ServiceCidrs(_) => Kind::ServiceCidr,
        }
    }

    /// Whether this update completes a kind's set (a `Reset`, or the end
    /// of a list).
    pub fn is_reset(&self) -> bool {
        matches!(
            self,
            Update::Services(Change::Reset(_) | Change::ListEnd)
                | Update::Slices(Change::Reset(_) | Change::ListEnd)
                | Update::Node(Change::Reset(_) | Change::ListEnd)
                | Update::ServiceCidrs(Change::Reset(_) | Change::ListEnd)
        )
    }
}

/// Converts one object, keyed by its metadata; `None` when it has no name
/// (it cannot be tracked, and the API never sends one).
pub(crate) fn convert<K, T>(
    obj: &K,
    f: impl Fn(&K) -> Result<Option<T>, Problem>,
) -> Option<Converted<T>>
where
    K: ::kube::Resource,
{
    let key = ObjectKey::from_meta(obj.meta())?;
    Some(Converted { key, value: f(obj) })
}

pub(crate) fn service(s: &k8s_openapi::api::core::v1::Service) -> Option<Converted<ServiceInfo>> {
    convert(s, ServiceInfo::from_service)
}

pub(crate) fn slice(
    s: &k8s_openapi::api::discovery::v1::EndpointSlice,
) -> Option<Converted<SliceInfo>> {
    convert(s, SliceInfo::from_slice)
}

pub(crate) fn node(n: &k8s_openapi::api::core::v1::Node) -> Option<Converted<NodeInfo>> {
    convert(n, |n| NodeInfo::from_node(n).map(Some))
}

pub(crate) fn service_cidr(
    c: &k8s_openapi::api::networking::v1::ServiceCIDR,
) -> Option<Converted<ServiceCidrInfo>> {
    convert(c, |c| ServiceCidrInfo::from_service_cidr(c).map(Some))
}
