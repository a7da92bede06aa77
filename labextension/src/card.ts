/**
 * One session's card: what it is, what it costs, when it stops itself, its
 * live GPU charts, and the stop / keep-alive buttons.
 */
import { errorMessage, GpuSessionClient } from './api';
import {
  control,
  element,
  message,
  setClass,
  setData,
  setText,
  showText
} from './dom';
import { formatDuration } from './format';
import { GpuStatsView } from './gpus';
import { SessionStatsModel } from './model';
import { STATS_WINDOW_S } from './series';
import { costText, idleText, isFinal, kindText, rateText } from './sessions';
import type { SessionView } from './types';

/** How long the keep-alive button extends a session. */
export const KEEPALIVE_DURATION = '1h';

/** Where a card sends the fresh views its buttons get back. */
export type ViewSink = (view: SessionView) => void;

export class SessionCard {
  constructor(view: SessionView, client: GpuSessionClient, sink: ViewSink) {
    this._client = client;
    this._sink = sink;
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
    this._keepAlive.type = 'button';
    this._keepAlive.textContent = `Keep alive ${KEEPALIVE_DURATION}`;
    this._keepAlive.title = `Postpone the idle stop by ${KEEPALIVE_DURATION}`;
    this._keepAlive.addEventListener('click', () => void this._onKeepAlive());
    this._stop.type = 'button';
    this._stop.textContent = 'Stop';
    this._stop.title = 'Stop this session and its billing';
    this._stop.addEventListener('click', () => void this._onStop());
    actions.append(this._keepAlive, this._stop);

    this._view = view;
    this.node.append(
      header,
      this._kind,
      facts,
      this._idleWarning,
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
    this._view = view;
    const final = isFinal(view);

    setData(this.node, 'sessionName', view.name);
    setData(this.node, 'state', view.state);
    setText(this._name, view.name || view.id);
    setText(this._state, view.state);
    setClass(this._state, `gpusession-state gpusession-state-${view.state}`);
    setText(this._kind, kindText(view));
    setText(this._uptime, formatDuration(view.uptime_s));
    setText(this._price, rateText(view));
    setText(this._cost, costText(view));
    setText(this._idle, idleText(view));
    showText(this._idleWarning, final ? null : view.idle.warning);
    showText(this._error, view.error);

    this._keepAlive.hidden = final || view.idle.timeout_s === null;
    this._stop.hidden = final;
    if (!this._busy) {
      this._stop.disabled = view.state === 'stopping';
    }
    this._gpus.node.hidden = view.state !== 'running';

    if (final && this._stats) {
      this._stats.dispose();
      this._stats = null;
    }
    if (view.state === 'running' && !this._stats) {
      this._stats = new SessionStatsModel(this._client, view.id);
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
    this._stats?.dispose();
    this._stats = null;
    this.node.remove();
  }

  private _updateWanted(): void {
    if (this._stats) {
      this._stats.wanted = this._onScreen && this.view.state === 'running';
    }
  }

  private _onStats(stats: SessionStatsModel): void {
    this._gpus.update(stats);
  }

  private async _onStop(): Promise<void> {
    this._stop.textContent = 'Stopping…';
    await this._act(() => this._client.stopSession(this.id));
    this._stop.textContent = 'Stop';
  }

  private async _onKeepAlive(): Promise<void> {
    await this._act(() => this._client.keepAlive(this.id, KEEPALIVE_DURATION));
  }

  /** Run one button's request; show its error on the card. */
  private async _act(request: () => Promise<SessionView>): Promise<void> {
    this._busy = true;
    this._stop.disabled = true;
    this._keepAlive.disabled = true;
    try {
      const view = await request();
      showText(this._actionError, null);
      this._sink(view);
    } catch (error) {
      showText(this._actionError, errorMessage(error));
    } finally {
      this._busy = false;
      this._keepAlive.disabled = false;
      this._stop.disabled = this.view.state === 'stopping';
    }
  }

  private readonly _client: GpuSessionClient;
  private readonly _sink: ViewSink;
  private _view: SessionView;
  private _stats: SessionStatsModel | null = null;
  private _onScreen = false;
  private _busy = false;
  private readonly _name = element('span', 'gpusession-name');
  private readonly _state = control('span', 'gpusession-state');
  private readonly _kind = element('div', 'gpusession-kind');
  private readonly _uptime = control('span', 'gpusession-uptime');
  private readonly _price = control('span', 'gpusession-price');
  private readonly _cost = control('span', 'gpusession-cost');
  private readonly _idle = control('span', 'gpusession-idle');
  private readonly _idleWarning = message('gpusession-idle-warning');
  private readonly _error = message('gpusession-error');
  private readonly _actionError = message('gpusession-action-error');
  private readonly _keepAlive = control('button', 'gpusession-keepalive');
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
