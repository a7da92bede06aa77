/**
 * Polled state behind the panel: the session list and each session's stats.
 *
 * Polls back off on failure and stand by while the browser tab is hidden or
 * while nobody is looking (panel collapsed, card scrolled away).
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { errorMessage, GpuSessionClient } from './api';
import { appendSamples, STATS_WINDOW_S } from './series';
import type { Sample, SessionView } from './types';

/** How often the session list is fetched, in ms. */
export const LIST_INTERVAL_MS = 2000;
/** How often a visible running session's stats are fetched, in ms. */
export const STATS_INTERVAL_MS = 2000;

/** The list of sessions, refreshed every `LIST_INTERVAL_MS`. */
export class SessionListModel {
  constructor(client: GpuSessionClient) {
    this.client = client;
    this._poll = new Poll<void, unknown, 'standby'>({
      factory: () => this._fetch(),
      frequency: { interval: LIST_INTERVAL_MS, backoff: true, max: 30_000 },
      name: 'gpusession-labextension:SessionListModel#sessions',
      standby: () => (this._active ? 'when-hidden' : true),
      auto: false
    });
  }

  readonly client: GpuSessionClient;

  /** Emitted after every fetch, successful or not. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Sessions as last fetched, in the server's order. */
  get sessions(): readonly SessionView[] {
    return this._sessions;
  }

  /** Whether a fetch has ever succeeded. */
  get loaded(): boolean {
    return this._loaded;
  }

  /** Why the last fetch failed, or null if it succeeded. */
  get error(): string | null {
    return this._error;
  }

  /** Whether someone is looking; the poll stands by while not. */
  get active(): boolean {
    return this._active;
  }
  set active(value: boolean) {
    if (value === this._active) {
      return;
    }
    this._active = value;
    if (value) {
      void this.refresh();
    }
  }

  /** Start polling (after the first view is attached). */
  start(): Promise<void> {
    return this._poll.start();
  }

  /** Fetch now, e.g. right after a start or stop request. */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  /** Replace one session with a fresher view (e.g. an action's reply). */
  upsert(view: SessionView): void {
    const index = this._sessions.findIndex(s => s.id === view.id);
    if (index >= 0) {
      this._sessions = this._sessions.map(s => (s.id === view.id ? view : s));
    } else {
      this._sessions = [view, ...this._sessions];
    }
    this._changed.emit();
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _fetch(): Promise<void> {
    try {
      this._sessions = await this.client.listSessions();
      this._loaded = true;
      this._error = null;
    } catch (error) {
      this._error = errorMessage(error);
      throw error; // so that the poll backs off
    } finally {
      this._changed.emit();
    }
  }

  private readonly _poll: Poll<void, unknown, 'standby'>;
  private readonly _changed = new Signal<this, void>(this);
  private _sessions: SessionView[] = [];
  private _loaded = false;
  private _error: string | null = null;
  private _active = false;
}

/**
 * The recent stats of one session: the last `STATS_WINDOW_S` seconds of
 * samples, fetched incrementally with `since`, only while `wanted`.
 */
export class SessionStatsModel {
  constructor(client: GpuSessionClient, sessionId: string) {
    this._client = client;
    this.sessionId = sessionId;
    this._poll = new Poll<void, unknown, 'standby'>({
      factory: () => this._fetch(),
      frequency: { interval: STATS_INTERVAL_MS, backoff: true, max: 30_000 },
      name: `gpusession-labextension:SessionStatsModel#${sessionId}`,
      standby: () => (this._wanted ? 'when-hidden' : true),
      auto: true
    });
  }

  readonly sessionId: string;

  /** Emitted after every fetch, successful or not. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Samples of the last `STATS_WINDOW_S` seconds, oldest first. */
  get samples(): readonly Sample[] {
    return this._samples;
  }

  /** False when the agent reported no GPU; see `message`. */
  get gpusVisible(): boolean {
    return this._gpusVisible;
  }

  /** The server's note on missing stats, or null. */
  get message(): string | null {
    return this._message;
  }

  /** Why the last fetch failed, or null if it succeeded. */
  get error(): string | null {
    return this._error;
  }

  /** Whether a fetch has ever succeeded. */
  get loaded(): boolean {
    return this._loaded;
  }

  /** Poll only while true: the session runs and its card is on screen. */
  get wanted(): boolean {
    return this._wanted;
  }
  set wanted(value: boolean) {
    if (value === this._wanted) {
      return;
    }
    this._wanted = value;
    if (value && !this._poll.isDisposed) {
      void this._poll.refresh();
    }
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _fetch(): Promise<void> {
    try {
      const last = this._samples[this._samples.length - 1];
      const since = last ? last.t : Date.now() / 1000 - STATS_WINDOW_S;
      const reply = await this._client.getStats(this.sessionId, since);
      this._gpusVisible = reply.gpus_visible;
      this._message = reply.message;
      this._samples = appendSamples(this._samples, reply.samples);
      this._loaded = true;
      this._error = null;
    } catch (error) {
      this._error = errorMessage(error);
      throw error; // so that the poll backs off
    } finally {
      this._changed.emit();
    }
  }

  private readonly _client: GpuSessionClient;
  private readonly _poll: Poll<void, unknown, 'standby'>;
  private readonly _changed = new Signal<this, void>(this);
  private _samples: readonly Sample[] = [];
  private _gpusVisible = true;
  private _message: string | null = null;
  private _error: string | null = null;
  private _loaded = false;
  private _wanted = false;
}
