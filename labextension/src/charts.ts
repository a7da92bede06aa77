/**
 * The main-area view of one session's history, like nvdashboard's but for a
 * remote GPU: large charts per GPU (utilization, memory, temperature,
 * power) and of the session's CPU and memory, over 5 minutes to an hour.
 */
import { Message } from '@lumino/messaging';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { BigChart } from './bigchart';
import { control, element, message, setText, showText } from './dom';
import { RECORDED_TITLE } from './gpus';
import { gpuIcon } from './icon';
import { SessionListModel, SessionStatsModel } from './model';
import { chartedMetrics, gpuFrame, hostSeries, metricCharts } from './series';
import { endedText, kindText, noGpuNote } from './sessions';
import type { GpuSample, MetricView, Sample, SessionView } from './types';

export const CHARTS_ID = 'gpusession-charts';
/** The agent keeps an hour of samples: the widest window. */
export const HISTORY_WINDOW_S = 3600;
/** The windows to choose from, in seconds. */
export const WINDOWS_S: readonly number[] = [300, 900, 3600];

/** A large chart per drawn metric of a scope, in the table's order. */
class BigCharts {
  constructor(metrics: readonly MetricView[]) {
    this.metrics = metrics;
    this.node = element('div', 'gpusession-charts-grid');
    for (const metric of metrics) {
      const chart = new BigChart(metric.key, metric.label);
      this._charts.set(metric.key, chart);
      this.node.appendChild(chart.node);
    }
  }

  readonly metrics: readonly MetricView[];
  readonly node: HTMLDivElement;

  update(series: readonly { t: number; item: GpuSample | Sample }[], windowS: number): void {
    for (const { metric, data, topText } of metricCharts(series, this.metrics, windowS)) {
      this._charts.get(metric.key)?.update(data, topText);
    }
  }

  private readonly _charts = new Map<string, BigChart>();
}

/** The charts of one GPU. */
class GpuCharts {
  constructor(index: number, metrics: readonly MetricView[]) {
    this.node = element('section', 'gpusession-charts-gpu');
    this.node.dataset.gpuIndex = String(index);
    this._charts = new BigCharts(chartedMetrics(metrics, 'gpu'));
    this.node.append(this._title, this._charts.node);
  }

  readonly node: HTMLElement;

  update(index: number, samples: readonly Sample[], windowS: number): void {
    const frame = gpuFrame(samples, index);
    if (!frame) {
      return;
    }
    setText(this._title, frame.title);
    this._title.title = frame.tooltip;
    this._charts.update(frame.series, windowS);
  }

  private readonly _title = element('h3', 'gpusession-charts-title');
  private readonly _charts: BigCharts;
}

/** The session's CPU and memory. */
class HostCharts {
  constructor(metrics: readonly MetricView[]) {
    this.node = element('section', 'gpusession-charts-host');
    const title = element('h3', 'gpusession-charts-title');
    title.textContent = 'Session processes';
    this._charts = new BigCharts(chartedMetrics(metrics, 'host'));
    this.node.append(title, this._charts.node);
  }

  readonly node: HTMLElement;

  update(samples: readonly Sample[], windowS: number): void {
    this._charts.update(hostSeries(samples), windowS);
  }

  private readonly _charts: BigCharts;
}

export class GpuChartsView extends Widget {
  constructor(model: SessionListModel) {
    super();
    this.id = CHARTS_ID;
    this.addClass('gpusession-charts');
    this.node.dataset.testid = CHARTS_ID;
    this.title.label = 'GPU charts';
    this.title.caption = 'History charts of a GPU session';
    this.title.icon = gpuIcon;
    this.title.closable = true;
    this._model = model;

    const toolbar = element('div', 'gpusession-charts-toolbar');
    const sessionLabel = element('label', 'gpusession-charts-field');
    sessionLabel.append('Session ', this._sessionSelect);
    const windowLabel = element('label', 'gpusession-charts-field');
    windowLabel.append('Last ', this._windowSelect);
    for (const seconds of WINDOWS_S) {
      const entry = document.createElement('option');
      entry.value = String(seconds);
      entry.textContent = seconds >= 3600 ? `${seconds / 3600} hour` : `${seconds / 60} minutes`;
      this._windowSelect.appendChild(entry);
    }
    this._windowSelect.value = String(this._windowS);
    this._source.textContent = 'recorded';
    this._source.title = RECORDED_TITLE;
    this._source.hidden = true;
    toolbar.append(sessionLabel, windowLabel, this._source, this._kind);
    this.node.append(toolbar, this._note, this._gpuNote, this._gpus);

    this._sessionSelect.addEventListener('change', () => this.showSession(this._sessionSelect.value));
    this._windowSelect.addEventListener('change', () => {
      this._windowS = Number(this._windowSelect.value);
      this._draw();
    });
    model.changed.connect(this._onList, this);
    this._onList();
  }

  /** The session shown, or null. */
  get sessionId(): string | null {
    return this._sessionId;
  }

