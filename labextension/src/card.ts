/**
 * One live session's card: what it is, what it costs, when it stops itself,
 * the stage of its start, its live charts, and the charts / keep-alive / stop
 * buttons.
 */
import { Notification } from '@jupyterlab/apputils';

import { ApiError, errorMessage, GpuSessionClient } from './api';
import {
  control,
  element,
  message,
  setClass,
  setData,
  setText,
  showText
} from './dom';
import { formatDuration, formatRate } from './format';
import { GpuStatsView } from './gpus';
import { SessionStatsModel } from './model';
import { STATS_WINDOW_S } from './series';
import {
  costText,
  IdleCountdown,
  isFinal,
  kindText,
  progressText
} from './sessions';
import { notifyFailed } from './panel';
import { askStop } from './stopdialog';
import { switchWhere } from './switchbody';
import { askSwitch, keepSwitchLine, takeSwitchLine } from './switchdialog';
import type { SessionView } from './types';

/** How long the keep-alive button extends a session. */
export const KEEPALIVE_DURATION = '1h';
/** How long a failed stop or keep-alive stays said on the card, in ms. */
export const ACTION_ERROR_MS = 15_000;

/** What a card needs from the panel. */
export interface CardHost {
  readonly client: GpuSessionClient;
  /** Where the fresh views the buttons get back go. */
  sink(view: SessionView): void;
  /** Open the large charts of a session (the main-area view). */
  openCharts(id: string): void;
  /** Refresh the list at the starting pace until the returned function is called. */
  hurry(): () => void;
  /** The notebooks that use a session now (their file names). */
  usersOf(view: SessionView): string[];
}

/** What "cloud rate, own hardware" means, on hover. */
const PRICE_NOTE_TITLE =
  "The rate is the catalog's cloud price for these GPUs, applied to your own machine; " +
  'GpuSessionConfig.price_per_hour (or GPUSESSION_PRICE_PER_HOUR) sets a price of your own.';

export class SessionCard {
  constructor(view: SessionView, host: CardHost) {
    this._host = host;
    this.id = view.id;

    this.node = element('div', 'gpusession-card');
    this.node.dataset.sessionId = view.id;
    this.node.dataset.testid = 'gpusession-card';

    const header = element('div', 'gpusession-card-header');
    header.append(this._name, this._state);
    const facts = element('div', 'gpusession-facts');
    facts.append(
      fact('Uptime', this._uptime),
      fact('Rate', this._price),
      fact('Cost', this._cost),
      fact('Idle stop', this._idle)
    );
    const actions = element('div', 'gpusession-card-actions');
    button(this._charts, 'Charts', 'Open the large charts of this session', () =>
      this._host.openCharts(this.id)
    );
    button(
      this._keepAlive,
      `Keep alive ${KEEPALIVE_DURATION}`,
      `Postpone the idle stop by ${KEEPALIVE_DURATION}`,
      () => void this._onKeepAlive()
    );
    button(
      this._switch,
      'Switch GPU…',
      'Move this session to another GPU type, backend, image or host, keeping its variables and files',
      () => void this._onSwitch()
    );
    button(this._stop, 'Stop', 'Stop this session and its billing', () => void this._onStop());
    actions.append(this._charts, this._keepAlive, this._switch, this._stop);

    this._view = view;
    this.node.append(
      header,
      this._kind,
      this._usedBy,
      this._progress,
      this._restored,
      this._switched,
      facts,
      this._priceNote,
      this._placement,
      this._costNote,
      this._idleWarning,
      this._cutSwitch,
      this._error,
      this._actionError,
      actions,
      this._gpus.node
    );
    this.update(view);
  }

  readonly id: string;
  readonly node: HTMLDivElement;

  /** The last view shown. */
  get view(): SessionView {
    return this._view;
  }

