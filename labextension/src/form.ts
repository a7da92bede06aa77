/**
 * The "start a GPU session" form, built from the option table the server
 * serves (GET `options`): one field per option with `form: true`, in the
 * server's order, each shown only with the backends it applies to. Values
 * are checked by the server as they are typed (POST `options/check`) and
 * once more by the start itself (POST `sessions`). The catalog (GET
 * `catalog`) only adds memory and prices to the GPU types.
 */
import { ApiError, errorMessage, GpuSessionClient } from './api';
import { control, element, message, setText, showText } from './dom';
import { formatRate } from './format';
import { Latest } from './latest';
import {
  backendOption,
  controlClass,
  controlKind,
  FieldValue,
  formOptions,
  gpuTypeOption,
  initialValue,
  RESET_AFTER_START,
  requestBody,
  selectChoices,
  splitErrors,
  visibleOptions
} from './options';
import type {
  CatalogReply,
  GpuTypeView,
  ImagesReply,
  OptionView,
  SessionView,
  StartRequest,
  WorkspaceView
} from './types';

/** How long typing must pause before the values are checked, in ms. */
export const CHECK_DELAY_MS = 300;

/** The bool option whose checkbox makes the price shown the spot price. */
const SPOT_OPTION = 'spot';
/** aws's `--cheapest`: a spot start in the cheapest zone, so its current price shows too. */
const CHEAPEST_OPTION = 'cheapest';

/** One option's field. */
export interface Field {
  readonly option: OptionView;
  /** The whole field, hidden while the option does not apply. */
  readonly node: HTMLDivElement;
  readonly input: HTMLInputElement | HTMLSelectElement;
  /** The server's word on the value, shown under it. */
  readonly error: HTMLDivElement;
  /** What the typed value will do (the image field: on the engine, or pulled). */
  readonly note: HTMLDivElement;
}

/** The kind of option whose field offers the chosen backend's images. */
const IMAGE_OPTION = 'image';
/** The option naming the machine whose images are offered. */
const HOST_OPTION = 'host';

/**
 * What the form's button does with the body: start a session (the sidebar),
 * or something else with the same fields ("Run this notebook on a GPU…").
 */
export interface FormMode {
  readonly title: string;
  readonly button: string;
  readonly busy: string;
  /** Options this mode does not take (their fields stay hidden, out of the body). */
  readonly skip?: readonly string[];
  /** Act on a body the server's check accepted; a view when a session started. */
  submit(body: StartRequest): Promise<SessionView | null>;
}

export class StartForm {
  constructor(
    client: GpuSessionClient,
    onStarted: (view: SessionView) => void,
    onFailed: (text: string) => void = () => undefined,
    mode?: FormMode
  ) {
    this._client = client;
    this._onStarted = onStarted;
    this._onFailed = onFailed;
    this._mode = mode ?? {
      title: 'Start a GPU session',
      button: 'Start',
      busy: 'Starting…',
      submit: body => client.startSession(body)
    };

    this.node = document.createElement('form');
    this.node.className = 'gpusession-start-form';
    this.node.dataset.testid = 'gpusession-start-form';
    this.node.noValidate = true;

    const title = document.createElement('h3');
    title.className = 'gpusession-section-title';
    title.textContent = this._mode.title;

    this._submit.type = 'submit';
    this._submit.textContent = this._mode.button;

    this.node.append(
      title,
      this._fieldsNode,
      this._submit,
      this._formError,
      this._optionsError,
      this._catalogError,
      this._catalogNote
    );
    this.node.addEventListener('input', () => this._onEdit());
    this.node.addEventListener('change', () => this._onEdit());
    this.node.addEventListener('submit', event => {
      event.preventDefault();
      void this._onSubmit();
    });
    this._refresh();
  }

  readonly node: HTMLFormElement;

  /** Whether the options and the catalog have both been loaded. */
  get loaded(): boolean {
    return this._options !== null && this._catalog !== null;
  }

  /**
   * Whether the panel already shows that the API is unreachable; the form's
   * own load failures then go unsaid rather than said twice.
   */
  set apiDown(value: boolean) {
    if (value !== this._apiDown) {
      this._apiDown = value;
      this._refresh();
    }
  }

  /** Load what is missing of the options and the catalog; say what failed. */
  async load(): Promise<void> {
    if (this._loading) {
      return;
    }
    this._loading = true;
    try {
      await Promise.all([this._loadOptions(), this._loadCatalog()]);
      void this._loadWorkspaces();
    } finally {
      this._loading = false;
      this._refresh();
    }
  }

