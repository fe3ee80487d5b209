// JSON in linear memory: a pull reader over the UTF-8 bytes the host wrote, and a writer that
// builds UTF-8 output in place. AssemblyScript has no exceptions (a `throw` aborts the instance), so
// the reader records its first error and from then on returns defaults: check `error` at the end.

/** A JSON value's kind, as `JsonReader.peek()` sees its first byte. */
export enum JsonKind {
  Null,
  Bool,
  Number,
  String,
  Array,
  Object,
  /** Not the start of a JSON value, or the end of the input. */
  Invalid,
}

const U64_MAX_DIV_10: u64 = 1844674407370955161;

/** Strings up to this many bytes are read in one pass (`JsonReader.string`). */
const SHORT_STRING: usize = 256;

/**
 * Reads one JSON document from `ptr..ptr + len`, value by value, without building a tree.
 *
 * ```ts
 * if (!r.object()) return;            // `{`; an error unless the value is an object
 * while (r.next()) {                  // each key in turn, then `}`
 *   if (r.is("capacity")) s.capacity = r.u64();
 *   else r.unknown();                 // or r.skip() to ignore it
 * }
 * ```
 *
 * Every read consumes one value. After the first error every read returns a default and `next()`
 * returns false; `error` holds the message.
 */
export class JsonReader {
  private pos: usize;
  private end: usize;
  private keyStart: usize = 0;
  private keyEnd: usize = 0;
  /** The first error, or null. */
  error: string | null = null;
  // Whether `error` is set: a reference compare on strings calls `String.__eq` in AssemblyScript,
  // and the reader asks at every key.
  private failed: bool = false;

  constructor(ptr: usize, len: usize) {
    this.pos = ptr;
    this.end = ptr + len;
  }

  /** A reader over `text`'s UTF-8 bytes. */
  static of(text: string): JsonReader {
    const buf = String.UTF8.encode(text);
    return new JsonReader(changetype<usize>(buf), <usize>buf.byteLength);
  }

  get ok(): bool {
    return !this.failed;
  }

  /** Records `message` unless an error is already recorded; always returns false. */
  fail(message: string): bool {
    if (!this.failed) this.error = message;
    this.failed = true;
    this.pos = this.end;
    return false;
  }

  /** Fails naming the current key: "`key`: message". */
  invalid(message: string): bool {
    return this.fail(this.keyEnd > this.keyStart ? "`" + this.key() + "`: " + message : message);
  }

  /** Fails unless only whitespace is left. */
  finish(): bool {
    this.ws();
    if (this.pos < this.end) return this.fail("trailing characters after the JSON value");
    return this.ok;
  }

  /** The kind of the next value, consuming nothing. */
  peek(): JsonKind {
    this.ws();
    if (this.pos >= this.end) return JsonKind.Invalid;
    const c = load<u8>(this.pos);
    if (c == 0x7b) return JsonKind.Object;
    if (c == 0x5b) return JsonKind.Array;
    if (c == 0x22) return JsonKind.String;
    if (c == 0x74 || c == 0x66) return JsonKind.Bool;
    if (c == 0x6e) return JsonKind.Null;
    if (c == 0x2d || (c >= 0x30 && c <= 0x39)) return JsonKind.Number;
    return JsonKind.Invalid;
  }

  /** Consumes a `null` if there is one: true then. */
  null(): bool {
    if (this.peek() != JsonKind.Null) return false;
    return this.literal("null");
  }

  // --- objects and arrays ---

  /** Enters an object (`{`); then call `next()` for each key. Fails unless the value is one. */
  object(): bool {
    if (this.peek() != JsonKind.Object) return this.invalid("expected an object");
    this.pos++;
    this.first = true;
    return true;
  }

  private first: bool = false;

  /**
   * Moves to the next key of the object entered last, and returns true; at its `}`, consumes it and
   * returns false. Read (or `skip()`) the key's value before calling it again.
   */
  next(): bool {
    if (!this.ok) return false;
    this.ws();
    if (this.pos >= this.end) return this.fail("unexpected end of the input in an object");
    let c = load<u8>(this.pos);
    if (c == 0x7d) {
      this.pos++;
      this.first = false;
      this.keyStart = this.keyEnd = 0;
      return false;
    }
    if (!this.first) {
      if (c != 0x2c) return this.fail("expected `,` or `}` in an object");
      this.pos++;
      this.ws();
      if (this.pos >= this.end) return this.fail("unexpected end of the input in an object");
      c = load<u8>(this.pos);
    }
    this.first = false;
    if (c != 0x22) return this.fail("expected a key in an object");
    const start = this.pos + 1;
    if (!this.skipString()) return false;
    this.keyStart = start;
    this.keyEnd = this.pos - 1;
    this.ws();
    if (this.pos >= this.end || load<u8>(this.pos) != 0x3a) return this.fail("expected `:` after a key");
    this.pos++;
    return true;
  }

