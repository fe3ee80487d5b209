// slotgate's AssemblyScript policy SDK: the ABI v1 wire types (types.ts, mirroring
// sdk/src/types.rs), a JSON reader and writer over linear memory (json.ts), typed host functions
// (host.ts), the `Policy` class a policy extends (policy.ts) and the export helpers its entry file
// calls (export.ts). The contract is docs/policy-abi.md; the README shows a whole policy.

export * from "./types";
export * from "./json";
export * from "./host";
export * from "./identity";
export * from "./policy";
export * from "./export";
// Loaded with the SDK so that `--use abort=…` (asconfig.json) can name them.
export { slotgateAbort, slotgateTrace, slotgateSeed } from "./runtime";
