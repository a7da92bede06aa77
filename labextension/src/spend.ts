/**
 * The Spend view (GET `report`): where the money went over a period, a bar
 * per UTC day stacked by GPU type, a table by workspace, the totals (cost,
 * GPU-hours, idle cost, could save), the month's spend against the monthly
 * budget when one is set, and which prices the numbers use. The numbers read
 * as `gpusession report` prints them (format.ts mirrors
 * gpusession/words/spend.py).
 *
 * Also here: the sidebar's budget line with the button that opens the view
 * (its notifications are in alerts.ts).
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { errorMessage, GpuSessionClient } from './api';
import { control, element, message, setText, showText } from './dom';
import { formatMoney, reportCells } from './format';
import { gpuIcon } from './icon';
import { Latest } from './latest';
import type { BudgetView, ReportReply, ReportRow } from './types';

export const SPEND_ID = 'gpusession-spend';
/** The periods to choose from, as `--since` takes them. */
export const SPEND_PERIODS: readonly string[] = ['month', '7d', '30d', '90d'];

/** A period in words: "This month" (the calendar month, UTC: the budget's), "Last 7 days". */
export function periodText(period: string): string {
  return period === 'month' ? 'This month' : `Last ${period.slice(0, -1)} days`;
}
const DAY_S = 86_400;
/** The columns of the workspace table, as `gpusession report --by workspace` heads them. */
const TABLE_HEADS = [
  'WORKSPACE',
  'SESSIONS',
  'GPU-HOURS',
  'COST',
  'MEAN UTIL',
  'IDLE COST',
  'COULD SAVE',
  'PRICES'
];
/** Colours of the GPU types in the bars, from the theme (readable in light and dark). */
const TYPE_COLOURS = [
  'var(--jp-brand-color1)',
  'var(--jp-warn-color1)',
  'var(--jp-success-color1)',
  'var(--jp-error-color1)',
  'var(--jp-accent-color1)',
  'var(--jp-brand-color3)',
  'var(--jp-warn-color3)'
];

/** The UTC days from `since` to `until`, as the report keys them ("2026-11-30"). */
export function periodDays(since: number, until: number): string[] {
  const days: string[] = [];
  for (let t = Math.floor(since / DAY_S) * DAY_S; t <= until; t += DAY_S) {
    days.push(new Date(t * 1000).toISOString().slice(0, 10));
  }
  return days;
}

/** The GPU types of a day report's parts, each with its colour (by name, stable). */
export function typeColours(rows: readonly ReportRow[]): Map<string, string> {
  const types = new Set<string>();
  for (const row of rows) {
    for (const part of row.split ?? []) {
      types.add(part.key);
    }
  }
  const colours = new Map<string, string>();
  [...types].sort().forEach((type, i) => colours.set(type, TYPE_COLOURS[i % TYPE_COLOURS.length]!));
  return colours;
}

/** A budget's meter width (0-100) and its class suffix (ok, warn, over). */
function budgetMeter(budget: BudgetView): [number, string] {
  return [Math.min(100, Math.max(0, 100 * budget.fraction)), budget.state];
}

export class SpendView extends Widget {
  constructor(client: GpuSessionClient) {
    super();
    this.id = SPEND_ID;
    this.addClass('gpusession-charts'); // the main-area views' page, colours and notes
    this.addClass('gpusession-spend');
    this.node.dataset.testid = SPEND_ID;
    this.title.label = 'GPU spend';
    this.title.caption = 'Where the GPU money went: by day, GPU type and workspace';
    this.title.icon = gpuIcon;
    this.title.closable = true;
    this._client = client;

    const toolbar = element('div', 'gpusession-charts-toolbar gpusession-spend-toolbar');
    const heading = element('h2', 'gpusession-spend-heading');
    heading.textContent = 'GPU spend';
    const periodLabel = element('label', 'gpusession-charts-field');
    periodLabel.append('Period ', this._period);
    for (const period of SPEND_PERIODS) {
      const entry = document.createElement('option');
      entry.value = period;
      entry.textContent = periodText(period);
      this._period.appendChild(entry);
    }
    this._period.value = 'month'; // the header's and the budget's period: one figure on every face
    this._period.addEventListener('change', () => void this.load());
    this._refresh.type = 'button';
    this._refresh.textContent = 'Refresh';
    this._refresh.addEventListener('click', () => void this.load());
    toolbar.append(heading, periodLabel, this._refresh, this._span);

    const budget = element('section', 'gpusession-spend-budget-box');
    budget.append(this._budgetLine, this._budgetMeter);
    this._budgetMeter.append(this._budgetFill);
    this._budgetBox = budget;
    budget.hidden = true;

    const chart = element('section', 'gpusession-spend-chart');
    const chartTitle = element('h3', 'gpusession-spend-title');
    chartTitle.textContent = 'Cost per day (UTC), by GPU type';
    chart.append(chartTitle, this._legend, this._axis, this._bars, this._dayLabels);

    const table = element('section', 'gpusession-spend-workspaces');
    const tableTitle = element('h3', 'gpusession-spend-title');
    tableTitle.textContent = 'By workspace';
    table.append(tableTitle, this._table);

    this.node.append(
      toolbar,
      this._note,
      this._totals,
      budget,
      this._prices,
      chart,
      table
    );
  }

