/**
 * "Run this notebook on a GPU…" keeps the variables: the notebook's current
 * kernel saves them (the code of POST `carry`), its kernel changes, and the
 * GPU kernel restores them (POST `sessions/<id>/carry`). The words of what
 * moved and what did not, for the notice.
 */
import type { CarryReply, CarrySaved } from './types';

/** The line each side prints its answer on (session/carry.py CARRY_MARK). */
export const CARRY_MARK = 'GPUSESSION_CARRY';

/** The saved answer in what the notebook's kernel printed, or null. */
export function savedFrom(text: string): CarrySaved | null {
  for (const line of text.split('\n')) {
    if (line.startsWith(`${CARRY_MARK} `)) {
      try {
        return JSON.parse(line.slice(CARRY_MARK.length + 1)) as CarrySaved;
      } catch {
        return null;
      }
    }
  }
  return null;
}

function names(list: readonly string[], most = 6): string {
  const shown = list.slice(0, most).join(', ');
  return list.length > most ? `${shown} and ${list.length - most} more` : shown;
}

/**
 * One sentence for the notice: "Variables moved into t4-2: answer, table
 * (imports: np); not moved: gen (generator)."
 */
export function carryLine(session: string, reply: CarryReply): string {
  const left = [
    ...reply.skipped.map(s => `${s.name} (${s.why})`),
    ...reply.failed.map(f => `${f.name} (${f.why ?? f.error ?? 'failed'})`)
  ];
  const imports = reply.imports.length ? ` (imports: ${names(reply.imports)})` : '';
  const moved = reply.restored.length
    ? `Variables moved into ${session}: ${names(reply.restored)}${imports}`
    : `No variable moved into ${session}${imports}`;
  return left.length ? `${moved}; not moved: ${names(left)}.` : `${moved}.`;
}

/** Why nothing could be saved in the notebook's kernel, for the notice. */
export function notSavedLine(saved: CarrySaved | null): string | null {
  if (saved === null) {
    return 'Variables not moved: the notebook’s kernel did not save them (is gpusession installed in its Python?).';
  }
  if (saved.error) {
    return `Variables not moved: the notebook’s kernel could not save them (${saved.error}).`;
  }
  return null;
}
