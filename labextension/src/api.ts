/**
 * Typed client of the gpusession REST API (see `types.ts` for the endpoints).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type {
  CarryReply,
  CarryStage,
  CatalogReply,
  ConnectRequest,
  ErrorReply,
  ImagesReply,
  KernelspecReply,
  KeepAliveRequest,
  MetricView,
  OptionCheckReply,
  OptionsReply,
  PricesReply,
  ReportReply,
  SessionListReply,
  SessionView,
  StartRequest,
  StatsReply,
  SwitchReply,
  SwitchRequest,
  WorkspaceDeleteReply,
  WorkspaceListReply
} from './types';

/** Path of the API under the server's base URL. */
export const API_PATH = 'gpusession/api';

/** A failed API call, with a message fit to show the user. */
export class ApiError extends Error {
  /** HTTP status, or null when the server could not be reached. */
  readonly status: number | null;
  /** The `message` of the server's error body, when it sent one. */
  readonly serverMessage: string | null;

  constructor(message: string, status: number | null, serverMessage: string | null = null) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.serverMessage = serverMessage;
  }
}

/** Turn anything thrown into one line for the panel. */
export function errorMessage(error: unknown): string {
  if (error instanceof Error) {
    return error.message || error.name;
  }
  return String(error);
}

export class GpuSessionClient {
  constructor(settings: ServerConnection.ISettings) {
    this._settings = settings;
  }

  /** GET `sessions?history=N`: the live sessions and the N that ended last. */
  async listSessions(history = 0): Promise<SessionView[]> {
    return (await this.listing(history)).sessions;
  }

  /** GET `sessions`: the sessions and the month's budget, read at one moment. */
  async listing(history = 0): Promise<SessionListReply> {
    const query = history > 0 ? URLExt.objectToQueryString({ history: String(history) }) : '';
    const reply = await this._request<SessionListReply>('sessions' + query);
    expectArray(reply.sessions, 'sessions', 'sessions');
    return reply;
  }

  /** GET `sessions/<id>` */
  getSession(id: string): Promise<SessionView> {
    return this._request<SessionView>(sessionPath(id));
  }

  /** GET `sessions/<id>/stats?since=<unix seconds>` */
  async getStats(id: string, since: number): Promise<StatsReply> {
    const query = URLExt.objectToQueryString({ since: String(since) });
    const path = `${sessionPath(id)}/stats`;
    const reply = await this._request<StatsReply>(path + query);
    expectArray(reply.samples, 'samples', path);
    return reply;
  }

  /** POST `sessions`: the reply comes before the session is running. */
  startSession(body: StartRequest): Promise<SessionView> {
    return this._request<SessionView>('sessions', {
      method: 'POST',
      body: JSON.stringify(body)
    });
  }

  /**
   * PUT `kernels/<kernel_id>/session`: connect a notebook's kernel to a
   * session; its next `%%gpu` cell runs there.
   */
  connectKernel(kernelId: string, session: string): Promise<SessionView> {
    const body: ConnectRequest = { session };
    return this._request<SessionView>(`kernels/${encodeURIComponent(kernelId)}/session`, {
      method: 'PUT',
      body: JSON.stringify(body)
    });
  }

  /** POST `kernelspecs`: install the GPU kernelspec of these start options. */
  installKernelspec(body: StartRequest): Promise<KernelspecReply> {
    return this._request<KernelspecReply>('kernelspecs', {
      method: 'POST',
      body: JSON.stringify(body)
    });
  }

  /** POST `carry`: a staging folder for a notebook's variables, and the code that saves them. */
  stageCarry(): Promise<CarryStage> {
    return this._request<CarryStage>('carry', { method: 'POST', body: '{}' });
  }

  /** POST `sessions/<id>/carry`: the staged variables into the session's kernel. */
  carryInto(id: string, folder: string): Promise<CarryReply> {
    return this._request<CarryReply>(`${sessionPath(id)}/carry`, {
      method: 'POST',
      body: JSON.stringify({ folder })
    });
  }

  /** DELETE `sessions/<id>` */
  stopSession(id: string, save = false): Promise<SessionView> {
    const query = save ? '?save=1' : '';
    return this._request<SessionView>(sessionPath(id) + query, { method: 'DELETE' });
  }

  /** POST `sessions/<id>/keepalive` */
  keepAlive(id: string, duration: string): Promise<SessionView> {
    const body: KeepAliveRequest = { duration };
    return this._request<SessionView>(`${sessionPath(id)}/keepalive`, {
      method: 'POST',
      body: JSON.stringify(body)
    });
  }

  /**
   * POST `sessions/<id>/switch`: answers once the new session runs and the
   * old one stopped (the old card's progress shows the stages meanwhile).
   */
  switchSession(id: string, body: SwitchRequest): Promise<SwitchReply> {
    return this._request<SwitchReply>(`${sessionPath(id)}/switch`, {
      method: 'POST',
      body: JSON.stringify(body)
    });
  }

  /** GET `options`: the start options, with the user's config as defaults. */
  async getOptions(): Promise<OptionsReply> {
    const reply = await this._request<OptionsReply>('options');
    expectArray(reply.options, 'options', 'options');
    return reply;
  }

