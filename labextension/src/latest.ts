/**
 * Numbers the loads of one view so that only the latest one's reply is
 * shown: a slow reply to an older request (a refresh clicked twice, a
 * listing asked before a resume) must not overwrite a newer one.
 */
export class Latest {
  /** A ticket for a load about to ask the server. */
  next(): number {
    return ++this._count;
  }

  /** True while no later load has started since `ticket` was taken. */
  isLatest(ticket: number): boolean {
    return ticket === this._count;
  }

  /** How many loads have started (shown as a `data-loaded` mark for tests). */
  get count(): number {
    return this._count;
  }

  private _count = 0;
}

/**
 * A listing's sessions, less what it could not know: a session whose view an
 * action's reply replaced after the listing was asked (a switch's new session
 * under its final name, a stop's end) keeps that reply's view, and one the
 * listing does not have yet stays. Without this a listing asked a moment
 * before a switch answered put the new card back under its passing name.
 */
export function keepNewer<T extends { id: string }>(
  listed: readonly T[],
  shown: readonly T[],
  newer: (id: string) => boolean
): T[] {
  const kept = shown.filter(s => newer(s.id));
  if (kept.length === 0) {
    return [...listed];
  }
  const byId = new Map(kept.map(s => [s.id, s]));
  const listedIds = new Set(listed.map(s => s.id));
  return [
    ...kept.filter(s => !listedIds.has(s.id)),
    ...listed.map(s => byId.get(s.id) ?? s)
  ];
}
