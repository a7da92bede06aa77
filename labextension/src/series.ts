/**
 * The numbers behind the charts, without a DOM: the stats window kept in
 * memory, one GPU's series, and a series as SVG polyline points.
 */
import type { GpuSample, Sample } from './types';

/** How much stats history the charts show, in seconds. */
export const STATS_WINDOW_S = 300;

/** Width and height of a chart's SVG coordinate system; the CSS sets the size. */
export const VIEW_W = 100;
export const VIEW_H = 30;

/** One point of a series: unix seconds and a value. */
export interface Point {
  t: number;
  v: number;
}

/** What a chart shows at one update. */
export interface ChartData {
  points: readonly Point[];
  /** Right edge of the time axis, unix seconds. */
  tEnd: number;
  /** Width of the time axis, seconds. */
  windowS: number;
  /** Top of the value axis (values are clipped to it). */
  max: number;
  /** Latest value as text, e.g. "57%". */
  valueText: string;
  /** Latest value as a plain number, for tests and tooltips. */
  value: number | null;
}

/**
 * Append the samples newer than what we have and drop those older than the
 * window, measured from the newest sample so that a browser clock that
 * differs from the server's does not empty the charts.
 */
export function appendSamples(
  current: readonly Sample[],
  incoming: readonly Sample[],
  windowS: number = STATS_WINDOW_S
): readonly Sample[] {
  const lastT = current.length ? current[current.length - 1]!.t : -Infinity;
  const fresh = incoming.filter(s => s.t > lastT);
  if (!fresh.length) {
    return current;
  }
  const merged = current.concat(fresh);
  const cutoff = merged[merged.length - 1]!.t - windowS;
  const firstKept = merged.findIndex(s => s.t >= cutoff);
  return firstKept > 0 ? merged.slice(firstKept) : merged;
}

/** The samples of the GPU with this index, oldest first (skipping samples without it). */
export function gpuSeries(
  samples: readonly Sample[],
  index: number
): { t: number; gpu: GpuSample }[] {
  const series: { t: number; gpu: GpuSample }[] = [];
  for (const sample of samples) {
    const gpu = sample.gpus.find(g => g.index === index);
    if (gpu) {
      series.push({ t: sample.t, gpu });
    }
  }
  return series;
}

/** The `points` attribute of the polyline, in view-box coordinates. */
export function polylinePoints(data: ChartData): string {
  const tStart = data.tEnd - data.windowS;
  const max = data.max > 0 ? data.max : 1;
  const coords: string[] = [];
  for (const { t, v } of data.points) {
    if (t < tStart || !Number.isFinite(v)) {
      continue;
    }
    const x = ((t - tStart) / data.windowS) * VIEW_W;
    const clipped = Math.min(Math.max(v, 0), max);
    const y = VIEW_H - (clipped / max) * VIEW_H;
    coords.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  }
  return coords.join(' ');
}