  /** Whether the current key is `name` (ASCII, compared byte by byte: no string is allocated). */
  is(name: string): bool {
    const n = <usize>name.length;
    const key = this.keyStart;
    if (this.keyEnd - key != n) return false;
    const chars = changetype<usize>(name);
    for (let i: usize = 0; i < n; i++) {
      if (<u32>load<u8>(key + i) != <u32>load<u16>(chars + (i << 1))) return false;
    }
    return true;
  }

  /** The current key. */
  key(): string {
    return decode(this.keyStart, this.keyEnd);
  }

  /** Fails with "unknown field `key`" (for settings that refuse keys they do not know). */
  unknown(): bool {
    const key = this.key();
    this.keyStart = this.keyEnd = 0;
    return this.fail("unknown field `" + key + "`");
  }

  /** Enters an array (`[`); then call `more()` before each element. Fails unless the value is one. */
  array(): bool {
    if (this.peek() != JsonKind.Array) return this.invalid("expected an array");
    this.pos++;
    this.first = true;
    return true;
  }

  /** True when another element of the array entered last follows; at its `]`, consumes it. */
  more(): bool {
    if (!this.ok) return false;
    this.ws();
    if (this.pos >= this.end) return this.fail("unexpected end of the input in an array");
    const c = load<u8>(this.pos);
    if (c == 0x5d) {
      this.pos++;
      this.first = false;
      return false;
    }
    if (!this.first) {
      if (c != 0x2c) return this.fail("expected `,` or `]` in an array");
      this.pos++;
    }
    this.first = false;
    return true;
  }

  // --- scalars ---

  /** A string. */
  string(): string {
    if (this.peek() != JsonKind.String) {
      this.invalid("expected a string");
      return "";
    }
    const start = this.pos + 1;
    // One pass for the usual case, a short plain-ASCII string without escapes: widen each byte
    // into the string until the closing quote. Anything else goes on with the general path.
    const short = min(this.end, start + SHORT_STRING);
    const out = changetype<usize>(__new((short - start) << 1, idof<string>()));
    let p = start;
    while (p < short) {
      const c = load<u8>(p);
      if (c == 0x22) {
        this.pos = p + 1;
        return changetype<string>(__renew(out, (p - start) << 1));
      }
      if (c == 0x5c || c >= 0x80) break;
      store<u16>(out + ((p - start) << 1), c);
      p++;
    }
    let escaped = false;
    while (p < this.end) {
      const c = load<u8>(p);
      if (c == 0x22) break;
      if (c == 0x5c) {
        escaped = true;
        p += 2;
      } else {
        p++;
      }
    }
    if (p >= this.end) {
      this.fail("unterminated string");
      return "";
    }
    this.pos = p + 1;
    return escaped ? unescape(start, p) : decode(start, p);
  }

  /** A string, or null for a JSON `null`. */
  stringOrNull(): string | null {
    if (this.null()) return null;
    return this.string();
  }

  /** `true` or `false`. */
  bool(): bool {
    if (this.peek() == JsonKind.Bool) {
      if (load<u8>(this.pos) == 0x74) return this.literal("true");
      this.literal("false");
      return false;
    }
    this.invalid("expected a boolean");
    return false;
  }

  /** A non-negative integer (no fraction, no exponent) up to 2^64 - 1, as serde reads a `u64`. */
  u64(): u64 {
    if (this.peek() != JsonKind.Number) {
      this.invalid("expected a non-negative integer");
      return 0;
    }
    let p = this.pos;
    if (load<u8>(p) == 0x2d) {
      this.numberEnd();
      this.invalid("expected a non-negative integer");
      return 0;
    }
    let n: u64 = 0;
    while (p < this.end) {
      const c = load<u8>(p);
      if (c < 0x30 || c > 0x39) break;
      const d = <u64>(c - 0x30);
      if (n > U64_MAX_DIV_10 || (n == U64_MAX_DIV_10 && d > 5)) {
        this.numberEnd();
        this.invalid("integer out of range");
        return 0;
      }
      n = n * 10 + d;
      p++;
    }
    const end = this.numberEnd();
    if (end != p) {
      this.invalid("expected a non-negative integer");
      return 0;
    }
    return n;
  }

