/**
 * A large history chart of the main-area charts view: an SVG line over a
 * shaded area, grid lines, the scale beside the plot (its top and 0, never
 * over the data) and the time axis of the chosen window.
 */
import { element, setData, setText } from './dom';
import { areaPoints, type ChartData, polylinePoints } from './series';

const SVG_NS = 'http://www.w3.org/2000/svg';
/** The chart's SVG coordinate system; the CSS sets the size. */
const W = 600;
const H = 150;

export class BigChart {
  /**
   * @param metric - what it shows, also `data-metric`: "util", "memory", ...
   * @param label - its caption, e.g. "Utilization".
   */
  constructor(metric: string, label: string) {
    this.node = element('div', 'gpusession-bigchart');
    this.node.dataset.metric = metric;
    this.node.dataset.testid = 'gpusession-bigchart';

    const header = element('div', 'gpusession-bigchart-header');
    const caption = element('span', 'gpusession-bigchart-label');
    caption.textContent = label;
    header.append(caption, this._value);

    const plot = element('div', 'gpusession-bigchart-plot');
    const svg = document.createElementNS(SVG_NS, 'svg');
    svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('class', 'gpusession-bigchart-svg');
    for (const y of [0.25, 0.5, 0.75]) {
      const grid = document.createElementNS(SVG_NS, 'line');
      grid.setAttribute('class', 'gpusession-bigchart-grid');
      grid.setAttribute('x1', '0');
      grid.setAttribute('x2', String(W));
      grid.setAttribute('y1', String(H * y));
      grid.setAttribute('y2', String(H * y));
      grid.setAttribute('vector-effect', 'non-scaling-stroke');
      svg.appendChild(grid);
    }
    this._area.setAttribute('class', 'gpusession-bigchart-area');
    this._line.setAttribute('class', 'gpusession-bigchart-line');
    this._line.setAttribute('vector-effect', 'non-scaling-stroke');
    svg.append(this._area, this._line);
    const scale = element('div', 'gpusession-bigchart-scale');
    const zero = element('span', 'gpusession-bigchart-zero');
    zero.textContent = '0';
    scale.append(this._top, zero);
    const axis = element('div', 'gpusession-bigchart-axis');
    axis.append(this._start, this._end);
    this._end.textContent = 'now';
    // a grid: the scale left of the plot, the time axis under the plot only
    plot.append(scale, svg, element('span', 'gpusession-bigchart-corner'), axis);

    this.node.append(header, plot);
  }

  readonly node: HTMLDivElement;

  /** Draw the series; `topText` labels the top of the scale ("100%", "16 GiB"). */
  update(data: ChartData, topText: string): void {
    setText(this._value, data.valueText);
    setText(this._top, topText);
    setText(this._start, `-${windowText(data.windowS)}`);
    setData(this.node, 'value', data.value === null ? '' : String(data.value));
    const line = polylinePoints(data, W, H);
    setData(this.node, 'points', String(line ? line.split(' ').length : 0));
    this._line.setAttribute('points', line);
    this._area.setAttribute('points', areaPoints(line, H));
  }

  private readonly _value = element('span', 'gpusession-bigchart-value');
  private readonly _top = element('span', 'gpusession-bigchart-top');
  private readonly _start = element('span', 'gpusession-bigchart-start');
  private readonly _end = element('span', 'gpusession-bigchart-end');
  private readonly _line = document.createElementNS(SVG_NS, 'polyline');
  private readonly _area = document.createElementNS(SVG_NS, 'polygon');
}

/** "5m", "15m", "1h": the width of the time axis. */
export function windowText(seconds: number): string {
  return seconds % 3600 === 0 ? `${seconds / 3600}h` : `${Math.round(seconds / 60)}m`;
}
