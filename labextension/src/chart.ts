/**
 * A small live line chart: one SVG polyline, updated in place.
 */

import { setData, setText } from './dom';
import { type ChartData, polylinePoints, VIEW_H, VIEW_W } from './series';

export type { ChartData, Point } from './series';

const SVG_NS = 'http://www.w3.org/2000/svg';

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
