/**
 * The left-sidebar panel: one card per live session, the start form, the
 * ended sessions (history), and the API's errors (never a blank panel).
 */
import { Notification, showErrorMessage } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { errorMessage, GpuSessionClient } from './api';
import { CardHost, SessionCard } from './card';
import { control, element, message, setText, showText } from './dom';
import { StartForm } from './form';
import { HistorySection } from './history';
import { WorkspacesSection } from './workspacelist';
import { gpuIcon } from './icon';
import { SessionListModel } from './model';
import { NotebookLinks } from './notebooks';
import { endedSessions, liveCount, liveRateText, liveSessions } from './sessions';
import type { SessionView } from './types';

export const PANEL_ID = 'gpusession-panel';

/** How long to wait before fetching the form's options or catalog again after a failure, in ms. */
const FORM_RETRY_MS = 30_000;

export class GpuSessionPanel extends Widget {
  /**
   * @param model - the session list, shared with the status bar and charts.
   * @param openCharts - opens the large charts of a session.
   * @param links - the notebooks and the sessions they use.
   */
  constructor(model: SessionListModel, openCharts: (id: string) => void, links: NotebookLinks) {
    super();
    this.id = PANEL_ID;
    this.addClass('gpusession-panel');
    this.node.dataset.testid = PANEL_ID;
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU sessions';

    this.model = model;
    const client: GpuSessionClient = model.client;
    this.model.changed.connect(this._render, this);
    this._form = new StartForm(
      client,
      view => this._onStarted(view),
      text => notifyFailed('GPU session start failed', text)
    );
    this._cardHost = {
      client,
      sink: view => this.model.upsert(view),
      openCharts,
      hurry: () => this.model.hurry(),
      usersOf: view => links.usersOf(view)
    };
    this._links = links;
    this._history = new HistorySection({ client, started: view => this._onStarted(view) });
    this._workspaces = new WorkspacesSection(client);

    const header = element('div', 'gpusession-header');
    const title = element('h2', 'gpusession-title');
    title.textContent = 'GPU sessions';
    this._rate.title = 'What the live sessions cost per hour, together';
    header.append(title, this._count, this._rate);
    this._loading.textContent = 'Loading sessions…';
    // what a session is, in two lines, and where a first run starts
    const what = element('p', 'gpusession-empty-what');
    what.textContent =
      'No GPU session running. A session is a Python kernel on a GPU machine (this one, a ' +
      'Docker engine, a cloud, a cluster), billed while it runs and stopped when idle.';
    const start = element('p', 'gpusession-empty-start');
    start.textContent =
      'Start one below, or run `gpusession setup` in a terminal to find where your GPUs are.';
    this._empty.append(what, start);
    this._empty.hidden = true;
    this.node.append(
      header,
      this._apiError,
      this._loading,
      this._empty,
      this._list,
      this._form.node,
      this._history.node,
      this._workspaces.node
    );

    // Stats are fetched only for cards on screen: this also turns them off
    // while the sidebar is collapsed, since hidden nodes never intersect.
    this._observer = new IntersectionObserver(entries => {
      for (const entry of entries) {
        const id = (entry.target as HTMLElement).dataset.sessionId ?? '';
        const card = this._cards.get(id);
        if (card) {
          card.onScreen = entry.isIntersecting;
        }
      }
    });
  }

  readonly model: SessionListModel;

  /** Bring the start form into view and put the focus in it. */
  focusForm(): void {
    this._form.node.scrollIntoView({ block: 'nearest' });
    this._form.focus();
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._release?.();
    this._observer.disconnect();
    this._form.dispose();
    for (const card of this._cards.values()) {
      card.dispose();
    }
    this._cards.clear();
    Signal.disconnectReceiver(this);
    super.dispose();
  }

