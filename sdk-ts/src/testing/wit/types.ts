/**
 * `slotgate:policy/types@2.0.0` under Node. The interface holds records only, which TypeScript
 * erases (`import type`); this empty module is there for a policy that imports it for its side of
 * nothing, so the import still resolves.
 */

export {};
