//! End to end against the real llama-server (`scripts/setup-llama.sh`, `$LLAMA_SERVER` and the tiny
//! models): the e2e scenarios, the soak's CI run, its fault rows, the Python SDKs and LiteLLM, the
//! observability kit (promtool), the route table against llama-server's source (`$LLAMA_SOURCE`),
//! and `llama_today`.
//!
//! Every async test here holds [`slotgate_tests::llama::serial`], so they run one at a time: two
//! CPU-bound llama-servers on this machine's two cores would skew each other's timings, and the
//! soak's fd and RSS checks want the machine to themselves. (The few sync tests only read files
//! and run promtool.)
//!
//! Needs everything `scripts/test.sh` sets up. Not in the fast tier.

mod admin_plane;
mod callers;
mod e2e_litellm;
mod e2e_llama;
mod e2e_llama_budget;
mod e2e_llama_cost;
mod e2e_llama_fleet;
mod e2e_llama_gaie;
mod e2e_llama_pool;
mod e2e_llama_wrap;
mod e2e_openai_sdk;
mod e2e_smg;
mod examples_enterprise;
mod fault_upstream;
mod keys;
mod llama_today;
mod observability_kit;
mod policies_v2;
mod quotas;
mod readme;
mod router;
mod router_asks;
mod routes_source;
mod service_levels;
mod soak_ci;
mod spend;
mod top;
mod traces;
