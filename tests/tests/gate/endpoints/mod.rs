//! The llama-server of today against the fake llama-server: every route classified (health,
//! admin-only, host endpoints), what slotgate forwards and answers kept faithful (the client's bytes,
//! llama-server's own errors, CORS), outcomes that say what llama-server did, requests that take
//! several slots, and admission by a shared KV pool. The real llama-server's side of each is in
//! `llama_today/`.

mod cors;
mod fidelity;
mod outcomes;
mod pool;
mod routes;
mod several_slots;
