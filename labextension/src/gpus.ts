/**
 * The stats part of a session card: four live charts per GPU, or why there
 * are none.
 */
import { Sparkline } from './chart';
import { control, element, setClass, showText } from './dom';
import { formatBytes, formatMemory } from './format';
import type { SessionStatsModel } from './model';
import { chartSpan, cpuScale, gpuFrame, valueText } from './series';
import { noGpuNote } from './sessions';
import type { Sample } from './types';

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
    const frame = gpuFrame(samples, index);
    if (!frame) {
      return;
    }
    const { gpu, tEnd, memoryTotal, powerLimit } = frame;
    if (this._title.textContent !== frame.title) {
      this._title.textContent = frame.title;
      this._title.title = frame.tooltip;
    }
    const base = { tEnd, windowS };
    this._util.update({
      ...base,
      points: frame.util,
      max: 100,
      valueText: valueText(gpu.utilization, v => `${Math.round(v)}%`),
      value: gpu.utilization
    });
    this._memory.update({
      ...base,
      points: frame.memory,
      max: memoryTotal ?? 0,
      valueText: valueText(gpu.memory_used, v => formatMemory(v, memoryTotal ?? 0)),
      value: gpu.memory_used
    });
    this._temperature.update({
      ...base,
      points: frame.temperature,
      max: 100,
      valueText: valueText(gpu.temperature, v => `${Math.round(v)}°C`),
      value: gpu.temperature
    });
    this._power.update({
      ...base,
      points: frame.power,
      max: powerLimit ?? 0,
      valueText: valueText(
        gpu.power_draw,
        v => `${Math.round(v)}/${valueText(powerLimit, l => String(Math.round(l)))} W`
      ),
      value: gpu.power_draw
    });
  }

  private readonly _title: HTMLDivElement;
  private readonly _util = new Sparkline('gpusession-gpu-util', 'Util');
  private readonly _memory = new Sparkline('gpusession-gpu-memory', 'Mem');
  private readonly _temperature = new Sparkline('gpusession-gpu-temp', 'Temp');
  private readonly _power = new Sparkline('gpusession-gpu-power', 'Power');
}

/** The session's own CPU and memory (there with or without a GPU). */
class HostRow {
  constructor() {
    this.node = element('div', 'gpusession-host');
    const charts = element('div', 'gpusession-gpu-charts');
    charts.append(this._cpu.node, this._ram.node);
    this.node.append(charts);
  }

  readonly node: HTMLDivElement;

  update(samples: readonly Sample[], windowS: number): void {
    const latest = samples[samples.length - 1];
    if (!latest) {
      return;
    }
    const tEnd = latest.t;
    const cpu = samples
      .filter(s => s.cpu_percent !== null)
      .map(s => ({ t: s.t, v: s.cpu_percent as number }));
    const cpuNow = latest.cpu_percent;
    this._cpu.update({
      points: cpu,
      tEnd,
      windowS,
      max: cpuScale(cpu.map(p => p.v)),
      valueText: cpuNow === null ? 'n/a' : `${Math.round(cpuNow)}%`,
      value: cpuNow
    });
    const ram = samples
      .filter(s => s.memory_used !== null)
      .map(s => ({ t: s.t, v: s.memory_used as number }));
    const { memory_used: used, memory_total: total } = latest;
    this._ram.update({
      points: ram,
      tEnd,
      windowS,
      max: total ?? Math.max(1, ...ram.map(p => p.v)),
      valueText: used === null ? 'n/a' : formatBytes(used),
      value: used
    });
  }

  private readonly _cpu = new Sparkline('gpusession-cpu', 'CPU');
  private readonly _ram = new Sparkline('gpusession-ram', 'RAM');
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
    this.node.append(this._source, this._note, this._rows, this._host.node);
    this._host.node.hidden = true;
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
    } else if (!latest) {
      note = stats.loaded
        ? stats.message || 'Waiting for the first stats…'
        : 'Loading stats…';
      noteClass = 'gpusession-stats-waiting';
    }
    this._setNote(note, noteClass, detail);
    this._source.hidden = stats.source !== 'recorded';

    const gpus = stats.gpusVisible && latest ? latest.gpus : [];
    const span = chartSpan(samples, this._windowS);
    this._syncRows(gpus.map(g => g.index));
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
  private readonly _host = new HostRow();
  private readonly _source = control('span', 'gpusession-recorded');
}

/** What the "recorded" badge means. */
export const RECORDED_TITLE =
  'Replayed GPU values recorded from a real driver (the agent runs with --nvml-replay): ' +
  'not the GPUs of this session';
