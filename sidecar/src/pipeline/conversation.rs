//! A request naming a conversation (`X-Conversation-Id`) while it waits here, and llama-server's
//! stream routes for it. llama-server knows such a request from the moment it arrives (its router
//! parks it while it loads the model), so a stop (`DELETE /v1/stream?conv_id=`) ends it and a
//! resume (`GET`) is told to retry later. One slotgate holds has not reached llama-server, so
//! slotgate does the same for it (`admission::Stops`); once forwarded, llama-server's own answer
//! stands. And as llama-server keeps a parked session request when its client goes, the request
//! runs as a task of its own (see `handle`).

use http::{Method, Request};
use hyper::body::Incoming;

use super::admit::{self, Admitted};
use super::decide::Decided;
use super::intake::Intake;
use super::{Ctx, Exchange};
use crate::error::GateError;
use crate::state::App;

/// llama-server's stream routes' path.
const STREAM_PATH: &str = "/v1/stream";

/// `admit::admit`, for a slot route's request naming a conversation: ended by a stop of its
/// conversation while it waits (for its model's load or a slot).
pub(super) async fn admit(
    app: &App,
    intake: &mut Intake,
    decided: &Decided,
    ctx: &Ctx,
    ex: &mut Exchange,
) -> Result<Admitted, GateError> {
    let conversation = match intake.conversation() {
        Some(c) if ctx.slot_route => c.to_owned(),
        _ => return admit::admit(app, intake, decided, ctx, ex).await,
    };
    let pool = intake.model_pool(app);
    let mut waiting = app.stops.wait(&conversation, pool.as_ref().map(|p| &*p.id));
    tokio::select! {
        biased;
        () = waiting.stopped() => Err(GateError::Stopped {
            loading: pool.is_some_and(|p| p.admission.is_paused()),
        }),
        admitted = admit::admit(app, intake, decided, ctx, ex) => admitted,
    }
}

/// llama-server's stream routes, for a conversation whose request waits here: a stop ends it (and
/// goes on to llama-server, which answers it); a resume is answered 503, retry later.
pub(super) fn stream_route(app: &App, req: &Request<Incoming>) -> Result<(), GateError> {
    if req.uri().path() != STREAM_PATH {
        return Ok(());
    }
    let Some(conversation) = conv_id(req.uri().query()) else {
        return Ok(());
    };
    match *req.method() {
        Method::DELETE => {
            let n = app.stops.stop(&conversation);
            if n > 0 {
                tracing::info!(
                    conversation,
                    requests = n,
                    "a stop ended the conversation's waiting requests"
                );
            }
            Ok(())
        }
        Method::GET => match app.stops.model_of(&conversation) {
            None => Ok(()),
            Some(model) => Err(GateError::StreamPending {
                loading: model
                    .and_then(|m| app.models.pool_for(m.as_str()))
                    .is_some_and(|p| p.admission.is_paused()),
            }),
        },
        _ => Ok(()),
    }
}

/// The `conv_id` of a stream route's query, decoded as llama-server decodes it.
fn conv_id(query: Option<&str>) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == "conv_id")
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conversation_is_read_from_the_query_as_llama_server_reads_it() {
        assert_eq!(
            conv_id(Some(
                "conv_id=conv-stream-test%3A%3Aggml-org%2Ftiny%3AQ8_0&from=0"
            ))
            .as_deref(),
            Some("conv-stream-test::ggml-org/tiny:Q8_0")
        );
        assert_eq!(conv_id(Some("from=0")), None);
        assert_eq!(conv_id(Some("conv_id=")), None);
        assert_eq!(conv_id(None), None);
    }
}
