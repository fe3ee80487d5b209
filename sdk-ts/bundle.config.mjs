// Rolldown options that `jco componentize --bundle-config` merges in.
//
// The world's own interfaces are the component's imports, not modules to bundle (jco marks only
// `wasi:` external by itself, and would warn once per import).
//
// Node's built-in modules stay unbundled too, so importing one fails the build ("Error loading
// module") instead of jco's default: standing in for it with a `jco:node/...` import, which it adds
// by rewriting the world in the WIT file it was given, and which slotgate refuses at load anyway.
import { builtinModules } from 'node:module';

export default { external: [/^slotgate:policy\//, /^node:/, ...builtinModules] };
