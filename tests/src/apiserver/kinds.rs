//! The resource types the test API server serves, and their REST names.

use std::fmt;

/// A resource type the server stores and serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    /// core/v1 `Service`, namespaced.
    Service,
    /// discovery.k8s.io/v1 `EndpointSlice`, namespaced.
    EndpointSlice,
    /// core/v1 `Node`, cluster-scoped.
    Node,
    /// networking.k8s.io/v1 `ServiceCIDR`, cluster-scoped.
    ServiceCidr,
}

impl ResourceKind {
    pub const ALL: [ResourceKind; 4] = [
        Self::Service,
        Self::EndpointSlice,
        Self::Node,
        Self::ServiceCidr,
    ];

    /// `kind` of one object, e.g. `Service`.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Node => "Node",
            Self::ServiceCidr => "ServiceCIDR",
        }
    }

    /// `kind` of a list, e.g. `ServiceList`.
    pub fn list_kind(self) -> &'static str {
        match self {
            Self::Service => "ServiceList",
            Self::EndpointSlice => "EndpointSliceList",
            Self::Node => "NodeList",
            Self::ServiceCidr => "ServiceCIDRList",
        }
    }

    /// `apiVersion`, e.g. `v1` or `discovery.k8s.io/v1`.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::Service | Self::Node => "v1",
            Self::EndpointSlice => "discovery.k8s.io/v1",
            Self::ServiceCidr => "networking.k8s.io/v1",
        }
    }

    /// API group, empty for core.
    pub fn group(self) -> &'static str {
        match self {
            Self::Service | Self::Node => "",
            Self::EndpointSlice => "discovery.k8s.io",
            Self::ServiceCidr => "networking.k8s.io",
        }
    }

    /// Resource name in URLs, e.g. `services`.
    pub fn plural(self) -> &'static str {
        match self {
            Self::Service => "services",
            Self::EndpointSlice => "endpointslices",
            Self::Node => "nodes",
            Self::ServiceCidr => "servicecidrs",
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(self, Self::Node | Self::ServiceCidr)
    }

    /// The kind with this `apiVersion` and `kind`, if served.
    pub fn from_type(api_version: &str, kind: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.api_version() == api_version && k.kind() == kind)
    }

    /// The kind of a k8s-openapi type, if served.
    pub fn of<K: k8s_openapi::Resource>() -> Option<Self> {
        Self::from_type(K::API_VERSION, K::KIND)
    }

    /// The kind served under `/api/v1` (`group == ""`) or
    /// `/apis/{group}/v1` with this plural name.
    pub(crate) fn from_path(group: &str, version: &str, plural: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| {
            k.group() == group
                && k.plural() == plural
                && k.api_version().rsplit('/').next() == Some(version)
        })
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())
    }
}
