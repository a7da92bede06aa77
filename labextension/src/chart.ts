/**
 * A small live line chart: one SVG polyline, updated in place.
 */

import { setData, setText } from './dom';

const SVG_NS = 'http://www.w3.org/2000/svg';
/** Width and height of the SVG coordinate system; the CSS sets the size. */
const VIEW_W = 100;
const VIEW_H = 30;

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

export class Sparkline {
  /**
   * @param className - extra class of the root, e.g. `gpusession-gpu-util`;
   *   also used as its `data-testid`.
   * @param label - short caption, e.g. "Util".
   */
  constructor(className: string, label: string) {
    this.node = document.createElement('div');
    this.node.className = `gpusession-chart ${className}`;
    this.node.dataset.testid = className;

    const caption = document.createElement('div');
    caption.className = 'gpusession-chart-caption';
    const labelNode = document.createElement('span');
    labelNode.className = 'gpusession-chart-label';
    labelNode.textContent = label;
    this._valueNode = document.createElement('span');
    this._valueNode.className = 'gpusession-chart-value';
    caption.append(labelNode, this._valueNode);

    const svg = document.createElementNS(SVG_NS, 'svg');
    svg.setAttribute('viewBox', `0 0 ${VIEW_W} ${VIEW_H}`);
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('class', 'gpusession-chart-svg');
    this._line = document.createElementNS(SVG_NS, 'polyline');
    this._line.setAttribute('class', 'gpusession-chart-line');
    this._line.setAttribute('vector-effect', 'non-scaling-stroke');
    svg.appendChild(this._line);

    this.node.append(caption, svg);
  }

  readonly node: HTMLDivElement;

  update(data: ChartData): void {
    setText(this._valueNode, data.valueText);
    this._valueNode.title = data.valueText;
    setData(this.node, 'value', data.value === null ? '' : String(data.value));
    this._line.setAttribute('points', polylinePoints(data));
  }

  private readonly _valueNode: HTMLSpanElement;
  private readonly _line: SVGPolylineElement;
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
