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

/**
 * The `points` attribute of the polyline, in view-box coordinates (`width`
 * by `height`; a small chart's by default).
 */
export function polylinePoints(
  data: ChartData,
  width: number = VIEW_W,
  height: number = VIEW_H
): string {
  const tStart = data.tEnd - data.windowS;
  const max = data.max > 0 ? data.max : 1;
  const coords: string[] = [];
  for (const { t, v } of data.points) {
    if (t < tStart || !Number.isFinite(v)) {
      continue;
    }
    const x = ((t - tStart) / data.windowS) * width;
    const clipped = Math.min(Math.max(v, 0), max);
    const y = height - (clipped / max) * height;
    coords.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  }
  return coords.join(' ');
}

/**
 * The `points` of the area under a polyline (closed along the bottom), or
 * "" for fewer than two points.
 */
export function areaPoints(line: string, height: number): string {
  const coords = line ? line.split(' ') : [];
  if (coords.length < 2) {
    return '';
  }
  const x = (coord: string) => coord.split(',')[0];
  return `${x(coords[0]!)},${height} ${line} ${x(coords[coords.length - 1]!)},${height}`;
}

/** The top of a CPU chart: 100% of one core, or more while several are busy. */
export function cpuScale(values: readonly number[]): number {
  return Math.max(100, Math.ceil(Math.max(0, ...values) / 100) * 100);
}

/** One GPU's values over time, the samples without that value left out. */
export function gpuPoints(
  series: readonly { t: number; gpu: GpuSample }[],
  pick: (gpu: GpuSample) => number | null
): Point[] {
  const points: Point[] = [];
  for (const { t, gpu } of series) {
    const v = pick(gpu);
    if (v !== null && Number.isFinite(v)) {
      points.push({ t, v });
    }
  }
  return points;
}

/** A value as text, or "n/a" where the board does not report it. */
export function valueText(value: number | null | undefined, text: (v: number) => string): string {
  return value === null || value === undefined || !Number.isFinite(value) ? 'n/a' : text(value);
}

/**
 * "GPU 0 · Tesla T4"; a GPU NVML could not read says why, after the name it
 * had in an earlier sample: "GPU 1 · Tesla T4 · GpuIsLost".
 */
export function gpuTitle(series: readonly { gpu: GpuSample }[]): string {
  const latest = series[series.length - 1]?.gpu;
  if (!latest) {
    return '';
  }
  let name = latest.name;
  for (let i = series.length - 1; name === null && i >= 0; i--) {
    name = series[i]!.gpu.name;
  }
  const parts = [`GPU ${latest.index}`, name ?? 'unknown'];
  if (latest.error) {
    parts.push(latest.error.split(':')[0]!.replace('NVMLError_', ''));
  }
  return parts.join(' · ');
}

/**
 * The time axis of a small chart: the window, or less while the session is
 * younger (at least a minute), so that a new session's chart is not a dot at
 * the right edge.
 */
export function chartSpan(samples: readonly { t: number }[], windowS: number): number {
  const first = samples[0];
  const last = samples[samples.length - 1];
  if (!first || !last) {
    return windowS;
  }
  return Math.min(windowS, Math.max(60, Math.ceil(last.t - first.t)));
}

/** The latest value a GPU reported (a scale's top: memory total, power limit), or null. */
export function lastKnown(
  series: readonly { gpu: GpuSample }[],
  pick: (gpu: GpuSample) => number | null
): number | null {
  for (let i = series.length - 1; i >= 0; i--) {
    const value = pick(series[i]!.gpu);
    if (value !== null && Number.isFinite(value)) {
      return value;
    }
  }
  return null;
}

/** What both the sidebar's and the main area's charts of one GPU draw. */
export interface GpuFrame {
  gpu: GpuSample;
  tEnd: number;
  /** "GPU 0 · Tesla T4", and what NVML said when it could not read the board. */
  title: string;
  tooltip: string;
  memoryTotal: number | null;
  powerLimit: number | null;
  util: Point[];
  memory: Point[];
  temperature: Point[];
  power: Point[];
}

/** One GPU's latest sample and series, or null before its first sample. */
export function gpuFrame(samples: readonly Sample[], index: number): GpuFrame | null {
  const series = gpuSeries(samples, index);
  const latest = series[series.length - 1];
  if (!latest) {
    return null;
  }
  const { gpu } = latest;
  return {
    gpu,
    tEnd: latest.t,
    title: gpuTitle(series),
    tooltip: gpu.error ?? gpu.uuid ?? '',
    memoryTotal: lastKnown(series, g => g.memory_total),
    powerLimit: lastKnown(series, g => g.power_limit),
    util: gpuPoints(series, g => g.utilization),
    memory: gpuPoints(series, g => g.memory_used),
    temperature: gpuPoints(series, g => g.temperature),
    power: gpuPoints(series, g => g.power_draw)
  };
}
