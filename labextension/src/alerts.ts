/**
 * Later notices about sessions as JupyterLab notifications (issue 32 §5),
 * never under an old cell of a notebook: the month's budget past 80% and
 * 100% while a session runs (once per session and level; the server puts the
 * warning's words in the view's `budget_alert`), and a session this sidebar
 * saw running that ended by itself or was stopped or switched elsewhere (its
 * idle watchdog, a notebook, the CLI), once, in its history line (`ended`).
 * A stop or switch made in this sidebar says its own line instead.
 */
import type { SessionView } from './types';

/** How a notice is shown: JupyterLab's Notification in the sidebar. */
export type Notify = (kind: 'info' | 'warning', text: string) => void;

/** Who stops and switches from the sidebar (`StopReasonView.by`). */
const BY_THE_SIDEBAR = 'the JupyterLab sidebar';

export class SessionAlerts {
  constructor(notify: Notify) {
    this._notify = notify;
  }

  /** Look at the sessions as last listed; notify what is new. */
  see(sessions: readonly SessionView[]): void {
    for (const view of sessions) {
      this._budget(view);
      this._ended(view);
    }
  }

  private _budget(view: SessionView): void {
    const alert = view.budget_alert;
    if (!alert || view.state !== 'running') {
      return;
    }
    const key = `${view.id}:${alert.level}`;
    if (!this._shown.has(key)) {
      this._shown.add(key);
      this._notify('warning', `GPU session ${view.name}: ${alert.text}`);
    }
  }

  private _ended(view: SessionView): void {
    if (view.state === 'running') {
      this._running.add(view.id);
      return;
    }
    if (!this._running.delete(view.id) || !view.ended) {
      return; // never seen running here, or still on its way (stopping)
    }
    if ((view.stop_reason?.by ?? '').startsWith(BY_THE_SIDEBAR)) {
      return; // its card said so
    }
    this._notify('info', `GPU session ${view.name}: ${view.ended}`);
  }

  private readonly _notify: Notify;
  private readonly _shown = new Set<string>();
  private readonly _running = new Set<string>();
}