  /** Show this session's charts (null: the first running one). */
  showSession(id: string | null): void {
    const running = this._running();
    const wanted = id ?? this._sessionId ?? running[0]?.id ?? null;
    if (wanted === this._sessionId) {
      this._onList();
      return;
    }
    this._stats?.dispose();
    this._stats = null;
    this._sessionId = wanted;
    for (const charts of this._gpuCharts.values()) {
      charts.node.remove();
    }
    this._gpuCharts.clear();
    if (this._host) {
      this._host.node.hidden = true;
    }
    if (wanted) {
      this._stats = new SessionStatsModel(this._model.client, wanted, HISTORY_WINDOW_S);
      this._stats.changed.connect(this._draw, this);
      this._stats.wanted = this.isVisible;
    }
    this._onList();
    this._draw();
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._release?.();
    this._stats?.dispose();
    Signal.disconnectReceiver(this);
    super.dispose();
  }

  protected override onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._release ??= this._model.watch(false);
  }

  protected override onBeforeDetach(msg: Message): void {
    this._release?.();
    this._release = null;
    super.onBeforeDetach(msg);
  }

  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    if (this._stats) {
      this._stats.wanted = true;
    }
  }

  protected override onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    if (this._stats) {
      this._stats.wanted = false;
    }
  }

  private _running(): SessionView[] {
    return this._model.sessions.filter(s => s.state === 'running');
  }

  /** The session list changed: the choices, and whether ours still runs. */
  private _onList(): void {
    const running = this._running();
    const current = this._model.sessions.find(s => s.id === this._sessionId);
    const choices = [...running];
    if (current && !running.includes(current)) {
      choices.unshift(current);
    }
    const entries = choices.map(view => {
      const entry = document.createElement('option');
      entry.value = view.id;
      entry.textContent = `${view.name} (${view.gpu_type} × ${view.gpu_count}, ${view.backend})`;
      return entry;
    });
    const signature = choices.map(v => `${v.id}:${v.name}`).join('|');
    if (signature !== this._choices) {
      this._choices = signature;
      this._sessionSelect.replaceChildren(...entries);
    }
    this._sessionSelect.value = this._sessionId ?? '';
    this._sessionSelect.disabled = choices.length === 0;
    setText(this._kind, current ? kindText(current) : '');

    let note: string | null = null;
    if (!this._sessionId) {
      note = running.length ? null : 'No running GPU session: start one in the GPU sessions sidebar.';
      if (running.length) {
        this.showSession(running[0]!.id);
        return;
      }
    } else if (current && current.state !== 'running') {
      note = `Session ${current.name} is ${current.state}${current.ended ? `: ${endedText(current)}` : ''}.`;
      if (this._stats) {
        this._stats.wanted = false; // its agent is gone; keep the charts as they were
      }
    }
    showText(this._note, note);
  }

  private _draw(): void {
    const stats = this._stats;
    if (!stats) {
      showText(this._gpuNote, null);
      this._source.hidden = true;
      return;
    }
    const samples = stats.samples;
    const latest = samples[samples.length - 1];
    this._source.hidden = stats.source !== 'recorded';
    let note: string | null = null;
    if (stats.error) {
      note = `Stats unavailable: ${stats.error}`;
    } else if (stats.loaded && !stats.gpusVisible) {
      const { text, detail } = noGpuNote(stats.message);
      note = detail ? `${text} (${detail})` : text;
    } else if (!latest || !stats.metrics) {
      note = stats.loaded ? 'Waiting for the first stats…' : 'Loading stats…';
    }
    showText(this._gpuNote, note);
    const metrics = stats.metrics;
    if (!metrics) {
      return;
    }
    if (!this._host) {
      this._host = new HostCharts(metrics);
      this.node.appendChild(this._host.node);
    }
    const gpus = stats.gpusVisible && latest ? latest.gpus : [];
    const span = this._windowS; // the chosen window, data or not (the sidebar's fill their width)
    const indices = new Set(gpus.map(g => g.index));
    for (const [index, charts] of this._gpuCharts) {
      if (!indices.has(index)) {
        charts.node.remove();
        this._gpuCharts.delete(index);
      }
    }
    for (const gpu of gpus) {
      let charts = this._gpuCharts.get(gpu.index);
      if (!charts) {
        charts = new GpuCharts(gpu.index, metrics);
        this._gpuCharts.set(gpu.index, charts);
        this._gpus.appendChild(charts.node);
      }
      charts.update(gpu.index, samples, span);
    }
    this._host.node.hidden = !latest;
    this._host.update(samples, span);
  }

  private readonly _model: SessionListModel;
  private _stats: SessionStatsModel | null = null;
  private _sessionId: string | null = null;
  private _windowS = 900;
  private _choices = '';
  private _release: (() => void) | null = null;
  private readonly _sessionSelect = control('select', 'gpusession-charts-session');
  private readonly _windowSelect = control('select', 'gpusession-charts-window');
  private readonly _source = control('span', 'gpusession-recorded');
  private readonly _kind = element('span', 'gpusession-kind');
  private readonly _note = message('gpusession-charts-note');
  private readonly _gpuNote = message('gpusession-charts-gpu-note');
  private readonly _gpus = element('div', 'gpusession-charts-gpus');
  private readonly _gpuCharts = new Map<number, GpuCharts>();
  /** Made once the metric table has come (with the first stats). */
  private _host: HostCharts | null = null;
}