  /** The report shown (by day), or null before the first load. */
  get report(): ReportReply | null {
    return this._days;
  }

  /** Fetch the report (by day split by type, and by workspace) and show it. */
  async load(): Promise<void> {
    const since = this._period.value;
    const ticket = this._loads.next();
    showText(this._note, this._days ? null : 'Loading the spend report…');
    this._refresh.disabled = true;
    try {
      const [days, workspaces] = await Promise.all([
        this._client.getReport(since, 'day', 'type'),
        this._client.getReport(since, 'workspace')
      ]);
      if (!this._loads.isLatest(ticket)) {
        return; // a later load (another period) is on its way
      }
      this._days = days;
      this._show(days, workspaces);
      showText(this._note, days.rows.length ? null : 'No session was billed in this period.');
    } catch (error) {
      if (this._loads.isLatest(ticket)) {
        showText(this._note, `Cannot load the spend report: ${errorMessage(error)}`);
      }
    } finally {
      if (this._loads.isLatest(ticket)) {
        this._refresh.disabled = false;
        this.node.dataset.loaded = String(this._loads.count);
      }
    }
  }

  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.load();
  }

  private _show(days: ReportReply, workspaces: ReportReply): void {
    const day = (t: number) => new Date(t * 1000).toISOString().slice(0, 16).replace('T', ' ');
    setText(this._span, `${day(days.since)} .. ${day(days.until)} UTC`);
    this._showTotals(days.total);
    setText(this._prices, `prices: ${days.prices_text}`);
    this._prices.title =
      'Where each cost comes from: the price paid at launch (a spot price), the catalog rate, or a configured price (docs/cost.md)';
    this._showBudget(days.budget, days.budget_line);
    this._showBars(days);
    this._showTable(workspaces);
  }

  private _showTotals(total: ReportRow): void {
    const [sessions, gpuHours, cost, mean, idle, save] = reportCells(total);
    const items: [string, string, string][] = [
      ['cost', 'cost', cost!],
      ['gpu-hours', 'GPU-hours', gpuHours!],
      ['idle-cost', 'idle cost', idle!],
      ['could-save', 'could save', save!],
      ['sessions', 'sessions', sessions!],
      ['mean-util', 'mean utilization', mean!]
    ];
    const nodes = items.map(([key, label, value]) => {
      const box = element('div', 'gpusession-spend-total');
      box.dataset.total = key;
      const number = element('span', 'gpusession-spend-total-value');
      number.textContent = value;
      const name = element('span', 'gpusession-spend-total-label');
      name.textContent = label;
      box.append(number, name);
      return box;
    });
    const notes: string[] = [];
    if (total.running) {
      notes.push(`${total.running} still running (counted up to now)`);
    }
    if (total.failed) {
      notes.push(`${total.failed} failed (billed until they failed)`);
    }
    this._totals.replaceChildren(...nodes);
    if (notes.length) {
      const note = element('div', 'gpusession-spend-states');
      note.textContent = notes.join(', ');
      this._totals.append(note);
    }
  }

  private _showBudget(budget: BudgetView | null, line: string | null): void {
    this._budgetBox.hidden = !budget;
    if (!budget) {
      return;
    }
    const [width, state] = budgetMeter(budget);
    setText(this._budgetLine, line ?? '');
    this._budgetLine.title = `Set by ${budget.source}`;
    this._budgetBox.dataset.state = state;
    this._budgetFill.style.width = `${width}%`;
    this._budgetFill.className = `gpusession-spend-budget-fill gpusession-budget-${state}`;
  }

  private _showBars(report: ReportReply): void {
    const colours = typeColours(report.rows);
    const byDay = new Map(report.rows.map(row => [row.key, row]));
    const top = Math.max(0, ...report.rows.map(row => row.cost));
    setText(this._axis, top > 0 ? `${formatMoney(top)} a day at most` : '');
    const bars: HTMLElement[] = [];
    const labels: HTMLElement[] = [];
    const days = periodDays(report.since, report.until);
    days.forEach((day, i) => {
      const row = byDay.get(day);
      const bar = element('div', 'gpusession-spend-bar');
      bar.dataset.day = day;
      bar.dataset.cost = String(row?.cost ?? 0);
      bar.title = row ? `${day}: ${formatMoney(row.cost)} (${row.sessions} session(s))` : `${day}: $0`;
      for (const part of row?.split ?? []) {
        const segment = element('div', 'gpusession-spend-segment');
        segment.dataset.type = part.key;
        segment.dataset.cost = String(part.cost);
        segment.style.height = top > 0 ? `${(100 * part.cost) / top}%` : '0';
        segment.style.background = colours.get(part.key) ?? TYPE_COLOURS[0]!;
        segment.title = `${day} · ${part.key}: ${formatMoney(part.cost)}, ${reportCells(part)[1]} GPU-hours`;
        bar.append(segment);
      }
      bars.push(bar);
      const label = element('span', 'gpusession-spend-day');
      // a label every week (and the last day), so they never overlap
      label.textContent = i % 7 === 0 || i === days.length - 1 ? day.slice(5) : '';
      labels.push(label);
    });
    this._bars.replaceChildren(...bars);
    this._dayLabels.replaceChildren(...labels);
    this._legend.replaceChildren(
      ...[...colours].map(([type, colour]) => {
        const item = element('span', 'gpusession-spend-legend-item');
        item.dataset.type = type;
        const swatch = element('span', 'gpusession-spend-swatch');
        swatch.style.background = colour;
        item.append(swatch, type);
        return item;
      })
    );
  }

  private _showTable(report: ReportReply): void {
    const head = document.createElement('tr');
    for (const name of TABLE_HEADS) {
      const cell = document.createElement('th');
      cell.textContent = name;
      head.append(cell);
    }
    const line = (row: ReportRow, total: boolean) => {
      const tr = document.createElement('tr');
      tr.className = total ? 'gpusession-spend-total-row' : 'gpusession-spend-row';
      tr.dataset.key = row.key;
      const texts = [row.key, ...reportCells(row), total ? '' : (row.prices_text ?? '')];
      texts.forEach(text => {
        const cell = document.createElement('td');
        cell.textContent = text;
        tr.append(cell);
      });
      return tr;
    };
    const rows = report.rows.map(row => line(row, false));
    if (report.rows.length) {
      rows.push(line(report.total, true));
    }
    this._table.replaceChildren(head, ...rows);
  }

  private readonly _client: GpuSessionClient;
  private _days: ReportReply | null = null;
  private readonly _loads = new Latest();
  private readonly _period = control('select', 'gpusession-spend-period');
  private readonly _refresh = control('button', 'gpusession-spend-refresh');
  private readonly _span = control('span', 'gpusession-spend-span');
  private readonly _note = message('gpusession-spend-note');
  private readonly _totals = control('div', 'gpusession-spend-totals');
  private readonly _budgetBox: HTMLElement;
  private readonly _budgetLine = control('div', 'gpusession-spend-budget');
  private readonly _budgetMeter = element('div', 'gpusession-spend-budget-meter');
  private readonly _budgetFill = element('div', 'gpusession-spend-budget-fill');
  private readonly _prices = control('div', 'gpusession-spend-prices');
  private readonly _legend = control('div', 'gpusession-spend-legend');
  private readonly _axis = control('div', 'gpusession-spend-axis');
  private readonly _bars = control('div', 'gpusession-spend-bars');
  private readonly _dayLabels = element('div', 'gpusession-spend-days');
  private readonly _table = control('table', 'gpusession-spend-table');
}

/**
 * The sidebar's spend line: the month's spend against the budget when one
 * is set, and the button that opens the Spend view. It shows the budget that
 * came with the session list (`SessionListModel.budget`), the same reading of
 * the store as the cards' budget warnings: one figure, to the cent.
 */
export class SpendSection {
  constructor(open: () => void) {
    this.node = element('div', 'gpusession-spend-section');
    this.node.dataset.testid = 'gpusession-spend-section';
    const button = control('button', 'gpusession-open-spend');
    button.type = 'button';
    button.textContent = 'Spend';
    button.title = 'Where the GPU money went: by day, GPU type and workspace';
    button.addEventListener('click', open);
    this._line.hidden = true;
    this.node.append(this._line, button);
  }

  readonly node: HTMLElement;

  /** Show the month's budget as the session list brought it. */
  show(budget: BudgetView | null, line: string | null): void {
    showText(this._line, line);
    this._line.dataset.state = budget?.state ?? '';
    this._line.title = budget ? `Set by ${budget.source}` : '';
  }

  private readonly _line = control('div', 'gpusession-budget-line');
}
