/**
 * Text formats of durations, money and metrics.
 *
 * `formatDuration` and `formatMoney` follow `format_duration` and
 * `format_money` of `gpusession/core/durations.py` to the character, so that the
 * sidebar and the notebook print the same numbers the same way;
 * `tests/data/format_cases.json` (written by the Python functions) holds both
 * to that. Python rounds half to even on the exact binary value of a float,
 * where JavaScript's `Math.round` and `toFixed` round half up: the helpers
 * below make up the difference.
 */
import type { MetricView } from './types';

/**
 * Python's `format_duration`: "off" for null, else whole seconds (rounded
 * half to even, clamped at 0) as "1h05m", "3m09s" or "42s". Hours do not
 * roll over into days ("26h00m").
 */
export function formatDuration(seconds: number | null): string {
  if (seconds === null) {
    return 'off';
  }
  if (!Number.isFinite(seconds)) {
    return '-'; // Python raises here; a panel shows a dash instead
  }
  const total = Math.max(0, roundHalfEven(seconds));
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = total % 60;
  if (h) {
    return `${h}h${pad2(m)}m`;
  }
  if (m) {
    return `${m}m${pad2(s)}s`;
  }
  return `${s}s`;
}

/**
 * Python's `format_money`: US dollars with four decimals below $1 (so that a
 * small cost visibly moves: "$0.5260"), else two, with thousands separators
 * ("$1,234.50"). A negative amount reads "$-0.5000", as in Python.
 */
export function formatMoney(dollars: number): string {
  if (Number.isNaN(dollars)) {
    return '$nan';
  }
  if (!Number.isFinite(dollars)) {
    return dollars > 0 ? '$inf' : '$-inf';
  }
  return `$${formatFixed(dollars, dollars < 1 ? 4 : 2)}`;
}

/** A price per hour: "$0.5260/h" (as the notebook prints it). */
export function formatRate(perHour: number): string {
  return `${formatMoney(perHour)}/h`;
}

/**
 * A metric's value as `gpusession.configuration.metrics.metric_text` prints it, with the
 * row of the table the server sent: "57%", "70 °C", "67/70 W" (against its
 * limit when known), "10.2/15.0 GiB", "76 MiB/23.5 GiB"; "n/a" when the
 * board does not report it.
 */
export function formatMetric(metric: MetricView, value: number | null, limit: number | null = null): string {
  if (value === null || !Number.isFinite(value)) {
    return 'n/a';
  }
  const [number, unit] = metricNumber(metric, value);
  if (limit === null || !Number.isFinite(limit)) {
    return withUnit(number, unit);
  }
  const [top, topUnit] = metricNumber(metric, limit);
  return topUnit === unit
    ? withUnit(`${number}/${top}`, unit)
    : `${withUnit(number, unit)}/${withUnit(top, topUnit)}`;
}

/** The number and unit one value is shown in: ["67", "W"], ["76", "MiB"]. */
function metricNumber(metric: MetricView, raw: number): [string, string] {
  if (metric.format === 'bytes' && Math.abs(raw) < 2 ** 30) {
    return [formatFixed(raw / 2 ** 20, 0).replace(/,/g, ''), 'MiB'];
  }
  return [formatFixed(raw / metric.scale, metric.digits).replace(/,/g, ''), metric.unit];
}

function withUnit(number: string, unit: string): string {
  return unit === '%' ? `${number}%` : `${number} ${unit}`;
}

/**
 * Python's `round(x)` for a finite number: to the nearest integer, ties to
 * the even one (`round(2.5) == 2`, `round(59.5) == 60`).
 */
export function roundHalfEven(x: number): number {
  const floor = Math.floor(x);
  const diff = x - floor; // exact for every finite double
  if (diff > 0.5) {
    return floor + 1;
  }
  if (diff < 0.5) {
    return floor;
  }
  return floor % 2 === 0 ? floor : floor + 1;
}

/**
 * Python's `f"{x:,.{digits}f}"` for a finite number: the exact binary value
 * rounded half to even, thousands separated by commas, "-" kept on -0.
 */
export function formatFixed(x: number, digits: number): string {
  const negative = x < 0 || Object.is(x, -0);
  const [whole, fraction] = fixedDigits(Math.abs(x), digits);
  const grouped = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  return `${negative ? '-' : ''}${grouped}${fraction ? '.' + fraction : ''}`;
}

/** Integer and fraction digits of `x >= 0` to `digits` places, ties to even. */
function fixedDigits(x: number, digits: number): [string, string] {
  if (x >= 1e21) {
    // toFixed switches to exponent form here; such a double is an integer.
    return [BigInt(x).toString(), '0'.repeat(digits)];
  }
  let text = x.toFixed(digits);
  // toFixed breaks an exact tie upwards. The exact decimal value of a double
  // that can be a tie at `digits` places has at most 100 decimals (x >= 1e-15
  // here), so toFixed(100) shows whether it is one.
  const exact = x.toFixed(100);
  const point = exact.indexOf('.');
  const cut = point + 1 + digits;
  if (exact[cut] === '5' && /^0*$/.test(exact.slice(cut + 1))) {
    const truncated = exact.slice(0, digits ? cut : point);
    const lastDigit = Number(truncated[truncated.length - 1]);
    if (lastDigit % 2 === 0) {
      text = truncated;
    }
  }
  const [whole = '0', fraction = ''] = text.split('.');
  return [whole, fraction];
}

function pad2(n: number): string {
  return n < 10 ? `0${n}` : String(n);
}

/**
 * A spend report row's cells as `gpusession report` prints them
 * (gpusession/words/spend.py `_report_row`): sessions, GPU-hours "12.50",
 * cost, mean utilization "41%" or "n/a", idle cost, could save.
 */
export function reportCells(row: {
  sessions: number;
  gpu_hours: number;
  cost: number;
  mean_utilization: number | null;
  idle_cost: number;
  could_save: number;
}): string[] {
  const mean = row.mean_utilization;
  return [
    String(row.sessions),
    formatFixed(row.gpu_hours, 2).replace(/,/g, ''),
    formatMoney(row.cost),
    mean === null ? 'n/a' : `${formatFixed(mean, 0).replace(/,/g, '')}%`,
    formatMoney(row.idle_cost),
    formatMoney(row.could_save)
  ];
}
