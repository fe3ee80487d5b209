//! Deployment examples checked with the real tools: systemd (socket activation, notify, the units
//! through `systemd-analyze verify`) and Kubernetes (manifests through `$KUBE_VALIDATE`).
//!
//! Needs systemd's tools (`systemd-analyze`, `systemd-socket-activate`), `$KUBE_VALIDATE`
//! (`scripts/setup-kubernetes-tools.sh`) and the Rust example policies. Not in the fast tier.

mod deploy_kubernetes;
mod deploy_systemd;
