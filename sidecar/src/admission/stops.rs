//! Conversations waiting in slotgate: a request naming one (`X-Conversation-Id`) that waits for a
//! slot or for its model's load, and the stop (`DELETE /v1/stream?conv_id=`) that ends it.
//!
//! llama-server registers such a request before it waits (its router before the load, a single
//! server as its handler starts), so its stream routes know it: a stop ends it (the router answers
//! it 400 "request cancelled by a stop while the model was loading"), and a resume while the router
//! loads its model is told to retry later (503). A request slotgate holds has not reached
//! llama-server yet, so slotgate keeps the same record for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::oneshot;

/// The conversations with a request waiting in slotgate.
#[derive(Default)]
pub struct Stops {
    waiting: Mutex<HashMap<Box<str>, Vec<Entry>>>,
    next: AtomicU64,
}

struct Entry {
    id: u64,
    /// The model it asked for, in front of a router.
    model: Option<Box<str>>,
    stop: oneshot::Sender<()>,
}

/// One waiting request's record, taken out of [`Stops`] when it is dropped (the request got its
/// slot, was refused or ended).
pub struct Waiting<'a> {
    stops: &'a Stops,
    conversation: Box<str>,
    id: u64,
    stopped: oneshot::Receiver<()>,
}

impl Stops {
    /// Records a request of `conversation` (for `model`, in front of a router) about to wait.
    pub fn wait(&self, conversation: &str, model: Option<&str>) -> Waiting<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (stop, stopped) = oneshot::channel();
        self.lock()
            .entry(conversation.into())
            .or_default()
            .push(Entry {
                id,
                model: model.map(Into::into),
                stop,
            });
        Waiting {
            stops: self,
            conversation: conversation.into(),
            id,
            stopped,
        }
    }

    /// Ends every request of `conversation` still waiting; how many there were.
    pub fn stop(&self, conversation: &str) -> usize {
        let Some(waiters) = self.lock().remove(conversation) else {
            return 0;
        };
        let n = waiters.len();
        for w in waiters {
            let _ = w.stop.send(());
        }
        n
    }

    /// Whether a request of `conversation` waits in slotgate: then the model the first one asked
    /// for, if any.
    pub fn model_of(&self, conversation: &str) -> Option<Option<String>> {
        let waiting = self.lock();
        let first = waiting.get(conversation)?.first()?;
        Some(first.model.as_deref().map(str::to_owned))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Vec<Entry>>> {
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Waiting<'_> {
    /// Resolves once a stop names the conversation; never otherwise.
    pub async fn stopped(&mut self) {
        if (&mut self.stopped).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waiting = self.stops.lock();
        if let Some(list) = waiting.get_mut(&self.conversation) {
            list.retain(|e| e.id != self.id);
            if list.is_empty() {
                waiting.remove(&self.conversation);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stop_ends_the_conversations_waiting_requests_only() {
        let stops = Stops::default();
        let mut a1 = stops.wait("a", Some("m"));
        let mut a2 = stops.wait("a", None);
        let mut b = stops.wait("b", None);
        assert_eq!(stops.model_of("a"), Some(Some("m".to_owned())));
        assert_eq!(stops.stop("a"), 2);
        a1.stopped().await;
        a2.stopped().await;
        assert_eq!(stops.model_of("a"), None);
        assert_eq!(stops.model_of("b"), Some(None));
        let pending = tokio::time::timeout(std::time::Duration::from_millis(20), b.stopped());
        assert!(pending.await.is_err(), "b was not stopped");
        drop(b);
        assert_eq!(stops.model_of("b"), None);
        assert_eq!(stops.stop("b"), 0);
    }

    #[test]
    fn a_request_that_leaves_takes_its_record_with_it() {
        let stops = Stops::default();
        let first = stops.wait("a", None);
        let second = stops.wait("a", None);
        drop(first);
        assert!(stops.model_of("a").is_some());
        drop(second);
        assert!(stops.model_of("a").is_none());
    }
}