  /**
   * The metric table of GET `options` (what the charts draw and how their
   * values read), fetched once for every chart of the page.
   */
  getMetrics(): Promise<readonly MetricView[]> {
    if (!this._metrics) {
      const pending = this.getOptions().then(reply => {
        expectArray(reply.metrics, 'metrics', 'options');
        return reply.metrics;
      });
      this._metrics = pending;
      pending.catch(() => {
        if (this._metrics === pending) {
          this._metrics = null; // asked again at the next poll
        }
      });
    }
    return this._metrics;
  }

  /** POST `options/check`: what is wrong with a start body, per option. */
  /** The images `backend` already has on `host` (GET `images`). */
  async getImages(backend: string, host: string): Promise<ImagesReply> {
    const query = new URLSearchParams({ backend, host }).toString();
    const reply = await this._request<ImagesReply>(`images?${query}`);
    expectArray(reply.images, 'images', 'images');
    return reply;
  }

  async checkOptions(body: StartRequest): Promise<OptionCheckReply> {
    const reply = await this._request<OptionCheckReply>('options/check', {
      method: 'POST',
      body: JSON.stringify(body)
    });
    if (typeof reply.errors !== 'object' || reply.errors === null) {
      throw new ApiError(`Unexpected reply from ${API_PATH}/options/check: no "errors"`, null);
    }
    return reply;
  }

  /** GET `catalog` */
  async getCatalog(): Promise<CatalogReply> {
    const reply = await this._request<CatalogReply>('catalog');
    expectArray(reply.types, 'types', 'catalog');
    return reply;
  }

  /** GET `prices?type=...`: the current spot prices of a GPU type (where a cloud answers). */
  async getPrices(type: string): Promise<PricesReply> {
    const reply = await this._request<PricesReply>('prices' + URLExt.objectToQueryString({ type }));
    expectArray(reply.rows, 'rows', 'prices');
    return reply;
  }

  /** GET `report?since=...&by=...[&split=...]`: the spend report. */
  async getReport(since: string, by: string, split?: string): Promise<ReportReply> {
    const query = URLExt.objectToQueryString(split ? { since, by, split } : { since, by });
    const reply = await this._request<ReportReply>('report' + query);
    expectArray(reply.rows, 'rows', 'report');
    return reply;
  }

  /** The workspaces that outlive sessions (GET `workspaces`). */
  async listWorkspaces(): Promise<WorkspaceListReply> {
    const reply = await this._request<WorkspaceListReply>('workspaces');
    expectArray(reply.workspaces, 'workspaces', 'workspaces');
    return reply;
  }

  /** Delete a workspace; the server wants its name again as confirmation. */
  async deleteWorkspace(name: string, backend: string): Promise<WorkspaceDeleteReply> {
    const query = `?confirm=${encodeURIComponent(name)}&backend=${encodeURIComponent(backend)}`;
    return this._request<WorkspaceDeleteReply>(
      `workspaces/${encodeURIComponent(name)}${query}`,
      { method: 'DELETE' }
    );
  }

  private async _request<T>(path: string, init: RequestInit = {}): Promise<T> {
    const url = URLExt.join(this._settings.baseUrl, API_PATH, path);
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this._settings);
    } catch (error) {
      throw new ApiError(
        `Cannot reach the Jupyter server: ${errorMessage(error)}`,
        null
      );
    }
    const text = await response.text();
    if (!response.ok) {
      throw new ApiError(
        failureMessage(response, text),
        response.status,
        serverMessageOf(text)
      );
    }
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new ApiError(
        `Invalid JSON from ${API_PATH}/${path} (HTTP ${response.status})`,
        response.status
      );
    }
  }

  private readonly _settings: ServerConnection.ISettings;
  private _metrics: Promise<readonly MetricView[]> | null = null;
}

/** The replies are trusted to match types.ts; this catches a wrong server. */
function expectArray(value: unknown, key: string, path: string): void {
  if (!Array.isArray(value)) {
    throw new ApiError(`Unexpected reply from ${API_PATH}/${path}: no "${key}" list`, null);
  }
}

function sessionPath(id: string): string {
  return `sessions/${encodeURIComponent(id)}`;
}

/** The `message` of a JSON error body, or null. */
function serverMessageOf(text: string): string | null {
  try {
    const body = JSON.parse(text) as ErrorReply | null;
    return typeof body?.message === 'string' && body.message ? body.message : null;
  } catch {
    return null;
  }
}

/** The message of a non-2xx reply: the server's own when it sent one. */
function failureMessage(response: Response, text: string): string {
  if (response.status === 404 && !text.trim().startsWith('{')) {
    return (
      'The gpusession server extension is not answering ' +
      `(HTTP 404 at ${API_PATH}): is gpusession installed and enabled ` +
      'in this Jupyter server?'
    );
  }
  let serverMessage = '';
  try {
    const body = JSON.parse(text) as ErrorReply;
    serverMessage = body.message || body.reason || '';
  } catch {
    serverMessage = text.trim().slice(0, 200);
  }
  const status = `HTTP ${response.status}${
    response.statusText ? ' ' + response.statusText : ''
  }`;
  return serverMessage ? `${serverMessage} (${status})` : status;
}