  /** Put the focus in the first shown field (or on Start before the options came). */
  focus(): void {
    const first = Array.from(this._fields.values()).find(field => !field.node.hidden);
    (first?.input ?? this._submit).focus();
  }

  dispose(): void {
    window.clearTimeout(this._checkTimer);
    this._checkSeq++;
  }

  private async _loadOptions(): Promise<void> {
    if (this._options) {
      return;
    }
    try {
      const reply = await this._client.getOptions();
      this._places = reply.places ?? {};
      this._setOptions(reply.options);
      this._optionsProblem = null;
    } catch (error) {
      this._optionsProblem = `Could not load the start options: ${errorMessage(error)}`;
    }
  }

  /** The Resume pick list's workspaces: asked at load, when it gets the focus, after a start. */
  private async _loadWorkspaces(): Promise<void> {
    const field = this._fields.get(RESUME_OPTION);
    if (!field) {
      return;
    }
    const ticket = this._workspaceLoads.next();
    try {
      const workspaces = (await this._client.listWorkspaces()).workspaces;
      if (!this._workspaceLoads.isLatest(ticket)) {
        return; // a later listing is on its way
      }
      this._workspaces = workspaces;
    } catch {
      return; // the Workspaces section says why it cannot list them
    }
    this._fillResume();
  }

  private _fillResume(): void {
    const field = this._fields.get(RESUME_OPTION);
    const backend = this._options && backendOption(this._options);
    if (field && field.input instanceof HTMLSelectElement) {
      fillResume(field.input, this._workspaces, backend ? this._values().get(backend.name) : undefined);
    }
  }

  private async _loadCatalog(): Promise<void> {
    if (this._catalog) {
      return;
    }
    try {
      this._catalog = await this._client.getCatalog();
      this._catalogProblem = null;
      this._labelTypes();
      setText(
        this._catalogNote,
        `Prices per GPU-hour (${this._catalog.region}): ${this._catalog.prices_line}`
      );
    } catch (error) {
      this._catalogProblem = `Could not load the GPU catalog: ${errorMessage(error)}`;
    }
  }

  private _setOptions(options: readonly OptionView[]): void {
    this._options = options;
    const typeOption = gpuTypeOption(options);
    const nodes: HTMLElement[] = [];
    for (const option of formOptions(options)) {
      const field = makeField(option);
      this._fields.set(option.name, field);
      if (option.name === RESUME_OPTION) {
        field.input.addEventListener('focus', () => void this._loadWorkspaces());
      }
      nodes.push(field.node);
      if (option === typeOption) {
        nodes.push(this._typePrice, this._livePrice);
      }
    }
    this._imagesList.id = IMAGES_LIST_ID;
    this._placesList.id = PLACES_LIST_ID;
    // what a first start does not need folds under "More" (the sidebar is 250 px wide)
    const first = nodes.filter(node => this._isFirst(node));
    const more = nodes.filter(node => !this._isFirst(node));
    const summary = element('summary', 'gpusession-more-summary');
    summary.textContent = 'More';
    this._more.replaceChildren(summary, ...more);
    this._fieldsNode.replaceChildren(
      ...first,
      ...(more.length ? [this._more] : []),
      this._imagesList,
      this._placesList
    );
    this._labelTypes();
  }

  /** Whether a form node is shown at once: a first start's field, or the type's price lines. */
  private _isFirst(node: HTMLElement): boolean {
    const name = node.dataset.option;
    return name === undefined || this._fields.get(name)?.option.first === true;
  }

  /** Show the first field the server found wrong (opening "More" for it) and focus it. */
  private _focusInvalid(errors: Record<string, string>): void {
    const field = Array.from(this._fields.values()).find(
      candidate => !candidate.node.hidden && candidate.option.name in errors
    );
    if (!field) {
      return;
    }
    if (this._more.contains(field.node)) {
      this._more.open = true;
    }
    field.node.scrollIntoView({ block: 'nearest' });
    field.input.focus();
  }

  /** The host field offers the chosen backend's named places (a docker pool: `pool:lab`). */
  private _fillPlaces(values: Map<string, FieldValue>): void {
    const places = this._places[String(values.get('backend') ?? '')] ?? [];
    if (places.join('\n') === this._placesShown) {
      return;
    }
    this._placesShown = places.join('\n');
    this._placesList.replaceChildren(
      ...places.map(place => {
        const entry = document.createElement('option');
        entry.value = place;
        return entry;
      })
    );
  }

