/**
 * The status-bar item: the session that the current notebook's (or
 * console's) kernel started, with its type, cost so far and idle countdown.
 * A click opens the sidebar.
 */
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { element, setData, setText } from './dom';
import { SessionListModel } from './model';
import { IdleCountdown, sessionOfKernel, statusText } from './sessions';
import type { SessionView } from './types';

/** How often the countdown moves on between list replies, in ms. */
const TICK_MS = 1000;
/** How often the agent's own countdown is fetched (the list's may be stale), in ms. */
const IDLE_POLL_MS = 10_000;
/** How often while no countdown is known yet (a session just up, or busy until now), in ms. */
const IDLE_UNKNOWN_POLL_MS = 2_000;

export class GpuStatusItem extends Widget {
  constructor(model: SessionListModel, onClick: () => void) {
    super();
    this._model = model;
    this.addClass('gpusession-status');
    this.node.dataset.testid = 'gpusession-status';
    this.node.title = 'GPU session of this notebook: click to open the GPU sessions sidebar';
    this.node.append(this._icon, this._text);
    this._icon.textContent = 'GPU';
    this.node.addEventListener('click', onClick);
    model.changed.connect(this._render, this);
    this._release = model.watch(false);
    // The list's countdown is only as fresh as the server's last word from the agent (none
    // while the sidebar is closed): ask the agent now and then, as the sidebar's cards do.
    this._idlePoll = new Poll<void, unknown, 'standby'>({
      factory: () => this._fetchIdle(),
      frequency: { interval: IDLE_POLL_MS, backoff: true, max: 60_000 },
      name: 'gpusession-labextension:GpuStatusItem#idle',
      standby: () => (this._wantsIdle() ? 'when-hidden' : true)
    });
  }

  /** Emitted when the item starts or stops having a session to show. */
  get activeChanged(): ISignal<this, void> {
    return this._activeChanged;
  }

  /** Whether the current kernel has a session (the item is shown only then). */
  get isActive(): boolean {
    return this._session !== undefined;
  }

  /** The session shown, if any. */
  get session(): SessionView | undefined {
    return this._session;
  }

  /** The kernel of the current notebook or console, or null. */
  set kernelId(id: string | null) {
    if (id !== this._kernelId) {
      this._kernelId = id;
      this._render();
    }
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearInterval(this._timer);
    this._idlePoll.dispose();
    this._release();
    Signal.clearData(this);
    super.dispose();
  }

  private _wantsIdle(): boolean {
    const session = this._session;
    return session?.state === 'running' && session.idle.timeout_s !== null;
  }

  private async _fetchIdle(): Promise<void> {
    const session = this._session;
    if (!session || !this._wantsIdle()) {
      return;
    }
    const reply = await this._model.client.getStats(session.id, Date.now() / 1000);
    if (reply.idle && this._session?.id === session.id) {
      this._countdown.see(reply.idle.remaining_s, Date.now());
      this._show();
    }
    this._idlePace();
  }

  /** Ask the agent often until a countdown is known, then now and then. */
  private _idlePace(): void {
    const known = this._countdown.remaining(Date.now()) !== null;
    const interval = known ? IDLE_POLL_MS : IDLE_UNKNOWN_POLL_MS;
    if (this._idlePoll.frequency.interval !== interval) {
      this._idlePoll.frequency = { interval, backoff: true, max: 60_000 };
    }
  }

  private _render(): void {
    const session = sessionOfKernel(this._model.sessions, this._kernelId);
    const changed = session?.id !== this._session?.id;
    if (changed) {
      this._countdown = new IdleCountdown();
    }
    const wasActive = this.isActive;
    this._session = session;
    if (session) {
      this._countdown.see(session.idle.remaining_s, Date.now());
    }
    this._show();
    window.clearInterval(this._timer);
    if (session?.state === 'running' && session.idle.timeout_s !== null) {
      this._timer = window.setInterval(() => this._show(), TICK_MS);
    }
    if (wasActive !== this.isActive) {
      this._activeChanged.emit();
    }
    if (changed && this._wantsIdle()) {
      this._idlePace();
      void this._idlePoll.refresh();
    }
  }

  private _show(): void {
    const session = this._session;
    if (!session) {
      setText(this._text, '');
      return;
    }
    setData(this.node, 'sessionName', session.name);
    setData(this.node, 'state', session.state);
    setText(this._text, `${session.name}: ${statusText(session, this._countdown.text(session, Date.now()))}`);
  }

  private readonly _model: SessionListModel;
  private readonly _release: () => void;
  private readonly _activeChanged = new Signal<this, void>(this);
  private readonly _icon = element('span', 'gpusession-status-icon');
  private readonly _text = element('span', 'gpusession-status-text');
  private _kernelId: string | null = null;
  private _session: SessionView | undefined = undefined;
  private _countdown = new IdleCountdown();
  private _timer = 0;
  private readonly _idlePoll: Poll<void, unknown, 'standby'>;
}