  /** Show a fresh view of the session, touching only what changed. */
  update(view: SessionView): void {
    if (view.state !== this._view.state) {
      this._showActionError(null); // e.g. a keep-alive refused while it was starting
    }
    this._view = view;
    const switched = takeSwitchLine(view.id); // the switch that made this session, from here
    if (switched) {
      showText(this._switched, switched);
    }
    const final = isFinal(view);
    const running = view.state === 'running';
    this._countdown.see(view.idle.remaining_s, Date.now());

    setData(this.node, 'sessionName', view.name);
    setData(this.node, 'state', view.state);
    setText(this._name, view.name || view.id);
    setText(this._state, view.state);
    setClass(this._state, `gpusession-state gpusession-state-${view.state}`);
    setText(this._kind, kindText(view));
    const users = this._host.usersOf(view);
    showText(this._usedBy, users.length ? `Used by ${users.join(', ')}` : null);
    // while a switch runs: its stages as the server says them; until the first comes, what
    // was asked (the lines before are the session's own start)
    const lines = (view.progress ?? []).join('\n');
    const progress = this._switching
      ? ((lines !== this._linesBefore ? progressText(view, true) : null) ?? this._switchAsked)
      : progressText(view);
    showText(this._progress, progress);
    this._progress.title = view.progress?.join('\n') ?? '';
    showText(this._restored, running ? (view.restored ?? null) : null);
    setText(this._uptime, view.never_ran ? view.ran : formatDuration(view.uptime_s));
    setText(this._price, formatRate(view.price_per_hour));
    showText(this._priceNote, view.price_note);
    this._priceNote.title = view.price_note ? PRICE_NOTE_TITLE : '';
    showText(this._costNote, view.cost_note ?? null);
    setText(this._cost, costText(view));
    this._showIdle();
    showText(this._idleWarning, final ? null : view.idle.warning);
    showText(this._cutSwitch, view.cut_switch_text ?? null);
    showText(this._placement, view.placement ?? null);
    showText(this._error, view.error);

    // Keep-alive talks to the session's agent: only a running session has one.
    this._keepAlive.hidden = !running || view.idle.timeout_s === null;
    this._charts.hidden = !running;
    // a switch moves the variables through the workspace: only a backend that keeps one
    this._switch.hidden = !running || !view.workspace;
    this._stop.hidden = final;
    if (!this._busy) {
      this._stop.disabled = view.state === 'stopping';
    }
    this._gpus.node.hidden = !running;

    if (!running && this._stats) {
      this._stats.dispose();
      this._stats = null;
    }
    if (running && !this._stats) {
      this._stats = new SessionStatsModel(this._host.client, view.id);
      this._stats.changed.connect(this._onStats, this);
    }
    this._updateWanted();
  }

  /** Whether the card is on screen (scrolled into view, panel shown). */
  set onScreen(value: boolean) {
    this._onScreen = value;
    this._updateWanted();
  }

  dispose(): void {
    window.clearTimeout(this._actionErrorTimer);
    this._stats?.dispose();
    this._stats = null;
    this.node.remove();
  }

  private _showIdle(): void {
    setText(this._idle, this._countdown.text(this._view, Date.now()));
  }

  private _updateWanted(): void {
    if (this._stats) {
      this._stats.wanted = this._onScreen && this.view.state === 'running';
    }
  }

  private _onStats(stats: SessionStatsModel): void {
    if (stats.idle) {
      this._countdown.see(stats.idle.idle.remaining_s, stats.idle.at);
      this._showIdle();
    }
    this._gpus.update(stats);
  }

  /** Ask first when there is something to save: one click must not lose the variables. */
  private async _onStop(): Promise<void> {
    let save = false;
    if (this.view.workspace) {
      const { choice } = await askStop([this.view]);
      if (choice === null) {
        return;
      }
      save = choice === 'save';
    }
    this._stop.textContent = save ? 'Saving…' : 'Stopping…';
    await this._act(() => this._host.client.stopSession(this.id, save));
    this._stop.textContent = 'Stop';
  }

  /**
   * Ask where to, then switch: the card says the stages meanwhile (its
   * progress, from the list), the new card the one line of the result; a
   * failure raises a notification with the whole message (this session
   * keeps running).
   */
  private async _onSwitch(): Promise<void> {
    const name = this.view.name;
    let body;
    try {
      body = await askSwitch(this.view, (await this._host.client.getOptions()).options);
    } catch (error) {
      this._showActionError(`Cannot switch: ${errorMessage(error)}`);
      return;
    }
    if (!body) {
      return;
    }
    this._linesBefore = (this.view.progress ?? []).join('\n');
    this._switchAsked = `switch: asking for ${switchWhere(this.view, body)}`;
    this._setSwitching(true);
    this._showActionError(null);
    this.update(this.view);
    const unhurry = this._host.hurry();
    try {
      const reply = await this._host.client.switchSession(this.id, body);
      keepSwitchLine(reply.session.id, reply.line);
      Notification.success(reply.line, { autoClose: 10_000 });
      this._host.sink(reply.session);
    } catch (error) {
      const reason =
        error instanceof ApiError && error.serverMessage ? error.serverMessage : errorMessage(error);
      this._showActionError(`Switch failed: ${reason}`);
      notifyFailed(`Switch of ${name} failed`, reason);
    } finally {
      unhurry();
      this._setSwitching(false);
      this.update(this.view);
    }
  }

