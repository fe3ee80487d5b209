//! The admin `/metrics`: slotgate's series, with the figures computed per scrape, then
//! llama-server's own.

use crate::metrics as m;
use crate::state::App;

use super::status::band_totals;

/// slotgate's series, then llama-server's own (`--upstream-metrics`) when it answers in time: one
/// scrape target for both. The estimate of reserved KV cache is computed here, per scrape, not on
/// the request path.
pub async fn metrics_text(app: &App) -> String {
    let q = app.admission.stats();
    if let Some(ctx) = app.capacity.slot_context() {
        let capacity = ctx.pool.unwrap_or(ctx.n_ctx * q.slots as u64) as f64;
        metrics::gauge!(m::KV_CACHE_RESERVED_RATIO)
            .set((q.kv_reserved as f64 / capacity).clamp(0.0, 1.0));
    }
    // Each band's share now, and its refusals (bounded: the bands are the configuration's).
    for b in band_totals(app) {
        let band = b.name.to_string();
        metrics::gauge!(m::BAND_SLOTS_BUSY, "band" => band.clone()).set(b.slots_busy as f64);
        metrics::gauge!(m::BAND_QUEUE_DEPTH, "band" => band.clone()).set(b.waiting as f64);
        metrics::counter!(m::BAND_REFUSED_TOTAL, "band" => band).absolute(b.refused);
    }
    let mut text = app.prometheus.render();
    if app.config.upstream_metrics && app.upstream.is_ready() {
        if let Some(theirs) = app.upstream.metrics_copy().await {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            // Only llama-server's own families: nothing it says can shadow a slotgate series.
            for line in theirs.lines().filter(|l| !l.contains("slotgate_")) {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    text
}
