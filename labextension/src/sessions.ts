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

/** "T4 × 2 · docker · spot · ssh://gpu-box" */
export function kindText(view: SessionView): string {
  const kind = [`${view.gpu_type} × ${view.gpu_count}`, view.backend];
  if (view.spot) {
    kind.push('spot');
  }
  if (view.host) {
    kind.push(view.host);
  }
  return kind.join(' · ');
}

/** "$0.5260/h" */
export function rateText(view: SessionView): string {
  return formatRate(view.price_per_hour);
}

/** "$0.1234", or "$0.1234 of $5.00" with a cost cap. */
export function costText(view: SessionView): string {
  const cost = formatMoney(view.cost_so_far);
  return view.max_cost ? `${cost} of ${formatMoney(view.max_cost)}` : cost;
}

/**
 * The idle stop: the bare countdown ("29m59s": short, so that the facts grid
 * never clips it), "off" without an idle timeout, "-" once the session ended.
 */
export function idleText(view: SessionView): string {
  if (isFinal(view)) {
    return '-';
  }
  const { timeout_s, remaining_s } = view.idle;
  if (timeout_s === null) {
    return formatDuration(null);
  }
  return formatDuration(remaining_s ?? timeout_s);
}
