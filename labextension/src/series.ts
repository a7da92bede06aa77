/**
 * The numbers behind the charts, without a DOM: the stats window kept in
 * memory, one GPU's series, and a series as SVG polyline points.
 */
import { formatMetric } from './format';
import type { GpuSample, MetricView, Sample } from './types';

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

/**
 * The top of a scale without a limit: `step`, or whole steps above while
 * values exceed it (CPU: 100% of one core, 200% while two are busy).
 */
export function scaleTop(step: number, values: readonly number[]): number {
  return Math.max(step, Math.ceil(Math.max(0, ...values) / step) * step);
}

/** A numeric field of a GPU or a sample by its name (a metric row's), or null. */
export function fieldValue(item: GpuSample | Sample, name: string | null): number | null {
  const value: unknown = name === null ? null : (item as unknown as Record<string, unknown>)[name];
  return typeof value === 'number' && Number.isFinite(value) ? value : null;
}

/** One field's values over time, the items without that value left out. */
export function fieldPoints(
  series: readonly { t: number; item: GpuSample | Sample }[],
  name: string
): Point[] {
  const points: Point[] = [];
  for (const { t, item } of series) {
    const v = fieldValue(item, name);
    if (v !== null) {
      points.push({ t, v });
    }
  }
  return points;
}

/**
 * "GPU 0 · Tesla T4"; a GPU NVML could not read says why, after the name it
 * had in an earlier sample: "GPU 1 · Tesla T4 · the GPU is lost: the driver no longer sees it".
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
    parts.push(latest.error_text ?? latest.error);
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

/** The latest value a field had (a scale's top: memory total, power limit), or null. */
export function lastKnown(
  series: readonly { item: GpuSample | Sample }[],
  name: string
): number | null {
  for (let i = series.length - 1; i >= 0; i--) {
    const value = fieldValue(series[i]!.item, name);
    if (value !== null) {
      return value;
    }
  }
  return null;
}

/** What a chart of one metric draws, for the sidebar's and the main area's alike. */
export interface MetricChart {
  metric: MetricView;
  data: ChartData;
  /** The top of the scale as text: "100%", "70 W", "15.0 GiB". */
  topText: string;
}

/**
 * The charts of one GPU or of the session's processes: one per drawn row of
 * the table (of the items' scope), from their samples, oldest first.
 */
export function metricCharts(
  series: readonly { t: number; item: GpuSample | Sample }[],
  metrics: readonly MetricView[],
  windowS: number
): MetricChart[] {
  const latest = series[series.length - 1];
  if (!latest) {
    return [];
  }
  return metrics
    .filter(metric => metric.charted)
    .map(metric => {
      const points = fieldPoints(series, metric.name);
      const limit = metric.limit === null ? null : lastKnown(series, metric.limit);
      const values = points.map(p => p.v);
      const max = limit ?? (metric.top ? scaleTop(metric.top, values) : Math.max(1, ...values));
      const value = fieldValue(latest.item, metric.name);
      const top = limit ?? (metric.top ? max : null);
      return {
        metric,
        data: {
          points,
          tEnd: latest.t,
          windowS,
          max,
          valueText:
            value === null && metric.name === 'utilization' && 'mig' in latest.item && latest.item.mig
              ? MIG_UTILIZATION
              : formatMetric(metric, value, limit),
          value
        },
        topText: formatMetric(metric, top)
      };
    });
}

/** A MIG slice's utilization: NVML reports none for a slice (never shown as 0). */
export const MIG_UTILIZATION = 'n/a (MIG)';

/** The drawn rows of a scope, in the table's order. */
export function chartedMetrics(metrics: readonly MetricView[], scope: MetricView['scope']): MetricView[] {
  return metrics.filter(metric => metric.scope === scope && metric.charted);
}

/** The samples as the series of the session's processes (`metricCharts`'s items). */
export function hostSeries(samples: readonly Sample[]): { t: number; item: Sample }[] {
  return samples.map(sample => ({ t: sample.t, item: sample }));
}

/** One GPU's title and series (`metricCharts`'s items), or null before its first sample. */
export function gpuFrame(
  samples: readonly Sample[],
  index: number
): { title: string; tooltip: string; series: { t: number; item: GpuSample }[] } | null {
  const series = gpuSeries(samples, index);
  const latest = series[series.length - 1];
  if (!latest) {
    return null;
  }
  return {
    title: gpuTitle(series),
    tooltip: latest.gpu.error_text ?? latest.gpu.uuid ?? '',
    series: series.map(({ t, gpu }) => ({ t, item: gpu }))
  };
}