  /** An integer (no fraction, no exponent) within the range of `i64`. */
  i64(): i64 {
    if (this.peek() == JsonKind.Number && load<u8>(this.pos) == 0x2d) {
      this.pos++;
      const n = this.u64();
      if (n > <u64>i64.MAX_VALUE + 1) {
        this.invalid("integer out of range");
        return 0;
      }
      return -(<i64>n);
    }
    const n = this.u64();
    if (n > <u64>i64.MAX_VALUE) {
      this.invalid("integer out of range");
      return 0;
    }
    return <i64>n;
  }

  /** Any number. */
  f64(): f64 {
    if (this.peek() != JsonKind.Number) {
      this.invalid("expected a number");
      return 0;
    }
    const start = this.pos;
    const end = this.numberEnd();
    if (end == start || (end == start + 1 && load<u8>(start) == 0x2d)) {
      this.invalid("expected a number");
      return 0;
    }
    return parseFloat(decode(start, end));
  }

  // --- anything else ---

  /** Consumes the next value, whatever it is (nested ones included). */
  skip(): bool {
    const kind = this.peek();
    if (kind == JsonKind.Object) {
      this.object();
      while (this.next()) this.skip();
    } else if (kind == JsonKind.Array) {
      this.array();
      while (this.more()) this.skip();
    } else if (kind == JsonKind.String) {
      this.skipString();
    } else if (kind == JsonKind.Number) {
      if (this.numberEnd() == 0) return false;
    } else if (kind == JsonKind.Bool) {
      this.bool();
    } else if (kind == JsonKind.Null) {
      this.null();
    } else {
      return this.fail(this.pos >= this.end ? "unexpected end of the input" : "expected a JSON value");
    }
    return this.ok;
  }

  /**
   * Skips the next value and returns where it lies, as `(start << 32) | end` (addresses in memory):
   * read it later with `JsonReader.span()`.
   */
  capture(): u64 {
    this.ws();
    const start = this.pos;
    this.skip();
    return (<u64>start << 32) | <u64>this.pos;
  }

  /** A reader over a value `capture()` returned. */
  static span(captured: u64): JsonReader {
    const start = <usize>(captured >> 32);
    const end = <usize>(captured & 0xffffffff);
    return new JsonReader(start, end - start);
  }

  /** An array of strings. */
  strings(): string[] {
    const out = new Array<string>();
    if (!this.array()) return out;
    while (this.more()) out.push(this.string());
    return out;
  }

  /** An object whose values are strings. */
  stringMap(): Map<string, string> {
    const out = new Map<string, string>();
    if (!this.object()) return out;
    while (this.next()) {
      const k = this.key();
      out.set(k, this.string());
    }
    return out;
  }

  // --- internals ---

  private ws(): void {
    let p = this.pos;
    while (p < this.end) {
      const c = load<u8>(p);
      if (c != 0x20 && c != 0x0a && c != 0x0d && c != 0x09) break;
      p++;
    }
    this.pos = p;
  }

  private literal(word: string): bool {
    const n = <usize>word.length;
    if (this.pos + n > this.end) return this.fail("unexpected end of the input");
    for (let i: usize = 0; i < n; i++) {
      if (<u32>load<u8>(this.pos + i) != <u32>word.charCodeAt(<i32>i)) return this.fail("expected `" + word + "`");
    }
    this.pos += n;
    return true;
  }

  /** Consumes a string (at its opening quote) without decoding it. */
  private skipString(): bool {
    let p = this.pos + 1;
    while (p < this.end) {
      const c = load<u8>(p);
      if (c == 0x22) {
        this.pos = p + 1;
        return true;
      }
      p += c == 0x5c ? 2 : 1;
    }
    return this.fail("unterminated string");
  }

  /** Consumes a number token and returns its end; 0 after failing on a malformed one. */
  private numberEnd(): usize {
    let p = this.pos;
    if (p < this.end && load<u8>(p) == 0x2d) p++;
    const digits = p;
    while (p < this.end && isDigit(load<u8>(p))) p++;
    if (p == digits) {
      this.fail("malformed number");
      return 0;
    }
    if (p < this.end && load<u8>(p) == 0x2e) {
      p++;
      const frac = p;
      while (p < this.end && isDigit(load<u8>(p))) p++;
      if (p == frac) {
        this.fail("malformed number");
        return 0;
      }
    }
    if (p < this.end && (load<u8>(p) | 0x20) == 0x65) {
      p++;
      if (p < this.end && (load<u8>(p) == 0x2b || load<u8>(p) == 0x2d)) p++;
      const exp = p;
      while (p < this.end && isDigit(load<u8>(p))) p++;
      if (p == exp) {
        this.fail("malformed number");
        return 0;
      }
    }
    this.pos = p;
    return p;
  }
}

