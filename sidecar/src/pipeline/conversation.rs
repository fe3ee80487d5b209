//! A request naming a conversation (`X-Conversation-Id`) while it waits here, and llama-server's
//! stream routes for it. llama-server knows such a request from the moment it arrives (its router
//! parks it while it loads the model), so a stop (`DELETE /v1/stream?conv_id=`) ends it and a
//! resume (`GET`) is told to retry later. One slotgate holds has not reached llama-server, so
//! slotgate does the same for it (`admission::Stops`); once forwarded, llama-server's own answer
//! stands. And as llama-server keeps a parked session request when its client goes, the request
//! runs as a task of its own (see `handle`).
//!
//! Only the caller who started a conversation may read, look up or stop it here (`admission::Owners`): the
//! same key, or on a Unix socket without one the same uid. Anyone else's stop ends nothing, and
//! their read, look-up or stop goes to llama-server for an id that does not exist, so its answer is
//! the one an unknown id gets: nothing says whether the id exists.

use bytes::Bytes;
use http::{Method, Request};
use hyper::body::Incoming;
use serde_json::Value;

use super::admit::{self, Admitted};
use super::decide::Decided;
use super::intake::Intake;
use super::{Ctx, Exchange};
use crate::admission::Caller;
use crate::error::GateError;
use crate::state::App;

/// llama-server's stream routes' path.
const STREAM_PATH: &str = "/v1/stream";
/// llama-server's look-up of conversations by id.
const LOOKUP_PATH: &str = "/v1/streams/lookup";
/// What a stranger's read or stop names instead: no conversation has this id.
const NOBODYS: &str = "slotgate-no-such-conversation";

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
    app.owners.claim(&conversation, ctx.caller);
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

/// llama-server's stream routes, for a conversation whose request waits here: its caller's stop
/// ends it (and goes on to llama-server, which answers it); its caller's resume is answered 503,
/// retry later. Another caller's read or stop names an id nobody has instead (see `Owners`).
pub(super) fn stream_route(
    app: &App,
    req: &mut Request<Incoming>,
    caller: Caller,
) -> Result<(), GateError> {
    if req.uri().path() != STREAM_PATH {
        return Ok(());
    }
    let Some(conversation) = conv_id(req.uri().query()) else {
        return Ok(());
    };
    if !app.owners.allows(&conversation, caller) {
        tracing::info!(
            conversation,
            method = %req.method(),
            "a caller other than the conversation's own named it on a stream route: forwarded for an id nobody has"
        );
        *req.uri_mut() = with_conv_id(req.uri(), NOBODYS);
        return Ok(());
    }
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

/// `POST /v1/streams/lookup`: the ids of conversations another caller owns are taken out of the
/// body, so llama-server answers for them as for ids it does not know.
pub(super) fn lookup(app: &App, intake: &mut Intake, caller: Caller) {
    if intake.parts.method != Method::POST || intake.parts.uri.path() != LOOKUP_PATH {
        return;
    }
    let Some(Value::Array(ids)) = intake
        .json
        .as_mut()
        .and_then(|j| j.get_mut("conversation_ids"))
    else {
        return;
    };
    let before = ids.len();
    ids.retain(|id| id.as_str().is_none_or(|id| app.owners.allows(id, caller)));
    if ids.len() != before {
        if let Some(json) = &intake.json {
            intake.body = Bytes::from(json.to_string());
            intake.parts.headers.remove(http::header::CONTENT_LENGTH);
        }
    }
}

/// `uri` with its query's `conv_id` replaced by `id` (its other parameters kept).
fn with_conv_id(uri: &http::Uri, id: &str) -> http::Uri {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "conv_id" => query.append_pair("conv_id", id),
            _ => query.append_pair(&k, &v),
        };
    }
    let pq = format!("{}?{}", uri.path(), query.finish());
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = pq.parse().ok();
    http::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
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
    fn a_strangers_id_is_replaced_and_the_rest_of_the_query_kept() {
        let uri: http::Uri = "/v1/stream?conv_id=a%3A%3Ab&from=3".parse().unwrap();
        let new = with_conv_id(&uri, NOBODYS);
        assert_eq!(new.path(), "/v1/stream");
        assert_eq!(conv_id(new.query()).as_deref(), Some(NOBODYS));
        assert!(new.query().unwrap().contains("from=3"));
    }

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