  protected override onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    void this.model.start();
  }

  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._release ??= this.model.watch(true);
    this._loadForm();
  }

  protected override onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._release?.();
    this._release = null;
  }

  /** Load the form's options and catalog, again after a failure but not too often. */
  private _loadForm(): void {
    const now = Date.now();
    if (this._form.loaded || now < this._formRetryAt) {
      return;
    }
    this._formRetryAt = now + FORM_RETRY_MS;
    void this._form.load();
  }

  private _onStarted(view: SessionView): void {
    this._startedHere.add(view.id);
    this.model.upsert(view);
    this._links.offer(view); // the open notebook: connect it to this session?
    // The form sits below the list: bring the new card into view.
    this._cards.get(view.id)?.node.scrollIntoView({ block: 'nearest' });
    void this.model.refresh();
  }

  private _render(model: SessionListModel): void {
    let error = model.error
      ? `Cannot load GPU sessions${model.loaded ? ' (showing the last list)' : ''}: ${model.error}`
      : null;
    let live: SessionView[] = [];
    this._notifyEnds(model.sessions);
    try {
      live = liveSessions(model.sessions);
      this._syncCards(live);
      this._history.update(endedSessions(model.sessions));
    } catch (failure) {
      // A reply that does not match types.ts must not leave a blank panel.
      error = `Cannot show GPU sessions: ${errorMessage(failure)}`;
    }
    showText(this._apiError, error);
    this._loading.hidden = model.loaded || error !== null;
    this._empty.hidden = !model.loaded || live.length > 0;
    setText(
      this._count,
      model.loaded ? String(liveCount(model.sessions)) : ''
    );
    showText(this._rate, model.loaded ? liveRateText(model.sessions) : null);
    this._form.apiDown = model.error !== null;
    if (!model.error) {
      this._loadForm();
    }
  }

  /**
   * A start from this sidebar that failed in the background raises a
   * notification with its whole message (the history's line is cut short).
   */
  private _notifyEnds(sessions: readonly SessionView[]): void {
    for (const view of sessions) {
      if (!this._startedHere.has(view.id) || !['failed', 'running', 'stopped'].includes(view.state)) {
        continue;
      }
      this._startedHere.delete(view.id);
      if (view.state === 'failed') {
        notifyFailed(
          `GPU session ${view.name} did not start`,
          view.error ?? view.ended ?? 'no reason given'
        );
      }
    }
  }

  /** Update cards in place; create, remove and reorder only what changed. */
  private _syncCards(sessions: readonly SessionView[]): void {
    const ids = new Set(sessions.map(s => s.id));
    for (const [id, card] of this._cards) {
      if (!ids.has(id)) {
        this._observer.unobserve(card.node);
        card.dispose();
        this._cards.delete(id);
      }
    }
    sessions.forEach((view, position) => {
      let card = this._cards.get(view.id);
      if (card) {
        card.update(view);
      } else {
        card = new SessionCard(view, this._cardHost);
        this._cards.set(view.id, card);
        this._observer.observe(card.node);
      }
      // Move only cards that are out of place.
      if (this._list.children[position] !== card.node) {
        this._list.insertBefore(card.node, this._list.children[position] ?? null);
      }
    });
  }

  private readonly _links: NotebookLinks;
  private readonly _form: StartForm;
  private readonly _cardHost: CardHost;
  private readonly _history: HistorySection;
  private readonly _workspaces: WorkspacesSection;
  private _release: (() => void) | null = null;
  private readonly _observer: IntersectionObserver;
  private readonly _cards = new Map<string, SessionCard>();
  /** Sessions this sidebar started that have not come up yet (or failed). */
  private readonly _startedHere = new Set<string>();
  private _formRetryAt = 0;
  private readonly _count = control('span', 'gpusession-count');
  private readonly _rate = control('span', 'gpusession-total-rate');
  private readonly _apiError = message('gpusession-api-error');
  private readonly _loading = control('div', 'gpusession-loading');
  private readonly _empty = control('div', 'gpusession-empty');
  private readonly _list = control('div', 'gpusession-list');
}

/** The longest message a notification shows whole (JupyterLab cuts longer ones). */
const NOTIFICATION_CHARS = 140;

/**
 * An error notification that stays until dismissed; when the message is too
 * long for it, "Show all" opens the whole message (with what to do).
 */
export function notifyFailed(title: string, text: string): void {
  const line = `${title}: ${text}`;
  const fits = line.length <= NOTIFICATION_CHARS;
  Notification.error(fits ? line : `${line.slice(0, NOTIFICATION_CHARS - 1)}…`, {
    autoClose: false,
    actions: fits
      ? []
      : [
          {
            label: 'Show all',
            caption: 'The whole message, and what to do',
            callback: () => void showErrorMessage(title, text)
          }
        ]
  });
}