  /** Ask for the images of the chosen backend and host when those changed. */
  private _loadImages(values: Map<string, FieldValue>, shown: Set<string>): void {
    if (!shown.has(IMAGE_OPTION)) {
      return;
    }
    const backend = String(values.get('backend') ?? '');
    const host = shown.has(HOST_OPTION) ? String(values.get(HOST_OPTION) ?? '').trim() : '';
    const key = `${backend}\n${host}`;
    if (key === this._imagesKey) {
      return;
    }
    this._imagesKey = key;
    this._images = null;
    this._imagesProblem = null;
    this._client.getImages(backend, host).then(
      reply => {
        if (this._imagesKey !== key) {
          return;
        }
        this._images = reply;
        this._imagesList.replaceChildren(
          ...reply.images.map(image => {
            const entry = document.createElement('option');
            entry.value = image.reference;
            entry.label = image.text;
            return entry;
          })
        );
        this._showImageNote();
      },
      error => {
        if (this._imagesKey === key) {
          this._imagesProblem = `Could not list the images there: ${errorMessage(error)}`;
          this._imagesList.replaceChildren();
          this._showImageNote();
        }
      }
    );
  }

  /** Under the image field: what it has of the typed image, or that the start pulls it. */
  private _showImageNote(): void {
    const field = this._fields.get(IMAGE_OPTION);
    if (!field) {
      return;
    }
    const typed = field.input.value.trim();
    const reply = this._images;
    let text: string | null = this._imagesProblem;
    if (reply) {
      const reference = typed || reply.default;
      const found = reply.images.find(image => image.reference === reference);
      if (!reference) {
        text = null;
      } else if (found) {
        text = `${typed ? '' : 'default: '}${found.text}`;
      } else {
        text =
          `${typed ? reference : `default ${reference}`}: not on the engine yet; ` +
          'the start pulls it first (that can take minutes)';
      }
    }
    showText(field.note, text);
  }

  /** "T4 · 16 GB · $0.5260/h" for the GPU types the catalog knows. */
  private _labelTypes(): void {
    const option = this._options && gpuTypeOption(this._options);
    const field = option && this._fields.get(option.name);
    if (!field || !(field.input instanceof HTMLSelectElement) || !this._catalog) {
      return;
    }
    for (const entry of Array.from(field.input.options)) {
      const gpu = this._catalog.types.find(type => type.name === entry.value);
      if (gpu) {
        setText(
          entry,
          `${gpu.name} · ${gpu.memory_gb} GB · ${formatRate(gpu.on_demand_per_hour)}`
        );
      }
    }
  }

  /** Every field's value, shown or not. */
  private _values(): Map<string, FieldValue> {
    const values = new Map<string, FieldValue>();
    for (const [name, field] of this._fields) {
      const { input } = field;
      values.set(
        name,
        input instanceof HTMLInputElement && input.type === 'checkbox'
          ? input.checked
          : input.value
      );
    }
    return values;
  }

  private _body(): StartRequest {
    const skip = new Set(this._mode.skip ?? []);
    return requestBody(
      (this._options ?? []).filter(option => !skip.has(option.name)),
      this._values()
    );
  }

  /** Show the fields that apply, the price, the load errors, the button. */
  private _refresh(): void {
    const options = this._options ?? [];
    const values = this._values();
    const skip = new Set(this._mode.skip ?? []);
    const shown = new Set(
      visibleOptions(options, values)
        .map(option => option.name)
        .filter(name => !skip.has(name))
    );
    for (const [name, field] of this._fields) {
      field.node.hidden = !shown.has(name);
    }
    this._showPrice(values, shown);
    this._fillPlaces(values);
    this._loadImages(values, shown);
    this._showImageNote();
    showText(this._optionsError, this._apiDown ? null : this._optionsProblem);
    showText(this._catalogError, this._apiDown ? null : this._catalogProblem);
    this._submit.disabled = this._starting || this._options === null;
  }

  /** The price of the selected GPU type, spot when a shown spot box is ticked. */
  private _showPrice(values: Map<string, FieldValue>, shown: Set<string>): void {
    const option = this._options && gpuTypeOption(this._options);
    const name = option ? values.get(option.name) : undefined;
    const gpu: GpuTypeView | undefined = this._catalog?.types.find(
      type => type.name === name
    );
    let text: string | null = null;
    const backend = values.get('backend');
    const listed = this._catalog?.backend_prices?.find(row => row.backend === backend);
    const own = typeof name === 'string' ? listed?.prices[name] : undefined;
    if (listed && own !== undefined) {
      text = `${formatRate(own)} per GPU (${listed.source})`;
    } else if (gpu) {
      if (shown.has(SPOT_OPTION) && values.get(SPOT_OPTION) === true) {
        text =
          gpu.spot_per_hour === null || gpu.spot_per_hour === undefined
            ? 'No spot price for this type'
            : `${formatRate(gpu.spot_per_hour)} spot per GPU`;
      } else {
        text = `${formatRate(gpu.on_demand_per_hour)} on demand per GPU`;
      }
    }
    showText(this._typePrice, text);
    const live =
      typeof name === 'string' &&
      shown.has(SPOT_OPTION) &&
      (values.get(SPOT_OPTION) === true || values.get(CHEAPEST_OPTION) === true);
    this._showLivePrice(live ? name : null);
  }

