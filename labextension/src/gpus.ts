/**
 * The stats part of a session card: four live charts per GPU, or why there
 * are none.
 */
import { Sparkline } from './chart';
import { element, setClass, showText } from './dom';
import { formatMemory } from './format';
import type { SessionStatsModel } from './model';
import { gpuSeries } from './series';
import type { GpuSample, Sample } from './types';

/** The charts of one GPU. */
class GpuRow {
  constructor(index: number) {
    this.node = element('div', 'gpusession-gpu');
    this.node.dataset.gpuIndex = String(index);
    this._title = element('div', 'gpusession-gpu-title');
    const charts = element('div', 'gpusession-gpu-charts');
    charts.append(
      this._util.node,
      this._memory.node,
      this._temperature.node,
      this._power.node
    );
    this.node.append(this._title, charts);
  }

  readonly node: HTMLDivElement;

  update(index: number, samples: readonly Sample[], windowS: number): void {
    const series = gpuSeries(samples, index);
    const latest = series[series.length - 1];
    if (!latest) {
      return;
    }
    const { gpu } = latest;
    const tEnd = latest.t;
    const title = `GPU ${gpu.index} · ${gpu.name}`;
    if (this._title.textContent !== title) {
      this._title.textContent = title;
      this._title.title = gpu.uuid;
    }
    const points = (pick: (g: GpuSample) => number) =>
      series.map(({ t, gpu: g }) => ({ t, v: pick(g) }));

    this._util.update({
      points: points(g => g.utilization),
      tEnd,
      windowS,
      max: 100,
      valueText: `${Math.round(gpu.utilization)}%`,
      value: gpu.utilization
    });
    this._memory.update({
      points: points(g => g.memory_used),
      tEnd,
      windowS,
      max: gpu.memory_total,
      valueText: formatMemory(gpu.memory_used, gpu.memory_total),
      value: gpu.memory_used
    });
    this._temperature.update({
      points: points(g => g.temperature),
      tEnd,
      windowS,
      max: 100,
      valueText: `${Math.round(gpu.temperature)}°C`,
      value: gpu.temperature
    });
    this._power.update({
      points: points(g => g.power_draw),
      tEnd,
      windowS,
      max: gpu.power_limit,
      valueText: `${Math.round(gpu.power_draw)}/${Math.round(gpu.power_limit)} W`,
      value: gpu.power_draw
    });
  }

  private readonly _title: HTMLDivElement;
  private readonly _util = new Sparkline('gpusession-gpu-util', 'Util');
  private readonly _memory = new Sparkline('gpusession-gpu-memory', 'Mem');
  private readonly _temperature = new Sparkline('gpusession-gpu-temp', 'Temp');
  private readonly _power = new Sparkline('gpusession-gpu-power', 'Power');
}

/** Charts of every GPU of a session, plus its no-GPU and error notes. */
export class GpuStatsView {
  constructor(windowS: number) {
    this._windowS = windowS;
    this.node = element('div', 'gpusession-gpus');
    this._note = element('div', 'gpusession-stats-note');
    this._rows = element('div', 'gpusession-gpu-rows');
    this.node.append(this._note, this._rows);
  }

  readonly node: HTMLDivElement;

  update(stats: SessionStatsModel): void {
    const samples = stats.samples;
    const latest = samples[samples.length - 1];
    let note = '';
    let noteClass = '';
    if (stats.error) {
      note = `Stats unavailable: ${stats.error}`;
      noteClass = 'gpusession-stats-error';
    } else if (stats.loaded && !stats.gpusVisible) {
      note = stats.message || 'No GPU visible in this session';
      noteClass = 'gpusession-no-gpu';
    } else if (!latest) {
      note = stats.loaded
        ? stats.message || 'Waiting for the first stats…'
        : 'Loading stats…';
      noteClass = 'gpusession-stats-waiting';
    }
    this._setNote(note, noteClass);

    const gpus = stats.gpusVisible && latest ? latest.gpus : [];
    this._syncRows(gpus.map(g => g.index));
    for (const gpu of gpus) {
      this._rowsByIndex.get(gpu.index)?.update(gpu.index, samples, this._windowS);
    }
  }

  private _setNote(text: string, className: string): void {
    setClass(this._note, `gpusession-stats-note ${className}`.trim());
    showText(this._note, text || null);
  }

  /** Keep one row per GPU index, creating and removing only what changed. */
  private _syncRows(indices: number[]): void {
    const wanted = new Set(indices);
    for (const [index, row] of this._rowsByIndex) {
      if (!wanted.has(index)) {
        row.node.remove();
        this._rowsByIndex.delete(index);
      }
    }
    for (const index of indices) {
      if (!this._rowsByIndex.has(index)) {
        const row = new GpuRow(index);
        this._rowsByIndex.set(index, row);
        this._rows.appendChild(row.node);
      }
    }
  }

  private readonly _windowS: number;
  private readonly _note: HTMLDivElement;
  private readonly _rows: HTMLDivElement;
  private readonly _rowsByIndex = new Map<number, GpuRow>();
}