// @ts-ignore: decorator
@inline function isDigit(c: u8): bool {
  return c >= 0x30 && c <= 0x39;
}

/**
 * The UTF-8 bytes `start..end` as a string. ASCII, nearly every key and value slotgate sends, is
 * widened byte by byte: a fraction of the instructions of the general decoder, which takes over at
 * the first byte that is not.
 */
function decode(start: usize, end: usize): string {
  const n = end - start;
  const out = changetype<string>(__new(n << 1, idof<string>()));
  const dst = changetype<usize>(out);
  for (let i: usize = 0; i < n; i++) {
    const c = load<u8>(start + i);
    if (c >= 0x80) return String.UTF8.decodeUnsafe(start, n);
    store<u16>(dst + (i << 1), c);
  }
  return out;
}

function hexDigit(c: u32): i32 {
  if (c >= 0x30 && c <= 0x39) return <i32>(c - 0x30);
  c |= 0x20;
  if (c >= 0x61 && c <= 0x66) return <i32>(c - 0x61 + 10);
  return -1;
}

function hex4(p: usize): i32 {
  let v = 0;
  for (let i: usize = 0; i < 4; i++) {
    const d = hexDigit(load<u8>(p + i));
    if (d < 0) return -1;
    v = (v << 4) | d;
  }
  return v;
}

/** Decodes a string body with escapes (`\n`, `\uXXXX`, surrogate pairs) into UTF-8, then to a string. */
function unescape(start: usize, end: usize): string {
  const out = new ByteBuf(<i32>(end - start));
  let p = start;
  while (p < end) {
    const c = load<u8>(p);
    if (c != 0x5c) {
      out.byte(c);
      p++;
      continue;
    }
    const e = p + 1 < end ? load<u8>(p + 1) : 0;
    p += 2;
    if (e == 0x6e) out.byte(0x0a);
    else if (e == 0x74) out.byte(0x09);
    else if (e == 0x72) out.byte(0x0d);
    else if (e == 0x62) out.byte(0x08);
    else if (e == 0x66) out.byte(0x0c);
    else if (e == 0x75) {
      let cp = p + 4 <= end ? hex4(p) : -1;
      if (cp < 0) {
        out.codePoint(0xfffd);
        continue;
      }
      p += 4;
      if (cp >= 0xd800 && cp < 0xdc00 && p + 6 <= end && load<u8>(p) == 0x5c && load<u8>(p + 1) == 0x75) {
        const lo = hex4(p + 2);
        if (lo >= 0xdc00 && lo < 0xe000) {
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          p += 6;
        }
      }
      // A lone surrogate cannot be UTF-8.
      out.codePoint(cp >= 0xd800 && cp < 0xe000 ? 0xfffd : cp);
    } else out.byte(e);
  }
  return String.UTF8.decodeUnsafe(out.ptr, <usize>out.len);
}

/**
 * A growable UTF-8 buffer in linear memory. Never freed: every instance lives for one call (see
 * the runtime note in `export.ts`).
 */
export class ByteBuf {
  ptr: usize;
  len: i32 = 0;
  private cap: i32;

  constructor(capacity: i32 = 256) {
    this.cap = max(capacity, 16);
    this.ptr = heap.alloc(<usize>this.cap);
  }

  private reserve(n: i32): void {
    const need = this.len + n;
    if (need <= this.cap) return;
    let cap = this.cap << 1;
    while (cap < need) cap <<= 1;
    // The newest block grows in place with the stub runtime.
    this.ptr = heap.realloc(this.ptr, <usize>cap);
    this.cap = cap;
  }

  byte(b: u32): void {
    this.reserve(1);
    store<u8>(this.ptr + <usize>this.len, <u8>b);
    this.len++;
  }

  /** ASCII text, as is (for keys and literals the SDK writes). */
  ascii(s: string): void {
    const n = s.length;
    this.reserve(n);
    for (let i = 0; i < n; i++) store<u8>(this.ptr + <usize>(this.len + i), <u8>s.charCodeAt(i));
    this.len += n;
  }

