//! The one contract the chain speaks. A loaded policy is a [`Guest`]: asked about a request with an
//! [`Ask`], told how one it allowed ended with a [`Tell`], its answer the host's checked
//! [`Decision`]. A `slotgate:policy@2.0.0` component answers in the contract's records (`v2/`); an
//! ABI v1 module answers through its adapter (`v1/`), which owns v1's JSON both ways. Nothing else
//! in the policy room knows which contract a policy speaks.
//!
//! It sits between the two: it speaks v2's records, and v1's adapter speaks it (`arrows` holds the
//! order: `compiled.rs` → `v1/` → `guest.rs` → `v2/`).

use std::future::Future;
use std::pin::Pin;

use serde_json::value::RawValue;
use serde_json::Value;
use slotgate_sdk::{Completion, Decision, Earlier, EvaluateInput, RequestSummary};

use super::error::{EvalError, LoadError};
use super::sandbox::{block_on, Evaluation, Runs, SettingsVerdict};
use super::v2::{self, records, t, ComponentPolicy, Isolation};

/// A call in progress: boxed, so that policies of both contracts sit behind one trait object.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, EvalError>> + Send + 'a>>;

/// A loaded policy, whatever contract it speaks.
pub trait Guest: Send + Sync {
    /// The contract it speaks, for `/status` and `slotgate policy check`.
    fn contract(&self) -> Contract;

    /// How long its instances live.
    fn isolation(&self) -> Isolation;

    /// Instances kept idle for their callers now.
    fn instances_kept(&self) -> usize;

    /// Whether it checks its settings itself (a component always does).
    fn has_validate(&self) -> bool;

    /// Whether `on_complete` runs after the requests it allowed.
    fn has_on_complete(&self) -> bool;

    /// Whether it imports any WASI interface (a Python or JavaScript runtime does).
    fn imports_wasi(&self) -> bool;

    /// Runs its settings check once, at load: what the policy, so configured, asks of the host.
    fn validate_settings(&self, settings: &Value) -> Result<SettingsVerdict, LoadError>;

    /// Evaluates the request `ask` holds: the decision, checked, and what it cost.
    fn evaluate<'a>(
        &'a self,
        ask: &'a mut Ask<'_>,
        runs: Runs,
    ) -> Pending<'a, (Decision, Evaluation)>;

    /// Tells it how a request it allowed ended (`None`: it did not want to hear).
    fn on_complete<'a>(
        &'a self,
        tell: &'a mut Tell<'_>,
        runs: Runs,
    ) -> Pending<'a, Option<Evaluation>>;
}

impl dyn Guest {
    /// Evaluates an [`EvaluateInput`] (the shape `slotgate policy eval` reads) on this thread; its
    /// `settings`, unless null, go with it.
    pub fn evaluate_input(
        &self,
        input: &EvaluateInput,
    ) -> Result<(Decision, Evaluation), EvalError> {
        let text = serde_json::value::to_raw_value(&input.settings)
            .map_err(|e| EvalError::Abi(e.to_string()))?;
        let mut ask = Ask::new(&input.request, input.now_unix_ms);
        ask.earlier = input.earlier.clone();
        if !input.settings.is_null() {
            ask.settings = Some(Settings {
                text: &text,
                value: &input.settings,
            });
        }
        block_on(self.evaluate(&mut ask, Runs::Blocking))
    }
}

/// A policy's settings as every call carries them: parsed, and as the JSON text they were read
/// as (serialised once, at load).
#[derive(Debug, Clone, Copy)]
pub struct Settings<'a> {
    pub text: &'a RawValue,
    pub value: &'a Value,
}

impl Settings<'_> {
    /// The text a component's calls take: `null` for a policy that holds its settings already.
    pub fn text_of(settings: Option<Settings<'_>>) -> &str {
        settings.map_or("null", |s| s.text.get())
    }
}

/// A contract's own encoding of a request (ABI v1's JSON, `v1/json.rs`): the bytes, and how many
/// of them every policy of the chain shares.
pub struct Encoded {
    pub bytes: Vec<u8>,
    pub shared: usize,
}

/// One request as each policy of a chain in turn is asked about it: the host's record, what the
/// enforced policies before it allowed with, and the policy's own settings. The contract's record
/// of it is made once, on first use, for all the chain's policies.
pub struct Ask<'a> {
    request: &'a RequestSummary,
    now_unix_ms: u64,
    /// What the enforced policies so far allowed with.
    pub earlier: Earlier,
    /// The settings of the policy asked next (`None`: it holds its own).
    pub settings: Option<Settings<'a>>,
    record: Option<t::Evaluation>,
    /// A contract's own encoding of the request, made once for the whole chain: ABI v1's JSON
    /// (see `v1/json.rs`).
    pub(super) encoded: Option<Result<Encoded, EvalError>>,
}

