/**
 * The sidebar's workspaces (GET `workspaces`): each with where it lives,
 * its size, its monthly cost when it has one and who uses it, and Delete,
 * which asks first and is refused while a session uses the workspace.
 * Collapsed at first; loaded when opened (sizing a volume asks its engine)
 * and by its Refresh button.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';

import { ApiError, errorMessage, GpuSessionClient } from './api';
import { control, element, message, setText, showText } from './dom';
import { Latest } from './latest';
import type { WorkspaceView } from './types';
import { deleteBlocked, deleteQuestion, workspaceLine, workspacesTitle } from './workspaces';

/** Ask before deleting; true: go ahead. */
export type Confirm = (question: string) => Promise<boolean>;

async function askInDialog(question: string): Promise<boolean> {
  const answer = await showDialog({
    title: 'Delete workspace',
    body: question,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
  });
  return answer.button.accept;
}

export class WorkspacesSection {
  constructor(client: GpuSessionClient, confirm: Confirm = askInDialog) {
    this._client = client;
    this._confirm = confirm;
    this.node = element('details', 'gpusession-workspaces');
    this.node.dataset.testid = 'gpusession-workspaces';
    this._summary.className = 'gpusession-history-summary';
    this._summary.dataset.testid = 'gpusession-workspaces-summary';
    this._summary.textContent = 'Workspaces';
    this._refresh.type = 'button';
    this._refresh.textContent = 'Refresh';
    this._refresh.addEventListener('click', () => void this.load());
    this.node.addEventListener('toggle', () => {
      if (this.node.open) {
        void this.load();
      }
    });
    this.node.append(this._summary, this._list, this._empty, this._error, this._refresh);
  }

  readonly node: HTMLDetailsElement;

  /** Ask the server for the workspaces and show them. */
  async load(): Promise<void> {
    const ticket = this._loads.next();
    this._refresh.disabled = true;
    try {
      const reply = await this._client.listWorkspaces();
      if (!this._loads.isLatest(ticket)) {
        return; // a later listing is on its way: an older reply must not overwrite it
      }
      this._show(reply.workspaces);
      showText(this._error, reply.skipped.length ? `Not listed: ${reply.skipped.join('; ')}` : null);
    } catch (error) {
      if (this._loads.isLatest(ticket)) {
        showText(this._error, `Could not list the workspaces: ${errorMessage(error)}`);
      }
    } finally {
      if (this._loads.isLatest(ticket)) {
        this._refresh.disabled = false;
        this.node.dataset.loaded = String(this._loads.count);
      }
    }
  }

  private _show(list: readonly WorkspaceView[]): void {
    setText(this._summary, workspacesTitle(list));
    showText(this._empty, list.length ? null : 'No workspaces yet: a session makes one at its start.');
    this._list.replaceChildren(...list.map(ws => this._row(ws)));
  }

  private _row(ws: WorkspaceView): HTMLDivElement {
    const row = element('div', 'gpusession-history-item gpusession-workspace');
    row.dataset.testid = 'gpusession-workspace';
    row.dataset.workspace = ws.name;
    const name = element('span', 'gpusession-name');
    name.textContent = ws.name;
    const line = control('div', 'gpusession-workspace-line');
    line.textContent = workspaceLine(ws);
    line.title = ws.where;
    const error = message('gpusession-history-error');
    const remove = control('button', 'gpusession-workspace-delete');
    remove.type = 'button';
    remove.textContent = 'Delete';
    const blocked = deleteBlocked(ws);
    remove.disabled = blocked !== null;
    remove.title = blocked ?? `Delete ${ws.name}: its files and saved variables`;
    remove.addEventListener('click', () => void this._delete(ws, remove, error));
    const actions = element('div', 'gpusession-card-actions');
    actions.append(remove);
    row.append(name, line, error, actions);
    return row;
  }

  private async _delete(ws: WorkspaceView, button: HTMLButtonElement, error: HTMLDivElement): Promise<void> {
    if (!(await this._confirm(deleteQuestion(ws)))) {
      return;
    }
    button.disabled = true;
    try {
      await this._client.deleteWorkspace(ws.name, ws.backend);
      await this.load();
    } catch (failure) {
      const reason =
        failure instanceof ApiError && failure.serverMessage ? failure.serverMessage : errorMessage(failure);
      showText(error, `Delete failed: ${reason}`);
      button.disabled = false;
    }
  }

  private readonly _client: GpuSessionClient;
  private readonly _confirm: Confirm;
  private readonly _summary = document.createElement('summary');
  private readonly _list = element('div', 'gpusession-history-list');
  private readonly _empty = message('gpusession-workspaces-empty');
  private readonly _error = message('gpusession-workspaces-error');
  private readonly _refresh = control('button', 'gpusession-workspaces-refresh');
  private readonly _loads = new Latest();
}
