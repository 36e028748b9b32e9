//! A kubeconfig pointing at the test API server (plain HTTP, no auth).

use std::path::Path;

use anyhow::{Context, Result};

/// Name of the cluster, user and context in the kubeconfig.
pub const CONTEXT: &str = "sluice-test";

/// A kubeconfig for `server` (e.g. `http://127.0.0.1:1234`), with
/// `default` as the context's namespace.
pub fn kubeconfig_yaml(server: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {CONTEXT}
  cluster:
    server: {server}
users:
- name: {CONTEXT}
  user: {{}}
contexts:
- name: {CONTEXT}
  context:
    cluster: {CONTEXT}
    user: {CONTEXT}
    namespace: default
current-context: {CONTEXT}
preferences: {{}}
"
    )
}

pub fn write_kubeconfig(path: &Path, server: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, kubeconfig_yaml(server))
        .with_context(|| format!("writing {}", path.display()))
}
