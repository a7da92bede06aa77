/**
 * The "start a GPU session" form: GPU type from the catalog (with its price),
 * backend, host, spot, idle timeout, cost cap and name.
 */
import { errorMessage, GpuSessionClient } from './api';
import { control, message, setText, showText } from './dom';
import { formatRate, isDuration } from './format';
import type { CatalogReply, GpuTypeView, SessionView, StartRequest } from './types';

/** Backends offered in the form; the server validates the choice. */
export const BACKENDS: readonly string[] = ['local', 'docker', 'aws'];

export class StartForm {
  constructor(client: GpuSessionClient, onStarted: (view: SessionView) => void) {
    this._client = client;
    this._onStarted = onStarted;

    this.node = document.createElement('form');
    this.node.className = 'gpusession-start-form';
    this.node.dataset.testid = 'gpusession-start-form';
    this.node.noValidate = true;

    const title = document.createElement('h3');
    title.className = 'gpusession-section-title';
    title.textContent = 'Start a GPU session';

    this._type.required = true;
    this._type.addEventListener('change', () => this._showPrice());
    for (const backend of BACKENDS) {
      const option = document.createElement('option');
      option.value = backend;
      option.textContent = backend;
      this._backend.appendChild(option);
    }
    this._backend.value = 'docker';
    this._backend.addEventListener('change', () => this._showHost());
    this._host.type = 'text';
    this._host.placeholder = 'ssh://user@host (default: this machine)';
    this._spot.type = 'checkbox';
    this._spot.addEventListener('change', () => this._showPrice());
    this._idle.type = 'text';
    this._idle.placeholder = 'e.g. 30m, 2h; 0 = never';
    this._maxCost.type = 'number';
    this._maxCost.min = '0';
    this._maxCost.step = '0.01';
    this._maxCost.placeholder = 'no cap';
    this._name.type = 'text';
    this._name.placeholder = 'optional';
    this._submit.type = 'submit';
    this._submit.textContent = 'Start';

    const spotLabel = document.createElement('label');
    spotLabel.className = 'gpusession-field gpusession-field-inline';
    spotLabel.append(this._spot, document.createTextNode(' Spot instance'));
    this._hostField = field('Host', this._host);

    this.node.append(
      title,
      field('GPU type', this._type),
      this._typePrice,
      field('Backend', this._backend),
      this._hostField,
      spotLabel,
      field('Idle timeout', this._idle),
      field('Max cost ($)', this._maxCost),
      field('Name', this._name),
      this._submit,
      this._formError,
      this._catalogError,
      this._catalogNote
    );
    this.node.addEventListener('submit', event => {
      event.preventDefault();
      void this._onSubmit();
    });
    this._showHost();
    this._showPrice();
  }

  readonly node: HTMLFormElement;

  /** Whether the catalog has been loaded. */
  get hasCatalog(): boolean {
    return this._catalog !== null;
  }

  /**
   * Whether the panel already shows that the API is unreachable; the
   * catalog's failure then goes unsaid rather than said twice.
   */
  set apiDown(value: boolean) {
    if (value !== this._apiDown) {
      this._apiDown = value;
      this._showPrice();
    }
  }

  /** Load the GPU types into the select; on failure say so in the form. */
  async loadCatalog(): Promise<void> {
    if (this._loading) {
      return;
    }
    this._loading = true;
    try {
      const catalog = await this._client.getCatalog();
      this._setCatalog(catalog);
      this._catalogProblem = null;
    } catch (error) {
      this._catalogProblem = `Could not load the GPU catalog: ${errorMessage(error)}`;
    } finally {
      this._loading = false;
      this._showPrice();
    }
  }

  private _setCatalog(catalog: CatalogReply): void {
    this._catalog = catalog;
    const selected = this._type.value;
    this._type.replaceChildren(
      ...catalog.types.map(gpu => {
        const option = document.createElement('option');
        option.value = gpu.name;
        option.textContent = `${gpu.name} · ${gpu.memory_gb} GB · ${formatRate(
          gpu.on_demand_per_hour
        )}`;
        return option;
      })
    );
    if (catalog.types.some(gpu => gpu.name === selected)) {
      this._type.value = selected;
    }
    setText(
      this._catalogNote,
      `Prices: ${catalog.region}, snapshot of ${catalog.snapshot_date}`
    );
  }

