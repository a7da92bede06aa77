/**
 * What the panel says about sessions, without a DOM: their order, the live
 * count, and the text of a card's facts (the same words and numbers as the
 * notebook's `%gpu panel` card, `gpusession/widgets/card.py`).
 */
import { formatDuration, formatMoney, formatRate } from './format';
import type { SessionState, SessionView } from './types';

/** States after which nothing more happens to a session. */
export const FINAL_STATES: ReadonlySet<SessionState> = new Set(['stopped', 'failed']);

export function isFinal(view: SessionView): boolean {
  return FINAL_STATES.has(view.state);
}

/** Whether the session may still run, or cost: not stopped or failed. */
export function isLive(view: SessionView): boolean {
  return !isFinal(view);
}

/** Live sessions first, newest first within each group. */
export function displayOrder(sessions: readonly SessionView[]): SessionView[] {
  return [...sessions].sort(
    (a, b) => Number(isLive(b)) - Number(isLive(a)) || b.created_at - a.created_at
  );
}

/** How many sessions are live (the number in the panel's header). */
export function liveCount(sessions: readonly SessionView[]): number {
  return sessions.filter(isLive).length;
}

/** What the live sessions cost per hour together ("$1.0520/h"); null when none is live. */
export function liveRateText(sessions: readonly SessionView[]): string | null {
  const live = sessions.filter(isLive);
  return live.length ? formatRate(live.reduce((sum, view) => sum + view.price_per_hour, 0)) : null;
}

/** "T4 × 2 · docker · spot · ssh://gpu-box · python:3.12-slim" */
export function kindText(view: SessionView): string {
  const kind = [`${view.gpu_type} × ${view.gpu_count}`, view.backend];
  if (view.spot) {
    kind.push('spot');
  }
  if (view.host) {
    kind.push(view.host);
  }
  if (view.image) {
    kind.push(view.image);
  }
  return kind.join(' · ');
}

/** "$0.5260/h", "$0.5260/h (cloud rate, own hardware)" */
export function rateText(view: SessionView): string {
  const rate = formatRate(view.price_per_hour);
  return view.price_note ? `${rate} (${view.price_note})` : rate;
}

/** "$0.1234", or "$0.1234 of $5.00" with a cost cap. */
export function costText(view: SessionView): string {
  const cost = formatMoney(view.cost_so_far);
  return view.max_cost ? `${cost} of ${formatMoney(view.max_cost)}` : cost;
}

/** States of a session on its way up (its card shows the start's stages). */
export const STARTING_STATES: ReadonlySet<SessionState> = new Set([
  'requested',
  'provisioning',
  'starting'
]);

export function isStarting(view: SessionView): boolean {
  return STARTING_STATES.has(view.state);
}

/** The live sessions, newest first (the sidebar's cards). */
export function liveSessions(sessions: readonly SessionView[]): SessionView[] {
  return displayOrder(sessions.filter(isLive));
}

/** The ended sessions, the one that ended last first (the history). */
export function endedSessions(sessions: readonly SessionView[]): SessionView[] {
  const endedAt = (view: SessionView) => view.stopped_at ?? view.created_at;
  return sessions.filter(isFinal).sort((a, b) => endedAt(b) - endedAt(a));
}

/**
 * The start's current stage, from its latest progress line: "[   2.1s]
 * connect: waiting for the kernel" -> "connect: waiting for the kernel (2.1s)";
 * null when there is none (a session started elsewhere, or not starting;
 * `always`: a running one's too, the stages of its switch).
 */
export function progressText(view: SessionView, always = false): string | null {
  if (!(always || isStarting(view)) || !view.progress?.length) {
    return null;
  }
  const line = view.progress[view.progress.length - 1]!;
  const match = /^\[\s*([\d.]+s)\]\s*(.*)$/.exec(line);
  return match ? `${match[2]} (${match[1]})` : line;
}

/** How the session ended and what it cost: "stopped by ... · $0.0123". */
/**
 * When a history row's session started (or was asked for, when it never
 * started), local time: "2026-12-01 19:07".
 */
export function startedWhen(view: SessionView): string {
  const at = new Date((view.started_at ?? view.created_at) * 1000);
  const two = (n: number) => String(n).padStart(2, '0');
  return (
    `${at.getFullYear()}-${two(at.getMonth() + 1)}-${two(at.getDate())} ` +
    `${two(at.getHours())}:${two(at.getMinutes())}`
  );
}

export function endedText(view: SessionView): string {
  return view.ended || view.error || view.stop_reason?.text || view.state;
}

/**
 * The live session a kernel (a notebook's, a console's) uses: the one it
 * took up last (started, or `%gpu use`), else the newest it started;
 * undefined when it uses none.
 */
export function sessionOfKernel(
  sessions: readonly SessionView[],
  kernelId: string | null | undefined
): SessionView | undefined {
  if (!kernelId) {
    return undefined;
  }
  const taken = (s: SessionView) => s.kernels?.[kernelId] ?? (s.kernel_id === kernelId ? s.created_at : null);
  const used = displayOrder(sessions.filter(s => isLive(s) && taken(s) !== null));
  return used.sort((a, b) => (taken(b) ?? 0) - (taken(a) ?? 0))[0];
}

/**
 * The idle countdown, kept between replies: a reply without a fresh word
 * from the agent (`remaining_s` null) keeps counting down from the last
 * deadline seen, rather than showing a dash or the whole timeout again.
 */
export class IdleCountdown {
  /** Take a remaining time seen at `atMs` (browser ms); null is ignored. */
  see(remainingS: number | null | undefined, atMs: number): void {
    if (remainingS !== null && remainingS !== undefined && Number.isFinite(remainingS)) {
      this._deadlineMs = atMs + remainingS * 1000;
    }
  }

  /** Seconds left at `nowMs`, or null when no deadline was seen yet. */
  remaining(nowMs: number): number | null {
    return this._deadlineMs === null ? null : Math.max(0, (this._deadlineMs - nowMs) / 1000);
  }

  /**
   * The card's idle stop: "-" once ended, "off" without an idle timeout,
   * else the countdown (the whole timeout until a deadline was seen).
   */
  text(view: SessionView, nowMs: number): string {
    if (isFinal(view)) {
      return '-';
    }
    if (view.idle.timeout_s === null) {
      this._deadlineMs = null;
      return formatDuration(null);
    }
    return formatDuration(this.remaining(nowMs) ?? view.idle.timeout_s);
  }

  private _deadlineMs: number | null = null;
}

/**
 * The status bar's text: "t4 × 1 · $0.0123 · stops in 29m41s" (when its idle
 * stop comes, as `%gpu status` says it), or the state while not running.
 */
export function statusText(view: SessionView, idle: string): string {
  const parts = [`${view.gpu_type} × ${view.gpu_count}`, formatMoney(view.cost_so_far)];
  if (view.state !== 'running') {
    parts.push(view.state);
  } else if (view.idle.timeout_s !== null) {
    parts.push(`stops in ${idle}`);
  }
  return parts.join(' · ');
}

/**
 * The no-GPU note, short: "no NVIDIA GPU visible" (the driver's detail goes
 * into the tooltip), so that every card does not repeat a long error.
 */
export function noGpuNote(message: string | null): { text: string; detail: string } {
  const full = message || 'no NVIDIA GPU visible';
  const cut = full.indexOf(' (');
  return cut > 0 && full.endsWith(')')
    ? { text: full.slice(0, cut), detail: full.slice(cut + 2, -1) }
    : { text: full, detail: '' };
}