  codePoint(cp: i32): void {
    if (cp < 0x80) {
      this.byte(cp);
    } else if (cp < 0x800) {
      this.byte(0xc0 | (cp >> 6));
      this.byte(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      this.byte(0xe0 | (cp >> 12));
      this.byte(0x80 | ((cp >> 6) & 0x3f));
      this.byte(0x80 | (cp & 0x3f));
    } else {
      this.byte(0xf0 | (cp >> 18));
      this.byte(0x80 | ((cp >> 12) & 0x3f));
      this.byte(0x80 | ((cp >> 6) & 0x3f));
      this.byte(0x80 | (cp & 0x3f));
    }
  }

  /** `s` as a JSON string: quoted, escaped, UTF-8 (a lone surrogate becomes U+FFFD). */
  jsonString(s: string): void {
    const n = s.length;
    // Room for the worst case at once (`\u00XX` is 6 bytes for 1 unit; UTF-8 at most 3 per unit),
    // so the plain characters below are stored without a check each.
    this.reserve(n * 6 + 2);
    let p = this.ptr + <usize>this.len;
    store<u8>(p++, 0x22);
    const src = changetype<usize>(s);
    for (let i = 0; i < n; i++) {
      let c = <i32>load<u16>(src + (<usize>i << 1));
      if (c >= 0x20 && c < 0x80 && c != 0x22 && c != 0x5c) {
        store<u8>(p++, <u8>c);
        continue;
      }
      this.len = <i32>(p - this.ptr);
      if (c == 0x22 || c == 0x5c) {
        this.byte(0x5c);
        this.byte(c);
      } else if (c < 0x20) {
        this.ascii(c == 0x0a ? "\\n" : c == 0x09 ? "\\t" : c == 0x0d ? "\\r" : "\\u00");
        if (c != 0x0a && c != 0x09 && c != 0x0d) {
          this.byte(HEX.charCodeAt(c >> 4));
          this.byte(HEX.charCodeAt(c & 15));
        }
      } else {
        if (c >= 0xd800 && c < 0xdc00 && i + 1 < n) {
          const lo = <i32>load<u16>(src + (<usize>(i + 1) << 1));
          if (lo >= 0xdc00 && lo < 0xe000) {
            c = 0x10000 + ((c - 0xd800) << 10) + (lo - 0xdc00);
            i++;
          }
        }
        this.codePoint(c >= 0xd800 && c < 0xe000 ? 0xfffd : c);
      }
      p = this.ptr + <usize>this.len;
    }
    store<u8>(p++, 0x22);
    this.len = <i32>(p - this.ptr);
  }

  u64(n: u64): void {
    this.ascii(n.toString());
  }

  i64(n: i64): void {
    this.ascii(n.toString());
  }

  f64(x: f64): void {
    // JSON has no NaN or infinity; the host refuses such a decision as invalid output either way.
    this.ascii(isFinite(x) ? x.toString() : "null");
  }

  /** The packed ABI answer, `(ptr << 32) | len`. */
  packed(): i64 {
    return <i64>((<u64>this.ptr << 32) | <u64>this.len);
  }
}

const HEX = "0123456789abcdef";

/**
 * Writes a JSON object key by key, commas included:
 * `w.begin(); w.key("verdict"); w.str("allow"); w.end();`.
 */
export class JsonWriter {
  buf: ByteBuf;
  private comma: bool = false;

  constructor(capacity: i32 = 256) {
    this.buf = new ByteBuf(capacity);
  }

  begin(): void {
    this.buf.byte(0x7b);
    this.comma = false;
  }

  end(): void {
    this.buf.byte(0x7d);
    this.comma = true;
  }

  /** A key (ASCII, not escaped) and its colon; write its value next. */
  key(name: string): void {
    if (this.comma) this.buf.byte(0x2c);
    this.buf.byte(0x22);
    this.buf.ascii(name);
    this.buf.ascii("\":");
    this.comma = false;
  }

  /** A key that may need escaping (a header name, say). */
  keyString(name: string): void {
    if (this.comma) this.buf.byte(0x2c);
    this.buf.jsonString(name);
    this.buf.byte(0x3a);
    this.comma = false;
  }

  str(s: string): void {
    this.buf.jsonString(s);
    this.comma = true;
  }

  u64(n: u64): void {
    this.buf.u64(n);
    this.comma = true;
  }

  i64(n: i64): void {
    this.buf.i64(n);
    this.comma = true;
  }

  f64(x: f64): void {
    this.buf.f64(x);
    this.comma = true;
  }

  bool(b: bool): void {
    this.buf.ascii(b ? "true" : "false");
    this.comma = true;
  }

  packed(): i64 {
    return this.buf.packed();
  }
}
