/**
 * A Node module-resolution hook (registered by `register.ts`): the WIT imports a policy makes,
 * `slotgate:policy/<interface>@2.x.y`, resolve to the fake host's modules in `wit/`. In a component
 * the same specifiers are the component's imports, so the policy's source is the same in both.
 */

const WIT_IMPORT = /^slotgate:policy\/(log|clocks|state|types)@2\.\d+\.\d+$/;

interface ResolveContext {
  conditions: string[];
  importAttributes: Record<string, string>;
  parentURL?: string;
}

interface ResolveResult {
  url: string;
  format?: string | null;
  shortCircuit?: boolean;
}

export async function resolve(
  specifier: string,
  context: ResolveContext,
  next: (specifier: string, context: ResolveContext) => Promise<ResolveResult>,
): Promise<ResolveResult> {
  const wit = WIT_IMPORT.exec(specifier);
  if (wit !== null) {
    return { url: new URL(`./wit/${wit[1]}.js`, import.meta.url).href, format: 'module', shortCircuit: true };
  }
  return next(specifier, context);
}
