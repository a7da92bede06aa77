/**
 * A session belongs to a notebook: the sidebar connects the open notebook
 * to a session (PUT `kernels/<kernel_id>/session`; the notebook's next
 * `%%gpu` cell runs there), offers it after a start or resume from the
 * sidebar, names on each card the notebooks that use it, and shows in each
 * notebook's toolbar the session it uses (type, $/h, state), one click to
 * change it.
 */
import { Dialog, ISessionContext, Notification, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { KernelSpec, Session } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { errorMessage } from './api';
import { carryLine, notSavedLine, savedFrom } from './carry';
import { element, setData, setText } from './dom';
import { formatRate } from './format';
import { StartForm } from './form';
import { SessionListModel } from './model';
import { isLive, kindText, liveSessions, rateText, sessionOfKernel } from './sessions';
import type { SessionView } from './types';

/** The notebook-level action: its whole kernel on a GPU session. */
export const RUN_ON_GPU = 'Run on a GPU kernel…';

/** What loads the magics into a notebook's kernel, so `%%gpu` works there. */
const LOAD_EXTENSION = '%load_ext gpusession';

/** The name a notebook goes by: its file name. */
export function notebookName(path: string): string {
  return path.split('/').pop() || path;
}

/**
 * Notebooks (their kernels) and the sessions they use. `sessions`: the
 * Jupyter server's sessions (notebook path -> kernel); `openForm` brings the
 * sidebar's start form up.
 */
export class NotebookLinks {
  constructor(
    model: SessionListModel,
    sessions: Session.IManager,
    kernelspecs: KernelSpec.IManager,
    openForm: () => void
  ) {
    this._model = model;
    this._sessions = sessions;
    this._kernelspecs = kernelspecs;
    this._openForm = openForm;
  }

  /** The notebook last in focus (the one a sidebar start offers to connect). */
  current: ISessionContext | null = null;

  /** The notebooks whose kernel uses `view` now (the newest session each took up). */
  usersOf(view: SessionView): string[] {
    const names: string[] = [];
    for (const model of this._sessions.running()) {
      const kernelId = model.kernel?.id;
      if (model.type === 'notebook' && kernelId && sessionOfKernel(this._model.sessions, kernelId)?.id === view.id) {
        names.push(notebookName(model.path));
      }
    }
    return names.sort();
  }

  /**
   * After a start or resume from the sidebar: with a notebook open that uses
   * another session or none, offer to connect it (naming it).
   */
  offer(view: SessionView): void {
    const context = this.current;
    const kernelId = context?.session?.kernel?.id;
    if (!context || context.isDisposed || context.type !== 'notebook' || !kernelId || isGpuKernel(context)) {
      return;
    }
    if (sessionOfKernel(this._model.sessions, kernelId)?.id === view.id) {
      return;
    }
    const name = notebookName(context.path);
    Notification.info(`GPU session ${view.name} is starting. Run ${name}'s %%gpu cells there?`, {
      autoClose: false,
      actions: [
        {
          label: `Connect ${name}`,
          caption: `The next %%gpu cell of ${name} runs in ${view.name}`,
          callback: () => void this.connect(context, view.name)
        }
      ]
    });
  }

  /**
   * Connect a notebook to a session: recorded on the server, and the magics
   * loaded in its kernel (quietly), so its next `%%gpu` cell runs there.
   */
  async connect(context: ISessionContext, session: string): Promise<void> {
    const kernel = context.session?.kernel;
    if (!kernel) {
      await showErrorMessage('Cannot connect the notebook', 'It has no kernel: start one first.');
      return;
    }
    try {
      this._model.upsert(await this._model.client.connectKernel(kernel.id, session));
    } catch (error) {
      await showErrorMessage(`Cannot connect ${notebookName(context.path)} to ${session}`, errorMessage(error));
      return;
    }
    const spec = await kernel.spec;
    if (spec?.language === 'python' && !isGpuKernel(context)) {
      kernel.requestExecute({ code: LOAD_EXTENSION, silent: true, store_history: false });
    }
    Notification.success(`${notebookName(context.path)} now runs its %%gpu cells in ${session}.`, {
      autoClose: 5000
    });
    void this._model.refresh();
  }

  /** The toolbar's click: pick the session this notebook uses, or start one. */
  async choose(context: ISessionContext): Promise<void> {
    const live = liveSessions(this._model.sessions).filter(isLive);
    const kernelId = context.session?.kernel?.id;
    const using = sessionOfKernel(this._model.sessions, kernelId);
    const name = notebookName(context.path);
    const body = new Widget();
    body.addClass('gpusession-connect-dialog');
    const select = document.createElement('select');
    select.className = 'gpusession-connect-pick jp-mod-styled';
    for (const view of live) {
      const entry = document.createElement('option');
      entry.value = view.name;
      entry.textContent = `${view.name} (${kindText(view)}, ${rateText(view)}, ${view.state})`;
      entry.selected = view.id === using?.id;
      select.append(entry);
    }
    const note = document.createElement('p');
    note.textContent = live.length
      ? `The next %%gpu cell of ${name} runs in the session you connect.`
      : 'No GPU session is running: start one in the sidebar.';
    body.node.append(note);
    if (live.length) {
      body.node.append(select);
    }
    const start = Dialog.createButton({ label: 'Start one…', className: 'gpusession-connect-start' });
    const gpuKernel = Dialog.createButton({ label: RUN_ON_GPU, className: 'gpusession-connect-kernel' });
    const connect = Dialog.okButton({ label: 'Connect', className: 'gpusession-connect-ok' });
    const answer = await showDialog({
      title: `GPU session of ${name}`,
      body,
      buttons: live.length
        ? [Dialog.cancelButton(), gpuKernel, start, connect]
        : [Dialog.cancelButton(), gpuKernel, start]
    });
    if (answer.button.label === RUN_ON_GPU) {
      await this.runOnGpu(context);
    } else if (answer.button.label === 'Start one…') {
      this._openForm();
    } else if (answer.button.accept && select.value) {
      await this.connect(context, select.value);
    }
  }

  /**
   * "Run this notebook on a GPU…": the start form's fields in a dialog; its
   * button installs the GPU kernelspec of those options (POST `kernelspecs`)
   * and changes the notebook's kernel to it, as Colab's "Change runtime type".
   */
  async runOnGpu(context: ISessionContext): Promise<void> {
    const name = notebookName(context.path);
    const body = new Widget();
    body.addClass('gpusession-gpu-kernel-dialog');
    const dialog = new Dialog({ title: `Run ${name} on a GPU`, body, buttons: [Dialog.cancelButton()] });
    const client = this._model.client;
    const form = new StartForm(client, () => undefined, () => undefined, {
      title: `The kernel of ${name} becomes a GPU session with these options`,
      button: 'Run on a GPU',
      busy: 'Starting the GPU kernel…',
      skip: ['name'], // each of its kernels is a new session: a kernelspec names none
      submit: async request => {
        const saved = await this._saveVariables(context); // while its kernel still runs
        const spec = await client.installKernelspec(request);
        await this._kernelspecs.refreshSpecs();
        dialog.resolve(0);
        await context.changeKernel({ name: spec.name });
        Notification.success(`${name} runs on ${spec.display_name}.`, { autoClose: 5000 });
        void this._model.refresh();
        const moved = await this._moveVariables(context, saved);
        if (moved) {
          Notification.info(moved, { autoClose: 15000 });
        }
        return null;
      }
    });
    body.node.append(form.node);
    void form.load();
    await dialog.launch();
    form.dispose();
  }

  /**
   * The notebook's variables saved by its current (Python) kernel into a
   * staging folder of the server: the folder, or why nothing was saved; null
   * when there is nothing to move (no kernel, another language, a GPU kernel
   * already: `%gpu switch` moves those).
   */
  private async _saveVariables(context: ISessionContext): Promise<Saved | null> {
    const kernel = context.session?.kernel;
    if (!kernel || isGpuKernel(context)) {
      return null;
    }
    const info = await kernel.info;
    if (info.language_info.name !== 'python') {
      return null;
    }
    const stage = await this._model.client.stageCarry();
    let text = '';
    const future = kernel.requestExecute({ code: stage.code, store_history: false });
    future.onIOPub = msg => {
      if (msg.header.msg_type === 'stream') {
        const content = msg.content as { name: string; text: string };
        text += content.name === 'stdout' ? content.text : '';
      }
    };
    await future.done;
    const why = notSavedLine(savedFrom(text));
    return why ? { note: why } : { folder: stage.folder };
  }

  /** The saved variables into the GPU kernel's session: the notice's words. */
  private async _moveVariables(context: ISessionContext, saved: Saved | null): Promise<string | null> {
    if (!saved || saved.note) {
      return saved?.note ?? null;
    }
    const kernelId = context.session?.kernel?.id;
    let session: SessionView | undefined;
    for (let tries = 0; !session && tries < 60; tries++) {
      session = sessionOfKernel((await this._model.client.listing()).sessions, kernelId);
      if (!session) {
        await new Promise(resolve => setTimeout(resolve, 1000));
      }
    }
    if (!session) {
      return 'Variables not moved: the GPU kernel’s session was not found within a minute.';
    }
    try {
      return carryLine(session.name, await this._model.client.carryInto(session.id, saved.folder!));
    } catch (error) {
      return `Variables not moved: ${errorMessage(error)}`;
    }
  }

  private readonly _model: SessionListModel;
  private readonly _sessions: Session.IManager;
  private readonly _kernelspecs: KernelSpec.IManager;
  private readonly _openForm: () => void;
}

/** What the notebook's kernel saved before its change: the staging folder, or why not. */
interface Saved {
  folder?: string;
  note?: string;
}

/** A notebook on a GPU kernel (a kernelspec of `gpusession kernelspec`) is its session already. */
function isGpuKernel(context: ISessionContext): boolean {
  return (context.session?.kernel?.name ?? '').startsWith('gpusession');
}

/**
 * A notebook toolbar's item: the session the notebook uses ("GPU t4-1 · t4 ×
 * 1 · $0.5260/h · running", as Colab's connected badge), or "Connect GPU"
 * when none; a click picks another (NotebookLinks.choose).
 */
export class NotebookSessionBadge extends Widget {
  constructor(model: SessionListModel, links: NotebookLinks, context: ISessionContext) {
    super({ node: document.createElement('button') });
    this._model = model;
    this._context = context;
    this.addClass('gpusession-notebook-badge');
    this.node.dataset.testid = 'gpusession-notebook-badge';
    this.node.append(this._icon, this._text);
    this._icon.textContent = 'GPU';
    this.node.addEventListener('click', () => void links.choose(context));
    model.changed.connect(this._render, this);
    context.kernelChanged.connect(this._render, this);
    context.sessionChanged.connect(this._render, this);
    this._release = model.watch(false);
    this._render();
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._release();
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    if (this.isDisposed || this._context.isDisposed) {
      return;
    }
    const session = sessionOfKernel(this._model.sessions, this._context.session?.kernel?.id);
    setData(this.node, 'sessionName', session?.name ?? '');
    setData(this.node, 'state', session?.state ?? 'none');
    if (!session) {
      setText(this._text, 'Connect GPU');
      this.node.title = 'This notebook uses no GPU session: click to connect one or start one';
      return;
    }
    const type = `${session.gpu_type} × ${session.gpu_count}`;
    setText(this._text, `${session.name} · ${type} · ${formatRate(session.price_per_hour)} · ${session.state}`);
    this.node.title = `This notebook's %%gpu cells run in ${session.name} (${kindText(session)}): click to change`;
  }

  private readonly _model: SessionListModel;
  private readonly _context: ISessionContext;
  private readonly _release: () => void;
  private readonly _icon = element('span', 'gpusession-notebook-badge-icon');
  private readonly _text = element('span', 'gpusession-notebook-badge-text');
}
