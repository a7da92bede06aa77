/**
 * The stats part of a session card: four live charts per GPU, or why there
 * are none.
 */
import { Sparkline } from './chart';
import { control, element, setClass, showText } from './dom';
import type { SessionStatsModel } from './model';
import { chartedMetrics, chartSpan, gpuFrame, hostSeries, metricCharts } from './series';
import { noGpuNote } from './sessions';
import type { GpuSample, MetricView, Sample } from './types';

/** A sparkline per drawn metric of a scope, in the table's order. */
class Sparklines {
  /** @param prefix - of each chart's class: "gpusession-gpu-" + "util". */
  constructor(metrics: readonly MetricView[], prefix: string) {
    this.metrics = metrics;
    this.node = element('div', 'gpusession-gpu-charts');
    for (const metric of metrics) {
      const chart = new Sparkline(`${prefix}${metric.key}`, metric.short);
      this._charts.set(metric.key, chart);
      this.node.appendChild(chart.node);
    }
  }

  readonly metrics: readonly MetricView[];
  readonly node: HTMLDivElement;

  update(series: readonly { t: number; item: GpuSample | Sample }[], windowS: number): void {
    for (const { metric, data } of metricCharts(series, this.metrics, windowS)) {
      this._charts.get(metric.key)?.update(data);
    }
  }

  private readonly _charts = new Map<string, Sparkline>();
}

/** The charts of one GPU. */
class GpuRow {
  constructor(index: number, metrics: readonly MetricView[]) {
    this.node = element('div', 'gpusession-gpu');
    this.node.dataset.gpuIndex = String(index);
    this._title = element('div', 'gpusession-gpu-title');
    this._charts = new Sparklines(chartedMetrics(metrics, 'gpu'), 'gpusession-gpu-');
    this.node.append(this._title, this._charts.node);
  }

  readonly node: HTMLDivElement;

  update(index: number, samples: readonly Sample[], windowS: number): void {
    const frame = gpuFrame(samples, index);
    if (!frame) {
      return;
    }
    if (this._title.textContent !== frame.title) {
      this._title.textContent = frame.title;
      this._title.title = frame.tooltip;
    }
    this._charts.update(frame.series, windowS);
  }

  private readonly _title: HTMLDivElement;
  private readonly _charts: Sparklines;
}

/** The session's own CPU and memory (there with or without a GPU). */
class HostRow {
  constructor(metrics: readonly MetricView[]) {
    this.node = element('div', 'gpusession-host');
    this._charts = new Sparklines(chartedMetrics(metrics, 'host'), 'gpusession-');
    this.node.append(this._charts.node);
  }

  readonly node: HTMLDivElement;

  update(samples: readonly Sample[], windowS: number): void {
    this._charts.update(hostSeries(samples), windowS);
  }

  private readonly _charts: Sparklines;
}

/** Charts of every GPU of a session and of its CPU and memory, plus notes. */
export class GpuStatsView {
  constructor(windowS: number) {
    this._windowS = windowS;
    this.node = element('div', 'gpusession-gpus');
    this._note = element('div', 'gpusession-stats-note');
    this._rows = element('div', 'gpusession-gpu-rows');
    this._source.textContent = 'recorded';
    this._source.title = RECORDED_TITLE;
    this._source.hidden = true;
    this.node.append(this._source, this._note, this._rows);
  }

  readonly node: HTMLDivElement;

  update(stats: SessionStatsModel): void {
    const samples = stats.samples;
    const latest = samples[samples.length - 1];
    let note = '';
    let noteClass = '';
    let detail = '';
    if (stats.error) {
      note = `Stats unavailable: ${stats.error}`;
      noteClass = 'gpusession-stats-error';
    } else if (stats.loaded && !stats.gpusVisible) {
      ({ text: note, detail } = noGpuNote(stats.message));
      noteClass = 'gpusession-no-gpu';
    } else if (!latest || !stats.metrics) {
      note = stats.loaded
        ? stats.message || 'Waiting for the first stats…'
        : 'Loading stats…';
      noteClass = 'gpusession-stats-waiting';
    }
    this._setNote(note, noteClass, detail);
    this._source.hidden = stats.source !== 'recorded';
    const elsewhere = stats.recording?.of_this_type === false;
    this._source.textContent = elsewhere ? 'recorded elsewhere' : 'recorded';
    this._source.title = elsewhere && stats.source_text ? stats.source_text : RECORDED_TITLE;

    const metrics = stats.metrics;
    if (!metrics) {
      return;
    }
    if (!this._host) {
      this._host = new HostRow(metrics);
      this.node.appendChild(this._host.node);
    }
    const gpus = stats.gpusVisible && latest ? latest.gpus : [];
    const span = chartSpan(samples, this._windowS);
    this._syncRows(gpus.map(g => g.index), metrics);
    for (const gpu of gpus) {
      this._rowsByIndex.get(gpu.index)?.update(gpu.index, samples, span);
    }
    this._host.node.hidden = !latest;
    this._host.update(samples, span);
  }

  private _setNote(text: string, className: string, detail: string): void {
    setClass(this._note, `gpusession-stats-note ${className}`.trim());
    showText(this._note, text || null);
    if (this._note.title !== detail) {
      this._note.title = detail;
    }
  }

  /** Keep one row per GPU index, creating and removing only what changed. */
  private _syncRows(indices: number[], metrics: readonly MetricView[]): void {
    const wanted = new Set(indices);
    for (const [index, row] of this._rowsByIndex) {
      if (!wanted.has(index)) {
        row.node.remove();
        this._rowsByIndex.delete(index);
      }
    }
    for (const index of indices) {
      if (!this._rowsByIndex.has(index)) {
        const row = new GpuRow(index, metrics);
        this._rowsByIndex.set(index, row);
        this._rows.appendChild(row.node);
      }
    }
  }

  private readonly _windowS: number;
  private readonly _note: HTMLDivElement;
  private readonly _rows: HTMLDivElement;
  private readonly _rowsByIndex = new Map<number, GpuRow>();
  /** Made once the metric table has come (with the first stats). */
  private _host: HostRow | null = null;
  private readonly _source = control('span', 'gpusession-recorded');
}

/** What the "recorded" badge means. */
export const RECORDED_TITLE =
  'Replayed GPU values recorded from a real driver (the agent runs with --nvml-replay): ' +
  'not the GPUs of this session';
