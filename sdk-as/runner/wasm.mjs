// Just enough of the WebAssembly binary format for the runner: the types of a module's imports and
// exports (JavaScript host functions accept any signature, so the runner checks them here, as
// slotgate's linker does), and a copy of the module with every global exported (so the runner can
// snapshot an instance the way slotgate pre-initialises one, see index.mjs).

const SECTION = { type: 1, import: 2, function: 3, global: 6, export: 7 };
const VALTYPE = { 0x7f: "i32", 0x7e: "i64", 0x7d: "f32", 0x7c: "f64", 0x7b: "v128", 0x70: "funcref", 0x6f: "externref" };

class Reader {
  constructor(bytes, pos = 0, end = bytes.length) {
    this.bytes = bytes;
    this.pos = pos;
    this.end = end;
  }

  byte() {
    if (this.pos >= this.end) throw new Error("unexpected end of the module");
    return this.bytes[this.pos++];
  }

  u32() {
    let result = 0;
    let shift = 0;
    for (;;) {
      const b = this.byte();
      result |= (b & 0x7f) << shift;
      if ((b & 0x80) === 0) return result >>> 0;
      shift += 7;
      if (shift > 35) throw new Error("malformed LEB128");
    }
  }

  name() {
    const n = this.u32();
    const s = new TextDecoder().decode(this.bytes.subarray(this.pos, this.pos + n));
    this.pos += n;
    return s;
  }

  valtype() {
    const b = this.byte();
    const t = VALTYPE[b];
    if (!t) throw new Error(`unknown value type 0x${b.toString(16)}`);
    return t;
  }

  limits() {
    const flags = this.byte();
    this.u32();
    if (flags & 1) this.u32();
  }
}

/** The sections of `bytes`: `[{id, start, end}]`, `start..end` being each one's contents. */
function sections(bytes) {
  if (bytes.length < 8 || bytes[0] !== 0 || bytes[1] !== 0x61 || bytes[2] !== 0x73 || bytes[3] !== 0x6d) {
    throw new Error("not a WebAssembly binary module");
  }
  const r = new Reader(bytes, 8);
  const out = [];
  while (r.pos < bytes.length) {
    const id = r.byte();
    const size = r.u32();
    out.push({ id, start: r.pos, end: r.pos + size });
    r.pos += size;
  }
  return out;
}

/** `"(i32, i32) -> (i64)"`, as slotgate's error messages spell a function type. */
export function signature(type) {
  return `(${type.params.join(", ")}) -> (${type.results.join(", ")})`;
}

/**
 * What the runner needs to know of a module: its imports (functions with their types) and its
 * exports (functions with their types; other kinds by kind), and how many globals it defines.
 */
export function describe(bytes) {
  const types = [];
  const funcTypes = []; // type of every function index, imports first
  const imports = [];
  const exports = [];
  let importedGlobals = 0;
  let definedGlobals = 0;
  for (const s of sections(bytes)) {
    const r = new Reader(bytes, s.start, s.end);
    if (s.id === SECTION.type) {
      for (let n = r.u32(); n > 0; n--) {
        if (r.byte() !== 0x60) throw new Error("unsupported type form");
        const params = [];
        for (let k = r.u32(); k > 0; k--) params.push(r.valtype());
        const results = [];
        for (let k = r.u32(); k > 0; k--) results.push(r.valtype());
        types.push({ params, results });
      }
    } else if (s.id === SECTION.import) {
      for (let n = r.u32(); n > 0; n--) {
        const module = r.name();
        const name = r.name();
        const kind = r.byte();
        if (kind === 0) {
          const type = types[r.u32()];
          funcTypes.push(type);
          imports.push({ module, name, kind: "function", type });
        } else if (kind === 1) {
          r.valtype();
          r.limits();
          imports.push({ module, name, kind: "table" });
        } else if (kind === 2) {
          r.limits();
          imports.push({ module, name, kind: "memory" });
        } else if (kind === 3) {
          r.valtype();
          r.byte();
          importedGlobals++;
          imports.push({ module, name, kind: "global" });
        } else {
          imports.push({ module, name, kind: `kind ${kind}` });
          break; // an import kind this reader does not know: the runner refuses the module anyway
        }
      }
    } else if (s.id === SECTION.function) {
      for (let n = r.u32(); n > 0; n--) funcTypes.push(types[r.u32()]);
    } else if (s.id === SECTION.global) {
      definedGlobals = r.u32();
    } else if (s.id === SECTION.export) {
      for (let n = r.u32(); n > 0; n--) {
        const name = r.name();
        const kind = r.byte();
        const index = r.u32();
        const kinds = ["function", "table", "memory", "global"];
        exports.push({ name, kind: kinds[kind] ?? `kind ${kind}`, type: kind === 0 ? funcTypes[index] : undefined });
      }
    }
  }
  return { imports, exports, importedGlobals, definedGlobals };
}

function leb(n) {
  const out = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n !== 0) b |= 0x80;
    out.push(b);
  } while (n !== 0);
  return out;
}

/** The prefix of the names `exportGlobals` gives the globals. */
export const GLOBAL_EXPORT = "__slotgate_runner_global_";

/**
 * `bytes` with every global the module defines exported as `__slotgate_runner_global_<n>` (n
 * counting the module's own globals from 0), so the runner can read and restore them.
 */
export function exportGlobals(bytes) {
  const { importedGlobals, definedGlobals } = describe(bytes);
  const extra = [];
  for (let i = 0; i < definedGlobals; i++) {
    const name = new TextEncoder().encode(GLOBAL_EXPORT + i);
    extra.push(...leb(name.length), ...name, 3, ...leb(importedGlobals + i));
  }
  const parts = [bytes.subarray(0, 8)];
  let done = false;
  for (const s of sections(bytes)) {
    const header = [s.id];
    if (s.id === SECTION.export) {
      const r = new Reader(bytes, s.start, s.end);
      const count = r.u32();
      const body = [...leb(count + definedGlobals), ...bytes.subarray(r.pos, s.end), ...extra];
      parts.push(Uint8Array.from([...header, ...leb(body.length), ...body]));
      done = true;
      continue;
    }
    const lenBytes = leb(s.end - s.start);
    parts.push(Uint8Array.from([...header, ...lenBytes]), bytes.subarray(s.start, s.end));
  }
  // A policy always exports its memory and functions.
  if (!done) throw new Error("the module has no export section");
  const total = parts.reduce((n, p) => n + p.length, 0);
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
