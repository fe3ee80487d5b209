//! Deployment examples checked with the real tools: systemd (socket activation, notify, the units
//! through `systemd-analyze verify`), Kubernetes (manifests through `$KUBE_VALIDATE`), and the
//! Debian package (built with `$CARGO_DEB`, installed with dpkg into a throwaway root).
//!
//! Needs systemd's tools (`systemd-analyze`, `systemd-socket-activate`), `$KUBE_VALIDATE`
//! (`scripts/setup-kubernetes-tools.sh`), `$CARGO_DEB` (`scripts/setup-package.sh`), dpkg and the
//! Rust example policies. Not in the fast tier.

mod deploy_image;
mod deploy_kubernetes;
mod deploy_package;
mod deploy_systemd;
