// A policy that exercises the SDK for its own tests (sdk.test.mjs): it echoes what it parsed in
// response headers, and reaches every host function, abort and trace, chosen by the request's path.

import {
  Completion,
  Decision,
  EvaluateInput,
  JsonReader,
  Level,
  Policy,
  bucketRefund,
  bucketTake,
  evaluate,
  log,
  nowMs,
  onComplete,
  slotgate_abi_version,
  slotgate_alloc,
  validateSettings,
  windowAdd,
} from "../assembly/index";

export { slotgate_abi_version, slotgate_alloc };

class Settings {
  maxChars: u64 = 10;
  label: string = "";
  keys: string[] = [];
  ratio: f64 = 0;
  count: bool = false;
}

class Probe extends Policy<Settings> {
  readSettings(r: JsonReader): Settings {
    const s = new Settings();
    if (!r.object()) return s;
    while (r.next()) {
      if (r.is("max_chars")) s.maxChars = r.u64();
      else if (r.is("label")) s.label = r.string();
      else if (r.is("keys")) s.keys = r.strings();
      else if (r.is("ratio")) s.ratio = r.f64();
      else if (r.is("count")) s.count = r.bool();
      else r.unknown();
    }
    return s;
  }

  validate(s: Settings): string | null {
    return s.maxChars == 0 ? "max_chars must be positive" : null;
  }

  needsPromptTokens(s: Settings): bool {
    return s.count;
  }

  evaluate(input: EvaluateInput, s: Settings): Decision {
    const r = input.request;
    const path = r.path;
    if (path == "/echo") {
      const d = Decision.allow();
      const h = d.mutations.responseHeaders;
      const model = r.model;
      const key = r.apiKey;
      const peer = r.peer;
      h.set("method", r.method);
      h.set("model", model !== null ? model : "<none>");
      h.set("stream", r.stream ? "true" : "false");
      h.set("max-tokens", r.hasMaxTokens ? r.maxTokens.toString() : "<none>");
      h.set("prompt-chars", r.promptChars.toString());
      h.set("prompt-best", r.promptTokensBest().toString());
      h.set("reserved", r.hasReservedTokens ? r.reservedTokens.toString() : "<none>");
      h.set("hint", r.hasPriorityHint ? r.priorityHint.toString() : "<none>");
      h.set("deadline", r.hasDeadlineMs ? r.deadlineMs.toString() : "<none>");
      h.set("peer", peer !== null ? peer.uid.toString() + "/" + peer.gid.toString() + "/" + (peer.hasPid ? peer.pid.toString() : "-") : "<none>");
      h.set("api-key", key !== null ? key : "<none>");
      h.set("identity", r.identity());
      const names = r.headers.keys().sort();
      let headers = "";
      for (let i = 0; i < names.length; i++) headers += names[i] + "=" + r.headers.get(names[i]) + ";";
      h.set("headers", headers);
      h.set("queue", r.queue.depth.toString() + "/" + r.queue.capacity.toString() + "/" + r.queue.inFlight.toString() + "/" + r.queue.estimatedWaitSeconds.toString());
      h.set("now", input.nowUnixMs.toString());
      h.set("settings", s.label + "|" + s.keys.join(",") + "|" + s.ratio.toString() + "|" + s.maxChars.toString());
      d.tenant = r.identity();
      d.cost = r.promptTokensBest();
      d.priority = r.hasPriorityHint ? r.priorityHint : -3;
      d.weight = 2.5;
      if (r.hasDeadlineMs) d.deadlineMs = r.deadlineMs / 2;
      d.mutations.capMaxTokens = 77;
      d.mutations.stripIdSlot = true;
      return d;
    }
    if (path == "/bucket") {
      const wait = bucketTake(r.identity(), 100, 10, <f64>r.promptTokensEstimate);
      if (wait > 0) return Decision.tooManyRequests("dry", isFinite(wait) ? <i64>Math.ceil(wait) : -1);
      const d = Decision.allow();
      d.cost = r.promptTokensEstimate;
      return d;
    }
    if (path == "/refund") {
      const d = Decision.allow();
      d.cost = <u64>bucketRefund(r.identity(), 100, 10, <f64>r.promptTokensEstimate);
      return d;
    }
    if (path == "/window") {
      const d = Decision.allow();
      d.cost = <u64>windowAdd("w", 1000, 1);
      d.priority = nowMs();
      return d;
    }
    if (path == "/log") {
      log(Level.Warn, "é".repeat(3000));
      log(Level.Info, "short");
      return Decision.allow();
    }
    if (path == "/abort") {
      assert(r.promptChars == 12345, "boom");
      return Decision.allow();
    }
    if (path == "/long-key") {
      bucketTake("k".repeat(5000), 1, 1, 1);
      return Decision.allow();
    }
    if (path == "/unicode") {
      const d = Decision.forbidden("model " + (r.model !== null ? r.model! : ""));
      return d;
    }
    if (path == "/random") {
      const d = Decision.allow();
      const x = Math.random();
      d.cost = x >= 0 && x < 1 ? 1 : 0;
      return d;
    }
    if (path == "/trace") {
      trace("tracing", 2, 1.5, 2);
      return Decision.allow();
    }
    if (path == "/bad-status") {
      return Decision.deny(500, "not allowed");
    }
    if (r.promptChars > s.maxChars) return Decision.forbidden("too long");
    return Decision.allow();
  }

  onComplete(c: Completion, s: Settings): void {
    windowAdd("done", 60000, 1);
    log(
      Level.Info,
      "complete " +
        c.outcome +
        " status=" +
        c.status.toString() +
        " tokens=" +
        c.promptTokens.toString() +
        "+" +
        c.completionTokens.toString() +
        " waited=" +
        c.queueWaitMs.toString() +
        " upstream=" +
        c.upstreamMs.toString() +
        " mine=" +
        (c.decision.isAllowed ? "allow" : "deny") +
        (c.decision.hasCost ? "/" + c.decision.cost.toString() : "") +
        " chain=" +
        (c.chainDecision.isAllowed ? "allow" : "deny") +
        " label=" +
        s.label,
    );
  }
}

const POLICY = new Probe();

export function slotgate_evaluate(ptr: i32, len: i32): i64 {
  return evaluate(POLICY, ptr, len);
}

export function slotgate_validate_settings(ptr: i32, len: i32): i64 {
  return validateSettings(POLICY, ptr, len);
}

export function slotgate_on_complete(ptr: i32, len: i32): i64 {
  return onComplete(POLICY, ptr, len);
}
