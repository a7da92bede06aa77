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