impl<'a> Ask<'a> {
    pub fn new(request: &'a RequestSummary, now_unix_ms: u64) -> Ask<'a> {
        Ask {
            request,
            now_unix_ms,
            earlier: Earlier::default(),
            settings: None,
            record: None,
            encoded: None,
        }
    }

    /// The host's record of the request.
    pub fn request(&self) -> &'a RequestSummary {
        self.request
    }

    pub fn now_unix_ms(&self) -> u64 {
        self.now_unix_ms
    }

    /// The request as the contract carries it, with what earlier policies decided.
    pub fn record(&mut self) -> &t::Evaluation {
        let (request, now) = (self.request, self.now_unix_ms);
        let record = self.record.get_or_insert_with(|| t::Evaluation {
            request: records::request_of(request),
            earlier: records::earlier_of(&Earlier::default()),
            now_unix_ms: now,
        });
        record.earlier = records::earlier_of(&self.earlier);
        record
    }
}

/// How a request ended, as each policy that allowed it is told in turn: the host's completion (its
/// `decision` the chain's), the policy's own decision, its settings. The contract's record is made
/// once for all of them (only its `decision` differs between them).
pub struct Tell<'a> {
    completion: &'a Completion,
    mine: Option<&'a Decision>,
    /// The settings of the policy told next (`None`: it holds its own).
    pub settings: Option<Settings<'a>>,
    record: Option<t::Completion>,
    /// Whether `record` carries `mine` as its decision.
    record_is_mine: bool,
}

impl<'a> Tell<'a> {
    pub fn new(completion: &'a Completion) -> Tell<'a> {
        Tell {
            completion,
            mine: None,
            settings: None,
            record: None,
            record_is_mine: false,
        }
    }

    /// Readies it for the policy whose own decision was `mine`, with `settings`.
    pub fn about(&mut self, mine: &'a Decision, settings: Option<Settings<'a>>) {
        self.mine = Some(mine);
        self.settings = settings;
        self.record_is_mine = false;
    }

    /// The host's completion; its `decision` is the chain's.
    pub fn completion(&self) -> &'a Completion {
        self.completion
    }

    /// The decision of the policy told (the chain's before [`Tell::about`]).
    pub fn mine(&self) -> &'a Decision {
        self.mine.unwrap_or(&self.completion.decision)
    }

    /// How the request ended as the contract carries it, with the policy's own decision.
    pub fn record(&mut self) -> &t::Completion {
        let mine = self.mine();
        if !self.record_is_mine {
            match &mut self.record {
                Some(record) => record.decision = records::allow_of(mine),
                None => self.record = Some(records::completion_of(self.completion, mine)),
            }
            self.record_is_mine = true;
        }
        self.record.as_ref().expect("made above")
    }
}

/// What a policy file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// An ABI v1 core module (JSON in and out).
    V1,
    /// A `slotgate:policy@2.0.0` component.
    V2,
    /// A core module built with wit-bindgen against the v2 contract: made a component on load.
    V2Embedded,
}

impl Contract {
    pub fn of(bytes: &[u8]) -> Contract {
        if v2::is_component(bytes) {
            Contract::V2
        } else if v2::embeds_contract(bytes) {
            Contract::V2Embedded
        } else {
            Contract::V1
        }
    }

    /// For `/status` and `slotgate policy check`.
    pub fn label(self) -> &'static str {
        match self {
            Contract::V1 => "v1",
            Contract::V2 | Contract::V2Embedded => "v2",
        }
    }
}

impl Guest for ComponentPolicy {
    fn contract(&self) -> Contract {
        Contract::V2
    }

    fn isolation(&self) -> Isolation {
        ComponentPolicy::isolation(self)
    }

    fn instances_kept(&self) -> usize {
        self.kept_idle()
    }

    fn has_validate(&self) -> bool {
        true
    }

    fn has_on_complete(&self) -> bool {
        self.wants_completions()
    }

    fn imports_wasi(&self) -> bool {
        ComponentPolicy::imports_wasi(self)
    }

    fn validate_settings(
        &self,
        settings: &serde_json::Value,
    ) -> Result<SettingsVerdict, LoadError> {
        ComponentPolicy::validate_settings(self, settings)
    }

    fn evaluate<'a>(
        &'a self,
        ask: &'a mut Ask<'_>,
        runs: Runs,
    ) -> Pending<'a, (Decision, Evaluation)> {
        let settings = Settings::text_of(ask.settings);
        let record = ask.record();
        Box::pin(self.evaluate_async(settings, record, runs))
    }

    fn on_complete<'a>(
        &'a self,
        tell: &'a mut Tell<'_>,
        runs: Runs,
    ) -> Pending<'a, Option<Evaluation>> {
        let settings = Settings::text_of(tell.settings);
        let record = tell.record();
        Box::pin(async move {
            self.on_complete_async(settings, record, runs)
                .await
                .map(Some)
        })
    }
}
