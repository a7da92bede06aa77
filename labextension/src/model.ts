/**
 * Polled state behind the panel: the session list and each session's stats.
 *
 * Polls back off on failure and stand by while the browser tab is hidden or
 * while nobody is looking (panel collapsed, card scrolled away).
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { errorMessage, GpuSessionClient } from './api';
import { keepNewer } from './latest';
import { appendSamples, STATS_WINDOW_S } from './series';
import { isStarting } from './sessions';
import type {
  BudgetView,
  MetricView,
  Sample,
  SessionView,
  StatsIdle,
  StatsReply
} from './types';

/** How often the session list is fetched while the sidebar is shown, in ms. */
export const LIST_INTERVAL_MS = 2000;
/** How often while only the status bar (or the charts) look, in ms. */
export const BACKGROUND_INTERVAL_MS = 5000;
/** How often while a session is starting, so that its card follows the stages. */
export const STARTING_INTERVAL_MS = 500;
/** How often a visible running session's stats are fetched, in ms. */
export const STATS_INTERVAL_MS = 2000;
/** How many ended sessions the list brings along (the sidebar's history). */
export const HISTORY_SIZE = 10;

/**
 * The live sessions and the last `HISTORY_SIZE` ended ones, refreshed while
 * someone watches (`watch`): every `LIST_INTERVAL_MS` for an eager watcher
 * (the sidebar), every `BACKGROUND_INTERVAL_MS` for the others (the status
 * bar), every `STARTING_INTERVAL_MS` while a session starts. One model feeds
 * the sidebar, the status bar and the charts.
 */
export class SessionListModel {
  constructor(client: GpuSessionClient, history: number = HISTORY_SIZE) {
    this.client = client;
    this._history = history;
    this._poll = new Poll<void, unknown, 'standby'>({
      factory: () => this._fetch(),
      frequency: { interval: BACKGROUND_INTERVAL_MS, backoff: true, max: 30_000 },
      name: 'gpusession-labextension:SessionListModel#sessions',
      standby: () => (this._watchers.size ? 'when-hidden' : true),
      auto: false
    });
  }

  readonly client: GpuSessionClient;

  /** Emitted after every fetch, successful or not, and after `upsert`. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Sessions as last fetched, in the server's order (live and ended). */
  get sessions(): readonly SessionView[] {
    return this._sessions;
  }

  /** The month's budget as last fetched with the sessions (null: none set). */
  get budget(): BudgetView | null {
    return this._budget;
  }

  /** The budget's line ("this month: $41.20 of the $50.00 ..."), or null. */
  get budgetLine(): string | null {
    return this._budgetLine;
  }

  /** Whether a fetch has ever succeeded. */
  get loaded(): boolean {
    return this._loaded;
  }

  /** Why the last fetch failed, or null if it succeeded. */
  get error(): string | null {
    return this._error;
  }

  /** Whether someone watches; the poll stands by while nobody does. */
  get active(): boolean {
    return this._watchers.size > 0;
  }

  /**
   * Ask for updates until the returned function is called; `eager`: at the
   * sidebar's pace rather than the background's.
   */
  watch(eager: boolean): () => void {
    const token = Symbol('watcher');
    this._watchers.set(token, eager);
    this._pace();
    void this.refresh();
    return () => {
      if (this._watchers.delete(token)) {
        this._pace();
      }
    };
  }

  /**
   * Poll at the starting pace until the returned function is called (a
   * switch: its stages come with the list, and a quick one lasts a second).
   */
  hurry(): () => void {
    this._hurried += 1;
    this._pace();
    void this.refresh();
    let done = false;
    return () => {
      if (!done) {
        done = true;
        this._hurried -= 1;
        this._pace();
      }
    };
  }

  /** Start polling (after the first view is attached). */
  start(): Promise<void> {
    return this._poll.start();
  }

  /** Fetch now, e.g. right after a start or stop request. */
  refresh(): Promise<void> {
    return this._poll.isDisposed ? Promise.resolve() : this._poll.refresh();
  }