  private _selectedType(): GpuTypeView | undefined {
    return this._catalog?.types.find(gpu => gpu.name === this._type.value);
  }

  /** The price of the selected type, spot or on demand; or the catalog error. */
  private _showPrice(): void {
    const gpu = this._selectedType();
    let text = '';
    if (gpu) {
      if (this._spot.checked) {
        text =
          gpu.spot_per_hour === null
            ? 'No spot price for this type'
            : `${formatRate(gpu.spot_per_hour)} spot per GPU`;
      } else {
        text = `${formatRate(gpu.on_demand_per_hour)} on demand per GPU`;
      }
    }
    showText(this._typePrice, text || null);
    showText(this._catalogError, this._apiDown ? null : this._catalogProblem);
    this._submit.disabled = this._starting || !gpu;
  }

  /** The host only matters for the docker backend. */
  private _showHost(): void {
    this._hostField.hidden = this._backend.value !== 'docker';
  }

  /** The request body, or a message saying what to fix. */
  private _request(): StartRequest | string {
    const gpu = this._selectedType();
    if (!gpu) {
      return 'Choose a GPU type.';
    }
    const body: StartRequest = { type: gpu.name, backend: this._backend.value };
    const host = this._host.value.trim();
    if (host && this._backend.value === 'docker') {
      body.host = host;
    }
    if (this._spot.checked) {
      body.spot = true;
    }
    const idle = this._idle.value.trim();
    if (idle) {
      if (!isDuration(idle)) {
        return `Idle timeout "${idle}" is not a duration like 30m or 2h.`;
      }
      body.idle = idle;
    }
    const maxCost = this._maxCost.value.trim();
    if (maxCost) {
      const value = Number(maxCost);
      if (!Number.isFinite(value) || value <= 0) {
        return 'Max cost must be a positive number of dollars.';
      }
      body.max_cost = value;
    }
    const name = this._name.value.trim();
    if (name) {
      body.name = name;
    }
    return body;
  }

  private async _onSubmit(): Promise<void> {
    const body = this._request();
    if (typeof body === 'string') {
      showText(this._formError, body);
      return;
    }
    this._starting = true;
    this._submit.disabled = true;
    this._submit.textContent = 'Starting…';
    try {
      const view = await this._client.startSession(body);
      showText(this._formError, null);
      this._name.value = '';
      this._onStarted(view);
    } catch (error) {
      showText(this._formError, `Start failed: ${errorMessage(error)}`);
    } finally {
      this._starting = false;
      this._submit.textContent = 'Start';
      this._showPrice();
    }
  }

  private readonly _client: GpuSessionClient;
  private readonly _onStarted: (view: SessionView) => void;
  private _catalog: CatalogReply | null = null;
  private _catalogProblem: string | null = null;
  private _loading = false;
  private _apiDown = false;
  private _starting = false;
  private readonly _hostField: HTMLElement;
  private readonly _type = control('select', 'gpusession-type-select');
  private readonly _typePrice = message('gpusession-type-price');
  private readonly _backend = control('select', 'gpusession-backend-select');
  private readonly _host = control('input', 'gpusession-host-input');
  private readonly _spot = control('input', 'gpusession-spot-input');
  private readonly _idle = control('input', 'gpusession-idle-input');
  private readonly _maxCost = control('input', 'gpusession-max-cost-input');
  private readonly _name = control('input', 'gpusession-name-input');
  private readonly _submit = control('button', 'gpusession-start-button');
  private readonly _formError = message('gpusession-form-error');
  private readonly _catalogError = message('gpusession-catalog-error');
  private readonly _catalogNote = control('div', 'gpusession-catalog-note');
}

/** A labelled form field. */
function field(label: string, input: HTMLElement): HTMLLabelElement {
  const node = document.createElement('label');
  node.className = 'gpusession-field';
  const caption = document.createElement('span');
  caption.className = 'gpusession-field-label';
  caption.textContent = label;
  node.append(caption, input);
  return node;
}
