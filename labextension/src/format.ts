/**
 * Text formats shared by the cards and the start form.
 */

/** "1h 02m", "3m 05s", "42s"; "-" for null. */
export function formatDuration(seconds: number | null): string {
  if (seconds === null || !Number.isFinite(seconds)) {
    return '-';
  }
  const s = Math.max(0, Math.floor(seconds));
  const days = Math.floor(s / 86400);
  const hours = Math.floor((s % 86400) / 3600);
  const minutes = Math.floor((s % 3600) / 60);
  const secs = s % 60;
  if (days > 0) {
    return `${days}d ${pad(hours)}h`;
  }
  if (hours > 0) {
    return `${hours}h ${pad(minutes)}m`;
  }
  if (minutes > 0) {
    return `${minutes}m ${pad(secs)}s`;
  }
  return `${secs}s`;
}

/** US dollars: cents above $1, four decimals below so small costs move. */
export function formatDollars(amount: number): string {
  if (!Number.isFinite(amount)) {
    return '-';
  }
  const digits = Math.abs(amount) >= 1 ? 2 : 4;
  return `$${amount.toFixed(digits)}`;
}

/** "$0.526/h" */
export function formatRate(perHour: number): string {
  return `$${perHour.toFixed(3)}/h`;
}

/** Used and total bytes as "5.1/16 GiB" (short enough for a narrow sidebar). */
export function formatMemory(used: number, total: number): string {
  const gib = 2 ** 30;
  const totalGiB = total / gib;
  return `${(used / gib).toFixed(1)}/${totalGiB.toFixed(totalGiB >= 10 ? 0 : 1)} GiB`;
}

/**
 * Whether a duration typed by the user looks like what the server accepts:
 * a number with an optional unit s, m, h or d ("30m", "1.5h", "0").
 */
export function isDuration(text: string): boolean {
  return /^\d+(\.\d+)?\s*[smhd]?$/i.test(text.trim());
}

function pad(n: number): string {
  return n < 10 ? `0${n}` : String(n);
}