  /** Under the type's price, for a spot start where a cloud prices it now: the current spot
   * price in the cheapest zone (GET `prices`, which AWS answers from a 5-minute cache). */
  private _showLivePrice(type: string | null): void {
    if (type === null) {
      this._liveType = null;
      showText(this._livePrice, null);
      return;
    }
    if (type === this._liveType) {
      return; // asked already; the line stays until the type changes
    }
    this._liveType = type;
    showText(this._livePrice, null);
    this._client.getPrices(type).then(
      reply => {
        if (this._liveType === type && reply.rows.length > 0) {
          showText(this._livePrice, reply.line);
        }
      },
      () => undefined // no cloud answers (no credentials): the catalog's price stays alone
    );
  }

  private _onEdit(): void {
    this._refresh();
    this._fillResume(); // the backend may have changed
    if (!this._options) {
      return;
    }
    window.clearTimeout(this._checkTimer);
    this._checkTimer = window.setTimeout(() => void this._check(this._body()), CHECK_DELAY_MS);
  }

  /**
   * Ask the server what is wrong with a body and show it on the fields.
   * Null when the check could not be made, or a newer one superseded it.
   */
  private async _check(body: StartRequest): Promise<Record<string, string> | null> {
    const seq = ++this._checkSeq;
    let errors: Record<string, string>;
    try {
      errors = (await this._client.checkOptions(body)).errors;
    } catch {
      return null; // the start itself will say what is wrong
    }
    if (seq !== this._checkSeq) {
      return null;
    }
    this._showErrors(errors);
    return errors;
  }

  private _showErrors(errors: Record<string, string>): void {
    const options = this._options ?? [];
    const shown = visibleOptions(options, this._values());
    const { fields, other } = splitErrors(errors, shown, options);
    for (const [name, field] of this._fields) {
      const text = fields.get(name) ?? null;
      showText(field.error, text);
      field.input.classList.toggle('gpusession-invalid', text !== null);
      field.input.setAttribute('aria-invalid', String(text !== null));
    }
    showText(this._formError, other.length ? other.join('\n') : null);
  }

  private async _onSubmit(): Promise<void> {
    if (!this._options || this._starting) {
      return;
    }
    window.clearTimeout(this._checkTimer);
    const body = this._body();
    this._starting = true;
    this._submit.textContent = this._mode.busy;
    this._refresh();
    try {
      const errors = await this._check(body);
      if (errors && Object.keys(errors).length) {
        this._focusInvalid(errors);
        return;
      }
      const view = await this._mode.submit(body);
      showText(this._formError, null);
      for (const name of RESET_AFTER_START) {
        const field = this._fields.get(name);
        if (field && !(field.input instanceof HTMLInputElement && field.input.type === 'checkbox')) {
          field.input.value = String(initialValue(field.option));
        }
      }
      if (view) {
        this._onStarted(view);
      }
      void this._loadWorkspaces(); // the one it resumed is in use now
    } catch (error) {
      const reason =
        error instanceof ApiError && error.status === 400 && error.serverMessage
          ? error.serverMessage
          : errorMessage(error);
      showText(this._formError, `Start failed: ${reason}`);
      this._onFailed(`Start failed: ${reason}`);
    } finally {
      this._starting = false;
      this._submit.textContent = this._mode.button;
      this._refresh();
    }
  }

