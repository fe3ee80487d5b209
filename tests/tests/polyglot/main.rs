//! Tests that need another language's toolchain but no llama-server: the Python example client
//! (`python3`) and the AssemblyScript policies (built by `scripts/build-policies-as.sh`, which needs
//! Node) on the fake upstream; docs/openapi.json through openapi-spec-validator (`$SLOTGATE_PYTHON`).
//!
//! Needs python3, `$SLOTGATE_PYTHON` (scripts/setup-python-clients.sh) and the AssemblyScript,
//! Python and TypeScript policies built (the caller's identity, the hostile guests). Not in the
//! fast tier.

mod caller_identity;
mod client_example;
mod openapi_valid;
mod policy_assemblyscript;
mod policy_hostile_guests;
mod policy_new;
mod starting;
mod tenant_header;
