/**
 * The sidebar's history: the sessions that ended last (failed starts and
 * watchdog stops included), each with how it ended, what it cost in the end,
 * and a button that starts the same kind of session again; when its stop
 * saved the kernel's variables, what was saved and a Resume button that
 * starts a new session on that workspace, restoring them.
 */
import { ApiError, errorMessage, GpuSessionClient } from './api';
import { control, element, message, setData, setText, showText } from './dom';
import { formatMoney } from './format';
import { endedText, kindText, startedWhen } from './sessions';
import type { SessionView, StartRequest } from './types';
import { resumeOffer, resumeTitle } from './workspaces';

/** What the history needs from the panel. */
export interface HistoryHost {
  readonly client: GpuSessionClient;
  /** A session was started again: show its card. */
  started(view: SessionView): void;
}

/** One ended session. */
class HistoryItem {
  constructor(view: SessionView, host: HistoryHost) {
    this._host = host;
    this.node = element('div', 'gpusession-history-item');
    this.node.dataset.sessionId = view.id;
    this.node.dataset.testid = 'gpusession-history-item';
    const header = element('div', 'gpusession-card-header');
    header.append(this._name, this._cost);
    this._restart.type = 'button';
    this._restart.textContent = 'Start again';
    this._restart.addEventListener('click', () => void this._start(this._view.restart, this._restart));
    this._resume.type = 'button';
    this._resume.textContent = RESUME;
    this._resume.addEventListener('click', () => {
      const offer = resumeOffer(this._view);
      if (offer) {
        void this._start(offer.body, this._resume);
      }
    });
    this._reason.addEventListener('click', () => this._reason.classList.toggle('gpusession-expanded'));
    const actions = element('div', 'gpusession-card-actions');
    actions.append(this._resume, this._restart);
    this.node.append(header, this._kind, this._reason, this._saved, this._error, actions);
    this._view = view;
    this.update(view);
  }

  readonly node: HTMLDivElement;

  update(view: SessionView): void {
    this._view = view;
    setData(this.node, 'sessionName', view.name);
    setData(this.node, 'state', view.state);
    setText(this._name, view.name || view.id);
    setText(this._cost, formatMoney(view.cost_so_far));
    this._cost.title = 'Final cost';
    setText(this._kind, `${startedWhen(view)} · ${kindText(view)} · ${view.ran}`);
    setText(this._reason, endedText(view));
    this._reason.classList.add('gpusession-history-reason');
    this._reason.classList.toggle('gpusession-history-reason-failed', view.state === 'failed');
    this._reason.title = this._reason.textContent ?? '';
    this._restart.title = view.restart.workspace
      ? `Start a new ${kindText(view)} session with the same options on workspace ${String(view.restart.workspace)} (its files; no variables restored)`
      : `Start a new ${kindText(view)} session with the same options`;
    const offer = resumeOffer(view);
    showText(this._saved, view.saved ?? null);
    this._resume.hidden = offer === null;
    this._resume.title = offer ? resumeTitle(offer) : '';
  }

  /** Start a session from `body`; `button` says so meanwhile. */
  private async _start(body: StartRequest, button: HTMLButtonElement): Promise<void> {
    const label = button.textContent ?? '';
    this._restart.disabled = true;
    this._resume.disabled = true;
    button.textContent = 'Starting…';
    try {
      const view = await this._host.client.startSession(body);
      showText(this._error, null);
      this._host.started(view);
    } catch (error) {
      const reason =
        error instanceof ApiError && error.serverMessage ? error.serverMessage : errorMessage(error);
      showText(this._error, `Start failed: ${reason}`);
    } finally {
      this._restart.disabled = false;
      this._resume.disabled = false;
      button.textContent = label;
    }
  }

  private readonly _host: HistoryHost;
  private _view: SessionView;
  private readonly _name = element('span', 'gpusession-name');
  private readonly _cost = control('span', 'gpusession-history-cost');
  private readonly _kind = element('div', 'gpusession-kind');
  private readonly _reason = control('div', 'gpusession-history-reason');
  private readonly _error = message('gpusession-history-error');
  private readonly _restart = control('button', 'gpusession-restart');
  private readonly _resume = control('button', 'gpusession-resume');
  /** What its stop saved into the workspace, or why not. */
  private readonly _saved = message('gpusession-history-saved');
}

const RESUME = 'Resume';

/** The collapsible list of ended sessions (open at first). */
export class HistorySection {
  constructor(host: HistoryHost) {
    this._host = host;
    this.node = element('details', 'gpusession-history');
    this.node.dataset.testid = 'gpusession-history';
    this.node.open = true;
    this._summary.className = 'gpusession-history-summary';
    this._summary.dataset.testid = 'gpusession-history-summary';
    this.node.append(this._summary, this._list);
    this.node.hidden = true;
  }

  readonly node: HTMLDetailsElement;

  /** Show these ended sessions, in this order. */
  update(ended: readonly SessionView[]): void {
    this.node.hidden = ended.length === 0;
    setText(this._summary, `Ended sessions (${ended.length})`);
    const ids = new Set(ended.map(view => view.id));
    for (const [id, item] of this._items) {
      if (!ids.has(id)) {
        item.node.remove();
        this._items.delete(id);
      }
    }
    ended.forEach((view, position) => {
      let item = this._items.get(view.id);
      if (item) {
        item.update(view);
      } else {
        item = new HistoryItem(view, this._host);
        this._items.set(view.id, item);
      }
      if (this._list.children[position] !== item.node) {
        this._list.insertBefore(item.node, this._list.children[position] ?? null);
      }
    });
  }

  private readonly _host: HistoryHost;
  private readonly _summary = document.createElement('summary');
  private readonly _list = element('div', 'gpusession-history-list');
  private readonly _items = new Map<string, HistoryItem>();
}