  private readonly _client: GpuSessionClient;
  private readonly _onStarted: (view: SessionView) => void;
  private readonly _mode: FormMode;
  private readonly _onFailed: (text: string) => void;
  private _images: ImagesReply | null = null;
  private _imagesProblem: string | null = null;
  private _imagesKey: string | null = null;
  private readonly _imagesList = document.createElement('datalist');
  private readonly _placesList = document.createElement('datalist');
  private _places: Record<string, string[]> = {};
  private _placesShown: string | null = null;
  private _options: readonly OptionView[] | null = null;
  private _catalog: CatalogReply | null = null;
  private _optionsProblem: string | null = null;
  private _catalogProblem: string | null = null;
  private _loading = false;
  private _apiDown = false;
  private _starting = false;
  private _checkTimer = 0;
  private _checkSeq = 0;
  private readonly _fields = new Map<string, Field>();
  private _workspaces: readonly WorkspaceView[] = [];
  private readonly _workspaceLoads = new Latest();
  private readonly _fieldsNode = element('div', 'gpusession-fields');
  private readonly _more = element('details', 'gpusession-more');
  private readonly _typePrice = message('gpusession-type-price');
  private readonly _livePrice = message('gpusession-live-price');
  private _liveType: string | null = null;
  private readonly _submit = control('button', 'gpusession-start-button');
  private readonly _formError = message('gpusession-form-error');
  private readonly _optionsError = message('gpusession-options-error');
  private readonly _catalogError = message('gpusession-catalog-error');
  private readonly _catalogNote = control('div', 'gpusession-catalog-note');
}

/** A labelled control for one option, with its value's error below it. */
export function makeField(option: OptionView): Field {
  const kind = controlKind(option);
  const className = controlClass(option);
  const value = initialValue(option);
  let input: HTMLInputElement | HTMLSelectElement;
  if (option.name === RESUME_OPTION) {
    input = control('select', 'gpusession-resume-select'); // filled with the workspaces
    input.append(noResume());
  } else if (kind === 'select') {
    const select = control('select', className);
    for (const choice of selectChoices(option)) {
      const entry = document.createElement('option');
      entry.value = choice;
      entry.textContent = choice || '(none)';
      select.appendChild(entry);
    }
    select.value = String(value);
    input = select;
  } else {
    const box = control('input', className);
    if (kind === 'checkbox') {
      box.type = 'checkbox';
      box.checked = value === true;
    } else {
      box.type = 'text';
      box.value = String(value);
      box.placeholder = option.placeholder || placeholder(option);
      box.spellcheck = false;
      if (option.name === IMAGE_OPTION) {
        box.setAttribute('list', IMAGES_LIST_ID); // offers the engine's images; any text goes
      } else if (option.name === HOST_OPTION) {
        box.setAttribute('list', PLACES_LIST_ID); // offers the backend's pools; any host goes
      }
    }
    input = box;
  }
  input.name = option.name;

  const node = element('div', 'gpusession-field');
  node.dataset.option = option.name;
  node.title = option.help ? `${option.help} (${option.flag})` : option.flag;
  const label = document.createElement('label');
  const caption = element('span', 'gpusession-field-label');
  caption.textContent = option.label;
  if (kind === 'checkbox') {
    label.className = 'gpusession-field-inline';
    label.append(input, caption);
  } else {
    label.className = 'gpusession-field-row';
    label.append(caption, input);
  }
  const help = element('div', 'gpusession-field-help');
  help.textContent = option.form_help ?? option.help;
  const error = message('gpusession-field-error');
  error.dataset.option = option.name;
  const note = message('gpusession-field-note');
  note.dataset.option = option.name;
  node.append(label, help, note, error);
  return { option, node, input, error, note };
}

/** The id of the list of images the image field offers. */
const IMAGES_LIST_ID = 'gpusession-images-list';
/** The id of the list of named places (pools) the host field offers. */
const PLACES_LIST_ID = 'gpusession-places-list';

/** The option whose field is a pick list of the workspaces (GET `workspaces`). */
const RESUME_OPTION = 'resume';

function noResume(): HTMLOptionElement {
  const entry = document.createElement('option');
  entry.value = '';
  entry.textContent = '(none: a fresh kernel)';
  return entry;
}

/** Fill the Resume pick list: the workspaces of `backend` no session uses, the choice kept. */
function fillResume(select: HTMLSelectElement, list: readonly WorkspaceView[], backend: FieldValue | undefined): void {
  const kept = select.value;
  const entries = [noResume()];
  for (const ws of list) {
    if (ws.in_use || (typeof backend === 'string' && backend && ws.backend !== backend)) {
      continue;
    }
    const entry = document.createElement('option');
    entry.value = ws.name;
    entry.textContent = ws.pick_text ?? `${ws.name} · ${ws.size}`;
    entries.push(entry);
  }
  select.replaceChildren(...entries);
  select.value = entries.some(entry => entry.value === kept) ? kept : '';
}

/** What an empty text field means (a server without served placeholders). */
function placeholder(option: OptionView): string {
  if (option.default !== null) {
    return String(option.default);
  }
  return option.kind === 'duration' || option.kind === 'money' ? 'off' : 'optional';
}
