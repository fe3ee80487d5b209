// Request guard, in AssemblyScript: refuses endpoints and models that are not allowed and prompts
// that are too large, caps (or refuses) `max_tokens`, and isolates tenants' prompt caches, all
// through the fixed mutations the host applies. A port of policies/request-guard (Rust), with the
// same settings and decisions.

import {
  Decision,
  EvaluateInput,
  JsonReader,
  Policy,
  evaluate,
  slotgate_abi_version,
  slotgate_alloc,
  validateSettings,
} from "@slotgate/sdk-as/assembly";

export { slotgate_abi_version, slotgate_alloc };

class Settings {
  /** The most tokens a request may generate (`hasMaxTokens`). */
  maxTokens: u64 = 0;
  hasMaxTokens: bool = false;
  /** What a larger `max_tokens` gets: lowered to the limit, or refused (403). */
  denyOverMaxTokens: bool = false;
  /** Largest prompt, in characters (`hasMaxPromptChars`). */
  maxPromptChars: u64 = 0;
  hasMaxPromptChars: bool = false;
  /**
   * Largest prompt, in tokens as llama-server counts them (`hasMaxPromptTokens`). Setting it makes
   * slotgate count every request's prompt before the chain decides (`needsPromptTokens`).
   */
  maxPromptTokens: u64 = 0;
  hasMaxPromptTokens: bool = false;
  /** Paths that are served (empty: all but `deniedPaths`). `/x*` matches every path under `/x`. */
  allowedPaths: string[] = [];
  /** Paths that are refused, checked first. */
  deniedPaths: string[] = [];
  /** Models that may be asked for by name (empty: any). A request naming none is let through. */
  allowedModels: string[] = [];
  /** Force `cache_prompt: false` and strip `id_slot`. */
  cacheIsolation: bool = false;
}

/** Exact match, or a prefix match for a pattern ending in `*`. */
function matches(pattern: string, value: string): bool {
  if (pattern.endsWith("*")) return value.startsWith(pattern.substring(0, pattern.length - 1));
  return pattern == value;
}

function anyMatches(patterns: string[], value: string): bool {
  for (let i = 0; i < patterns.length; i++) if (matches(patterns[i], value)) return true;
  return false;
}

class RequestGuard extends Policy<Settings> {
  readSettings(r: JsonReader): Settings {
    const s = new Settings();
    if (!r.object()) return s;
    while (r.next()) {
      if (r.is("max_tokens")) {
        if (!r.null()) {
          s.maxTokens = r.u64();
          s.hasMaxTokens = true;
        }
      } else if (r.is("over_max_tokens")) {
        const v = r.string();
        if (v == "deny") s.denyOverMaxTokens = true;
        else if (v != "cap") r.invalid("unknown variant `" + v + "`, expected `cap` or `deny`");
      } else if (r.is("max_prompt_chars")) {
        if (!r.null()) {
          s.maxPromptChars = r.u64();
          s.hasMaxPromptChars = true;
        }
      } else if (r.is("max_prompt_tokens")) {
        if (!r.null()) {
          s.maxPromptTokens = r.u64();
          s.hasMaxPromptTokens = true;
        }
      } else if (r.is("allowed_paths")) s.allowedPaths = r.strings();
      else if (r.is("denied_paths")) s.deniedPaths = r.strings();
      else if (r.is("allowed_models")) s.allowedModels = r.strings();
      else if (r.is("cache_isolation")) s.cacheIsolation = r.bool();
      else r.unknown();
    }
    return s;
  }

  validate(s: Settings): string | null {
    const paths = s.allowedPaths.concat(s.deniedPaths);
    for (let i = 0; i < paths.length; i++) {
      if (!paths[i].startsWith("/")) return "path pattern `" + paths[i] + "` must start with `/`";
    }
    for (let i = 0; i < s.allowedModels.length; i++) {
      if (s.allowedModels[i].length == 0) return "model pattern `` is empty";
    }
    if (s.hasMaxTokens && s.maxTokens == 0) return "max_tokens must be positive";
    return null;
  }

  /** A prompt limit in tokens is only as good as the count: with one set, ask for the exact one. */
  needsPromptTokens(s: Settings): bool {
    return s.hasMaxPromptTokens;
  }

  evaluate(input: EvaluateInput, s: Settings): Decision {
    const r = input.request;
    const query = r.path.indexOf("?");
    const path = query < 0 ? r.path : r.path.substring(0, query);
    if (anyMatches(s.deniedPaths, path) || !(s.allowedPaths.length == 0 || anyMatches(s.allowedPaths, path))) {
      return Decision.forbidden(path + " is not served here");
    }
    const model = r.model;
    if (model !== null) {
      if (!(s.allowedModels.length == 0 || anyMatches(s.allowedModels, model))) {
        return Decision.forbidden("model `" + model + "` is not served here");
      }
    }
    if (s.hasMaxPromptChars && r.promptChars > s.maxPromptChars) {
      return Decision.forbidden(
        "the prompt has " + r.promptChars.toString() + " characters; the limit is " + s.maxPromptChars.toString(),
      );
    }
    const tokens = r.promptTokensBest();
    if (s.hasMaxPromptTokens && tokens > s.maxPromptTokens) {
      const about = r.hasPromptTokens ? "" : "about ";
      return Decision.forbidden(
        "the prompt has " + about + tokens.toString() + " tokens; the limit is " + s.maxPromptTokens.toString(),
      );
    }
    if (s.hasMaxTokens && r.hasMaxTokens && s.denyOverMaxTokens && r.maxTokens > s.maxTokens) {
      return Decision.forbidden(
        "max_tokens " + r.maxTokens.toString() + " is over the limit of " + s.maxTokens.toString(),
      );
    }
    const d = Decision.allow();
    // Sent even when the request is within the limit or names none, so the host also bounds a
    // request that leaves max_tokens out.
    if (s.hasMaxTokens) d.mutations.capMaxTokens = s.maxTokens;
    d.mutations.disablePromptCache = s.cacheIsolation;
    d.mutations.stripIdSlot = s.cacheIsolation;
    return d;
  }
}

const POLICY = new RequestGuard();

export function slotgate_evaluate(ptr: i32, len: i32): i64 {
  return evaluate(POLICY, ptr, len);
}

export function slotgate_validate_settings(ptr: i32, len: i32): i64 {
  return validateSettings(POLICY, ptr, len);
}