  /** While a switch runs, its button says so and the card's other actions wait. */
  private _setSwitching(on: boolean): void {
    this._switching = on;
    this._busy = on;
    setData(this.node, 'switching', String(on));
    this._switch.textContent = on ? 'Switching…' : 'Switch GPU…';
    this._switch.disabled = on;
    this._keepAlive.disabled = on;
    this._stop.disabled = on || this.view.state === 'stopping';
  }

  private async _onKeepAlive(): Promise<void> {
    await this._act(() => this._host.client.keepAlive(this.id, KEEPALIVE_DURATION));
  }

  /** Run one button's request; say on the card when it failed. */
  private async _act(request: () => Promise<SessionView>): Promise<void> {
    this._busy = true;
    this._stop.disabled = true;
    this._keepAlive.disabled = true;
    try {
      const view = await request();
      this._showActionError(null);
      this._host.sink(view);
    } catch (error) {
      this._showActionError(errorMessage(error));
    } finally {
      this._busy = false;
      this._keepAlive.disabled = false;
      this._stop.disabled = this.view.state === 'stopping';
    }
  }

  /** Say a failed action for `ACTION_ERROR_MS` (or until the state changes). */
  private _showActionError(text: string | null): void {
    window.clearTimeout(this._actionErrorTimer);
    showText(this._actionError, text);
    if (text) {
      this._actionErrorTimer = window.setTimeout(
        () => showText(this._actionError, null),
        ACTION_ERROR_MS
      );
    }
  }

  private readonly _host: CardHost;
  private _view: SessionView;
  private _stats: SessionStatsModel | null = null;
  private _onScreen = false;
  private _busy = false;
  private _switching = false;
  private _linesBefore = '';
  private _switchAsked: string | null = null;
  private _actionErrorTimer = 0;
  private readonly _countdown = new IdleCountdown();
  private readonly _name = element('span', 'gpusession-name');
  private readonly _state = control('span', 'gpusession-state');
  private readonly _kind = element('div', 'gpusession-kind');
  private readonly _usedBy = message('gpusession-used-by');
  private readonly _progress = message('gpusession-progress');
  /** What a resumed session's kernel brought back from its workspace. */
  private readonly _restored = message('gpusession-restored');
  /** The switch that made this session, in one line (when this page made it). */
  private readonly _switched = message('gpusession-switched');
  private readonly _uptime = control('span', 'gpusession-uptime');
  /** Where the rate comes from, when no cloud bills it: "cloud rate, own hardware". */
  private readonly _priceNote = message('gpusession-price-note');
  private readonly _costNote = message('gpusession-cost-note');
  private readonly _price = control('span', 'gpusession-price');
  private readonly _cost = control('span', 'gpusession-cost');
  private readonly _idle = control('span', 'gpusession-idle');
  private readonly _idleWarning = message('gpusession-idle-warning');
  /** How it was placed: the type a fallback list took, a pool's box, the GPUs it holds. */
  private readonly _placement = message('gpusession-placement');
  /** A switch it took part in was cut: what was left, what to do. */
  private readonly _cutSwitch = message('gpusession-cut-switch');
  private readonly _error = message('gpusession-error');
  private readonly _actionError = message('gpusession-action-error');
  private readonly _charts = control('button', 'gpusession-open-charts');
  private readonly _keepAlive = control('button', 'gpusession-keepalive');
  private readonly _switch = control('button', 'gpusession-switch');
  private readonly _stop = control('button', 'gpusession-stop');
  private readonly _gpus = new GpuStatsView(STATS_WINDOW_S);
}

/** A "label: value" row of the facts grid. */
function fact(label: string, value: HTMLElement): HTMLElement {
  const row = element('div', 'gpusession-fact');
  const name = element('span', 'gpusession-fact-label');
  name.textContent = label;
  row.append(name, value);
  return row;
}

function button(node: HTMLButtonElement, text: string, title: string, onClick: () => void): void {
  node.type = 'button';
  node.textContent = text;
  node.title = title;
  node.addEventListener('click', onClick);
}