  /** Replace one session with a fresher view (e.g. an action's reply). */
  upsert(view: SessionView): void {
    const index = this._sessions.findIndex(s => s.id === view.id);
    if (index >= 0) {
      this._sessions = this._sessions.map(s => (s.id === view.id ? view : s));
    } else {
      this._sessions = [view, ...this._sessions];
    }
    this._upserted.set(view.id, ++this._step);
    this._pace();
    this._changed.emit();
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  /** Poll as often as the watchers and the starting sessions need. */
  private _pace(): void {
    if (this._poll.isDisposed) {
      return;
    }
    const eager = Array.from(this._watchers.values()).some(Boolean);
    const interval =
      this._hurried > 0 || this._sessions.some(isStarting)
      ? STARTING_INTERVAL_MS
      : eager
        ? LIST_INTERVAL_MS
        : BACKGROUND_INTERVAL_MS;
    if (this._poll.frequency.interval !== interval) {
      this._poll.frequency = { interval, backoff: true, max: 30_000 };
    }
  }

  private async _fetch(): Promise<void> {
    const asked = ++this._step;
    try {
      const reply = await this.client.listing(this._history);
      this._sessions = keepNewer(
        reply.sessions,
        this._sessions,
        id => (this._upserted.get(id) ?? 0) > asked
      );
      for (const [id, step] of this._upserted) {
        if (step < asked) {
          this._upserted.delete(id); // this listing knew it
        }
      }
      this._budget = reply.budget ?? null;
      this._budgetLine = reply.budget_line ?? null;
      this._loaded = true;
      this._error = null;
    } catch (error) {
      this._error = errorMessage(error);
      throw error; // so that the poll backs off
    } finally {
      this._pace();
      this._changed.emit();
    }
  }

  private readonly _history: number;
  private readonly _poll: Poll<void, unknown, 'standby'>;
  private readonly _changed = new Signal<this, void>(this);
  private readonly _watchers = new Map<symbol, boolean>();
  private _hurried = 0;
  private _step = 0; // counts listings asked and upserts, in order
  private readonly _upserted = new Map<string, number>(); // session id -> its upsert's step
  private _sessions: SessionView[] = [];
  private _budget: BudgetView | null = null;
  private _budgetLine: string | null = null;
  private _loaded = false;
  private _error: string | null = null;
}

/**
 * The recent stats of one session: the last `windowS` seconds of samples
 * (default `STATS_WINDOW_S`), fetched incrementally with `since`, only while
 * `wanted`.
 */
export class SessionStatsModel {
  constructor(client: GpuSessionClient, sessionId: string, windowS: number = STATS_WINDOW_S) {
    this._client = client;
    this.sessionId = sessionId;
    this.windowS = windowS;
    this._poll = new Poll<void, unknown, 'standby'>({
      factory: () => this._fetch(),
      frequency: { interval: STATS_INTERVAL_MS, backoff: true, max: 30_000 },
      name: `gpusession-labextension:SessionStatsModel#${sessionId}`,
      standby: () => (this._wanted ? 'when-hidden' : true),
      auto: true
    });
  }

  readonly sessionId: string;
  /** Seconds of samples kept (and fetched at first). */
  readonly windowS: number;

  /** Emitted after every fetch, successful or not. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Where the GPU values come from: the driver, or a replayed recording. */
  get source(): StatsReply['source'] {
    return this._source;
  }

  /** A replay's recording (its GPU name, count, whether of the session's type). */
  get recording(): StatsReply['recording'] {
    return this._recording;
  }

  /** Where replayed values come from, in words (null when live). */
  get source_text(): string | null {
    return this._sourceText;
  }

  /** The agent's idle watchdog as last fetched, with when (browser ms). */
  get idle(): { idle: StatsIdle; at: number } | null {
    return this._idle;
  }

  /** Samples of the last `windowS` seconds, oldest first. */
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

  /** The metric table (GET `options`), once fetched with the first stats. */
  get metrics(): readonly MetricView[] | null {
    return this._metrics;
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
      const since = last ? last.t : Date.now() / 1000 - this.windowS;
      this._metrics ??= await this._client.getMetrics();
      const reply = await this._client.getStats(this.sessionId, since);
      this._gpusVisible = reply.gpus_visible;
      this._message = reply.message;
      this._source = reply.source;
      this._recording = reply.recording ?? null;
      this._sourceText = reply.source_text ?? null;
      this._idle = reply.idle ? { idle: reply.idle, at: Date.now() } : null;
      this._samples = appendSamples(this._samples, reply.samples, this.windowS);
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
  private _metrics: readonly MetricView[] | null = null;
  private _source: StatsReply['source'] = undefined;
  private _recording: StatsReply['recording'] = null;
  private _sourceText: string | null = null;
  private _idle: { idle: StatsIdle; at: number } | null = null;
  private _gpusVisible = true;
  private _message: string | null = null;
  private _error: string | null = null;
  private _loaded = false;
  private _wanted = false;
}
