// What AssemblyScript's standard library would import from `env` (abort, trace, seed), served here
// instead: slotgate refuses any import outside the `slotgate` module. The SDK's asconfig.json points
// the compiler at these with `--use abort=...`, `--use trace=...`, `--use seed=...`.

import { Level, log, nowMs } from "./host";

/**
 * A failed assertion, an out-of-bounds access the standard library checks, or an explicit
 * `abort()`: logged as an error through the host, then a trap, which the host counts as a policy
 * error (`kind` `trap`) and answers by the policy's `on-error`.
 */
export function slotgateAbort(
  message: string | null = null,
  fileName: string | null = null,
  line: u32 = 0,
  column: u32 = 0,
): void {
  let text = "abort: " + (message !== null ? message : "(no message)");
  if (fileName !== null) text += " at " + fileName + ":" + line.toString() + ":" + column.toString();
  log(Level.Error, text);
  unreachable();
}

/** `trace()`: a debug log line. */
export function slotgateTrace(
  message: string,
  n: i32 = 0,
  a0: f64 = 0,
  a1: f64 = 0,
  a2: f64 = 0,
  a3: f64 = 0,
  a4: f64 = 0,
): void {
  let text = "trace: " + message;
  const args: f64[] = [a0, a1, a2, a3, a4];
  for (let i = 0; i < n && i < 5; i++) text += (i == 0 ? " " : ", ") + args[i].toString();
  log(Level.Debug, text);
}

/**
 * `Math.random`'s seed: the host's monotonic clock. Not a secret and not unpredictable; a policy
 * has no business with randomness that matters.
 */
export function slotgateSeed(): f64 {
  return <f64>nowMs();
}
