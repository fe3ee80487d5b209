// Who sent a request: its API key's hash, else its Unix-socket uid, else nobody we can name
// (`RequestSummary.identity()`), and the shape of a hashed key for validating settings.

/**
 * Whether `s` has the shape of a hashed API key, `sha256:` and 64 lower-case hex digits. Settings
 * that list raw keys never match (the host hashes every key), so validate them with this.
 */
export function isHashedKey(s: string): bool {
  if (s.length != 71 || !s.startsWith("sha256:")) return false;
  for (let i = 7; i < 71; i++) {
    const c = s.charCodeAt(i);
    if (!((c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66))) return false;
  }
  return true;
}

/**
 * Whether `s` is `uid:<n>` with `n` a 32-bit unsigned number (as Rust's `u32::from_str` reads it: an
 * optional `+`, then digits), the way `identity()` names a Unix-socket peer.
 */
export function isUidKey(s: string): bool {
  if (!s.startsWith("uid:")) return false;
  let i = 4;
  if (i < s.length && s.charCodeAt(i) == 0x2b) i++;
  if (i == s.length) return false;
  let n: u64 = 0;
  for (; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x30 || c > 0x39) return false;
    n = n * 10 + <u64>(c - 0x30);
    if (n > <u64>u32.MAX_VALUE) return false;
  }
  return true;
}
